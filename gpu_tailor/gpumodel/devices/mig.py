"""MIG instances, as NVIDIA's device plugin sells them.

mig-manager cuts each GPU into a fixed layout (the node's ``nvidia.com/mig.config``) before the device
plugin starts; pods never change it. Under the *mixed* strategy the device plugin then advertises one
resource per profile (``nvidia.com/mig-1g.5gb: 16``), under the *single* strategy every GPU is cut the
same way and the instances are ``nvidia.com/gpu``. So an instance of profile P is free iff fewer than
allocatable(P) are used: the fit is that count, and N units are N instances, from any GPUs.

Which GPU an instance sits on matters only for the per-GPU picture (what the fleet and the
``gpu-tailor.io/gpus`` annotation show). Where mig-manager applied one layout to every GPU (its
``all-*`` configs), the node's counts give each GPU's instances and each instance is placed on the
first GPU with one of its profile free. Otherwise the layout cannot be inferred: instances are counted
only, and the placement says so.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from gpu_tailor.gpumodel import labels, mig
from gpu_tailor.gpumodel.ask import Isolation
from gpu_tailor.gpumodel.devices.base import (
    BackingKind,
    DeclaredSpec,
    Device,
    Fit,
    Health,
    HealthState,
    NodeFacts,
    Offering,
    PodWrite,
    Reading,
    Requirement,
    Sharing,
)
from gpu_tailor.gpumodel.devices.whole import whole_offering
from gpu_tailor.gpumodel.occupancy import FULL, NodeGpus, Placement
from gpu_tailor.gpumodel.products import Product
from gpu_tailor.gpumodel.quantity import MIB
from gpu_tailor.gpumodel.resources import WHOLE_GPU, ResourceKind, mig_resource, parse_resource

NOT_INFERRED = "MIG layout not inferred from the node's counts: instances counted, not placed on GPUs"
GIB = 1024 * MIB


def profile_fraction(profile: mig.MigProfile) -> Fraction:
    return Fraction(profile.compute_slices, profile.total_compute_slices)


class MigInstances(Device):
    name = "mig"

    # --- reading a node ----------------------------------------------------------------------------
    def read(self, node: NodeFacts) -> Reading | None:
        product = node.product
        if product is not None and product.mig_invalid:
            # GFD's single strategy found GPUs cut differently: the devices it would sell are unusable.
            gpus = node.label_count or 0
            return Reading((), gpus, node.label_memory, None, 0, mig_strategy="single", health=Health(
                HealthState.INVALID_MIG, gpus, f"MIG configuration invalid ({product.raw}): the GPUs carry "
                "different MIG layouts under the single strategy"))
        if product is not None and product.mig_profile is not None:
            return self._single(node, product, product.mig_profile)
        if node.mig_strategy == "mixed" and any((r := parse_resource(k)) is not None and r.is_mig for k in node.alloc):
            return self._mixed(node)
        return None

    def _single(self, node: NodeFacts, product: Product, name: str) -> Reading:
        """Every device is one instance of the same profile, sold as nvidia.com/gpu; gpu.count and
        gpu.memory describe the instances, not the boards (mig-manager's all-<profile> configs)."""
        sku = mig.sku_for_product(product.base) if product.base else None
        profile = mig.profile_for(product.base, name)
        per_gpu = profile.max_instances if profile else 1
        if profile is not None and node.label_memory and node.label_memory != profile.memory_mib:
            profile = replace(profile, memory_mib=node.label_memory)
        whole = node.alloc.get(str(WHOLE_GPU), 0)
        devices = node.label_count if node.label_count is not None else whole
        offerings = (Offering(
            BackingKind.MIG, WHOLE_GPU, whole, per_gpu,
            profile_fraction(profile) if profile else Fraction(1, per_gpu),
            node.label_memory or (profile.memory_mib if profile else 0), mig_profile=profile),) if whole else ()
        return Reading(offerings, -(-devices // per_gpu), sku.memory_mib if sku else node.label_memory * per_gpu,
                       devices, whole, per_gpu, "single")

    def _mixed(self, node: NodeFacts) -> Reading:
        """One offering per profile the device plugin advertises, and GPUs left with MIG disabled sold whole."""
        product = node.product.base if node.product else ""
        sku = mig.sku_for_product(product) if product else None
        cut: list[tuple[str, bool, int, int, mig.MigProfile]] = []  # profile, renamed .shared, count, replicas
        expected = 0
        for key, count in sorted(node.alloc.items()):
            res = parse_resource(key)
            if res is None or res.kind is not ResourceKind.MIG or res.mig_profile is None:
                continue
            name = res.mig_profile
            prefix = f"{labels.MIG_LABEL_PREFIX}{name}"
            labelled = node.int_label(f"{prefix}.count")
            replicas = node.int_label(f"{prefix}.replicas") or 1
            table = mig.profile_for(product, name)
            memory = node.int_label(f"{prefix}.memory") or (table.memory_mib if table else 0)
            if table is None:
                parsed = mig.parse_profile_name(name)
                g = parsed.compute_slices if parsed else 1
                table = mig.MigProfile(name, g, 7, memory, max(1, 7 // g), (), 1)
            elif memory != table.memory_mib:
                table = replace(table, memory_mib=memory)
            expected += (labelled if labelled is not None else count // max(1, replicas)) * replicas
            cut.append((name, res.shared, count, replicas, table))
        whole = node.alloc.get(str(WHOLE_GPU), 0)
        layout = None
        if sku is not None and not whole and node.labels.get(labels.MIG_CONFIG, "").startswith("all-"):
            layout = mig.uniform_layout(sku, {n: c // r for n, _, c, r, _ in cut}, node.label_count or 0)
        offerings: list[Offering] = []
        for name, shared, count, replicas, table in cut:
            # A shared MIG device is time-sliced unless the node says MPS.
            sharing = (node.sharing if node.sharing is not Sharing.NONE else Sharing.TIME_SLICING) \
                if replicas > 1 else Sharing.NONE
            offerings.append(Offering(
                BackingKind.MIG, mig_resource(name, shared=shared), count,
                layout[name] * replicas if layout else 0, profile_fraction(table) / replicas,
                table.memory_mib // replicas if replicas > 1 else table.memory_mib, sharing, replicas, table))
        available = sum(o.allocatable for o in offerings)
        if whole:  # GPUs left with MIG disabled are still sold whole under the mixed strategy
            offerings.append(whole_offering(whole, node.label_memory))
        # no single per-GPU unit: health compares instance counts
        return Reading(tuple(offerings), node.label_count or 0, node.label_memory, expected, available, 0, "mixed")

    def selects(self, offering: Offering, mig_strategy: str) -> tuple[Requirement, ...]:
        return ((labels.MIG_STRATEGY, "In", (mig_strategy,)),)

    # --- offering it to the webhook ----------------------------------------------------------------
    def isolations(self, offering: Offering) -> frozenset[Isolation]:
        if offering.sharing is Sharing.NONE:
            return frozenset({Isolation.MIG})
        return frozenset({Isolation(offering.sharing.value)})  # replicas of an instance isolate no more

    def nominal_memory_bytes(self, offering: Offering) -> int:
        """Profile names are GiB classes (``1g.10gb`` serves a ``10Gi`` ask although the driver reports
        9.75 GiB): users size by the name, so the name counts."""
        parsed = mig.parse_profile_name(offering.mig_profile.name) if offering.mig_profile else None
        exact = offering.memory_mib * MIB
        return max(exact, parsed.memory_gb * GIB) if parsed is not None else exact

    def declared(self, spec: DeclaredSpec) -> tuple[Offering, PodWrite]:
        profile = mig.profile_for(spec.product, spec.mig_profile or "")
        assert profile is not None  # declared_problem said so
        resource = WHOLE_GPU if spec.mig_strategy == "single" else mig_resource(profile.name)
        offering = Offering(BackingKind.MIG, resource, spec.gpus_per_node * profile.max_instances,
                            profile.max_instances, profile_fraction(profile), profile.memory_mib, mig_profile=profile)
        selector = tuple((k, "In", (v,)) for k, v in spec.node_selector)
        return offering, PodWrite(str(resource), offering.label,
                                  selector or ((labels.MIG_STRATEGY, "In", (spec.mig_strategy,)),))

    def declared_problem(self, spec: DeclaredSpec) -> str | None:
        if not spec.mig_profile:
            return "backing mig needs migProfile (e.g. 1g.10gb)"
        if mig.profile_for(spec.product, spec.mig_profile) is None:
            sku = mig.sku_for_product(spec.product)
            known = ", ".join(p.name for p in sku.profiles) if sku else "none: not a MIG-capable product"
            hint = ""
            if "+me" in spec.mig_profile:
                # '+' is not allowed in a resource name: the device plugin sells +me instances as the plain profile
                plain = f"{labels.MIG_LABEL_PREFIX}{spec.mig_profile.replace('+me', '')}"
                hint = f"; +me instances are sold as {plain}, so declare that profile"
            return f"unknown MIG profile {spec.mig_profile!r} for {spec.product} (known: {known}){hint}"
        if spec.replicas is not None:
            return "replicas is only for time-slicing or mps, not mig"
        return None

    # --- counting and placing ----------------------------------------------------------------------
    def fit(self, offering: Offering, gpus: NodeGpus, used: int, units: int, nvlink: bool = False,
            place: bool = True) -> Fit:
        refused = self.count_refusal(offering, used, units)
        if refused is not None:
            return refused
        return Fit(True, placement=self.place(offering, gpus, units) if place else None)

    def place(self, offering: Offering, gpus: NodeGpus, units: int) -> Placement:
        """Each instance on the first GPU whose layout still has one of its profile free."""
        name = offering.mig_profile.name if offering.mig_profile is not None else ""
        chosen: list[int] = []
        if offering.per_gpu and name:
            for slot in gpus.usable_slots():
                room = offering.per_gpu - slot.mig.count(name)
                chosen += [slot.index] * max(0, min(room, units - len(chosen)))
        unplaced = units - len(chosen)
        note = ""
        if unplaced:  # the count is the truth; the per-GPU picture is ours
            note = NOT_INFERRED if not offering.per_gpu else (
                f"{unplaced} of {units} instances counted but not placed: the GPUs show no free {name} instance")
        return self._placement(offering, tuple(chosen), unplaced, note)

    def recorded(self, offering: Offering, gpus: NodeGpus, used: int, units: int,
                 annotation: tuple[int, ...] | None) -> Placement:
        if annotation is not None:  # one GPU per instance; fewer recorded (one for several) are repeated
            return self._placement(offering, tuple(annotation[i % len(annotation)] for i in range(units)))
        return self.place(offering, gpus, units)

    @staticmethod
    def _placement(offering: Offering, where: tuple[int, ...], unplaced: int = 0, note: str = "") -> Placement:
        return Placement(where, int(offering.fraction * FULL), offering.memory_mib, whole=False,
                         mig_profile=offering.mig_profile.name if offering.mig_profile else None,
                         unplaced=unplaced, note=note)

    def fleet_share(self, offering: Offering, units: int, nvlink: bool) -> tuple[int, int, bool]:
        milli = max(1, int(offering.fraction * FULL))
        # the instances on the first GPU they take: as many as the layout has of the profile there
        return 1, min(FULL, milli * min(units, max(1, offering.per_gpu))), False
