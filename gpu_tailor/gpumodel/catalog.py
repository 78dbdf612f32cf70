"""What the cluster offers, grouped, and which offering best meets a portable GPU ask.

Nodes that sell the same thing the same way (same resource name, backing, product) form one
``Candidate``; a candidate also carries the node-affinity terms that select exactly those nodes, so
the pod the webhook rewrites can only land where its new resource means what the user asked for.
Offerings declared in the webhook's config (node pools scaled to zero) become candidates with no
nodes and no free capacity: they can be chosen, never preferred over capacity that is free now.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from fractions import Fraction

from gpu_tailor.gpumodel import devices, labels
from gpu_tailor.gpumodel.ask import ContainerAsk, Isolation, PodAsk
from gpu_tailor.gpumodel.devices.base import DeclaredSpec, Device, PodWrite, Requirement
from gpu_tailor.gpumodel.inventory import BackingKind, HealthState, NodeInventory, Offering, Sharing
from gpu_tailor.gpumodel.products import normalise
from gpu_tailor.gpumodel.quantity import MIB, format_bytes

__all__ = ["Candidate", "NoFit", "OfferingChoice", "Requirement", "choose", "declared_candidate", "free_somewhere",
           "from_inventories"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """Nodes selling one offering the same way; what choosing it writes on a pod."""

    offering: Offering  # as one node sells it; ``allocatable``: the most one node of the group sells
    write: PodWrite  # resource, backing annotation, node affinity and tolerations
    product: str  # product label value(s) these nodes carry (raw)
    model: str
    fail_requests_gt_one: bool = False
    free_units: int = 0  # free now across the group (0 for declared offerings)
    most_free: int = 0  # free now on the node of the group with the most free
    nodes: tuple[str, ...] = ()
    declared: bool = False

    @property
    def device(self) -> Device:
        return devices.device_for(self.offering)

    @property
    def backing(self) -> str:  # "whole", "mig-1g.10gb", "shared:time-slicing:4"
        return self.write.backing

    @property
    def resource(self) -> str:  # what the pod will request
        return self.write.resource

    @property
    def affinity(self) -> tuple[Requirement, ...]:
        return self.write.affinity

    @property
    def kind(self) -> BackingKind:
        return self.offering.backing

    @property
    def sharing(self) -> Sharing:
        return self.offering.sharing

    @property
    def fraction(self) -> Fraction:  # of one GPU per unit
        return self.offering.fraction

    @property
    def memory_mib(self) -> int:  # per unit (for whole GPUs: the GPU's memory)
        return self.offering.memory_mib

    @property
    def max_units_per_node(self) -> int:
        return self.offering.allocatable

    def describe(self) -> str:
        mem = format_bytes(self.memory_mib * MIB) if self.memory_mib else "?"
        where = self.product or "unknown product"
        return f"{self.backing} ({mem}) on {where}"


@dataclass(frozen=True, slots=True)
class OfferingChoice:
    candidate: Candidate
    units: dict[str, int] = field(default_factory=dict)  # container key -> units of candidate.resource
    free_now: bool = True  # some node of the candidate has the units free now
    consumed: Fraction = Fraction(0)  # share of a GPU the pod takes
    spare: int = 0  # memory it holds beyond its ask, bytes


@dataclass(frozen=True, slots=True)
class NoFit:
    message: str


def from_inventories(inventories: Iterable[NodeInventory], used: dict[str, dict[str, int]] | None = None) -> list[
        Candidate]:
    """Group every healthy or degraded node's offerings; ``used`` gives units in use per node."""
    groups: dict[tuple[PodWrite, str], Candidate] = {}
    for inv in inventories:
        if inv.health.state not in (HealthState.HEALTHY, HealthState.DEGRADED) or inv.unschedulable:
            continue
        product = inv.product.raw if inv.product else ""
        for o in inv.offerings:
            write = devices.device_for(o).pod_write(o, inv.labels.get(labels.GPU_PRODUCT, ""), inv.mig_strategy)
            in_use = (used or {}).get(inv.name, {}).get(str(o.resource), 0)
            free = max(0, o.allocatable - in_use)
            prev = groups.get((write, product))
            if prev is None:
                groups[(write, product)] = Candidate(o, write, product, inv.model, free_units=free, most_free=free,
                                                     nodes=(inv.name,))
            else:
                biggest = replace(prev.offering, allocatable=max(prev.offering.allocatable, o.allocatable))
                groups[(write, product)] = replace(prev, offering=biggest, free_units=prev.free_units + free,
                                                   most_free=max(prev.most_free, free), nodes=(*prev.nodes, inv.name))
    return list(groups.values())


def free_somewhere(resource: str, units: int, per_container: int, candidates: list[Candidate]) -> bool | None:
    """Whether some node selling ``resource`` in a way that runs ``per_container`` units in one container has
    ``units`` free now; None when no candidate sells it so."""
    offers = [c for c in candidates if c.resource == resource
              and c.device.units_refusal(resource, per_container, c.sharing, c.fail_requests_gt_one) is None]
    return any(c.most_free >= units for c in offers) if offers else None


