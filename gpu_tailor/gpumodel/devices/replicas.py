"""Replicas of a shared GPU, what time-slicing and MPS have in common.

The device plugin's sharing config advertises each GPU ``replicas`` times, as ``nvidia.com/gpu`` or
(``renameByDefault``) ``nvidia.com/gpu.shared``; one replica is 1/replicas of a GPU. Kubernetes counts
the replicas per node and the device plugin hands a container any free ones, from one GPU or several,
so the count decides and each replica is then placed on a GPU as the plugin's allocation policy picks
it (``occupancy.ReplicaPolicy``: by default a GPU with the fewest replicas allocated). The simulator's
fleet models the same share of one GPU, on the GPU the plugin would pick (``Fleet.pick``).
``timeslicing`` and ``mps`` differ only in what they promise and what the plugin refuses.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import ClassVar

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
from gpu_tailor.gpumodel.resources import SHARED_GPU, WHOLE_GPU, NvidiaResource


def replica_placement(offering: Offering, gpus: tuple[int, ...], maybe: tuple[int, ...] = ()) -> Placement:
    """Replicas of ``offering``, one per entry of ``gpus`` (a GPU repeats when several sit on it);
    ``maybe``: the GPUs the device plugin may pick instead (``NodeGpus.predict_replicas``)."""
    return Placement(gpus, int(offering.fraction * FULL), offering.memory_mib, whole=False, replicas=1, maybe=maybe)


class Replicas(Device):
    sharing: ClassVar[Sharing]

    def read(self, node: NodeFacts) -> Reading | None:
        shared = node.alloc.get(str(SHARED_GPU), 0)
        if node.sharing is not self.sharing or not (node.replicas > 1 or shared):
            return None
        count = shared or node.alloc.get(str(WHOLE_GPU), 0)
        offerings = (self.offering(SHARED_GPU if shared else WHOLE_GPU, count, node.replicas,
                                   node.label_memory),) if count else ()
        expected = node.label_count * node.replicas if node.label_count is not None else None
        return Reading(offerings, node.label_count or 0, node.label_memory, expected, count, node.replicas)

    def offering(self, resource: NvidiaResource, allocatable: int, replicas: int, gpu_memory_mib: int) -> Offering:
        return Offering(BackingKind.SHARED, resource, allocatable, replicas, Fraction(1, replicas),
                        gpu_memory_mib // replicas, self.sharing, replicas)

    def selects(self, offering: Offering, mig_strategy: str) -> tuple[Requirement, ...]:
        return ((labels.GPU_SHARING_STRATEGY, "In", (offering.sharing.value,)),
                (labels.GPU_REPLICAS, "In", (str(offering.replicas),)))

    def isolations(self, offering: Offering) -> frozenset[Isolation]:
        return frozenset({Isolation(self.sharing.value)})

    def declared(self, spec: DeclaredSpec) -> tuple[Offering, PodWrite]:
        replicas = spec.replicas or 2
        offering = self.offering(SHARED_GPU if spec.renamed else WHOLE_GPU, spec.gpus_per_node * replicas, replicas,
                                 spec.gpu_memory_mib)
        selector = tuple((k, "In", (v,)) for k, v in spec.node_selector)
        return offering, PodWrite(str(offering.resource), offering.label,
                                  selector or self.selects(offering, "none"))

    def declared_problem(self, spec: DeclaredSpec) -> str | None:
        if spec.mig_profile:
            return f"migProfile is only for backing mig, not {self.name}"
        if spec.replicas is None:
            return f"backing {self.name} needs replicas (>= 2)"
        return None

    def fit(self, offering: Offering, gpus: NodeGpus, used: int, units: int, nvlink: bool = False,
            place: bool = True) -> Fit:
        refused = self.count_refusal(offering, used, units)
        if refused is not None:
            return refused
        where, maybe = gpus.predict_replicas(units, int(offering.fraction * FULL))
        if len(where) < units:  # the count allows it, the per-GPU picture does not
            if units == 1:
                return Fit(False, f"{offering.label}: no GPU has room for another replica")
            return Fit(False, f"{offering.label}: the GPUs have room for {len(where)} more replicas, {units} asked")
        placement = replica_placement(offering, where, maybe)
        return Fit(True, placement=placement if gpus.per_gpu_known else replace(placement, maybe=(), counted=True))

    def recorded(self, offering: Offering, gpus: NodeGpus, used: int, units: int,
                 annotation: tuple[int, ...] | None) -> Placement:
        if annotation is not None:  # one GPU per unit; fewer recorded (one for several units) are repeated
            return replace(replica_placement(offering, tuple(annotation[i % len(annotation)] for i in range(units))),
                           read_back=True)
        predicted = self.fit(offering, gpus, used, units).placement
        if predicted is not None:
            return predicted
        # over-committed as far as we can tell (e.g. bound before we knew): still count it, on GPU 0
        return replica_placement(offering, (0,) * units)

    def fleet_share(self, offering: Offering, units: int, nvlink: bool) -> tuple[int, int, bool]:
        milli = max(1, int(offering.fraction * FULL))
        # each replica goes where one would (``fit``): they stack on one GPU while it has room
        return 1, (min(FULL, milli * units) if units > 1 else milli), False
