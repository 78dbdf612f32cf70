"""What GPU a pod asks for, read from a Pod object (a dict as the API returns it).

Per container: the virtual resources ``gpu-tailor.io/gpu-milli`` (thousandths of a GPU; multiples of
1000 are whole GPUs) and ``gpu-tailor.io/gpu-memory`` (bytes), or native NVIDIA resources. For the pod:
its effective request the way the scheduler computes it -- the larger of the app containers' sum and
the largest init container (restartable "sidecar" init containers run alongside both, so they count
in both) plus ``spec.overhead``, ``kube_effective`` -- plus the annotations that constrain placement.

Invalid values become ``AskError`` records, never exceptions: the webhook turns them into a denial.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction
from typing import Any, TypeVar

from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.quantity import QuantityError, format_bytes, parse_bytes, parse_count, parse_quantity
from gpu_tailor.gpumodel.resources import is_gpu_resource, is_nvidia_resource, parse_resource

N = TypeVar("N", int, Fraction)


class Isolation(StrEnum):
    ANY = "any"
    MIG = "mig"
    MPS = "mps"
    TIME_SLICING = "time-slicing"
    EXCLUSIVE = "exclusive"


class Topology(StrEnum):
    NVLINK = "nvlink"
    PREFER_NVLINK = "prefer-nvlink"
    ANY = "any"


@dataclass(frozen=True, slots=True)
class AskError:
    code: str  # invalid-value | ambiguous | unknown-resource | invalid-annotation
    message: str
    container: str | None = None
    field: str | None = None


@dataclass(frozen=True, slots=True)
class Mismatch:
    resource: str
    request: str
    limit: str


@dataclass(frozen=True, slots=True)
class ContainerAsk:
    name: str
    init: bool
    sidecar: bool  # init container with restartPolicy Always (runs for the pod's whole life)
    index: int  # position in its list (containers or initContainers), for JSON paths
    milli: int = 0  # gpu-tailor.io/gpu-milli
    memory_bytes: int = 0  # gpu-tailor.io/gpu-memory
    native: dict[str, int] = field(default_factory=dict)  # nvidia.com/* -> count
    requests: dict[str, str] = field(default_factory=dict)  # GPU resources only, as written
    limits: dict[str, str] = field(default_factory=dict)
    mismatches: tuple[Mismatch, ...] = ()
    missing_limits: tuple[str, ...] = ()  # GPU resources with a request and no limit

    @property
    def virtual(self) -> bool:
        return bool(self.milli or self.memory_bytes)

    @property
    def has_gpu(self) -> bool:
        return self.virtual or any(self.native.values())

    @property
    def whole_gpus(self) -> int:
        """GPUs a gpu-milli ask of a multiple of 1000 wants (0 for a fraction)."""
        return self.milli // 1000 if self.milli >= 1000 else 0

    @property
    def path(self) -> str:
        return f"/spec/{'initContainers' if self.init else 'containers'}/{self.index}"

    def canonical(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.milli:
            out["gpuMilli"] = self.milli
        if self.memory_bytes:
            out["gpuMemory"] = format_bytes(self.memory_bytes)
        if self.native:
            out["native"] = dict(sorted(self.native.items()))
        return out


@dataclass(frozen=True, slots=True)
class PodAsk:
    containers: tuple[ContainerAsk, ...]
    isolation: Isolation = Isolation.ANY
    products: tuple[str, ...] = ()
    topology: Topology = Topology.PREFER_NVLINK
    errors: tuple[AskError, ...] = ()
    effective_milli: int = 0
    effective_memory_bytes: int = 0
    effective_native: dict[str, int] = field(default_factory=dict)

    @property
    def has_gpu(self) -> bool:
        return any(c.has_gpu for c in self.containers)

    @property
    def virtual(self) -> bool:
        return any(c.virtual for c in self.containers)

    @property
    def gpu_containers(self) -> tuple[ContainerAsk, ...]:
        return tuple(c for c in self.containers if c.has_gpu)

    def most_in_one_container(self, resource: str) -> int:
        """The most units of a native ``resource`` one container asks for (the device plugin allocates
        per container, so this, not the pod's total, is what one allocation must serve)."""
        return max((c.native.get(resource, 0) for c in self.containers), default=0)

    def canonical(self) -> dict[str, Any]:
        """A stable description of the ask for the ``gpu-tailor.io/ask`` annotation."""
        out: dict[str, Any] = {
            "containers": {("init:" if c.init else "") + c.name: c.canonical() for c in self.gpu_containers},
            "isolation": self.isolation.value,
            "topology": self.topology.value,
        }
        if self.products:
            out["products"] = list(self.products)
        return out


def kube_effective(parts: Iterable[tuple[bool, bool, N]], overhead: N) -> N:
    """Kubernetes' effective pod request of one resource (``component-helpers/resource.PodRequests``).

    ``parts`` are (init, sidecar, request) per container, init containers first and in order. The
    result is the larger of the app containers' sum plus every sidecar (an init container with
    ``restartPolicy: Always``, KEP-753: it runs for the pod's whole life) and the init phase's peak,
    where a plain init container runs beside the sidecars started before it and a sidecar beside
    those before it; plus the pod's ``spec.overhead``.
    """
    app: N = overhead * 0
    init_peak: N = app
    sidecars: N = app
    for init, sidecar, v in parts:
        if init and sidecar:
            sidecars += v
            init_peak = max(init_peak, sidecars)
        elif init:
            init_peak = max(init_peak, sidecars + v)
        else:
            app += v
    return max(app + sidecars, init_peak) + overhead


def _effective(containers: Iterable[ContainerAsk], value: Any, overhead: int = 0) -> int:
    """Kubernetes' effective pod request for one GPU quantity of the containers' asks."""
    return kube_effective(((c.init, c.sidecar, int(value(c))) for c in containers), overhead)


def _overhead_native(spec: dict[str, Any]) -> dict[str, int]:
    """NVIDIA units in ``spec.overhead`` (RuntimeClass overhead: kube-scheduler adds it to the pod's
    requests, extended resources included). The API server validated it; an unreadable value counts 0."""
    raw = spec.get("overhead")
    out: dict[str, int] = {}
    if isinstance(raw, dict):
        for k, v in raw.items():
            if isinstance(k, str) and parse_resource(k) is not None:
                with contextlib.suppress(QuantityError):
                    out[k] = parse_count(v)
    return out


def _container(raw: dict[str, Any], index: int, init: bool, errors: list[AskError]) -> ContainerAsk:
    name = str(raw.get("name", f"#{index}"))
    resources = _mapping(raw.get("resources"))
    requests = {str(k): str(v) for k, v in _mapping(resources.get("requests")).items() if is_gpu_resource(str(k))}
    limits = {str(k): str(v) for k, v in _mapping(resources.get("limits")).items() if is_gpu_resource(str(k))}
    mismatches: list[Mismatch] = []
    values: dict[str, str] = {}
    for key in sorted(set(requests) | set(limits)):
        req, lim = requests.get(key), limits.get(key)
        if req is not None and lim is not None and req != lim and not _same_quantity(req, lim):
            mismatches.append(Mismatch(key, req, lim))
        chosen = lim if lim is not None else req
        assert chosen is not None
        values[key] = chosen

    milli = 0
    memory = 0
    native: dict[str, int] = {}
    for key, value in values.items():
        try:
            if key == labels.GPU_MILLI:
                milli = parse_count(value)
                if milli == 0 or (milli > 1000 and milli % 1000):
                    errors.append(AskError("invalid-value", f"{key}={value}: must be 1..1000 (a fraction of one GPU) "
                                           "or a multiple of 1000 (whole GPUs)", name, key))
                    milli = 0
            elif key == labels.GPU_MEMORY_RESOURCE:
                memory = parse_bytes(value)
                if memory == 0:
                    errors.append(AskError("invalid-value", f"{key}={value}: must be more than zero", name, key))
            elif is_nvidia_resource(key):
                count = parse_count(value)
                if parse_resource(key) is None:
                    errors.append(AskError("unknown-resource", f"{key} is not an NVIDIA GPU resource this cluster "
                                           "can offer (expected nvidia.com/gpu, nvidia.com/gpu.shared or "
                                           "nvidia.com/mig-<g>g.<m>gb)", name, key))
                elif count:
                    native[key] = count
            else:
                errors.append(AskError("unknown-resource", f"{key} is not a gpu-tailor.io resource (expected "
                                       f"{labels.GPU_MILLI} or {labels.GPU_MEMORY_RESOURCE})", name, key))
        except QuantityError as exc:
            errors.append(AskError("invalid-value", f"{key}: {exc}", name, key))
    if (milli or memory) and native:
        errors.append(AskError("ambiguous", f"container {name} mixes gpu-tailor.io resources with "
                               f"{', '.join(sorted(native))}; ask either a portable amount or a native resource",
                               name, None))
    return ContainerAsk(
        name=name, init=init, sidecar=init and raw.get("restartPolicy") == "Always", index=index,
        milli=milli, memory_bytes=memory, native=native, requests=requests, limits=limits,
        mismatches=tuple(mismatches), missing_limits=tuple(k for k in sorted(requests) if k not in limits))


def _same_quantity(a: str, b: str) -> bool:
    """Equal as Kubernetes quantities, exactly: ``1`` == ``1000m`` and ``1Gi`` == ``1024Mi``, but ``500m``
    != ``1`` (no rounding before the comparison, which would hide a half-GPU request under a limit of 1)."""
    try:
        return parse_quantity(a) == parse_quantity(b)
    except QuantityError:
        return False


def _enum_annotation(annotations: dict[str, str], key: str, enum: type[Any], default: Any,
                     errors: list[AskError]) -> Any:
    raw = annotations.get(key)
    if raw is None:
        return default
    try:
        return enum(raw.strip().lower())
    except ValueError:
        allowed = " | ".join(e.value for e in enum)
        errors.append(AskError("invalid-annotation", f"annotation {key}={raw!r}: must be one of {allowed}", None, key))
        return default


def _mapping(value: Any) -> dict[Any, Any]:
    """``value`` if it is a JSON object, else empty: a malformed pod reads as one asking for nothing
    (the webhook refuses such a pod with a 400 before it gets here, ``webhook.shape``)."""
    return value if isinstance(value, dict) else {}


def from_pod(pod: dict[str, Any]) -> PodAsk:
    meta = _mapping(pod.get("metadata"))
    spec = _mapping(pod.get("spec"))
    annotations = {str(k): str(v) for k, v in _mapping(meta.get("annotations")).items()}
    errors: list[AskError] = []
    containers: list[ContainerAsk] = []
    for init, key in ((True, "initContainers"), (False, "containers")):
        listed = spec.get(key)
        for i, raw in enumerate(listed if isinstance(listed, list) else ()):
            if isinstance(raw, dict):
                containers.append(_container(raw, i, init, errors))
    isolation = _enum_annotation(annotations, labels.ANN_ISOLATION, Isolation, Isolation.ANY, errors)
    topology = _enum_annotation(annotations, labels.ANN_TOPOLOGY, Topology, Topology.PREFER_NVLINK, errors)
    products: tuple[str, ...] = ()
    raw_products = annotations.get(labels.ANN_GPU_PRODUCT)
    if raw_products is not None:
        products = tuple(p.strip() for p in raw_products.split("|"))
        if not products or any(not p for p in products):
            errors.append(AskError("invalid-annotation", f"annotation {labels.ANN_GPU_PRODUCT}={raw_products!r}: "
                                   "expected products or models separated by '|', e.g. A100|H100", None,
                                   labels.ANN_GPU_PRODUCT))
            products = tuple(p for p in products if p)
    overhead = _overhead_native(spec)
    native_keys = sorted({k for c in containers for k in c.native} | set(overhead))
    return PodAsk(
        containers=tuple(containers),
        isolation=isolation,
        products=products,
        topology=topology,
        errors=tuple(errors),
        effective_milli=_effective(containers, lambda c: c.milli),
        effective_memory_bytes=_effective(containers, lambda c: c.memory_bytes),
        effective_native={k: _effective(containers, lambda c, k=k: c.native.get(k, 0), overhead.get(k, 0))
                          for k in native_keys},
    )


def from_canonical(raw: str) -> PodAsk | None:
    """The portable ask a pod was admitted with, from its ``gpu-tailor.io/ask`` annotation (``PodAsk.canonical``
    as JSON): for a pod whose GPU is a claim, its resources no longer say what it asked. None when the annotation
    cannot be read (absent, or not written by gpu-tailor)."""
    try:
        canonical = json.loads(raw)
        containers: dict[str, list[dict[str, Any]]] = {"initContainers": [], "containers": []}
        for key, want in canonical["containers"].items():
            init = key.startswith("init:")
            res = {}
            if "gpuMilli" in want:
                res[labels.GPU_MILLI] = str(int(want["gpuMilli"]))
            if "gpuMemory" in want:
                res[labels.GPU_MEMORY_RESOURCE] = str(want["gpuMemory"])
            containers["initContainers" if init else "containers"].append(
                {"name": key.removeprefix("init:"), "resources": {"limits": res}})
        annotations = {labels.ANN_ISOLATION: str(canonical.get("isolation", "any")),
                       labels.ANN_TOPOLOGY: str(canonical.get("topology", Topology.PREFER_NVLINK.value))}
        if canonical.get("products"):
            annotations[labels.ANN_GPU_PRODUCT] = "|".join(map(str, canonical["products"]))
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError, RecursionError):
        return None
    ask = from_pod({"metadata": {"annotations": annotations}, "spec": containers})
    return None if ask.errors or not ask.virtual else ask
