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

from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.ask import ContainerAsk, Isolation, PodAsk
from gpu_tailor.gpumodel.inventory import BackingKind, HealthState, NodeInventory, Offering, Sharing
from gpu_tailor.gpumodel.quantity import MIB, format_bytes

# (label key, operator, values) -- a NodeSelectorRequirement
Requirement = tuple[str, str, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class Candidate:
    backing: str  # "whole", "mig-1g.10gb", "shared:time-slicing:4"
    kind: BackingKind
    resource: str  # what the pod will request
    product: str  # product label value(s) these nodes carry (raw)
    model: str
    fraction: Fraction  # of one GPU per unit
    memory_mib: int  # per unit (for whole GPUs: the GPU's memory)
    sharing: Sharing = Sharing.NONE
    fail_requests_gt_one: bool = False
    max_units_per_node: int = 0  # the most units one node of the group can sell
    free_units: int = 0  # free now across the group (0 for declared offerings)
    nodes: tuple[str, ...] = ()
    affinity: tuple[Requirement, ...] = ()
    declared: bool = False

    def describe(self) -> str:
        mem = format_bytes(self.memory_mib * MIB) if self.memory_mib else "?"
        where = self.product or "unknown product"
        return f"{self.backing} ({mem}) on {where}"


@dataclass(frozen=True, slots=True)
class OfferingChoice:
    candidate: Candidate
    units: dict[str, int] = field(default_factory=dict)  # container key -> units of candidate.resource


@dataclass(frozen=True, slots=True)
class NoFit:
    message: str


def _affinity(inv: NodeInventory, offering: Offering) -> tuple[Requirement, ...]:
    product = inv.labels.get(labels.GPU_PRODUCT, "")
    reqs: list[Requirement] = []
    if product:
        reqs.append((labels.GPU_PRODUCT, "In", (product,)))
    if offering.backing is BackingKind.WHOLE:
        reqs.append((labels.GPU_SHARING_STRATEGY, "NotIn", (Sharing.TIME_SLICING.value, Sharing.MPS.value)))
    elif offering.backing is BackingKind.MIG:
        reqs.append((labels.MIG_STRATEGY, "In", (inv.mig_strategy,)))
    else:
        reqs.append((labels.GPU_SHARING_STRATEGY, "In", (offering.sharing.value,)))
        reqs.append((labels.GPU_REPLICAS, "In", (str(offering.replicas),)))
    return tuple(reqs)


def from_inventories(inventories: Iterable[NodeInventory], used: dict[str, dict[str, int]] | None = None) -> list[
        Candidate]:
    """Group every healthy or degraded node's offerings; ``used`` gives units in use per node."""
    groups: dict[tuple[str, str, str, tuple[Requirement, ...]], Candidate] = {}
    for inv in inventories:
        if inv.health.state not in (HealthState.HEALTHY, HealthState.DEGRADED) or inv.unschedulable:
            continue
        for o in inv.offerings:
            aff = _affinity(inv, o)
            key = (o.label, str(o.resource), inv.product.raw if inv.product else "", aff)
            in_use = (used or {}).get(inv.name, {}).get(str(o.resource), 0)
            free = max(0, o.allocatable - in_use)
            prev = groups.get(key)
            if prev is None:
                groups[key] = Candidate(
                    backing=o.label, kind=o.backing, resource=str(o.resource),
                    product=inv.product.raw if inv.product else "", model=inv.model, fraction=o.fraction,
                    memory_mib=o.memory_mib, sharing=o.sharing, max_units_per_node=o.allocatable,
                    free_units=free, nodes=(inv.name,), affinity=aff)
            else:
                groups[key] = replace(prev, max_units_per_node=max(prev.max_units_per_node, o.allocatable),
                                      free_units=prev.free_units + free, nodes=(*prev.nodes, inv.name))
    return list(groups.values())


def _isolation_allows(isolation: Isolation, c: Candidate) -> bool:
    if isolation is Isolation.ANY:
        return True
    if isolation is Isolation.MIG:
        return c.kind is BackingKind.MIG and c.sharing is Sharing.NONE
    if isolation is Isolation.EXCLUSIVE:
        return c.kind is BackingKind.WHOLE
    want = Sharing.MPS if isolation is Isolation.MPS else Sharing.TIME_SLICING
    return c.sharing is want


def _units_for(container: ContainerAsk, c: Candidate) -> int | None:
    """Units of ``c`` that meet one container's virtual ask, or None when it cannot."""
    gpus = container.whole_gpus
    if gpus:
        # Several whole GPUs: only whole backings; memory is per GPU.
        if c.kind is not BackingKind.WHOLE or container.memory_bytes > c.memory_mib * MIB:
            return None
        return gpus
    share = Fraction(container.milli, 1000)
    if c.fraction < share:
        return None
    if container.memory_bytes > _nominal_memory_bytes(c):
        return None
    return 1


def _nominal_memory_bytes(c: Candidate) -> int:
    """Memory a unit is sold as. MIG profile names are GiB classes (``1g.10gb`` serves a ``10Gi``
    ask although the driver reports 9.75 GiB): users size by the name, so the name counts."""
    if c.kind is BackingKind.MIG and c.backing.startswith("mig-"):
        name = c.backing.split(":", 1)[0][len("mig-"):]
        gb = name.split(".", 1)[1].removesuffix("gb") if "." in name else ""
        if gb.isdigit():
            return max(c.memory_mib * MIB, int(gb) * 1024 * MIB)
    return c.memory_mib * MIB


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
        if not _product_ok(ask.products, cand) or not _isolation_allows(isolation, cand):
            continue
        units: dict[str, int] = {}
        for container in containers:
            n = _units_for(container, cand)
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
            busy = 0 if cand.free_units >= total else 1
            options.append(((busy, consumed, spare, cand.backing, cand.resource), OfferingChoice(cand, units)))
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
    pool = [c for c in candidates if _product_ok(ask.products, c) and _isolation_allows(isolation, c)]
    head = f"needs {' and '.join(needs) or 'a GPU'}" + (f" with {', '.join(constraint)}" if constraint else "")
    if not pool:
        offered = sorted({f"{c.backing} on {c.product or '?'}" for c in candidates})
        return f"{head}; no offering matches (the cluster offers: {', '.join(offered)})"
    if ask.effective_memory_bytes:
        biggest = max(pool, key=lambda c: (_nominal_memory_bytes(c), c.fraction))
        return f"{head}; largest offering is {biggest.describe()}"
    biggest = max(pool, key=lambda c: (c.fraction * max(1, c.max_units_per_node if c.kind is BackingKind.WHOLE
                                                         else 1), c.memory_mib))
    if biggest.kind is BackingKind.WHOLE:
        return f"{head}; largest offering is {biggest.max_units_per_node} x {biggest.describe()} per node"
    return f"{head}; largest offering is {biggest.describe()}"
