"""Multi-pod jobs on NVLink-domain fleets: gangs placed whole by gpu-tailor, against kube-scheduler and a
first-fit-domain placer (``gpu-tailor simulate --jobs``).

A job is a ``gangs.Gang``: its pods are useless until all of them run, and most ask for one NVLink domain. The fleets
are NVL72 racks (18 compute trays of 4 GPUs sharing one NVLink fabric, each rack one ``nvidia.com/gpu.clique``) and HGX
nodes (8 GPUs on one NVSwitch: the domain is the node). The schedulers:

- ``gpu-tailor``: the extender's own plan (``gangs.plan`` with tailor): the domain the packing policy prefers, the
  members placed by the policy inside it, nothing bound unless all are; single pods keep whole domains whole;
- ``kube-scheduler``: kube-scheduler alone, without gangs: every pod on its own, by the default profile
  (``simulate.kube.KubeModel``: LeastAllocated and BalancedAllocation), so a job's pods scatter over domains and bind
  as they fit, holding their GPUs while the rest wait;
- ``kube-gangs``: kube-scheduler with 1.36's gang scheduling (KEP-4671, KEP-5732): all or nothing; a job asking for a
  domain gets a topology constraint, each domain is one candidate placement where the pods are placed one after the
  other by the default profile, and of the feasible placements the tightest wins (NodeResourcesFit's placement score:
  the most GPUs allocated after it); a job that only prefers one domain has no constraint there (there is no
  preferred one), only the gang;
- ``first-fit-domain``: what Kueue's topology-aware scheduling does: the first domain (in name order) that holds the
  job, its pods placed there by the default profile; a job that prefers one domain goes anywhere where none holds it.

Two protocols. Without durations, as the FGD paper replays openb: jobs arrive until ``inflate`` x the GPUs have
arrived, each is placed when it arrives or dropped, and nothing leaves. With durations jobs arrive over time, wait
in a queue (first come first served, later jobs placed past one that does not fit), run, and leave; kube-scheduler's
pods wait one by one.
"""

from __future__ import annotations

import csv
import heapq
import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gpu_tailor.gpumodel.fleet import MILLI, Fleet, Shape
from gpu_tailor.gpumodel.gangs import ANYWHERE, PREFERRED, REQUIRED, Gang, GangMix, domain_slots, plan
from gpu_tailor.gpumodel.policies import Policy, TailorPolicy
from gpu_tailor.gpumodel.policies.base import NodeChoice
from gpu_tailor.gpumodel.topology import nvswitch
from gpu_tailor.simulate.kube import KubeModel, SimNode, SimPod
from gpu_tailor.simulate.trace import TraceError, TraceNode

SCHEDULERS = ("gpu-tailor", "kube-gangs", "first-fit-domain", "kube-scheduler")
WORKLOADS = ("training", "openb")


@dataclass(frozen=True, slots=True)
class FleetKind:
    """A fleet of identical nodes: per node CPU (milli), memory (MiB), GPUs and model; ``rack`` nodes share one
    NVLink domain (0: each node is its own, an HGX NVSwitch)."""

    model: str
    cpu: int
    mem: int
    gpus: int
    rack: int


# GB200 and GB300 compute trays: two Grace CPUs (72 Arm cores and 480 GB LPDDR5X each) and four GPUs; NVL72: 18 trays
# a rack on one NVLink switch fabric. HGX H100: two 56-core Xeons, 2 TiB, eight GPUs on NVSwitch (NVIDIA's DGX H100).
FLEETS = {
    "nvl72-gb200": FleetKind("NVIDIA-GB200", 144_000, 2 * 480 * 1024, 4, 18),
    "nvl72-gb300": FleetKind("NVIDIA-GB300", 144_000, 2 * 480 * 1024, 4, 18),
    "hgx-h100": FleetKind("NVIDIA-H100-80GB-HBM3", 112_000, 2048 * 1024, 8, 0),
}