def declared_candidate(spec: DeclaredSpec) -> Candidate:
    """A declared offering (a node pool scaled to zero): no nodes, nothing free, the most units a node sells."""
    offering, write = devices.DEVICES[spec.backing].declared(spec)
    return Candidate(offering, write, spec.product, normalise(spec.product).model,
                     fail_requests_gt_one=spec.fail_requests_gt_one, declared=True)


def _product_ok(products: tuple[str, ...], c: Candidate) -> bool:
    if not products:
        return True
    wanted = {p.upper() for p in products}
    base = c.product.upper().removesuffix("-SHARED").split("-MIG-")[0]
    return bool(wanted & {c.model.upper(), base, c.product.upper()})


def choose(ask: PodAsk, candidates: list[Candidate], isolation: Isolation) -> OfferingChoice | NoFit:
    """The candidate that meets every virtual container of ``ask`` with the least GPU consumed.

    Preference: free capacity now, then the smallest share of a GPU taken, then the least spare
    memory, then the name (stable answers). A pod's containers share one node, so one candidate
    must serve all of them, and that node must also offer the pod's native resources.
    """
    containers = [c for c in ask.gpu_containers if c.virtual]
    native_needed = {k: v for k, v in ask.effective_native.items() if v}
    options: list[tuple[tuple[int, Fraction, int, str, str], OfferingChoice]] = []
    for cand in candidates:
        if not _product_ok(ask.products, cand) or not cand.device.serves(isolation, cand.offering):
            continue
        units: dict[str, int] = {}
        for container in containers:
            n = cand.device.units_for(container, cand.offering)
            if n is None:
                break
            units[_key(container)] = n
        else:
            total = _pod_units(ask, units)
            if total > cand.max_units_per_node:
                continue
            if native_needed and not _offers_native(cand, native_needed, candidates):
                continue
            consumed = cand.fraction * total
            spare = cand.memory_mib * MIB * total - ask.effective_memory_bytes
            busy = 0 if cand.most_free >= total else 1
            options.append(((busy, consumed, spare, cand.backing, cand.resource),
                            OfferingChoice(cand, units, free_now=not busy, consumed=consumed, spare=spare)))
    if options:
        return min(options, key=lambda o: o[0])[1]
    return NoFit(_explain(ask, candidates, isolation))


def _key(container: ContainerAsk) -> str:
    return ("init:" if container.init else "") + container.name


def _pod_units(ask: PodAsk, units: dict[str, int]) -> int:
    """Units the pod needs at once: app containers add up, init containers run one at a time."""
    app = sum(n for k, n in units.items() if not k.startswith("init:"))
    init = max((n for k, n in units.items() if k.startswith("init:")), default=0)
    return max(app, init)


def _offers_native(cand: Candidate, native: dict[str, int], candidates: list[Candidate]) -> bool:
    nodes = set(cand.nodes)
    if not nodes:
        return False
    for resource, count in native.items():
        if resource == cand.resource:
            continue
        if not any(o.resource == resource and nodes & set(o.nodes) and o.max_units_per_node >= count
                   for o in candidates):
            return False
    return True


def _explain(ask: PodAsk, candidates: list[Candidate], isolation: Isolation) -> str:
    if not candidates:
        return "the cluster offers no GPUs (no GPU nodes are ready and no offerings are declared)"
    needs: list[str] = []
    if ask.effective_milli:
        needs.append(f"{ask.effective_milli // 1000} whole GPUs" if ask.effective_milli >= 1000 and
                     ask.effective_milli % 1000 == 0 else f"{ask.effective_milli} milli-GPU")
    if ask.effective_memory_bytes:
        needs.append(f"{format_bytes(ask.effective_memory_bytes)} of GPU memory")
    constraint = []
    if isolation is not Isolation.ANY:
        constraint.append(f"isolation {isolation.value}")
    if ask.products:
        constraint.append(f"product {'|'.join(ask.products)}")
    pool = [c for c in candidates if _product_ok(ask.products, c) and c.device.serves(isolation, c.offering)]
    head = f"needs {' and '.join(needs) or 'a GPU'}" + (f" with {', '.join(constraint)}" if constraint else "")
    if not pool:
        offered = sorted({f"{c.backing} on {c.product or '?'}" for c in candidates})
        return f"{head}; no offering matches (the cluster offers: {', '.join(offered)})"
    if ask.effective_memory_bytes:
        biggest = max(pool, key=lambda c: (c.device.nominal_memory_bytes(c.offering), c.fraction))
        return f"{head}; largest offering is {biggest.describe()}"
    biggest = max(pool, key=lambda c: (c.fraction * max(1, c.max_units_per_node if c.device.sells_whole_gpus
                                                         else 1), c.memory_mib))
    if biggest.device.sells_whole_gpus:
        return f"{head}; largest offering is {biggest.max_units_per_node} x {biggest.describe()} per node"
    return f"{head}; largest offering is {biggest.describe()}"
