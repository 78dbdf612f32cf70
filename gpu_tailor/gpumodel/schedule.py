"""The extender's decisions for one pod against one node's snapshot: does it fit, why not, where.

Pure functions over ``NodeState`` (inventory + per-GPU occupancy + CPU/memory requested by bound
pods). Scoring across nodes is ``packing``'s job; this module turns a pod into a ``Demand`` and a
node into fleet numbers that ``packing`` understands.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.ask import PodAsk, Topology, from_pod
from gpu_tailor.gpumodel.fleet import Shape
from gpu_tailor.gpumodel.inventory import BackingKind, HealthState, NodeInventory, Offering, UnitsRefusal, units_refusal
from gpu_tailor.gpumodel.mig import sku_for_product
from gpu_tailor.gpumodel.occupancy import FULL, NodeGpus, Placement, parse_gpu_annotation
from gpu_tailor.gpumodel.quantity import parse_quantity
from gpu_tailor.gpumodel.topology import infer


@dataclass(frozen=True, slots=True)
class Demand:
    """What a pod needs from a node, in the native resources it asks for."""

    key: str  # namespace/name
    resource: str = ""  # the one NVIDIA resource it asks for ("" = none)
    units: int = 0
    per_container: int = 0  # the most units one container asks for (the device plugin allocates per container)
    cpu_milli: int = 0
    memory_mib: int = 0
    products: tuple[str, ...] = ()
    nvlink: bool = False
    error: str = ""

    @property
    def gpu(self) -> bool:
        return bool(self.resource)


def pod_key(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _requests(pod: dict[str, Any], name: str) -> Fraction:
    """Effective pod request of cpu/memory: max(sum of app containers, each init container)."""
    spec = pod.get("spec") or {}

    def one(c: dict[str, Any]) -> Fraction:
        raw = ((c.get("resources") or {}).get("requests") or {}).get(name)
        try:
            return parse_quantity(str(raw)) if raw is not None else Fraction(0)
        except ValueError:
            return Fraction(0)

    apps: Fraction = sum((one(c) for c in spec.get("containers") or [] if isinstance(c, dict)), Fraction(0))
    inits = [one(c) for c in spec.get("initContainers") or [] if isinstance(c, dict)]
    return max([apps, *inits])


def demand_of(pod: dict[str, Any], ask: PodAsk | None = None) -> Demand:
    ask = ask or from_pod(pod)
    key = pod_key(pod)
    cpu = int(_requests(pod, "cpu") * 1000)
    mem = int(_requests(pod, "memory")) // 2**20
    native = {k: v for k, v in ask.effective_native.items() if v > 0}
    common = {"cpu_milli": cpu, "memory_mib": mem, "products": ask.products, "nvlink": ask.topology is Topology.NVLINK}
    if len(native) > 1:
        return Demand(key, error=f"asks for several NVIDIA resources at once ({', '.join(sorted(native))})",
                      **common)  # type: ignore[arg-type]
    if not native:
        return Demand(key, **common)  # type: ignore[arg-type]
    (resource, units), = native.items()
    return Demand(key, resource, units, ask.most_in_one_container(resource), **common)  # type: ignore[arg-type]


@dataclass
class NodeState:
    """One node as the extender sees it: inventory, GPU occupancy, and requested CPU/memory."""

    inventory: NodeInventory
    gpus: NodeGpus
    cpu_used: int = 0
    mem_used_mib: int = 0
    units_used: dict[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.inventory.name


def node_state(inv: NodeInventory) -> NodeState:
    topo = infer(inv.model, inv.product.raw if inv.product else "", inv.gpu_count, inv.labels)
    has_mig = any(o.mig_profile is not None for o in inv.offerings)
    sku = sku_for_product(inv.product.raw) if has_mig and inv.product else None
    gpus = NodeGpus(inv.gpu_count, inv.gpu_memory_mib, topo, usable=inv.usable_gpus, mig_sku=sku)
    return NodeState(inv, gpus)


def shape_of(demand: Demand, offering: Offering | None) -> Shape:
    """The pod as ``packing`` sees it: whole GPUs, or one GPU's share for replicas and MIG slices."""
    if not demand.gpu or offering is None:
        return Shape(demand.cpu_milli, demand.memory_mib)
    if offering.backing is BackingKind.WHOLE:
        return Shape(demand.cpu_milli, demand.memory_mib, demand.units, FULL, nvlink=demand.nvlink)
    milli = max(1, int(offering.fraction * FULL))
    if demand.units > 1:  # each unit goes where one would (``fit``): they stack on one GPU while it has room
        milli = min(FULL, milli * demand.units)
    return Shape(demand.cpu_milli, demand.memory_mib, 1, milli)