@dataclass(frozen=True, slots=True)
class FleetNode:
    node: TraceNode
    domain: str  # "" where the node is a domain of its own


def fleet_nodes(kind: str, count: int) -> list[FleetNode]:
    """``count`` racks of ``kind`` (``FLEETS``), or ``count`` nodes where a node is its own domain."""
    if kind not in FLEETS:
        raise TraceError(f"unknown fleet {kind!r}; choose from {', '.join(FLEETS)}")
    k = FLEETS[kind]
    if count < 1:
        raise TraceError(f"a fleet of {count} racks or nodes")
    if not k.rack:
        return [FleetNode(TraceNode(f"hgx-{i:03d}", k.cpu, k.mem, k.gpus, k.model), "") for i in range(count)]
    # GFD's clique label: <fabric cluster UUID>.<clique id>
    return [FleetNode(TraceNode(f"rack{r}-tray{t:02d}", k.cpu, k.mem, k.gpus, k.model), f"rack-{r:02d}-uuid.{r}")
            for r in range(count) for t in range(k.rack)]


@dataclass(frozen=True, slots=True)
class Job:
    name: str
    gang: Gang
    arrival: float = 0.0  # seconds
    duration: float = math.inf

    @property
    def gpus(self) -> float:
        """GPUs asked, a share of one counted as its share (as the openb replay counts allocation)."""
        return gpus(self.gang.member, self.gang.size)


def gpus(shape: Shape, pods: int) -> float:
    """The GPUs ``pods`` pods of ``shape`` take, a share of one GPU counted as its share."""
    return pods * shape.gpu_milli / MILLI


