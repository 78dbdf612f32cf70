"""kube-scheduler around the placement policy: what a cluster's scheduler does with the same pods alone, and with
gpu-tailor's extender, before anyone installs anything (``gpu-tailor simulate --scheduler``).

The policy replay (``simulate.trace.replay``) places each pod where the policy likes best. On a cluster the policy
is one voice among kube-scheduler's: the extender's rank score at its weight beside NodeResourcesFit. ``KubeModel``
is that scheduler, reduced to what differs between nodes when pods carry no affinity, spread or tolerations:

- its filter counts CPU, memory and the device plugin's units per node: idle GPUs on nodes that sell them whole,
  free replicas on time-sliced or MPS nodes (a fractional pod asks ``ceil(milli x replicas / 1000)`` of them, as the
  openb replay on a real control plane creates it: ``nvidia.com/gpu.shared: N``; the webhook itself sends a
  portable ask to a pool only where one replica holds it, so on a cluster with gpu-tailor this is the model of
  native asks for replicas; it goes to shared nodes only, whole GPUs to the others);
- ``kube-default``: the default profile alone, LeastAllocated plus BalancedAllocation on CPU and memory, over the
  first feasible nodes its adaptive ``percentageOfNodesToScore`` finds (``pkg/scheduler/schedule_one.go``);
- ``gpu-tailor``: gpu-tailor-scheduler as ``manifests/scheduler`` configures it, MostAllocated (GPU resources
  weighing 10) plus the extender's prioritize at the manifest's weight. The extender's part is its own code
  (``extender.scores``: ``extender_scores`` by rank of the policy's score, ``tie_order``), and the extender's
  filter keeps the nodes the policy fits, and for replicas also those with enough free replicas on some GPUs.

kube-scheduler takes one of the best totals at random, so a run is one draw: ``run`` takes a seed. The openb
replay on a real control plane (``benchmarks/cluster_replay.py``, ``tests/e2e/test_replay.py``) checks this model
pod for pod against real kube-schedulers of v1.28 and v1.36.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from gpu_tailor.extender.scores import MAX_SCORE, extender_scores, node_order, tie_order
from gpu_tailor.gpumodel.fleet import MILLI, PICK_FIRST, PICK_LEAST_FREE, PICK_MOST_FREE, Fleet, Shape
from gpu_tailor.gpumodel.occupancy import ReplicaPolicy
from gpu_tailor.gpumodel.policies import POLICIES, FgdPolicy, Mix, Policy, Prior, configure
from gpu_tailor.simulate.trace import TraceNode, TracePod, _curve, build_fleet

SCHEDULERS = ("kube-default", "gpu-tailor")
MAX_NODE_SCORE = 100  # kube-scheduler's framework.MaxNodeScore
GPU_WEIGHT = 10  # manifests/scheduler: NodeResourcesFit MostAllocated, cpu 1, memory 1, GPU resources 10
MIN_FEASIBLE_NODES, MIN_FEASIBLE_PERCENT = 100, 5  # pkg/scheduler/schedule_one.go
DEFAULT_EXTENDER_WEIGHT = 11  # manifests/scheduler/configmap.yaml (a test keeps them equal)


@dataclass(frozen=True, slots=True)
class SimNode:
    """A node: its trace row (name, CPU, memory, GPUs, model) and how its device plugin sells the GPUs."""

    node: TraceNode
    replicas: int = 0  # time-sliced or MPS replicas per GPU; 0: whole GPUs
    policy: ReplicaPolicy = ReplicaPolicy.DISTRIBUTED  # how its device plugin hands out replicas
    # published by NVIDIA's DRA driver instead: its GPUs as devices taken whole, or, with ``replicas``, as shared
    # devices (``allowMultipleAllocations``) of which a claim consumes memory in the same steps
    dra: bool = False

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def shared(self) -> bool:
        return self.replicas > 0


@dataclass(frozen=True, slots=True)
class SimPod:
    """A pod as it arrives: ``fractional`` asks for replicas (a share of one GPU), else for whole GPUs."""

    name: str
    shape: Shape
    fractional: bool = False

    @property
    def kind(self) -> str:
        s = self.shape
        return "cpu" if not s.gpus else "frac" if self.fractional else "1gpu" if s.gpus == 1 else "multi"


def replicas_for(milli: int, replicas: int) -> int:
    """The replicas of a pool of ``replicas`` per GPU that hold ``milli`` of one GPU (rounded up)."""
    return -(-milli * replicas // MILLI)


def sim_pod(pod: TracePod, replicas: int = 0) -> SimPod:
    """A trace pod; with ``replicas`` (per GPU, where every shared pool has the same count) a fractional pod's GPU
    share is rounded up to whole replicas, as the extender counts a pod asking for that many."""
    s = pod.shape
    if not (s.gpus and s.milli < MILLI):
        return SimPod(pod.name, s)
    milli = min(replicas_for(s.milli, replicas) * MILLI // replicas, MILLI) if replicas else s.milli
    return SimPod(pod.name, Shape(s.cpu, s.mem, 1, milli, s.models), True)


def nodes_to_score(n: int) -> int:
    """How many feasible nodes kube-scheduler's default (adaptive) percentageOfNodesToScore looks for."""
    if n < MIN_FEASIBLE_NODES:
        return n
    percent = max(50 - n // 125, MIN_FEASIBLE_PERCENT)
    return max(n * percent // 100, MIN_FEASIBLE_NODES)


class KubeModel:
    """kube-scheduler's view of the fleet: CPU, memory and device-plugin units counted per node (the per-GPU picture
    stays in the fleet, which only the extender reads)."""

    def __init__(self, fleet: Fleet, rows: np.ndarray, nodes: list[SimNode], seed: int) -> None:
        self.fleet, self.rows = fleet, rows
        self.shared = np.array([n.shared for n in nodes], bool)
        self.replicas = np.array([n.replicas for n in nodes], np.int64)
        self.step = np.array([MILLI // n.replicas if n.replicas else MILLI for n in nodes], np.int64)
        self.cpu_cap, self.mem_cap = fleet.cpu[rows].copy(), fleet.mem[rows].copy()
        self.unit_cap = np.array([n.node.gpus * max(n.replicas, 1) for n in nodes], np.int64)
        self.packed = np.array([n.policy is ReplicaPolicy.PACKED for n in nodes], bool)
        self.spread = np.array([n.policy is ReplicaPolicy.SPREAD for n in nodes], bool)
        self.dra = np.array([n.dra for n in nodes], bool)
        # the extender's fleet: on shared nodes the device plugin picks a replica's GPU, on DRA nodes the allocator
        # picks every device (``Fleet.pick``)
        fleet.pick[rows] = np.where(self.dra, PICK_FIRST, np.where(
            self.shared, np.where(self.packed, PICK_LEAST_FREE, PICK_MOST_FREE), 0))
        fleet.step[rows] = np.where(self.shared & ~self.dra, self.step, 0)
        self.rng = random.Random(seed)
        self.next_start = 0  # the default profile's round-robin start (percentageOfNodesToScore)

    def units_free(self) -> np.ndarray:
        gpu = self.fleet.gpu[self.rows]
        per_replica = np.where(gpu > 0, gpu // self.step[:, None], 0).sum(axis=1)
        idle = (gpu == MILLI).sum(axis=1)
        out: np.ndarray = np.where(self.shared, per_replica, idle)
        return out

    def units(self, pod: SimPod) -> np.ndarray:
        """The device-plugin units the pod asks for on each node."""
        s = pod.shape
        if pod.fractional:
            return np.asarray(-(-s.milli * self.replicas // MILLI), np.int64)
        return np.full(len(self.rows), s.gpus, np.int64)

    def fits(self, pod: SimPod) -> np.ndarray:
        """NodeResourcesFit's filter: CPU, memory and the pod's device-plugin resource; on DRA nodes
        DynamicResources': the allocator finds devices for the claim (idle GPUs, or a shared one with the memory)."""
        s = pod.shape
        ok = (self.fleet.cpu[self.rows] >= s.cpu) & (self.fleet.mem[self.rows] >= s.mem)
        if s.gpus:
            gpu = self.fleet.gpu[self.rows]
            claim = (gpu >= s.milli).any(axis=1) if pod.fractional else (gpu == MILLI).sum(axis=1) >= s.gpus
            room = np.where(self.dra, claim, self.units_free() >= self.units(pod))
            ok &= (self.shared if pod.fractional else ~self.shared) & room
        out: np.ndarray = ok
        return out

    def _used(self, pod: SimPod) -> tuple[np.ndarray, np.ndarray]:
        # scoring counts a pod without requests as 100m CPU and 200 MiB (schedutil.GetNonzeroRequests)
        cpu, mem = pod.shape.cpu or 100, pod.shape.mem or 200
        return (self.cpu_cap - self.fleet.cpu[self.rows] + cpu, self.mem_cap - self.fleet.mem[self.rows] + mem)

    def most_allocated(self, pod: SimPod) -> np.ndarray:
        """gpu-tailor-scheduler's NodeResourcesFit score (MostAllocated, GPU resources weighing 10)."""
        cpu, mem = self._used(pod)
        cpu_cap, mem_cap = np.maximum(self.cpu_cap, 1), np.maximum(self.mem_cap, 1)
        score = cpu * MAX_NODE_SCORE // cpu_cap + mem * MAX_NODE_SCORE // mem_cap
        weights = 2
        if pod.shape.gpus:  # a DRA node has no GPU allocatable: NodeResourcesFit scores its CPU and memory alone
            used = self.unit_cap - self.units_free() + self.units(pod)
            gpu = GPU_WEIGHT * (used * MAX_NODE_SCORE // np.maximum(self.unit_cap, 1))
            out: np.ndarray = np.where(self.dra, score // weights, (score + gpu) // (weights + GPU_WEIGHT))
            return out
        out = score // weights
        return out

    def default_profile(self, pod: SimPod) -> np.ndarray:
        """The default profile's NodeResourcesFit (LeastAllocated) plus NodeResourcesBalancedAllocation."""
        cpu, mem = self._used(pod)
        cpu_cap, mem_cap = np.maximum(self.cpu_cap, 1), np.maximum(self.mem_cap, 1)
        least = ((cpu_cap - cpu) * MAX_NODE_SCORE // cpu_cap + (mem_cap - mem) * MAX_NODE_SCORE // mem_cap) // 2
        fc, fm = np.minimum(cpu / cpu_cap, 1.0), np.minimum(mem / mem_cap, 1.0)
        balanced = ((1 - np.abs(fc - fm) / 2) * MAX_NODE_SCORE).astype(np.int64)
        out: np.ndarray = least + balanced
        return out

    def pick(self, ok: np.ndarray, scores: np.ndarray) -> int:
        """The row kube-scheduler binds among ``ok`` (indexes into ``rows``): best score, ties at random."""
        best = np.flatnonzero(ok & (scores == scores[ok].max()))
        return int(best[self.rng.randrange(len(best))])

    def with_extender(self, engine: Policy, pod: SimPod, weight: int) -> tuple[np.ndarray, bool]:
        """The rows gpu-tailor-scheduler may bind (it picks one at random), and whether the extender was asked to
        prioritize (and so learnt the pod's shape first, as ``extender.server`` does).

        Among the nodes kube-scheduler's filter passes, the extender's filter keeps those the policy fits, and for
        replicas also those with enough free replicas on some GPUs. Where one node is left kube-scheduler binds it
        without scoring; otherwise the best totals of the extender's prioritize (``extender_scores`` on the policy's
        scores, ranks 10 down to 1, 0 where it does not fit) times ``weight`` plus MostAllocated. Empty: the pod is
        unschedulable."""
        offered = self.fits(pod)
        at = self.rows[offered]
        s = pod.shape
        fits = self.fleet.feasible(s, at)
        keep = fits | (pod.fractional & ~self.dra[offered])  # replicas: counted; a shared device: its room
        if keep.sum() < 2:  # kube-scheduler runs no score plugin, and no extender's prioritize, for one node
            return at[keep], False
        engine.observe(s)
        raw, _ = engine.node_scores(s, at)
        whole = s if engine.keep_whole_nodes else None
        ext = extender_scores(raw, ~np.isnan(raw), tie_order(self.fleet, at, s.gpus > 0, whole, engine.tie_keys))
        total = ext * weight * (MAX_NODE_SCORE // MAX_SCORE) + self.most_allocated(pod)[offered]
        best: np.ndarray = at[np.flatnonzero(keep & (total == total[keep].max()))]
        return best, True

    def sample(self, ok: np.ndarray) -> np.ndarray:
        """The default profile scores only the first ``nodes_to_score`` feasible nodes, searching from where the
        last search stopped (in the order nodes joined)."""
        n, want = len(ok), nodes_to_score(len(ok))
        order = (np.arange(n) + self.next_start) % n
        hits = np.flatnonzero(ok[order])
        if len(hits) <= want:  # every node was searched: the next search starts where this one did
            return ok
        last = int(hits[want - 1])
        self.next_start = (self.next_start + last + 1) % n
        kept = np.zeros(n, bool)
        kept[order[hits[:want]]] = True
        return kept

    def place(self, at: int, pod: SimPod, gpus: tuple[int, ...]) -> None:
        """What the bind leaves on the node (a fleet row). Replicas as the extender records them
        (``NodeGpus.predict_replicas``): one at a time, each where the node's device plugin would put it -- by
        default the GPU with the most free (fewest replicas), packed the fitting one with the least, spread first
        the GPUs the pod has none on -- lowest index on ties."""
        fleet = self.fleet
        if not pod.fractional:
            fleet.take(at, pod.shape, gpus)
            return
        row = int(np.flatnonzero(self.rows == at)[0])
        if self.dra[row]:  # the allocator: the first shared device with the memory
            g = int(np.flatnonzero(fleet.gpu[at, : fleet.ngpu[at]] >= pod.shape.milli)[0])
            fleet.take(at, pod.shape, (g,))
            return
        step = int(self.step[row])
        fleet.take(at, Shape(pod.shape.cpu, pod.shape.mem), ())
        sign = 1 if self.packed[row] else -1
        mine: set[int] = set()
        for _ in range(replicas_for(pod.shape.milli, int(self.replicas[row]))):
            free = fleet.gpu[at, : fleet.ngpu[at]]
            g = min((self.spread[row] and i in mine, sign * int(f), i) for i, f in enumerate(free) if f >= step)[2]
            mine.add(g)
            fleet.take(at, Shape(0, 0, 1, step), (g,))


@dataclass
class Meter:
    """One run's record: alloc% per arrived% as ``simulate.trace.replay`` computes its curve, each arrival's node,
    pods dropped by kind, and the whole free nodes of the largest size when 90% and 100% have arrived."""

    capacity: int
    arrived: int = 0
    used: int = 0
    sums: dict[int, float] = field(default_factory=dict)
    counts: dict[int, int] = field(default_factory=dict)
    failed: Counter[str] = field(default_factory=Counter)
    on_shared: Counter[str] = field(default_factory=Counter)  # pods placed on time-sliced nodes, by kind
    where: list[str | None] = field(default_factory=list)  # each arrival's node, None if dropped
    whole_nodes: dict[str, int] = field(default_factory=dict)  # "90"/"100" -> largest nodes left whole and free
    disagree: list[tuple[int, str, str | None, list[str]]] = field(default_factory=list)  # see ``run(follow=)``

    def event(self, pod: SimPod, node: str | None, shared: bool = False) -> None:
        placed = node is not None
        self.where.append(node)
        self.on_shared[pod.kind] += shared
        self.arrived += pod.shape.gpu_milli
        if placed:
            self.used += pod.shape.gpu_milli
        else:
            self.failed[pod.kind] += 1
        pct = math.floor(self.arrived * 100 / self.capacity + 0.5)
        self.sums[pct] = self.sums.get(pct, 0.0) + self.used * 100 / self.capacity
        self.counts[pct] = self.counts.get(pct, 0) + 1

    def curve(self, top: int) -> dict[str, float]:
        return _curve(self.sums, self.counts, top)

    @property
    def alloc(self) -> float:
        """Mean alloc% of the arrivals at 100% arrived (NaN when none rounds to 100)."""
        n = self.counts.get(100, 0)
        return self.sums[100] / n if n else float("nan")


def run(nodes: list[SimNode], seq: list[SimPod], scheduler: str, seed: int, *, policy: str = "tailor",
        mix: list[SimPod] | None = None, weight: int = DEFAULT_EXTENDER_WEIGHT, cpu_spread: bool = False,
        follow: list[str | None] | None = None, ties: str | None = None, prior: Prior | None = None) -> Meter:
    """``seq`` arriving one by one (never leaving) on empty ``nodes``, placed by ``scheduler``.

    ``kube-default``: kube-scheduler alone. ``gpu-tailor``: ``policy`` as the extender runs it, under
    gpu-tailor-scheduler's profile with the extender at ``weight``. The policy learns its mix as the extender does:
    from each pod it is asked to prioritize, and from each GPU pod the watch shows bound (one that no node could
    take is never learnt); FGD is handed ``mix`` (default: ``seq``) as its known workload instead.
    ``ties``, ``prior``: as ``configure`` sets them (None: the policy's own).
    ``cpu_spread``: CPU-only pods go to kube-scheduler alone instead (the webhook's ``cpuOnlyPods: false``).
    ``follow``: a real run's node per arrival; each pod goes where the real one went, and ``Meter.disagree`` lists
    the pods the real run placed where the model would not (the real node not among its best, placed where the
    model finds no room, or dropped where it finds some)."""
    if scheduler not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {scheduler!r}; choose from {', '.join(SCHEDULERS)}")
    fleet = build_fleet([n.node for n in nodes], "none", seed)
    rows = fleet.rows()
    fleet.rank[rows] = [node_order(n.name) for n in nodes]  # the extender's tie-break, by node name
    kube = KubeModel(fleet, rows, nodes, seed)
    index = {n.name: i for i, n in enumerate(nodes)}
    engine: Policy | None = None
    if scheduler == "gpu-tailor" and policy == "fgd":
        known = Mix()
        for p in mix if mix is not None else seq:
            known.observe(p.shape)
        engine = FgdPolicy(fleet, seed, mix=known)
    elif scheduler == "gpu-tailor":
        engine = POLICIES[policy](fleet, seed)
    if engine is not None:
        configure(engine, ties, prior if policy != "fgd" else None)
    largest = max((n.node.gpus for n in nodes if not n.shared), default=0)
    # whole nodes of the largest size that sell whole GPUs (a time-sliced node takes no whole-GPU job)
    biggest = rows[(fleet.ngpu[rows] == largest) & ~kube.shared] if largest else np.zeros(0, np.int64)
    meter = Meter(fleet.capacity_milli() or 1)
    for i, pod in enumerate(seq):
        shape = pod.shape
        at: int | None = None
        asked = False
        alone = engine is None or (cpu_spread and not shape.gpus)
        if alone:
            ok = kube.fits(pod)
            if ok.any():
                at = int(rows[kube.pick(kube.sample(ok), kube.default_profile(pod))])
        else:
            assert engine is not None
            best, asked = kube.with_extender(engine, pod, weight)
            at = int(best[kube.rng.randrange(len(best))]) if len(best) else None
            if follow is not None:
                name = follow[i]
                real = None if name is None else index[name]
                if real != at and not (real is not None and real in best):
                    meter.disagree.append((i, pod.kind, follow[i], [nodes[b].name for b in best[:3]]))
        if follow is not None:
            name = follow[i]
            at = None if name is None else index[name]
        if at is not None:
            gpus: tuple[int, ...] = ()
            if shape.gpus and not pod.fractional:
                gpus = engine.whole_gpus(at, shape) if engine is not None else tuple(fleet.free_gpus(at)[: shape.gpus])
            kube.place(at, pod, gpus)
            if engine is not None:
                engine.placed(at, shape)
                if shape.gpus and not asked:  # the watch shows it bound: the extender learns its shape then
                    engine.observe(shape)
        meter.event(pod, None if at is None else nodes[at].name, at is not None and nodes[at].shared)
        pct = math.floor(meter.arrived * 100 / meter.capacity + 0.5)
        for mark in ("90", "100"):
            if pct >= int(mark) and mark not in meter.whole_nodes:
                meter.whole_nodes[mark] = int(fleet.untouched(biggest).sum()) if len(biggest) else 0
    return meter
