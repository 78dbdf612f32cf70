"""A node's GPU inventory, read from a Kubernetes Node object (a dict as the API returns it).

What the node *sells* comes from ``status.allocatable`` (what the device plugin advertised); what it
*is* comes from the GPU Feature Discovery labels. Comparing the two gives health: the GPU operator
can come up with fewer GPUs than the board has (an H100 HGX node on a driver without its NVSwitch
fabric manager exposes 5-7 of 8), and a new node carries the operator's ``gpu.deploy.*`` labels for
minutes before any ``nvidia.com/gpu`` is allocatable.

Backings a node can offer:

* ``whole``   -- ``nvidia.com/gpu`` = physical GPUs
* ``mig``     -- under the mixed strategy, ``nvidia.com/mig-<profile>`` per profile; under the single
                 strategy every GPU is cut the same way and the devices are ``nvidia.com/gpu``
* ``shared``  -- time-slicing or MPS replicas, as ``nvidia.com/gpu`` or (``renameByDefault``)
                 ``nvidia.com/gpu.shared``; one replica is 1/replicas of a GPU
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction
from typing import Any

from gpu_tailor.gpumodel import labels, mig
from gpu_tailor.gpumodel.products import Product, normalise
from gpu_tailor.gpumodel.quantity import QuantityError, parse_bytes, parse_count, parse_quantity
from gpu_tailor.gpumodel.resources import (
    SHARED_GPU,
    WHOLE_GPU,
    NvidiaResource,
    ResourceKind,
    mig_resource,
    parse_resource,
)


class BackingKind(StrEnum):
    WHOLE = "whole"
    MIG = "mig"
    SHARED = "shared"


class Sharing(StrEnum):
    NONE = "none"
    TIME_SLICING = "time-slicing"
    MPS = "mps"


class HealthState(StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    INITIALIZING = "initializing"
    INVALID_MIG = "invalid-mig"
    NO_GPU = "no-gpu"


@dataclass(frozen=True, slots=True)
class Health:
    state: HealthState
    missing_gpus: int = 0
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Offering:
    """One way a node sells GPU capacity: a resource name and how much of a GPU one unit is."""

    backing: BackingKind
    resource: NvidiaResource
    allocatable: int  # units the device plugin advertises now
    per_gpu: int  # units cut from one physical GPU
    fraction: Fraction  # share of one GPU's compute per unit
    memory_mib: int  # GPU memory one unit may use (nominal for time-slicing: not enforced)
    sharing: Sharing = Sharing.NONE
    replicas: int = 1
    mig_profile: mig.MigProfile | None = None

    @property
    def label(self) -> str:
        """The ``gpu-tailor.io/backing`` value: ``whole``, ``mig-1g.10gb``, ``shared:mps:10``."""
        parts: list[str] = []
        if self.mig_profile is not None:
            parts.append(f"mig-{self.mig_profile.name}")
        if self.sharing is not Sharing.NONE:
            parts.append(f"shared:{self.sharing.value}:{self.replicas}")
        return ":".join(parts) if parts else "whole"


class UnitsRefusal(StrEnum):
    """Why one container's several units of a resource can never run where it is sold a given way."""

    AMBIGUOUS = "ambiguous"  # nvidia.com/gpu: N where that name sells slices: N GPUs were meant
    ONE_PER_CONTAINER = "one-per-container"  # the device plugin fails requests for more than one replica


def units_refusal(resource: str, units: int, backing: BackingKind, sharing: Sharing,
                  fails_more_than_one: bool = False) -> UnitsRefusal | None:
    """Whether ``units`` of ``resource`` asked by one container can run where it is sold as ``backing``.

    The webhook (admit or deny) and the extender (filter) both ask this, so that a pod the webhook
    admits is one the extender can place. The device plugin allocates per container, so ``units`` is
    one container's count.

    * Names that only ever sell replicas or MIG instances (``nvidia.com/gpu.shared``,
      ``nvidia.com/mig-<p>``, ``nvidia.com/mig-<p>.shared``): N units are N replicas or instances,
      which the device plugin hands out from any GPUs with free ones.
    * ``nvidia.com/gpu`` is the portable way to ask for GPUs. On a node that sells time-slicing or MPS
      replicas (no ``renameByDefault``) or single-strategy MIG devices under that name, N > 1 units
      would be N slices, not the N GPUs the pod was written for: AMBIGUOUS, never placed there. One
      unit stays fine: a pod asking for "a GPU" gets one slice, which is what such a node is for.
    * More than one replica fails at the kubelet where the device plugin's sharing config sets
      ``failRequestsGreaterThanOne``, which MPS always does.
    """
    if units <= 1:
        return None
    if backing is not BackingKind.WHOLE and resource == str(WHOLE_GPU):
        return UnitsRefusal.AMBIGUOUS
    if sharing is Sharing.MPS or (sharing is not Sharing.NONE and fails_more_than_one):
        return UnitsRefusal.ONE_PER_CONTAINER
    return None


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