@dataclass(frozen=True, slots=True)
class Fit:
    ok: bool
    reason: str = ""
    unresolvable: bool = False  # preemption cannot help
    placement: Placement | None = None


def inventory_verdict(inv: NodeInventory, demand: Demand) -> Fit | Offering:
    """The part of ``fit`` that depends on the node's inventory only, not on what runs there.

    A ``Fit`` when that settles it (a GPU ask on a node without that resource, a product not wanted,
    an ask larger than the node sells ...); otherwise the offering the ask would be served from. Nodes
    with the same health, product and offerings get the same answer (the extender keeps it per kind).
    """
    if demand.error:
        return Fit(False, demand.error, unresolvable=True)
    if not demand.gpu:
        return Fit(True)
    state = inv.health.state
    if state is HealthState.NO_GPU:
        return Fit(False, "node has no NVIDIA GPUs", unresolvable=True)
    if state is HealthState.INITIALIZING:
        return Fit(False, inv.health.reason or "GPU stack initializing", unresolvable=True)
    if state is HealthState.INVALID_MIG:
        return Fit(False, inv.health.reason or "invalid MIG configuration", unresolvable=True)
    if demand.products and not (inv.product and any(inv.product.matches(p) for p in demand.products)):
        have = inv.product.raw if inv.product else "unknown product"
        return Fit(False, f"GPU product {have} is not one of {'|'.join(demand.products)}", unresolvable=True)
    offering = inv.offering(demand.resource)
    if offering is None or (offering.allocatable == 0 and state is not HealthState.DEGRADED):
        offers = ", ".join(f"{o.resource}" for o in inv.offerings if o.allocatable) or "nothing"
        return Fit(False, f"no {demand.resource} on this node (it offers {offers})", unresolvable=True)
    if demand.units > offering.allocatable:
        why = f"{demand.units} x {demand.resource} asked, {offering.allocatable} allocatable"
        if state is HealthState.DEGRADED:
            why = f"{inv.health.reason}; {why}"
        return Fit(False, why, unresolvable=True)
    label, n = offering.label, demand.per_container
    refusal = units_refusal(demand.resource, n, offering.backing, offering.sharing)
    if refusal is UnitsRefusal.AMBIGUOUS:
        return Fit(False, f"node sells {demand.resource} as {label}: {n} units would be {n} slices or replicas, "
                   f"not {n} GPUs", unresolvable=True)
    if refusal is UnitsRefusal.ONE_PER_CONTAINER:
        return Fit(False, f"node sells {demand.resource} as {label}: the device plugin fails a container's "
                   "request for more than one replica", unresolvable=True)
    return offering


