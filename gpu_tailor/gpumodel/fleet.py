"""The fleet as placement sees it: every node's free resources as numpy arrays, and the pod's shape.

This is half of the one placement engine of the project (the other half is ``policies``, which
score what this module offers). The extender's filter and prioritize use it for the candidate nodes
of a live cluster, and the trace simulator for every arrival of a replayed trace, so what the
simulator proves is what the scheduler does.

A node is reduced to what placement needs: free CPU (milli), free memory (MiB), the free share of
each GPU (milli, 1000 = idle; -1 pads nodes with fewer GPUs than the widest one), its GPU model and
optionally its GPU interconnect. A pod is a ``Shape``: CPU, memory, and ``gpus`` GPUs of ``milli``
each (a sharing pod has gpus == 1 and milli < 1000; whole-GPU pods have milli == 1000).
``candidates`` lists where a pod could go as ``PlacementCandidates``, arrays over every feasible
placement, so that a policy scores them all at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_tailor.gpumodel.topology import GpuTopology

MILLI = 1000
Array = np.ndarray[Any, Any]

# how a node's GPUs are NVLinked, for answering "is an all-NVLink set of k idle GPUs free" on many
# rows at once (``Fleet.nvlinked``); rows of any other shape are asked one by one
NO_TOPOLOGY, NO_NVLINK, ALL_NVLINK, NVLINK_PAIRS, OTHER_NVLINK = range(5)
TIE_KEYS = ("whole", "blocks", "multi-blocks")  # ``Fleet.ties``


def _link_class(topology: GpuTopology | None, gpus: int) -> int:
    if topology is None:
        return NO_TOPOLOGY
    n = topology.size
    if n != gpus:
        return OTHER_NVLINK
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    linked = {(a, b) for a, b in pairs if topology.nvlinked(a, b)}
    if not linked:
        return NO_NVLINK
    if len(linked) == len(pairs):
        return ALL_NVLINK
    if n % 2 == 0 and linked == {(a, b) for a, b in pairs if a // 2 == b // 2}:
        return NVLINK_PAIRS
    return OTHER_NVLINK


@dataclass(frozen=True, slots=True)
class Shape:
    """What one pod needs. ``models`` restricts the GPU model (empty = any)."""

    cpu: int
    mem: int
    gpus: int = 0
    milli: int = 0
    models: frozenset[str] = frozenset()
    nvlink: bool = False  # a multi-GPU ask that must sit on an all-NVLink set

    @property
    def sharing(self) -> bool:
        return self.gpus == 1 and 0 < self.milli < MILLI

    @property
    def gpu_milli(self) -> int:
        return self.gpus * self.milli

    @property
    def kind(self) -> tuple[int, int, int, frozenset[str]]:
        """The pod type as FGD groups pods: (cpu, milli per GPU, GPUs, allowed models)."""
        return (self.cpu, self.milli, self.gpus, self.models)




# Which GPU of a node a sharing pod goes to: the policy's choice (the simulator's GPU-sharing
# scheduler), or the node's device plugin's (replicas, ``occupancy.ReplicaPolicy``): the GPU with the
# most free (distributed, spread), or the least free that fits (packed). Replicas of one node are all
# alike, so free share orders the GPUs as their replica counts do. There a pod of several replicas fits
# where the node has that many free (the kubelet counts them; the plugin hands them out one at a time,
# over the GPUs), and is scored on the GPU that gets the most of them (``candidates``).
PICK_ANY, PICK_MOST_FREE, PICK_LEAST_FREE = 0, 1, 2
# Or kube-scheduler's DRA allocator, on a node whose GPUs a DRA driver publishes: the first device, in the order the
# pool lists them, that the claim fits (it scores no device), for a sharing pod (a share of a shared device) and for
# whole GPUs alike (``Policy.whole_gpus`` takes the first idle ones on a row of this pick).
PICK_FIRST = 3


class Fleet:
    """Free resources of every node, as arrays; rows are node slots, stable for a node's life."""

    def __init__(self, width: int = 8) -> None:
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.models: list[str] = []
        self.model_ids: dict[str, int] = {}
        self.topologies: list[GpuTopology | None] = []
        self.width = width
        self.n = 0
        cap = 16
        self.cpu = np.zeros(cap, np.int64)
        self.mem = np.zeros(cap, np.int64)
        self.cpu_cap = np.zeros(cap, np.int64)
        self.gpu = np.full((cap, width), -1, np.int64)
        self.ngpu = np.zeros(cap, np.int64)
        self.model = np.full(cap, -1, np.int64)
        self.alive = np.zeros(cap, bool)
        self.rank = np.zeros(cap, np.int64)  # score ties go to the lowest rank
        self.gen = np.zeros(cap, np.int64)  # bumped on every change: caches refresh those rows
        self.link = np.zeros(cap, np.int64)  # NO_TOPOLOGY, ALL_NVLINK, ...
        self.pick = np.zeros(cap, np.int64)  # PICK_ANY, PICK_MOST_FREE, PICK_LEAST_FREE
        self.step = np.zeros(cap, np.int64)  # milli of one replica where the device plugin picks
        # the NVLink domain of each row (``domain_names``): a labelled one several nodes share (an NVL72 rack's
        # clique), else the node alone; ``labelled`` says which ids are the shared kind
        self.domain = np.zeros(cap, np.int64)
        self.domain_names: list[str] = []
        self.domain_ids: dict[tuple[bool, str], int] = {}
        self.labelled: list[bool] = []
        self.shared_domains = 0  # how many of them are labelled
        self.max_cpu = 1
        self.max_gpus = 1

    # ----- building and updating -----
    def model_id(self, model: str) -> int:
        if model not in self.model_ids:
            self.model_ids[model] = len(self.models)
            self.models.append(model)
        return self.model_ids[model]

    def domain_id(self, name: str, labelled: bool) -> int:
        key = (labelled, name)
        if key not in self.domain_ids:
            self.domain_ids[key] = len(self.domain_names)
            self.domain_names.append(name)
            self.labelled.append(labelled)
            self.shared_domains += labelled
        return self.domain_ids[key]

    def _grow(self, rows: int, width: int) -> None:
        cap = max(rows, len(self.cpu))
        if cap > len(self.cpu):
            cap = max(cap, 2 * len(self.cpu))
        if cap == len(self.cpu) and width <= self.width:
            return
        width = max(width, self.width)
        for attr in ("cpu", "mem", "cpu_cap", "ngpu", "rank", "gen", "link", "pick", "step", "domain"):
            old = getattr(self, attr)
            new = np.zeros(cap, old.dtype)
            new[: len(old)] = old
            setattr(self, attr, new)
        model = np.full(cap, -1, np.int64)
        model[: len(self.model)] = self.model
        self.model = model
        alive = np.zeros(cap, bool)
        alive[: len(self.alive)] = self.alive
        self.alive = alive
        gpu = np.full((cap, width), -1, np.int64)
        gpu[: self.gpu.shape[0], : self.width] = self.gpu
        self.gpu, self.width = gpu, width

    def upsert(self, name: str, cpu_free: int, mem_free: int, gpu_free: Sequence[int], model: str = "",
               topology: GpuTopology | None = None, cpu_capacity: int | None = None, pick: int = PICK_ANY,
               step: int = 0, domain: str = "") -> int:
        """Add a node or replace what is known of it; returns its row. ``pick``: who picks the GPU of a
        pod of one replica (of ``step`` milli) there (``PICK_ANY``: the policy). ``domain``: the NVLink domain it
        shares with other nodes ("": the node is a domain of its own)."""
        i = self.index.get(name)
        if i is None:
            i = self.n
            self._grow(i + 1, len(gpu_free))
            self.n += 1
            self.names.append(name)
            self.topologies.append(topology)
            self.index[name] = i
            self.rank[i] = i
        else:
            self._grow(self.n, len(gpu_free))
            self.topologies[i] = topology
        self.cpu[i], self.mem[i] = cpu_free, mem_free
        self.cpu_cap[i] = cpu_capacity if cpu_capacity is not None else cpu_free
        self.gpu[i] = -1
        self.gpu[i, : len(gpu_free)] = gpu_free
        self.ngpu[i] = len(gpu_free)
        self.model[i] = self.model_id(model) if model else -1
        self.link[i] = _link_class(topology, len(gpu_free))
        self.pick[i], self.step[i] = pick, step
        self.domain[i] = self.domain_id(domain, True) if domain else self.domain_id(name, False)
        self.alive[i] = True
        self.gen[i] += 1
        self.max_cpu = max(self.max_cpu, int(self.cpu_cap[i]))
        self.max_gpus = max(self.max_gpus, len(gpu_free))
        return i

    def remove(self, name: str) -> None:
        i = self.index.get(name)
        if i is not None:
            self.alive[i] = False
            self.gen[i] += 1

    def take(self, node: int, shape: Shape, gpus: Iterable[int]) -> None:
        self.cpu[node] -= shape.cpu
        self.mem[node] -= shape.mem
        for g in gpus:
            self.gpu[node, g] -= shape.milli
        self.gen[node] += 1

    def release(self, node: int, shape: Shape, gpus: Iterable[int]) -> None:
        self.cpu[node] += shape.cpu
        self.mem[node] += shape.mem
        for g in gpus:
            self.gpu[node, g] += shape.milli
        self.gen[node] += 1

    # ----- questions -----
    def rows(self, names: Iterable[str] | None = None) -> Array:
        if names is None:
            return np.flatnonzero(self.alive[: self.n])
        idx = [self.index[n] for n in names if n in self.index]
        arr = np.asarray(idx, np.int64)
        return arr[self.alive[arr]] if len(arr) else arr

    def model_allowed(self, shape: Shape, rows: Array) -> Array:
        if not shape.models or shape.gpus == 0:
            return np.ones(len(rows), bool)
        ids = [self.model_ids[m] for m in shape.models if m in self.model_ids]
        return np.isin(self.model[rows], ids)

    def feasible(self, shape: Shape, rows: Array) -> Array:
        """Which of ``rows`` the pod fits on right now."""
        ok = (self.cpu[rows] >= shape.cpu) & (self.mem[rows] >= shape.mem) & self.model_allowed(shape, rows)
        if shape.gpus:
            gpu = self.gpu[rows]
            fits = (gpu >= shape.milli).sum(axis=1) >= shape.gpus
            several = self._several_replicas(shape, rows)
            if several.any():  # the kubelet counts replicas; the plugin hands them out over several GPUs
                fits = np.where(several, self._replicas_free(rows) * self.step[rows] >= shape.milli, fits)
            ok &= fits
        if shape.nvlink and shape.gpus > 1:
            ok &= self.nvlinked(rows, shape.gpus)
        return ok

    def _several_replicas(self, shape: Shape, rows: Array) -> Array:
        """Per row: whether ``shape`` is several replicas of a GPU the node's device plugin shares."""
        out: Array = shape.sharing & (self.pick[rows] != PICK_ANY) & (self.step[rows] > 0) & \
            (shape.milli > self.step[rows])
        return out

    def _replicas_free(self, rows: Array) -> Array:
        gpu = self.gpu[rows]
        out: Array = np.where(gpu > 0, gpu // np.maximum(self.step[rows], 1)[:, None], 0).sum(axis=1)
        return out

    def untouched(self, rows: Array) -> Array:
        """Per row: whether the node has GPUs and every one of them is wholly free (a whole free node, what a
        job of all its GPUs needs)."""
        gpu = self.gpu[rows]
        out: Array = (self.ngpu[rows] > 0) & np.all((gpu == MILLI) | (gpu < 0), axis=1)
        return out

    def ties(self, rows: Array, shape: Shape, keys: str = TIE_KEYS[-1]) -> Array:
        """Per row, for a pod of whole GPUs: how much placing it there takes from the larger free blocks, lower
        first (the tie-break where the policy scores placements alike, issue 28). In order of weight:

        1. a whole free node (every GPU idle) last: the next job of all a node's GPUs needs one (even where the pod
           fills the node: exempting those placed 0.11 point less on gpuspec10 at 90% arrived);
        2. the fewest GPUs idle on the node's largest NVLink domain (all of a node's idle GPUs where it has an
           NVSwitch, no NVLink at all (PCIe: any idle GPUs make the block) or no topology known): a small free block
           is filled before a larger one is broken;
        3. the fewest GPUs it would leave stranded: idle, and beyond what the node's CPU and memory left could feed
           at the pod's own CPU and memory per GPU.

        ``keys`` (``TIE_KEYS``): ``whole`` the first key alone; ``blocks`` all three for every pod of whole GPUs;
        ``multi-blocks`` all three for pods of several GPUs, the first alone for one GPU (on the openb replay keys 2
        and 3 for one-GPU pods cost 0.2 point of allocation, for multi-GPU pods nothing: docs/tailor-experiments.md).
        """
        if keys not in TIE_KEYS:
            raise ValueError(f"tie keys {keys!r}: expected one of {', '.join(TIE_KEYS)}")
        whole = self.untouched(rows).astype(np.int64)
        if keys == "whole" or shape.gpus <= 0 or (keys == "multi-blocks" and shape.gpus < 2):
            return whole
        idle = (self.gpu[rows] == MILLI).sum(axis=1)
        block = idle.copy()
        for j in np.flatnonzero((self.link[rows] == NVLINK_PAIRS) | (self.link[rows] == OTHER_NVLINK)):
            topo = self.topologies[int(rows[j])]
            if topo is not None:
                block[j] = topo.largest_nvlink_set(self.free_gpus(int(rows[j])))
        left = np.maximum(idle - shape.gpus, 0)
        fed = left
        if shape.cpu > 0:
            fed = np.minimum(fed, np.maximum(self.cpu[rows] - shape.cpu, 0) * shape.gpus // shape.cpu)
        if shape.mem > 0:
            fed = np.minimum(fed, np.maximum(self.mem[rows] - shape.mem, 0) * shape.gpus // shape.mem)
        out: Array = whole * 10_000 + np.minimum(block, 99) * 100 + np.minimum(left - fed, 99)
        return out

    def untouched_domains(self) -> Array:
        """Per domain id: whether it is labelled (shared by nodes) and every GPU of every live node in it is idle."""
        rows = self.rows()
        used = np.bincount(self.domain[rows], weights=~self.untouched(rows), minlength=len(self.domain_names))
        out: Array = (used == 0) & np.asarray(self.labelled, bool)
        return out

    def spare_whole_domains(self, shape: Shape, rows: Array) -> Array:
        """``rows`` less those of untouched labelled domains where a pod of ``shape`` fits on one of the others, else
        ``rows`` as they are: single pods fill the domains in use and leave whole ones to the gangs that need them."""
        if shape.gpus == 0 or not len(rows) or not self.shared_domains:
            return rows
        domains = self.domain[rows]
        if (domains == domains[0]).all():  # one domain (a gang's members placed in it): nothing to spare
            return rows
        whole = self.untouched_domains()[domains]
        if not whole.any() or whole.all():
            return rows
        rest = rows[~whole]
        return rest if self.feasible(shape, rest).any() else rows

    def free_gpus(self, node: int) -> list[int]:
        return [g for g in range(int(self.ngpu[node])) if self.gpu[node, g] == MILLI]

    def nvlinked(self, rows: Array, k: int) -> Array:
        """Per row: whether ``nvlink_set(row, k)`` finds a set, for all rows at once."""
        link = self.link[rows]
        idle = self.gpu[rows] == MILLI
        count = idle.sum(axis=1)
        if k <= 1:
            one: Array = (link != NO_TOPOLOGY) & (count >= k)
            return one
        even = self.width - self.width % 2
        both = idle[:, 0:even:2] & idle[:, 1:even:2]  # both GPUs of a pair idle
        out: Array = ((link == ALL_NVLINK) & (count >= k)) | ((link == NVLINK_PAIRS) & (k == 2) & both.any(axis=1))
        for j in np.flatnonzero(link == OTHER_NVLINK):
            out[j] = self.nvlink_set(int(rows[j]), k) is not None
        return out

    def nvlink_set(self, node: int, k: int) -> tuple[int, ...] | None:
        topo = self.topologies[node]
        if topo is None:
            return None
        best = topo.best_set(self.free_gpus(node), k)
        return best if best is not None and topo.all_nvlinked(best) else None

    def capacity_milli(self) -> int:
        return int(self.ngpu[: self.n][self.alive[: self.n]].sum()) * MILLI



@dataclass
class PlacementCandidates:
    """Placements to score: on ``node``, GPU ``gpu`` (a sharing pod) goes from free ``before`` to
    ``after``; a whole-GPU pod takes ``count`` idle GPUs (gpu = -1: chosen after the node)."""

    node: Array
    gpu: Array
    before: Array
    after: Array
    count: Array


def candidates(fleet: Fleet, shape: Shape, rows: Array) -> PlacementCandidates:
    rows = rows[fleet.feasible(shape, rows)]
    if shape.sharing:
        free = fleet.gpu[rows]
        i, g = np.nonzero(free >= shape.milli)
        before = free[i, g]
        # GPUs of one node with the same free share are interchangeable: keep the lowest index
        _, first = np.unique(i * (MILLI + 1) + before, return_index=True)
        i, g, before = i[first], g[first], before[first]
        allocator = fleet.pick[rows[i]] == PICK_FIRST
        if allocator.any():  # the allocator's pick: the lowest GPU with room (unique kept the lowest of each share)
            lowest = np.full(len(rows), fleet.width, np.int64)
            np.minimum.at(lowest, i, g)
            keep = ~allocator | (g == lowest[i])
            i, g, before = i[keep], g[keep], before[keep]
        pick = np.where(shape.milli <= fleet.step[rows[i]], fleet.pick[rows[i]], PICK_ANY)
        if pick.any():  # where the device plugin picks the GPU of one replica, that GPU is the only placement
            most = np.full(len(rows), -1, np.int64)
            np.maximum.at(most, i, before)
            least = np.full(len(rows), MILLI + 1, np.int64)
            np.minimum.at(least, i, before)
            keep = (pick == PICK_ANY) | ((pick == PICK_MOST_FREE) & (before == most[i])) | \
                   ((pick == PICK_LEAST_FREE) & (before == least[i]))
            i, g, before = i[keep], g[keep], before[keep]
        after = before - shape.milli
        several = np.flatnonzero(fleet._several_replicas(shape, rows))
        if len(several):
            # Several replicas where the device plugin hands them out: one at a time, over the GPUs, so the count
            # decides and no GPU need hold them all. Scored on the GPU that gets the most of them: the most free,
            # taking its share of them spread over the GPUs with room; packed, the fullest with room, filled first.
            keep = ~np.isin(i, several)
            i, g, before, after = i[keep], g[keep], before[keep], after[keep]
            step = fleet.step[rows[several]]
            room = np.maximum(free[several], 0) // step[:, None]  # replicas each GPU has room for
            units = -(-shape.milli // step)
            packed = fleet.pick[rows[several]] == PICK_LEAST_FREE
            fullest = np.where(room > 0, free[several], MILLI + 1).argmin(axis=1)
            top = np.where(packed, fullest, free[several].argmax(axis=1))
            spread = -(-units // np.maximum((room > 0).sum(axis=1), 1))
            took = np.minimum(np.where(packed, units, spread), room[np.arange(len(several)), top]) * step
            top_before = free[several, top]
            i, g = np.concatenate([i, several]), np.concatenate([g, top])
            before, after = np.concatenate([before, top_before]), np.concatenate([after, top_before - took])
        return PlacementCandidates(rows[i], g, before, after, np.ones(len(i), np.int64))
    n = len(rows)
    full = np.full(n, MILLI, np.int64)
    if shape.gpus:
        return PlacementCandidates(rows, np.full(n, -1), full, np.zeros(n, np.int64), np.full(n, shape.gpus))
    return PlacementCandidates(rows, np.full(n, -1), full, full, np.zeros(n, np.int64))
