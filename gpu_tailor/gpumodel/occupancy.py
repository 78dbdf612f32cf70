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
from enum import StrEnum

from gpu_tailor.gpumodel.topology import GpuTopology, pcie

FULL = 1000


class ReplicaPolicy(StrEnum):
    """How NVIDIA's device plugin picks the replicas of a shared GPU for a container, one at a time
    (``--shared-devices-allocation-policy``; k8s-device-plugin ``internal/rm/allocate.go``):

    * ``distributed`` (the plugin's default, and its only behaviour before v0.20): a GPU with the
      fewest replicas allocated;
    * ``packed``: a GPU with the most replicas allocated that still has a free one;
    * ``spread``: a GPU this container has no replica of yet, then as ``distributed`` (the plugin's
      main branch, in no release as of 2026-11).

    Among GPUs that rank alike the plugin takes whichever its map and sort order give first, so the
    prediction is a set: ``NodeGpus.predict_replicas``.
    """

    DISTRIBUTED = "distributed"
    PACKED = "packed"
    SPREAD = "spread"


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
    # a prediction among equals: every GPU the device plugin may hand one of these units (``gpus`` is
    # one such choice, the one the annotation records); empty when there was one choice, or the GPUs are known
    maybe: tuple[int, ...] = ()
    # the GPUs are bookkeeping, not a prediction: a degraded node whose unsold GPUs are not known
    # (``NodeGpus.per_gpu_known``); the units are counted there and no GPU is promised or annotated
    counted: bool = False
    # replicas read back from bind's annotation (after a restart, say): which GPUs they were picked among is lost
    read_back: bool = False

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
                 usable: int | None = None, policy: ReplicaPolicy = ReplicaPolicy.DISTRIBUTED) -> None:
        self.slots = [GpuSlot(i, memory_mib) for i in range(count)]
        self.topology = topology if topology is not None and topology.size == count else pcie(count)
        self.usable = count if usable is None else min(count, usable)
        self._sold = self.usable  # as the node's allocatable counts them
        # which GPUs the device plugin does not sell (a node agent's report); None: not known, and on a
        # degraded node the bookkeeping then takes the first ``usable`` GPUs, a guess it promises nothing by
        self.unhealthy: frozenset[int] | None = None
        self.policy = policy  # how the device plugin hands out replicas here
        self.placements: dict[str, Placement] = {}
        # per GPU, how many placements' ``maybe`` name it (kept as placements come and go: ``unsure`` is asked on
        # every prediction, and walking the placements there grew with the pods picked among equals)
        self._unsure: dict[int, int] = {}

    @property
    def per_gpu_known(self) -> bool:
        """Whether which GPU is which can be promised: every GPU is sold, or the agent said which are not."""
        return self.unhealthy is not None or self.usable == len(self.slots)

    @property
    def promised_topology(self) -> GpuTopology:
        """The links placements may count on: none where which GPUs are sold is not known (``per_gpu_known``)."""
        return self.topology if self.per_gpu_known else pcie(len(self.slots))

    def usable_slots(self) -> list[GpuSlot]:
        if self.unhealthy is None:
            return self.slots[: self.usable]
        return [s for s in self.slots if s.index not in self.unhealthy]

    def set_unhealthy(self, gpus: Iterable[int] | None) -> None:
        """What a node agent reports the device plugin does not sell (None: forget it, back to the guess)."""
        self.unhealthy = frozenset(g for g in gpus if 0 <= g < len(self.slots)) if gpus is not None else None
        self.usable = len(self.slots) - len(self.unhealthy) if self.unhealthy is not None else self._sold

    # --- queries -------------------------------------------------------------------------------
    def free_whole(self) -> list[int]:
        return [s.index for s in self.usable_slots() if s.idle]

    def free_milli_total(self) -> int:
        return sum(s.free_milli for s in self.usable_slots())

    def fitting_shares(self, milli: int, memory_mib: int = 0) -> list[int]:
        """GPUs with at least ``milli`` and ``memory_mib`` free for a share (no MIG on them)."""
        return [s.index for s in self.usable_slots()
                if not s.mig and s.free_milli >= milli and s.free_memory_mib >= memory_mib]

    def copy(self) -> NodeGpus:
        """An independent copy to try releases and placements on (the topology is shared)."""
        other = NodeGpus.__new__(NodeGpus)
        other.slots = [GpuSlot(s.index, s.memory_mib, s.whole_by, s.milli_used, s.memory_used_mib,
                               s.replicas_used, list(s.mig), set(s.pods)) for s in self.slots]
        other.topology, other.usable, other.policy = self.topology, self.usable, self.policy
        other.unhealthy, other._sold = self.unhealthy, self._sold
        other.placements = dict(self.placements)
        other._unsure = dict(self._unsure)
        return other

    # --- the single writer's operations --------------------------------------------------------
    def clear(self) -> None:
        """Forget every placement (before a relist re-places the pods)."""
        self.placements.clear()
        self._unsure.clear()
        self.slots = [GpuSlot(s.index, s.memory_mib) for s in self.slots]

    def place(self, pod: str, placement: Placement) -> None:
        """Record a placement; replaces an earlier one of the same pod (idempotent on replays)."""
        if pod in self.placements:
            self.release(pod)
        self.placements[pod] = placement
        for g in placement.maybe:
            self._unsure[g] = self._unsure.get(g, 0) + 1
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
        for g in placement.maybe:
            left = self._unsure[g] - 1
            if left:
                self._unsure[g] = left
            else:
                del self._unsure[g]
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
    def unsure(self) -> frozenset[int]:
        """The GPUs an earlier prediction among equals may have handed out instead of the ones it wrote down
        (the union of the placements' ``maybe``): which of them is free is not known until a node agent says."""
        return frozenset(self._unsure)

    def sold_but_lost(self) -> frozenset[int]:
        """The GPUs a node agent reports lost that the device plugin may still hand out: the node's allocatable
        counts more GPUs than the report leaves (NVIDIA's plugin learns of a loss only from an Xid event). Which of
        the unsold GPUs the plugin still sells is not told, so all of them are named: safe (a pick among them is no
        contradiction) though wider than it may be, until allocatable and the report agree again."""
        if not self.unhealthy or self._sold <= len(self.slots) - len(self.unhealthy):
            return frozenset()
        return self.unhealthy

    def surely_free(self) -> list[int]:
        """The idle GPUs that no earlier prediction among equals may have handed out: the ones this picture can
        name as free (``free_whole`` counts right, but which GPUs those are is unsure where ``unsure`` is not
        empty)."""
        unsure = self.unsure()
        return [g for g in self.free_whole() if g not in unsure]

    def predict_whole(self, k: int) -> tuple[int, ...] | None:
        """The k GPUs the best-effort allocator would pick among the free ones."""
        found = self.predict_whole_among(k)
        return found[0] if found is not None else None

    def predict_whole_among(self, k: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """The k GPUs the best-effort allocator would pick among the free ones and, where it may pick others,
        every GPU it may hand out (else empty): the GPUs of the free sets that score as well, and the GPUs an
        earlier prediction among equals left unsure (the free ones may be other than those written down), and the
        lost GPUs the plugin still sells (``sold_but_lost``)."""
        found = self.promised_topology.best_sets(self.free_whole(), k)
        if found is None:
            return None
        best, alike = found
        maybe = set(alike) | self.unsure() | set(best) | self.sold_but_lost()
        return best, (tuple(sorted(maybe)) if len(maybe) > len(best) else ())

    def predict_share(self, milli: int, memory_mib: int = 0) -> int | None:
        """The GPU one replica of ``milli`` would get (the lowest index among the GPUs the plugin may pick)."""
        where, _ = self.predict_replicas(1, milli, memory_mib)
        return where[0] if where else None

    def predict_units(self, n: int, milli: int) -> tuple[int, ...]:
        """The GPU of each of ``n`` replicas (``milli`` each): ``predict_replicas``'s first part."""
        return self.predict_replicas(n, milli)[0]

    def predict_replicas(self, n: int, milli: int, memory_mib: int = 0) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Where a container's ``n`` replicas go, as the device plugin picks them under ``policy``: one GPU
        per replica (fewer when room runs out) and, when the plugin may pick others that rank alike, every
        GPU it may hand any of them (sorted; else empty).

        Replicas are picked one at a time, each seeing the ones before it; the device plugin hands a
        container any ``n`` free units, from one GPU or several (Kubernetes only checks the node's count),
        so several units are not one bigger share that must fit one GPU. Of GPUs that rank alike the
        lowest index is the one written down, and the following picks see that choice.
        """
        fits = {g: self.slots[g].replicas_used for g in self.fitting_shares(milli, memory_mib)}
        room = {g: self.slots[g].free_milli // milli if milli > 0 else n for g in fits}
        mine: dict[int, int] = {}  # replicas of this container per GPU (``spread``)
        out: list[int] = []
        maybe: set[int] = set()
        policy = self.policy
        for _ in range(n):
            open_ = [g for g in fits if room[g] > 0]
            if not open_:
                break
            if policy is ReplicaPolicy.PACKED:
                rank = {g: -fits[g] for g in open_}
            elif policy is ReplicaPolicy.SPREAD:
                rank = {g: (mine.get(g, 0) > 0) * (1 << 20) + fits[g] for g in open_}
            else:
                rank = {g: fits[g] for g in open_}
            best = min(rank.values())
            alike = [g for g in open_ if rank[g] == best]
            g = alike[0]
            if len(alike) > 1:
                maybe.update(alike)
            out.append(g)
            fits[g] += 1
            room[g] -= 1
            mine[g] = mine.get(g, 0) + 1
        unsure = self.unsure() | self.sold_but_lost()
        tied = bool(maybe)
        if out and (maybe or unsure):
            # an earlier pick among equals may have gone elsewhere: the counts this one ranks by are then
            # off on those GPUs, and it may go to any of them
            maybe.update(out)
            usable = {s.index for s in self.usable_slots() if not s.mig} | self.sold_but_lost()
            maybe.update(g for g in unsure if g in usable)
        if not tied and maybe <= set(out):
            maybe = set()
        return tuple(out), tuple(sorted(maybe))


def parse_gpu_annotation(value: str) -> tuple[int, ...] | None:
    """``gpu-tailor.io/gpus`` = ``"0,3"``; None when unreadable (then the placement is predicted)."""
    try:
        out = tuple(int(p) for p in value.split(",") if p.strip())
    except ValueError:
        return None
    return out if out and all(g >= 0 for g in out) else None


def format_gpu_annotation(gpus: Iterable[int]) -> str:
    return ",".join(str(g) for g in sorted(gpus))