def fit(node: NodeState, demand: Demand, place: bool = True, settled: Fit | Offering | None = None) -> Fit:
    """Whether ``demand`` fits ``node`` now; the GPUs it would get; or a reason for people.

    ``place=False`` answers only whether (and why not): whole GPUs are then not chosen (``placement``
    is None), which saves the device plugin's set search on every candidate of a filter call.
    ``settled`` is ``inventory_verdict(node.inventory, demand)`` when the caller has it already.
    """
    verdict = inventory_verdict(node.inventory, demand) if settled is None else settled
    if isinstance(verdict, Fit):
        return verdict
    offering = verdict
    gpus = node.gpus
    if offering.backing is BackingKind.WHOLE:
        free = gpus.free_whole()
        if len(free) < demand.units:
            return Fit(False, f"{demand.units} whole GPUs asked, {len(free)} of {gpus.usable} free")
        if demand.nvlink and demand.units > 1:
            best = gpus.topology.best_set(free, demand.units)
            if best is None or not gpus.topology.all_nvlinked(best):
                largest = gpus.topology.largest_nvlink_set(free)
                if largest < demand.units and gpus.topology.largest_nvlink_set(list(range(gpus.usable))) < demand.units:
                    return Fit(False, f"no NVLink-connected set of {demand.units} GPUs on this node",
                               unresolvable=True)
                return Fit(False, f"no NVLink-connected set of {demand.units} free GPUs (largest: {largest})")
            chosen = best
        elif not place:
            return Fit(True)
        else:
            chosen = gpus.predict_whole(demand.units) or tuple(free[: demand.units])
        return Fit(True, placement=Placement(chosen))
    # Replicas and MIG instances: Kubernetes counts the units per node, and the device plugin hands out
    # any free ones, from one GPU or several. So the count decides, and each unit is then placed on a
    # GPU the way a one-unit pod would be (one model for one unit and for many).
    label = offering.label
    used = node.units_used.get(demand.resource, 0)
    left = offering.allocatable - used
    if left < demand.units:
        return Fit(False, f"{label}: {max(0, left)} of {offering.allocatable} free")
    profile = offering.mig_profile if offering.backing is BackingKind.MIG else None
    milli = int(offering.fraction * FULL)
    where = gpus.predict_units(demand.units, milli, mig_profile=profile)
    if len(where) < demand.units:  # the count allows it, the per-GPU picture does not
        what = f"{profile.name} instance" if profile is not None else "replica"
        if demand.units == 1:
            return Fit(False, f"{label}: no GPU has room for another {what}")
        return Fit(False, f"{label}: the GPUs have room for {len(where)} more {what}s, {demand.units} asked")
    return Fit(True, placement=unit_placement(offering, where))


def unit_placement(offering: Offering, gpus: tuple[int, ...]) -> Placement:
    """Replicas or MIG instances of ``offering``, one per entry of ``gpus`` (a GPU may repeat)."""
    profile = offering.mig_profile if offering.backing is BackingKind.MIG else None
    return Placement(gpus, int(offering.fraction * FULL), offering.memory_mib, whole=False,
                     mig_profile=profile.name if profile is not None else None, replicas=0 if profile else 1)


def recorded_placement(pod: dict[str, Any], node: NodeState, demand: Demand) -> Placement | None:
    """Where a bound pod sits: its ``gpu-tailor.io/gpus`` annotation if readable, else predicted."""
    if not demand.gpu:
        return None
    offering = node.inventory.offering(demand.resource)
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    recorded = parse_gpu_annotation(str(annotations.get(labels.ANN_GPUS, "")))
    if offering is None or offering.backing is BackingKind.WHOLE:
        if recorded is not None and len(recorded) == demand.units:
            return Placement(recorded)
        free = node.gpus.free_whole()
        return Placement(node.gpus.predict_whole(demand.units) or tuple(free[: demand.units]))
    # one GPU per unit; an annotation with fewer (one written for several units, say) is repeated
    if recorded is not None:
        return unit_placement(offering, tuple(recorded[i % len(recorded)] for i in range(demand.units)))
    predicted = fit(node, demand).placement
    if predicted is not None:
        return predicted
    # over-committed as far as we can tell (e.g. bound before we knew): still count it, on GPU 0
    return unit_placement(offering, (0,) * demand.units)

