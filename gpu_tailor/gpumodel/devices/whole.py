"""Whole GPUs: ``nvidia.com/gpu`` is physical GPUs, one unit each.

The fallback reading of any node that sells neither MIG instances nor replicas, and what MIG nodes sell
from GPUs left with MIG disabled. Which GPUs a pod gets is the device plugin's ``besteffort`` choice,
which prefers NVLink-connected sets (``occupancy.NodeGpus.predict_whole``). The simulator's fleet
models the same: a pod of N whole GPUs takes N idle GPUs of one node.
"""

from __future__ import annotations

from fractions import Fraction

from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.ask import Isolation
from gpu_tailor.gpumodel.devices.base import (
    BackingKind,
    DeclaredSpec,
    Device,
    Fit,
    NodeFacts,
    Offering,
    PodWrite,
    Reading,
    Requirement,
    Sharing,
)
from gpu_tailor.gpumodel.occupancy import FULL, NodeGpus, Placement
from gpu_tailor.gpumodel.resources import WHOLE_GPU


def whole_offering(allocatable: int, memory_mib: int) -> Offering:
    return Offering(BackingKind.WHOLE, WHOLE_GPU, allocatable, 1, Fraction(1), memory_mib)


class WholeGpus(Device):
    name = "whole"
    sells_whole_gpus = True

    def read(self, node: NodeFacts) -> Reading:
        whole = node.alloc.get(str(WHOLE_GPU), 0)
        offerings = (whole_offering(whole, node.label_memory),) if whole else ()
        gpus = node.label_count if node.label_count is not None else whole
        return Reading(offerings, gpus, node.label_memory, node.label_count, whole)

    def selects(self, offering: Offering, mig_strategy: str) -> tuple[Requirement, ...]:
        # a node that time-slices or shares through MPS sells nvidia.com/gpu as replicas, not GPUs
        return ((labels.GPU_SHARING_STRATEGY, "NotIn", (Sharing.TIME_SLICING.value, Sharing.MPS.value)),)

    def isolations(self, offering: Offering) -> frozenset[Isolation]:
        return frozenset({Isolation.EXCLUSIVE})

    def declared(self, spec: DeclaredSpec) -> tuple[Offering, PodWrite]:
        offering = whole_offering(spec.gpus_per_node, spec.gpu_memory_mib)
        selector = tuple((k, "In", (v,)) for k, v in spec.node_selector)
        return offering, PodWrite(str(WHOLE_GPU), offering.label,
                                  selector or ((labels.GPU_PRODUCT, "In", (spec.product,)),))

    def fit(self, offering: Offering, gpus: NodeGpus, used: int, units: int, nvlink: bool = False,
            place: bool = True) -> Fit:
        # Idle GPUs decide, not the count: a GPU is whole only if nothing else sits on it.
        free = gpus.free_whole()
        if len(free) < units:
            return Fit(False, f"{units} whole GPUs asked, {len(free)} of {gpus.usable} free")
        if nvlink and units > 1 and not gpus.per_gpu_known:
            return Fit(False, f"{len(gpus.slots) - gpus.usable} GPUs are not sold and which ones is not known: no "
                       f"NVLink-connected set of {units} GPUs can be promised (a node agent's report would tell)")
        unsure = gpus.unsure() if nvlink and units > 1 else frozenset()
        if unsure & set(free) and not gpus.topology.alike(sorted(unsure | set(free))):
            # earlier picks among equals may have left other GPUs free than the picture shows, and here it matters
            surely = gpus.surely_free()
            if gpus.topology.largest_nvlink_set(surely) < units:
                return Fit(False, f"which of the {len(free)} free GPUs are free is not known (the device plugin picked "
                           f"among equals before): no NVLink-connected set of {units} can be promised (a node agent's "
                           "report would tell)")
        if nvlink and units > 1:
            found = gpus.predict_whole_among(units)
            best = found[0] if found is not None else None
            if best is None or not gpus.topology.all_nvlinked(best):
                largest = gpus.topology.largest_nvlink_set(free)
                if largest < units and gpus.topology.largest_nvlink_set([s.index for s in gpus.usable_slots()]) < units:
                    return Fit(False, f"no NVLink-connected set of {units} GPUs on this node", unresolvable=True)
                return Fit(False, f"no NVLink-connected set of {units} free GPUs (largest: {largest})")
            assert found is not None
            return Fit(True, placement=Placement(best, maybe=found[1]))
        if not place:
            return Fit(True)
        return Fit(True, placement=_predicted(gpus, units))

    def recorded(self, offering: Offering | None, gpus: NodeGpus, used: int, units: int,
                 annotation: tuple[int, ...] | None) -> Placement:
        if annotation is not None and len(annotation) == units:
            return Placement(annotation)
        return _predicted(gpus, units)

    def fleet_share(self, offering: Offering, units: int, nvlink: bool) -> tuple[int, int, bool]:
        return units, FULL, nvlink


def _predicted(gpus: NodeGpus, units: int) -> Placement:
    """What the device plugin would hand a pod of ``units`` whole GPUs: the set, where it may pick among several
    (``Placement.maybe``); bookkeeping only where which GPUs are sold is not known."""
    found = gpus.predict_whole_among(units)
    if not gpus.per_gpu_known:
        return Placement(found[0] if found is not None else tuple(gpus.free_whole()[:units]), counted=True)
    if found is None:
        return Placement(tuple(gpus.free_whole()[:units]))
    return Placement(found[0], maybe=found[1])
