"""A node's GPU inventory, read from a Kubernetes Node object (a dict as the API returns it).

What the node *sells* comes from ``status.allocatable`` (what the device plugin advertised); what it
*is* comes from the GPU Feature Discovery labels. Comparing the two gives health: the GPU operator
can come up with fewer GPUs than the board has (an H100 HGX node on a driver without its NVSwitch
fabric manager exposes 5-7 of 8), and a new node carries the operator's ``gpu.deploy.*`` labels for
minutes before any ``nvidia.com/gpu`` is allocatable.

What a node sells is read by the device of its backing (``devices``: whole GPUs, MIG instances,
time-sliced or MPS replicas); this module reads what they share (product, counts, CPU and memory,
taints) and judges health from what the device expected and found.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpu_tailor.gpumodel import devices, labels
from gpu_tailor.gpumodel.devices.base import (
    BackingKind,
    Health,
    HealthState,
    NodeFacts,
    Offering,
    Reading,
    Sharing,
    UnitsRefusal,
    int_label,
)
from gpu_tailor.gpumodel.occupancy import ReplicaPolicy
from gpu_tailor.gpumodel.products import Product, normalise
from gpu_tailor.gpumodel.quantity import QuantityError, parse_bytes, parse_count, parse_quantity
from gpu_tailor.gpumodel.resources import NvidiaResource, parse_resource

__all__ = ["BackingKind", "Health", "HealthState", "NodeInventory", "Offering", "Sharing", "UnitsRefusal",
           "from_node"]


@dataclass(frozen=True, slots=True)
class NodeInventory:
    name: str
    labels: dict[str, str]
    product: Product | None
    architecture: str  # nvidia.com/gpu.family (ampere, hopper, ...), "" when unknown
    gpu_count: int  # physical GPUs on the board, as labelled
    gpu_memory_mib: int  # per physical GPU
    mig_strategy: str  # none | single | mixed
    sharing: Sharing
    replicas: int
    mps_capable: bool
    mig_capable: bool
    offerings: tuple[Offering, ...]
    health: Health
    gpu_taint: bool  # carries the nvidia.com/gpu NoSchedule taint
    cpu_milli: int
    memory_bytes: int
    unschedulable: bool = False
    problems: tuple[str, ...] = field(default=())  # labels that could not be read
    replica_policy: ReplicaPolicy = ReplicaPolicy.DISTRIBUTED  # how the device plugin hands out replicas here

    @property
    def model(self) -> str:
        return self.product.model if self.product else ""

    @property
    def has_gpus(self) -> bool:
        return self.health.state is not HealthState.NO_GPU

    @property
    def usable_gpus(self) -> int:
        """Physical GPUs the node can hand out now (allocatable, in whole-GPU terms)."""
        return max(0, self.gpu_count - self.health.missing_gpus)

    def offering(self, resource: NvidiaResource | str) -> Offering | None:
        key = str(resource)
        for o in self.offerings:
            if str(o.resource) == key:
                return o
        return None


def _allocatable(status: dict[str, Any], problems: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for key, value in (status.get("allocatable") or {}).items():
        if parse_resource(key) is None:
            continue
        try:
            out[key] = parse_count(value)
        except QuantityError:
            problems.append(f"allocatable {key}={value!r} is not a whole number")
    return out


def _sharing(node_labels: dict[str, str]) -> Sharing:
    value = node_labels.get(labels.GPU_SHARING_STRATEGY, "none")
    try:
        return Sharing(value)
    except ValueError:
        return Sharing.NONE


def _health(facts: NodeFacts, reading: Reading, operator_labels: bool) -> Health:
    state = facts.labels.get(labels.MIG_CONFIG_STATE)
    if state is not None and state != "success":
        # mig-manager moves labels and allocatable at different times while it re-cuts the GPUs (and may reboot
        # the node): nothing it sells now is to be counted on until it says success
        target = facts.labels.get(labels.MIG_CONFIG)
        return Health(HealthState.RECONFIGURING, 0, f"MIG layout being changed: {labels.MIG_CONFIG_STATE}={state}"
                      + (f" (to {labels.MIG_CONFIG}={target})" if target else ""))
    if reading.health is not None:
        return reading.health
    if facts.label_count is None and not facts.alloc and not operator_labels:
        return Health(HealthState.NO_GPU)
    if not any(o.allocatable for o in reading.offerings):
        what = ("no nvidia.com/gpu allocatable yet" if operator_labels or facts.label_count
                else "no GPU resource allocatable")
        return Health(HealthState.INITIALIZING, reading.gpu_count, f"GPU stack initializing: {what}")
    expected, available, per_gpu = reading.expected_units, reading.available_units, reading.units_per_gpu
    if expected is None or available >= expected:
        return Health(HealthState.HEALTHY)
    if not per_gpu:
        return Health(HealthState.DEGRADED, 0,
                      f"{expected - available} of {expected} MIG instances missing from allocatable")
    missing = -(-(expected - available) // per_gpu)
    if per_gpu == 1:
        reason = (f"{missing} of {reading.gpu_count} GPUs missing "
                  f"(allocatable {available} < nvidia.com/gpu.count {expected})")
    else:
        reason = (f"{missing} of {reading.gpu_count} GPUs missing ({expected - available} of "
                  f"{expected} devices not allocatable)")
    return Health(HealthState.DEGRADED, missing, reason)


def node_fields(obj: Any) -> dict[str, Any]:
    """The parts of a Node object ``from_node`` reads (name, labels, taints, unschedulable,
    allocatable), as plain dicts; ``obj``: a dict, or an object parsed lazily by simdjson (anything
    with ``get``, whose values have ``as_dict``/``as_list``). The rest -- images, conditions,
    managedFields, often most of a GPU node's bytes -- is never built."""

    def plain(value: Any) -> Any:
        for how in ("as_dict", "as_list"):
            if hasattr(value, how):
                return getattr(value, how)()
        return value

    out: dict[str, Any] = {}
    for part, keys in (("metadata", ("name", "labels")), ("spec", ("taints", "unschedulable")),
                       ("status", ("allocatable",))):
        raw = obj.get(part)
        if hasattr(raw, "get"):
            out[part] = {k: plain(v) for k in keys if (v := raw.get(k)) is not None}
    return out