def _int_label(node_labels: dict[str, str], key: str, problems: list[str]) -> int | None:
    value = node_labels.get(key)
    if value is None:
        return None
    try:
        return parse_count(value)
    except QuantityError:
        problems.append(f"label {key}={value!r} is not a whole number")
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


def profile_fraction(profile: mig.MigProfile) -> Fraction:
    return Fraction(profile.compute_slices, profile.total_compute_slices)


def _is_mig(resource_name: str) -> bool:
    res = parse_resource(resource_name)
    return res is not None and res.is_mig


def _sharing(node_labels: dict[str, str]) -> Sharing:
    value = node_labels.get(labels.GPU_SHARING_STRATEGY, "none")
    try:
        return Sharing(value)
    except ValueError:
        return Sharing.NONE


def _mixed_offerings(node_labels: dict[str, str], alloc: dict[str, int], product: str,
                     sharing: Sharing, problems: list[str]) -> tuple[list[Offering], int]:
    """One offering per MIG profile the device plugin advertises; returns also the expected count
    (the sum of the ``nvidia.com/mig-<p>.count`` labels) for the health check."""
    offerings: list[Offering] = []
    expected = 0
    for key, count in sorted(alloc.items()):
        res = parse_resource(key)
        if res is None or res.kind is not ResourceKind.MIG or res.mig_profile is None:
            continue
        name = res.mig_profile
        prefix = f"{labels.MIG_LABEL_PREFIX}{name}"
        labelled = _int_label(node_labels, f"{prefix}.count", problems)
        replicas = _int_label(node_labels, f"{prefix}.replicas", problems) or 1
        table = mig.profile_for(product, name)
        memory = _int_label(node_labels, f"{prefix}.memory", problems) or (table.memory_mib if table else 0)
        if table is None:
            parsed = mig.parse_profile_name(name)
            g = parsed.compute_slices if parsed else 1
            table = mig.MigProfile(name, g, 7, memory, max(1, 7 // g), (), 1)
        elif memory != table.memory_mib:
            table = mig.MigProfile(name, table.compute_slices, table.total_compute_slices, memory,
                                   table.max_instances, table.placements, table.span)
        expected += (labelled if labelled is not None else count // max(1, replicas)) * replicas
        shared = replicas > 1
        # A shared MIG device is time-sliced unless the node says MPS.
        mig_sharing = (sharing if sharing is not Sharing.NONE else Sharing.TIME_SLICING) if shared else Sharing.NONE
        offerings.append(Offering(
            backing=BackingKind.MIG,
            resource=mig_resource(name, shared=res.shared),
            allocatable=count,
            per_gpu=table.max_instances * replicas,
            fraction=profile_fraction(table) / replicas,
            memory_mib=memory // replicas if shared else memory,
            sharing=mig_sharing,
            replicas=replicas,
            mig_profile=table,
        ))
    return offerings, expected


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
    product = normalise(raw_product) if raw_product else None
    product_name = product.base if product else ""
    sharing = _sharing(node_labels)
    replicas = _int_label(node_labels, labels.GPU_REPLICAS, problems) or 1
    label_count = _int_label(node_labels, labels.GPU_COUNT, problems)
    label_memory = _int_label(node_labels, labels.GPU_MEMORY, problems) or 0
    mig_strategy = node_labels.get(labels.MIG_STRATEGY, "none")
    operator_labels = node_labels.get(labels.GPU_PRESENT) == "true" or any(
        k.startswith(labels.GPU_DEPLOY_PREFIX) for k in node_labels)
    sku = mig.sku_for_product(product_name) if product_name else None

    offerings: list[Offering] = []
    gpu_count = label_count or 0
    gpu_memory = label_memory
    expected_units: int | None = None
    available_units = 0
    units_per_gpu = 1
    effective_mig = "none"
    whole = alloc.get(str(WHOLE_GPU), 0)
    shared_alloc = alloc.get(str(SHARED_GPU), 0)

    if product is not None and product.mig_invalid:
        # GFD's single strategy found GPUs cut differently: the devices it would sell are unusable.
        effective_mig = "single"
    elif product is not None and product.mig_profile is not None:
        # Single strategy: every device is one MIG instance of the same profile, sold as nvidia.com/gpu,
        # and gpu.count / gpu.memory describe the MIG devices, not the boards.
        effective_mig = "single"
        profile = mig.profile_for(product_name, product.mig_profile)
        per_gpu = profile.max_instances if profile else 1
        if profile is not None and label_memory and label_memory != profile.memory_mib:
            profile = mig.MigProfile(profile.name, profile.compute_slices, profile.total_compute_slices,
                                     label_memory, profile.max_instances, profile.placements, profile.span)
        devices = label_count if label_count is not None else whole
        gpu_count = -(-devices // per_gpu)
        gpu_memory = sku.memory_mib if sku else label_memory * per_gpu
        units_per_gpu = per_gpu
        expected_units, available_units = devices, whole
        if whole:
            offerings.append(Offering(
                backing=BackingKind.MIG, resource=WHOLE_GPU, allocatable=whole, per_gpu=per_gpu,
                fraction=profile_fraction(profile) if profile else Fraction(1, per_gpu),
                memory_mib=label_memory or (profile.memory_mib if profile else 0), mig_profile=profile))
    elif mig_strategy == "mixed" and any(_is_mig(k) for k in alloc):
        effective_mig = "mixed"
        mig_offerings, expected_units = _mixed_offerings(node_labels, alloc, product_name, sharing, problems)
        offerings.extend(mig_offerings)
        available_units = sum(o.allocatable for o in mig_offerings)
        units_per_gpu = 0  # no single per-GPU unit: health compares instance counts
        if whole:  # GPUs left with MIG disabled are still sold whole under the mixed strategy
            offerings.append(Offering(BackingKind.WHOLE, WHOLE_GPU, whole, 1, Fraction(1), gpu_memory))
    elif sharing is not Sharing.NONE and (replicas > 1 or shared_alloc):
        resource = SHARED_GPU if shared_alloc else WHOLE_GPU
        count = shared_alloc or whole
        units_per_gpu = replicas
        expected_units, available_units = (label_count * replicas if label_count is not None else None), count
        if count:
            offerings.append(Offering(
                backing=BackingKind.SHARED, resource=resource, allocatable=count, per_gpu=replicas,
                fraction=Fraction(1, replicas), memory_mib=gpu_memory // replicas, sharing=sharing,
                replicas=replicas))
    else:
        expected_units, available_units = label_count, whole
        if whole:
            offerings.append(Offering(BackingKind.WHOLE, WHOLE_GPU, whole, 1, Fraction(1), gpu_memory))
        if label_count is None:
            gpu_count = whole

    if product is not None and product.mig_invalid:
        health = Health(HealthState.INVALID_MIG, gpu_count,
                        f"MIG configuration invalid ({raw_product}): the GPUs carry different MIG layouts "
                        "under the single strategy")
    elif label_count is None and not alloc and not operator_labels:
        health = Health(HealthState.NO_GPU)
    elif not any(o.allocatable for o in offerings):
        what = "no nvidia.com/gpu allocatable yet" if operator_labels or label_count else "no GPU resource allocatable"
        health = Health(HealthState.INITIALIZING, gpu_count, f"GPU stack initializing: {what}")
    elif expected_units is not None and available_units < expected_units:
        if units_per_gpu:
            missing = -(-(expected_units - available_units) // units_per_gpu)
            if units_per_gpu == 1:
                reason = (f"{missing} of {gpu_count} GPUs missing "
                          f"(allocatable {available_units} < nvidia.com/gpu.count {expected_units})")
            else:
                reason = (f"{missing} of {gpu_count} GPUs missing ({expected_units - available_units} of "
                          f"{expected_units} devices not allocatable)")
        else:
            missing = 0
            reason = f"{expected_units - available_units} of {expected_units} MIG instances missing from allocatable"
        health = Health(HealthState.DEGRADED, missing, reason)
    else:
        health = Health(HealthState.HEALTHY)

    return NodeInventory(
        name=str(meta.get("name", "")),
        labels=node_labels,
        product=product,
        architecture=node_labels.get(labels.GPU_FAMILY, ""),
        gpu_count=gpu_count,
        gpu_memory_mib=gpu_memory,
        mig_strategy=effective_mig,
        sharing=sharing,
        replicas=replicas,
        mps_capable=node_labels.get(labels.MPS_CAPABLE) == "true",
        mig_capable=node_labels.get(labels.MIG_CAPABLE) == "true",
        offerings=tuple(offerings),
        health=health,
        gpu_taint=gpu_taint,
        cpu_milli=cpu_milli,
        memory_bytes=memory_bytes,
        unschedulable=bool(spec.get("unschedulable")),
        problems=tuple(problems),
    )
