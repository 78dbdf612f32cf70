"""The extender's decisions for one pod against one node's snapshot: does it fit, why not, where.

Pure functions over ``NodeState`` (inventory + per-GPU occupancy + CPU/memory requested by bound
pods). What is generic lives here (health, product, whether the node sells the resource at all); what
depends on the backing -- how units are counted and which GPUs they take -- is asked of the offering's
device (``devices``). Scoring across nodes is the placement policies' job; this module turns a pod
into a ``Demand`` and a ``Shape`` the fleet understands.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

from gpu_tailor.gpumodel import devices, labels
from gpu_tailor.gpumodel.ask import PodAsk, Topology, from_pod, kube_effective
from gpu_tailor.gpumodel.devices.base import Fit as Fit
from gpu_tailor.gpumodel.dra_usage import GpuColumn
from gpu_tailor.gpumodel.fleet import PICK_ANY, PICK_FIRST, PICK_LEAST_FREE, PICK_MOST_FREE, Shape
from gpu_tailor.gpumodel.inventory import BackingKind, HealthState, NodeInventory, Offering, UnitsRefusal
from gpu_tailor.gpumodel.occupancy import FULL, NodeGpus, Placement, ReplicaPolicy, parse_gpu_annotation
from gpu_tailor.gpumodel.quantity import parse_quantity
from gpu_tailor.gpumodel.topology import GpuTopology, infer


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
    meta = pod.get("metadata")
    if not isinstance(meta, dict):
        return "/"
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _requests(pod: dict[str, Any], name: str) -> Fraction:
    """Effective pod request of cpu/memory as kube-scheduler counts it (``ask.kube_effective``:
    sidecar init containers and ``spec.overhead`` included); unreadable values count 0."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return Fraction(0)

    def quantity(raw: Any) -> Fraction:
        try:
            return parse_quantity(str(raw)) if raw is not None else Fraction(0)
        except ValueError:
            return Fraction(0)

    def one(c: dict[str, Any]) -> Fraction:
        resources = c.get("resources")
        requests = resources.get("requests") if isinstance(resources, dict) else None
        return quantity(requests.get(name)) if isinstance(requests, dict) else Fraction(0)

    def containers(key: str) -> list[dict[str, Any]]:
        raw = spec.get(key)
        return [c for c in raw if isinstance(c, dict)] if isinstance(raw, list) else []

    parts = [(True, c.get("restartPolicy") == "Always", one(c)) for c in containers("initContainers")]
    parts += [(False, False, one(c)) for c in containers("containers")]
    overhead = spec.get("overhead")
    return kube_effective(parts, quantity(overhead.get(name)) if isinstance(overhead, dict) else Fraction(0))


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

    def copy(self) -> NodeState:
        """An independent copy (a snapshot's): the occupancy and the unit counts are not shared."""
        return replace(self, gpus=self.gpus.copy(), units_used=dict(self.units_used))


@dataclass(frozen=True, slots=True)
class FleetRow:
    """A node as the placement fleet sees it (``Fleet.upsert``'s arguments): what kube-scheduler's
    NodeResourcesFit leaves free of CPU and memory, and the free milli of each GPU (0 for GPUs a
    degraded node does not sell)."""

    cpu_free: int
    mem_free_mib: int
    gpu_free: tuple[int, ...]
    model: str
    topology: GpuTopology | None  # None: no NVLink to count on (a DRA driver publishes none)
    cpu_capacity: int
    pick: int = PICK_ANY  # who picks a replica's GPU (``fleet.PICK_*``)
    step: int = 0  # milli of one replica, where the device plugin picks
    domain: str = ""  # the NVLink domain it shares with other nodes ("": none, the node alone)


# Where a node's NVLink domain is read: GFD's clique label on GB200/GB300 NVL72 nodes, unless the admin names other
# node labels first (a rack, a network block: ``--domain-label``)
DOMAIN_LABELS: tuple[str, ...] = (labels.GPU_CLIQUE,)


def domain_of(node_labels: dict[str, str], keys: tuple[str, ...] = DOMAIN_LABELS) -> str:
    """The node's NVLink domain: ``key=value`` of the first of ``keys`` it carries, "" where none."""
    for key in keys:
        value = node_labels.get(key)
        if value:
            return f"{key}={value}"
    return ""


_PICKS = {ReplicaPolicy.DISTRIBUTED: PICK_MOST_FREE, ReplicaPolicy.SPREAD: PICK_MOST_FREE,
          ReplicaPolicy.PACKED: PICK_LEAST_FREE}


