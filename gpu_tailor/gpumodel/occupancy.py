"""Per-GPU occupancy of one node: who holds which GPU, slice, replica or share.

Kubernetes counts ``nvidia.com/*`` per node only; which physical GPU a pod got is decided by the
device plugin at container start. Sharing decisions need it per GPU: a 600-milli pod does not fit a
node whose free 800 milli are spread as 400 + 400. So each node keeps, per GPU, what occupies it, and
placements name GPUs -- recorded ones (the ``gpu-tailor.io/gpus`` annotation) or predicted ones.

Units: compute is in milli-GPU (a MIG ``g``-slice instance of a 7-slice GPU holds ``1000*g/7``; a
replica of an N-way shared GPU holds ``1000/N``), memory in MiB. ``NodeGpus`` is mutable and meant to
have a single writer (the watch, or the simulator); readers take its numbers as they are. Where a pod's
units go is each backing's call (``devices``); this module only keeps the picture.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gpu_tailor.gpumodel.topology import GpuTopology, pcie

FULL = 1000


@dataclass(frozen=True, slots=True)
class Placement:
    """What one pod takes on a node: the same amount on each entry of ``gpus``.

    Whole GPUs are distinct entries. Replicas and MIG instances are one entry per unit, so a GPU
    repeats when several units sit on it (``(0, 0)``: two replicas of GPU 0). Units whose GPU cannot be
    told (a MIG layout that cannot be inferred) are counted in ``unplaced``, and ``note`` says why.
    """

    gpus: tuple[int, ...]
    milli: int = FULL  # per entry; FULL with whole=True for whole GPUs
    memory_mib: int = 0  # declared per entry (shares); whole GPUs take all memory
    whole: bool = True
    mig_profile: str | None = None
    replicas: int = 0  # replicas of a shared GPU, per entry
    unplaced: int = 0  # units held on no known GPU
    note: str = ""

    @property
    def units(self) -> int:
        return len(self.gpus) + self.unplaced


@dataclass(slots=True)
class GpuSlot:
    index: int
    memory_mib: int
    whole_by: str | None = None
    milli_used: int = 0
    memory_used_mib: int = 0
    replicas_used: int = 0
    mig: list[str] = field(default_factory=list)  # profile names of instances in use
    pods: set[str] = field(default_factory=set)

    @property
    def free_milli(self) -> int:
        return 0 if self.whole_by is not None else FULL - self.milli_used

    @property
    def free_memory_mib(self) -> int:
        return 0 if self.whole_by is not None else self.memory_mib - self.memory_used_mib

    @property
    def idle(self) -> bool:
        return not self.pods


class NodeGpus:
    """The GPUs of one node and what is placed on them, kept by pod key (``namespace/name``)."""

    def __init__(self, count: int, memory_mib: int, topology: GpuTopology | None = None,
                 usable: int | None = None) -> None:
        self.slots = [GpuSlot(i, memory_mib) for i in range(count)]
        self.topology = topology if topology is not None and topology.size == count else pcie(count)
        self.usable = count if usable is None else min(count, usable)  # degraded nodes: the first `usable`
        self.placements: dict[str, Placement] = {}

    # --- queries -------------------------------------------------------------------------------
    def free_whole(self) -> list[int]:
        return [s.index for s in self.slots[: self.usable] if s.idle]

    def free_milli_total(self) -> int:
        return sum(s.free_milli for s in self.slots[: self.usable])

    def fitting_shares(self, milli: int, memory_mib: int = 0) -> list[int]:
        """GPUs with at least ``milli`` and ``memory_mib`` free for a share (no MIG on them)."""
        return [s.index for s in self.slots[: self.usable]
                if not s.mig and s.free_milli >= milli and s.free_memory_mib >= memory_mib]

    def copy(self) -> NodeGpus:
        """An independent copy to try releases and placements on (the topology is shared)."""
        other = NodeGpus.__new__(NodeGpus)
        other.slots = [GpuSlot(s.index, s.memory_mib, s.whole_by, s.milli_used, s.memory_used_mib,
                               s.replicas_used, list(s.mig), set(s.pods)) for s in self.slots]
        other.topology, other.usable = self.topology, self.usable
        other.placements = dict(self.placements)
        return other

    # --- the single writer's operations --------------------------------------------------------
    def clear(self) -> None:
        """Forget every placement (before a relist re-places the pods)."""
        self.placements.clear()
        self.slots = [GpuSlot(s.index, s.memory_mib) for s in self.slots]

    def place(self, pod: str, placement: Placement) -> None:
        """Record a placement; replaces an earlier one of the same pod (idempotent on replays)."""
        if pod in self.placements:
            self.release(pod)
        self.placements[pod] = placement
        for g in placement.gpus:
            if not 0 <= g < len(self.slots):
                continue  # a recorded GPU this node no longer reports: keep the pod, skip the slot
            slot = self.slots[g]
            slot.pods.add(pod)
            if placement.whole:
                slot.whole_by = pod
                continue
            slot.milli_used += placement.milli
            slot.memory_used_mib += placement.memory_mib
            slot.replicas_used += placement.replicas
            if placement.mig_profile:
                slot.mig.append(placement.mig_profile)

    def release(self, pod: str) -> Placement | None:
        placement = self.placements.pop(pod, None)
        if placement is None:
            return None
        for g in placement.gpus:
            if not 0 <= g < len(self.slots):
                continue
            slot = self.slots[g]
            slot.pods.discard(pod)
            if placement.whole:
                if slot.whole_by == pod:
                    slot.whole_by = None
                continue
            slot.milli_used -= placement.milli
            slot.memory_used_mib -= placement.memory_mib
            slot.replicas_used -= placement.replicas
            if placement.mig_profile and placement.mig_profile in slot.mig:
                slot.mig.remove(placement.mig_profile)
        return placement

    # --- what the device plugin would hand out -------------------------------------------------
    def predict_whole(self, k: int) -> tuple[int, ...] | None:
        """The k GPUs the best-effort allocator would pick among the free ones."""
        return self.topology.best_set(self.free_whole(), k)

    def predict_share(self, milli: int, memory_mib: int = 0) -> int | None:
        """Best fit: the fitting GPU with the least free compute (lowest index on ties)."""
        fits = self.fitting_shares(milli, memory_mib)
        return min(fits, key=lambda g: (self.slots[g].free_milli, g)) if fits else None

    def predict_units(self, n: int, milli: int) -> tuple[int, ...]:
        """The GPU of each of ``n`` replicas (``milli`` each), chosen one at a time as for a one-replica
        pod, each seeing the ones before it. Fewer than ``n`` when room runs out.

        The device plugin hands a container any ``n`` free units, from one GPU or several; Kubernetes
        only checks the node's count. So several units are not one bigger share that must fit one GPU.
        """
        trial = self if n == 1 else self.copy()  # the node itself is never changed
        out: list[int] = []
        for i in range(n):
            g = trial.predict_share(milli)
            if g is None:
                break
            out.append(g)
            if i + 1 < n:
                trial.place(f"\0unit-{i}", Placement((g,), milli, whole=False, replicas=1))
        return tuple(out)


def parse_gpu_annotation(value: str) -> tuple[int, ...] | None:
    """``gpu-tailor.io/gpus`` = ``"0,3"``; None when unreadable (then the placement is predicted)."""
    try:
        out = tuple(int(p) for p in value.split(",") if p.strip())
    except ValueError:
        return None
    return out if out and all(g >= 0 for g in out) else None


def format_gpu_annotation(gpus: Iterable[int]) -> str:
    return ",".join(str(g) for g in sorted(gpus))