def from_node(node: dict[str, Any]) -> NodeInventory:
    """Build the inventory; never raises on odd labels (they are reported in ``problems``)."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    node_labels: dict[str, str] = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    problems: list[str] = []
    alloc = _allocatable(status, problems)
    raw_alloc = status.get("allocatable") or {}

    def _res(key: str, parse: Any) -> int:
        try:
            return int(parse(raw_alloc.get(key, 0)))
        except QuantityError:
            problems.append(f"allocatable {key}={raw_alloc.get(key)!r} is not a quantity")
            return 0

    cpu_milli = _res("cpu", lambda v: parse_quantity(v) * 1000)
    memory_bytes = _res("memory", parse_bytes)
    taints = spec.get("taints") or []
    gpu_taint = any(t.get("key") == labels.GPU_TAINT_KEY and t.get("effect") in ("NoSchedule", "NoExecute")
                    for t in taints if isinstance(t, dict))

    raw_product = node_labels.get(labels.GPU_PRODUCT)
    facts = NodeFacts(
        labels=node_labels, alloc=alloc, product=normalise(raw_product) if raw_product else None,
        sharing=_sharing(node_labels), replicas=int_label(node_labels, labels.GPU_REPLICAS, problems) or 1,
        label_count=int_label(node_labels, labels.GPU_COUNT, problems),
        label_memory=int_label(node_labels, labels.GPU_MEMORY, problems) or 0,
        mig_strategy=node_labels.get(labels.MIG_STRATEGY, "none"), problems=problems)
    operator_labels = node_labels.get(labels.GPU_PRESENT) == "true" or any(
        k.startswith(labels.GPU_DEPLOY_PREFIX) for k in node_labels)
    reading = devices.read(facts)
    return NodeInventory(
        name=str(meta.get("name", "")),
        labels=node_labels,
        product=facts.product,
        architecture=node_labels.get(labels.GPU_FAMILY, ""),
        gpu_count=reading.gpu_count,
        gpu_memory_mib=reading.gpu_memory_mib,
        mig_strategy=reading.mig_strategy,
        sharing=facts.sharing,
        replicas=facts.replicas,
        mps_capable=node_labels.get(labels.MPS_CAPABLE) == "true",
        mig_capable=node_labels.get(labels.MIG_CAPABLE) == "true",
        offerings=reading.offerings,
        health=_health(facts, reading, operator_labels),
        gpu_taint=gpu_taint,
        cpu_milli=cpu_milli,
        memory_bytes=memory_bytes,
        unschedulable=bool(spec.get("unschedulable")),
        replica_policy=_replica_policy(node_labels, problems),
        problems=tuple(problems),
    )


def _replica_policy(node_labels: dict[str, str], problems: list[str]) -> ReplicaPolicy:
    """The pool's ``gpu-tailor.io/replica-policy`` label; the device plugin's default when absent or unknown."""
    raw = node_labels.get(labels.REPLICA_POLICY_LABEL)
    if raw is None:
        return ReplicaPolicy.DISTRIBUTED
    try:
        return ReplicaPolicy(raw)
    except ValueError:
        problems.append(f"label {labels.REPLICA_POLICY_LABEL}={raw!r} is not one of "
                        f"{', '.join(p.value for p in ReplicaPolicy)}: read as distributed")
        return ReplicaPolicy.DISTRIBUTED