def fleet_row(node: NodeState, domain_keys: tuple[str, ...] = DOMAIN_LABELS) -> FleetRow:
    """The one conversion from the extender's node to the fleet's row, for the extender's scoring and
    for the check that the fleet (the simulator's model) agrees with ``fit``."""
    inv, gpus = node.inventory, node.gpus
    sold = {s.index for s in gpus.usable_slots()}
    free = tuple(s.free_milli if s.index in sold else 0 for s in gpus.slots)
    # replicas of whole GPUs (not of MIG instances: those sit where the node's MIG layout has them)
    shared = inv.replicas > 1 and any(o.backing is BackingKind.SHARED and o.mig_profile is None
                                      for o in inv.offerings)
    pick = _PICKS[gpus.policy] if shared else PICK_ANY
    # a degraded node whose unsold GPUs are not known promises no NVLink set: its links are not scored
    topology = gpus.promised_topology
    return FleetRow(inv.cpu_milli - node.cpu_used, inv.memory_bytes // 2**20 - node.mem_used_mib, free, inv.model,
                    topology, inv.cpu_milli, pick, FULL // inv.replicas if shared else 0,
                    domain_of(inv.labels, domain_keys))


def dra_row(row: FleetRow, column: GpuColumn | None, inv: NodeInventory) -> FleetRow:
    """The row of a node whose GPUs NVIDIA's DRA driver publishes (``dra_usage.gpu_column``), where its device plugin
    sells none (a node is one or the other): the DRA devices as its GPUs, each picked by kube-scheduler's allocator
    (first fit, ``PICK_FIRST``), no NVLink. Else ``row`` as it is."""
    if column is None or not column.free or any(o.allocatable > 0 for o in inv.offerings):
        return row
    return replace(row, gpu_free=column.free, model=column.product or row.model, topology=None, pick=PICK_FIRST,
                   step=0)


def node_state(inv: NodeInventory) -> NodeState:
    topo = infer(inv.model, inv.product.raw if inv.product else "", inv.gpu_count, inv.labels)
    return NodeState(inv, NodeGpus(inv.gpu_count, inv.gpu_memory_mib, topo, usable=inv.usable_gpus,
                                   policy=inv.replica_policy))


def shape_of(demand: Demand, offering: Offering | None) -> Shape:
    """The pod as the fleet sees it: whole GPUs, or one GPU's share for replicas and MIG instances."""
    if not demand.gpu or offering is None:
        return Shape(demand.cpu_milli, demand.memory_mib)
    gpus, milli, nvlink = devices.device_for(offering).fleet_share(offering, demand.units, demand.nvlink)
    return Shape(demand.cpu_milli, demand.memory_mib, gpus, milli, nvlink=nvlink)


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
    if state is HealthState.RECONFIGURING:  # it comes back, with a layout of its own: worth asking again
        return Fit(False, inv.health.reason or "MIG layout being changed")
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
    refusal = devices.device_for(offering).units_refusal(demand.resource, n, offering.sharing)
    if refusal is UnitsRefusal.AMBIGUOUS:
        return Fit(False, f"node sells {demand.resource} as {label}: {n} units would be {n} slices or replicas, "
                   f"not {n} GPUs", unresolvable=True)
    if refusal is UnitsRefusal.ONE_PER_CONTAINER:
        return Fit(False, f"node sells {demand.resource} as {label}: the device plugin fails a container's "
                   "request for more than one replica", unresolvable=True)
    return offering


def fit(node: NodeState, demand: Demand, place: bool = True, settled: Fit | Offering | None = None) -> Fit:
    """Whether ``demand`` fits ``node`` now; the GPUs it would get; or a reason for people.

    ``place=False`` answers only whether (and why not): units are then not placed (``placement`` is
    None, but for an NVLink set of whole GPUs), which saves the search on every candidate of a filter call.
    ``settled`` is ``inventory_verdict(node.inventory, demand)`` when the caller has it already.
    """
    verdict = inventory_verdict(node.inventory, demand) if settled is None else settled
    if isinstance(verdict, Fit):
        return verdict
    used = node.units_used.get(demand.resource, 0)
    return devices.device_for(verdict).fit(verdict, node.gpus, used, demand.units, demand.nvlink, place)


def recorded_placement(pod: dict[str, Any], node: NodeState, demand: Demand) -> Placement | None:
    """Where a bound pod sits: its ``gpu-tailor.io/gpus`` annotation if readable, else predicted."""
    if not demand.gpu:
        return None
    offering = node.inventory.offering(demand.resource)
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    recorded = parse_gpu_annotation(str(annotations.get(labels.ANN_GPUS, "")))
    used = node.units_used.get(demand.resource, 0)
    if offering is None:  # bound where its resource is not sold (before we knew?): counted as whole GPUs
        placement = devices.WHOLE.recorded(offering, node.gpus, used, demand.units, recorded)
    else:
        placement = devices.device_for(offering).recorded(offering, node.gpus, used, demand.units, recorded)
    among = parse_gpu_annotation(str(annotations.get(labels.ANN_GPUS_AMONG, ""))) if recorded is not None else None
    if among is not None and set(placement.gpus) <= set(among) and not placement.counted:
        # bind wrote down one pick of several the device plugin may make, and the set: both come back
        return replace(placement, maybe=among, read_back=False)
    return placement