def training_jobs(kind: str, seed: int, count: int, load: float = 0.9, capacity_gpus: int = 0) -> list[Job]:
    """A generated training mix for ``kind``'s nodes: 55% of the jobs single pods of 1, 2 or a node's GPUs, 20% jobs
    of half nodes (2 to 4 members, preferring one domain), 25% jobs of whole nodes (2 to 16 members on NVL72 racks,
    asking for one domain; 2 to 8 on HGX, asking for none, since there a domain is one node); by GPUs about a tenth
    single pods, a tenth to a fifth half nodes, the rest whole nodes. Durations are log-normal around an hour; with
    ``capacity_gpus`` arrivals are Poisson at ``load`` of it."""
    k = FLEETS[kind]
    rng = random.Random(seed)
    sizes = (2, 4, 8, 12, 16) if k.rack else (2, 4, 8)
    singles = (1, 1, 2, k.gpus)
    # the mix's mean GPUs per job and mean duration (log-normal: e^(mu + sigma^2 / 2))
    mean_gpus = 0.55 * sum(singles) / len(singles) + 0.20 * 3 * (k.gpus // 2) + 0.25 * k.gpus * sum(sizes) / len(sizes)
    mean_dur = 3600 * math.exp(0.8**2 / 2)
    big = REQUIRED if k.rack else ANYWHERE
    per_gpu = (k.cpu // k.gpus // 2, k.mem // k.gpus // 2)
    jobs: list[Job] = []
    t = 0.0
    for i in range(count):
        draw = rng.random()
        if draw < 0.55:
            g = rng.choice(singles)
            gang = Gang(1, Shape(per_gpu[0] * g, per_gpu[1] * g, g, MILLI), ANYWHERE)
        elif draw < 0.75:
            g = k.gpus // 2
            gang = Gang(rng.choice((2, 3, 4)), Shape(per_gpu[0] * g, per_gpu[1] * g, g, MILLI), PREFERRED)
        else:
            g = k.gpus
            gang = Gang(rng.choice(sizes), Shape(per_gpu[0] * g, per_gpu[1] * g, g, MILLI, nvlink=True), big)
        duration = rng.lognormvariate(math.log(3600), 0.8)
        job = Job(f"job-{i:05d}", gang, t, duration)
        jobs.append(job)
        if capacity_gpus:  # Poisson arrivals keeping ``load`` of the GPUs busy on average
            t += rng.expovariate(load * capacity_gpus / (mean_gpus * mean_dur))
    return jobs


OPENB_WINDOW = 600.0  # seconds: multi-GPU pods of one shape created this close together are one job


def openb_jobs(path: Path, kind: str, seed: int) -> list[Job]:
    """openb's pods as jobs (openb_pod_list_default.csv: creation and deletion times): multi-GPU pods of one shape
    created within ``OPENB_WINDOW`` of the previous one are one job (a pod larger than a node becomes node-sized
    members), asking for one domain where one holds them (anywhere on HGX where they need several nodes); GPU-sharing
    and one-GPU pods stay single. Times are the trace's, shifted by the seed's rotation so that each seed starts
    somewhere else."""
    k = FLEETS[kind]
    try:
        with path.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror or exc}") from exc
    need = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "creation_time", "deletion_time")
    if not rows or any(c not in rows[0] for c in need):
        raise TraceError(f"{path}: expected openb's columns {', '.join(need)}")
    pods = []
    for r in rows:
        gpus, milli = int(r["num_gpu"] or 0), int(r["gpu_milli"] or 0)
        if not gpus:
            continue
        born, gone = float(r["creation_time"] or 0), float(r["deletion_time"] or 0)
        pods.append((born, max(gone - born, 1.0), int(r["cpu_milli"] or 0), int(r["memory_mib"] or 0), gpus, milli))
    pods.sort()
    jobs: list[Job] = []
    group: list[tuple[float, float, int, int, int, int]] = []

    def close() -> None:
        born, _, cpu, mem, gpus, milli = group[0]
        members = len(group) * max(1, -(-gpus // k.gpus))
        per = min(gpus, k.gpus)
        scale = per / gpus
        shape = Shape(int(cpu * scale), int(mem * scale), per, milli if gpus == 1 else MILLI)
        # one domain where one can hold them all: on HGX a job of several whole nodes goes anywhere (as in
        # ``training_jobs``), else it would never start
        domain = REQUIRED if 1 < members <= max(k.rack, 1) * (k.gpus // per) else ANYWHERE
        jobs.append(Job(f"openb-{len(jobs):05d}", Gang(members, shape, domain), born,
                        max(d for _, d, *_ in group)))
        group.clear()

    for p in pods:
        if group and not (p[4] > 1 and p[2:] == group[-1][2:] and p[0] - group[-1][0] <= OPENB_WINDOW):
            close()
        group.append(p)
    if group:
        close()
    shift = random.Random(seed).random() * (jobs[-1].arrival - jobs[0].arrival)
    span = jobs[-1].arrival - jobs[0].arrival + 1
    out = [Job(j.name, j.gang, (j.arrival - jobs[0].arrival + shift) % span, j.duration) for j in jobs]
    return sorted(out, key=lambda j: j.arrival)


def build(nodes: list[FleetNode], seed: int) -> Fleet:
    fleet = Fleet(width=max(n.node.gpus for n in nodes))
    for n in nodes:
        t = n.node
        fleet.upsert(t.name, t.cpu, t.mem, [MILLI] * t.gpus, t.model, nvswitch(t.gpus), domain=n.domain)
    fleet.rank[: fleet.n] = np.random.default_rng(seed).permutation(fleet.n)
    return fleet


Placed = list[NodeChoice]


class Scheduler:
    """One of ``SCHEDULERS`` over one fleet: ``job`` places a whole job or nothing; ``pod`` one pod of a job that
    is placed pod by pod (kube-scheduler without gangs)."""

    def __init__(self, name: str, fleet: Fleet, nodes: list[FleetNode], seed: int) -> None:
        if name not in SCHEDULERS:
            raise TraceError(f"unknown scheduler {name!r}; choose from {', '.join(SCHEDULERS)}")
        self.name, self.fleet = name, fleet
        self.rows = fleet.rows()
        self.kube = KubeModel(fleet, self.rows, [SimNode(n.node) for n in nodes], seed)
        self.policy: Policy = TailorPolicy(fleet, seed)
        self.mix = GangMix()
        self.order = sorted(set(int(d) for d in fleet.domain[self.rows]), key=lambda d: fleet.domain_names[d])
        self.within = {d: fleet.domain[self.rows] == d for d in self.order}  # each domain's rows, as a mask
        self.holds: dict[Shape, tuple[int, np.ndarray]] = {}  # ``could``'s bound per shape, and the fleet it saw

    @property
    def gangs(self) -> bool:
        return self.name != "kube-scheduler"

    def observe(self, job: Job) -> None:
        if self.name == "gpu-tailor":
            for _ in range(job.gang.size):
                self.policy.observe(job.gang.member)
            self.mix.observe(job.gang)

    def job(self, job: Job) -> Placed | None:
        gang = job.gang
        if self.name == "gpu-tailor":
            chosen = plan(self.policy, gang, self.mix, self.rows)
            return list(chosen.members) if chosen is not None else None
        if gang.domain == ANYWHERE or gang.size == 1 or (gang.domain == PREFERRED and self.name == "kube-gangs"):
            return self._kube_all(gang)
        tried: list[tuple[float, int, Placed]] = []
        # a domain where not one member fits is passed over unasked (kube-scheduler would draw no tie there; a
        # pod restricted to GPU models is asked everywhere, as ``slots`` counts models and the model does not)
        hold = domain_slots(self.fleet, gang.member, self.rows)
        for d in self.order:
            if not hold[d] and not gang.member.models:
                continue
            placed = self._kube_all(gang, self.within[d])
            if placed is None:
                continue
            if self.name == "first-fit-domain":
                return placed
            tried.append((self._allocated(d, placed), -len(tried), placed))
        if tried:
            return max(tried, key=lambda t: t[:2])[2]
        return self._kube_all(gang) if gang.domain == PREFERRED else None

    def could(self, gang: Gang, members: int) -> bool:
        """Whether ``members`` more of ``gang`` may fit, by ``gangs.domain_slots``'s bound (a cheap no)."""
        if not members:
            return True
        seen = int(self.fleet.gen[self.rows].sum())  # rises with every take and release
        at, hold = self.holds.get(gang.member, (-1, None))
        if at != seen or hold is None:
            hold = domain_slots(self.fleet, gang.member, self.rows)
            self.holds[gang.member] = (seen, hold)
        if self.gangs and gang.domain == REQUIRED and gang.size > 1:
            return bool(hold.max() >= members)
        return bool(hold.sum() >= (members if self.gangs else 1))

    def _allocated(self, domain: int, placed: Placed) -> float:
        rows = self.rows[self.within[domain]]
        gpus = int(self.fleet.ngpu[rows].sum())
        idle = int((self.fleet.gpu[rows] == MILLI).sum()) - sum(len(c.gpus) for c in placed)
        return 1 - idle / max(gpus, 1)

    def pod(self, shape: Shape, among: np.ndarray | None = None) -> NodeChoice | None:
        """kube-scheduler's choice for one pod (the default profile), among the rows ``among`` marks (all by
        default)."""
        km = self.kube
        ok = km.fits(SimPod("", shape))
        if among is not None:
            ok &= among
        if not ok.any():
            return None
        at = int(self.rows[km.pick(ok, km.default_profile(SimPod("", shape)))])
        gpus = tuple(self.fleet.free_gpus(at)[: shape.gpus])
        return NodeChoice(at, gpus, 0.0)

    def _kube_all(self, gang: Gang, among: np.ndarray | None = None) -> Placed | None:
        taken = self.pods(gang, gang.size, among)
        return taken if len(taken) == gang.size else None

    def pods(self, gang: Gang, n: int, among: np.ndarray | None = None) -> Placed:
        """Up to ``n`` pods of ``gang``, one by one among ``among`` (all rows by default), as kube-scheduler places
        them without gangs: those that fit (nothing is left taken on the fleet: the caller takes them)."""
        placed: Placed = []
        for _ in range(n):
            c = self.pod(gang.member, among)
            if c is None:
                break
            self.fleet.take(c.node, gang.member, c.gpus)
            placed.append(c)
        for c in reversed(placed):
            self.fleet.release(c.node, gang.member, c.gpus)
        return placed


@dataclass
class JobRun:
    """One run's figures; fractions are of the fleet's GPUs (or of GPU-time, with durations)."""

    scheduler: str
    seed: int
    jobs: int = 0
    gangs: int = 0  # jobs of several pods
    gangs_whole: int = 0  # ... that ran with every pod
    split: int = 0  # ... of those that asked for one domain, placed over several
    spread: int = 0  # ... of those that preferred one, placed over several
    alloc: float = 0.0  # GPUs bound
    useful: float = 0.0  # GPUs of jobs running whole
    held: float = 0.0  # GPUs bound to jobs not yet whole
    waits: list[float] = field(default_factory=list)  # seconds, per job that started
    never: int = 0  # jobs still waiting at the end

    def wait(self, q: float) -> float:
        return float(np.percentile(self.waits, q)) if self.waits else 0.0


def _count(run: JobRun, fleet: Fleet, job: Job, placed: Placed) -> None:
    if job.gang.size > 1:
        run.gangs_whole += 1
        if len({int(fleet.domain[c.node]) for c in placed}) > 1:
            run.split += job.gang.domain == REQUIRED
            run.spread += job.gang.domain == PREFERRED


def replay(nodes: list[FleetNode], jobs: list[Job], scheduler: str, seed: int, *, inflate: float = 1.0,
           durations: bool = False, progress: Callable[[int], None] | None = None) -> JobRun:
    """One run: without ``durations`` the arrival protocol (jobs in order until ``inflate`` x the GPUs arrived,
    placed or dropped, never leaving), with them the queue."""
    fleet = build(nodes, seed)
    sched = Scheduler(scheduler, fleet, nodes, seed)
    capacity = int(fleet.ngpu[: fleet.n].sum())
    run = JobRun(scheduler, seed)
    if durations:
        _queue(run, sched, jobs, capacity, progress)
        return run
    arrived = held = 0.0
    for i, job in enumerate(jobs):
        if arrived + job.gpus > inflate * capacity:
            break
        arrived += job.gpus
        run.jobs += 1
        run.gangs += job.gang.size > 1
        sched.observe(job)
        placed = sched.job(job) if sched.gangs else sched.pods(job.gang, job.gang.size)
        if placed:
            for c in placed:
                fleet.take(c.node, job.gang.member, c.gpus)
            if len(placed) == job.gang.size:
                _count(run, fleet, job, placed)
                run.useful += job.gpus
            else:
                held += gpus(job.gang.member, len(placed))
        if progress is not None:
            progress(i + 1)
    run.alloc = (run.useful + held) / capacity
    run.useful /= capacity
    run.held = held / capacity
    return run


def _queue(run: JobRun, sched: Scheduler, jobs: list[Job], capacity: int,
           progress: Callable[[int], None] | None) -> None:
    fleet = sched.fleet
    horizon = max(j.arrival for j in jobs)
    ends: list[tuple[float, int]] = []  # (time, job index) of running jobs
    waiting: list[int] = []
    bound: dict[int, Placed] = {}  # what each job holds, whole or not
    busy = held = 0.0  # GPUs bound, and of those to jobs not whole
    last, area, held_area = 0.0, 0.0, 0.0
    nxt = 0
    for j in jobs:
        run.jobs += 1
        run.gangs += j.gang.size > 1

    def advance(now: float) -> None:
        nonlocal last, area, held_area
        span = max(min(now, horizon) - last, 0.0)
        area += busy * span
        held_area += held * span
        last = max(last, min(now, horizon))

    def start(i: int, now: float) -> None:
        nonlocal busy, held
        job = jobs[i]
        have = bound.setdefault(i, [])
        want = job.gang.size - len(have)
        placed = (sched.job(job) or []) if sched.gangs else sched.pods(job.gang, want)
        for c in placed:
            fleet.take(c.node, job.gang.member, c.gpus)
        have.extend(placed)
        busy += gpus(job.gang.member, len(placed))
        if len(have) == job.gang.size:
            held -= gpus(job.gang.member, len(have) - len(placed))
            waiting.remove(i)
            run.waits.append(now - job.arrival)
            _count(run, fleet, job, have)
            heapq.heappush(ends, (now + job.duration, i))
        else:
            held += gpus(job.gang.member, len(placed))

    while nxt < len(jobs) or ends:
        arrival = jobs[nxt].arrival if nxt < len(jobs) else math.inf
        freed = bool(ends) and ends[0][0] <= arrival
        if freed:
            now, i = heapq.heappop(ends)
            advance(now)
            for c in bound.pop(i):
                fleet.release(c.node, jobs[i].gang.member, c.gpus)
            busy -= jobs[i].gpus
        else:
            now = arrival
            advance(now)
            waiting.append(nxt)
            sched.observe(jobs[nxt])
            nxt += 1
            if progress is not None:
                progress(nxt)
        # an arrival changes nothing for the jobs already waiting: only the new one is tried; a departure, all of them
        for i in list(waiting) if freed else waiting[-1:]:
            if sched.could(jobs[i].gang, jobs[i].gang.size - len(bound.get(i, ()))):
                start(i, now)
    run.never = len(waiting)
    run.alloc = area / (capacity * horizon) if horizon else 0.0
    run.held = held_area / (capacity * horizon) if horizon else 0.0
    run.useful = run.alloc - run.held


def largest_whole_gang(fleet: Fleet) -> int:
    """The most whole free nodes in one labelled domain: the largest job of whole nodes that still fits in one."""
    rows = fleet.rows()
    whole = fleet.untouched(rows)
    counts = np.bincount(fleet.domain[rows], weights=whole, minlength=len(fleet.domain_names))
    labelled = np.asarray(fleet.labelled, bool)
    return int(counts[labelled].max()) if labelled.any() else 0


def fill(nodes: list[FleetNode], singles: Iterable[Shape], scheduler: str, seed: int,
         marks: tuple[float, ...] = (0.5, 0.6), policy: Callable[[Fleet, int], Policy] | None = None,
         ) -> dict[float, tuple[int, float]]:
    """Single pods placed one by one until each fraction of ``marks`` of the GPUs has arrived: at each, the largest
    job of whole nodes that still fits in one domain, and the GPUs placed over those arrived (nothing leaves).
    With ``policy`` (a factory) that policy alone places them (``Policy.choose``), and ``scheduler`` is a name."""
    fleet = build(nodes, seed)
    if policy is not None:
        alone = policy(fleet, seed)

        def place(shape: Shape) -> Placed | None:
            alone.observe(shape)
            choice = alone.choose(shape)
            return [choice] if choice is not None else None
    else:
        sched = Scheduler(scheduler, fleet, nodes, seed)

        def place(shape: Shape) -> Placed | None:
            job = Job("", Gang(1, shape, ANYWHERE))
            sched.observe(job)
            return sched.job(job) if sched.name == "gpu-tailor" else sched.pods(job.gang, 1)
    capacity = int(fleet.ngpu[: fleet.n].sum())
    out: dict[float, tuple[int, float]] = {}
    arrived = used = 0
    for shape in singles:
        if len(out) == len(marks):
            break
        placed = place(shape)
        arrived += shape.gpus
        if placed:
            fleet.take(placed[0].node, shape, placed[0].gpus)
            used += shape.gpus
        for m in marks:
            if m not in out and arrived >= m * capacity:
                out[m] = (largest_whole_gang(fleet), used / arrived)
    return out
