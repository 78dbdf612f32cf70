"""The device interface: what every way of selling GPU capacity must answer, and the values it trades in.

A node sells its GPUs one way or another -- whole, as MIG instances, as time-sliced replicas, as MPS
replicas -- and each way is one ``Device`` (a module of this package), as HAMi's ``pkg/device`` gives
each vendor one home. A device answers four questions, and nothing outside this package asks them
with an ``if backing == ...``:

1. **Reading a node** (``read``): what the node's labels and allocatable say it offers.
2. **Offering it to the webhook** (``serves``, ``units_for``, ``nominal_memory_bytes``, ``declared``):
   whether a portable ask can be met by one of its units, and offerings of node pools not up yet.
3. **Counting and placing** (``units_refusal``, ``fit``, ``recorded``, ``fleet_share``): whether an
   ask fits given what is used, and which GPUs each unit takes.
4. **Writing the pod** (``pod_write``): resource name, backing annotation, node affinity and
   tolerations, as data the webhook turns into a JSONPatch.

Backing names are those of the webhook's config: ``whole``, ``mig``, ``time-slicing``, ``mps``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction
from typing import ClassVar

from gpu_tailor.gpumodel import labels, mig
from gpu_tailor.gpumodel.ask import ContainerAsk, Isolation
from gpu_tailor.gpumodel.occupancy import NodeGpus, Placement
from gpu_tailor.gpumodel.products import Product
from gpu_tailor.gpumodel.quantity import MIB, QuantityError, parse_count
from gpu_tailor.gpumodel.resources import WHOLE_GPU, NvidiaResource

# (label key, operator, values): a NodeSelectorRequirement
Requirement = tuple[str, str, tuple[str, ...]]
# (key, operator, effect): a toleration
Toleration = tuple[str, str, str]
# The GPU operator taints GPU nodes nvidia.com/gpu:NoSchedule; every GPU pod must tolerate it.
GPU_TOLERATION: Toleration = (labels.GPU_TAINT_KEY, "Exists", "NoSchedule")
# Pods routed to gpu-tailor's scheduler tolerate the taint that keeps every other scheduler off its GPU nodes.
MANAGED_TOLERATION: Toleration = (labels.MANAGED_TAINT_KEY, "Exists", "NoSchedule")


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
    RECONFIGURING = "reconfiguring"  # mig-manager is changing the MIG layout (nvidia.com/mig.config.state)
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
    per_gpu: int  # units on one physical GPU (MIG: as the node's layout cut it; 0 when it cannot be inferred)
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

    @property
    def device(self) -> str:
        """The name of the device that sells it (``whole``, ``mig``, ``time-slicing``, ``mps``)."""
        return self.sharing.value if self.backing is BackingKind.SHARED else self.backing.value


class UnitsRefusal(StrEnum):
    """Why one container's several units of a resource can never run where it is sold a given way."""

    AMBIGUOUS = "ambiguous"  # nvidia.com/gpu: N where that name sells slices: N GPUs were meant
    ONE_PER_CONTAINER = "one-per-container"  # the device plugin fails requests for more than one replica


@dataclass(frozen=True, slots=True)
class Fit:
    ok: bool
    reason: str = ""
    unresolvable: bool = False  # preemption cannot help
    placement: Placement | None = None


@dataclass(frozen=True, slots=True)
class PodWrite:
    """What the webhook writes on a pod it sends to an offering (it turns this into a JSONPatch)."""

    resource: str  # replaces the portable resources in requests and limits
    backing: str  # the gpu-tailor.io/backing annotation
    affinity: tuple[Requirement, ...]  # ANDed into every required nodeSelectorTerm
    tolerations: tuple[Toleration, ...] = (GPU_TOLERATION,)


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What every device reads from a Node: GPU labels and the NVIDIA resources it advertises."""

    labels: dict[str, str]
    alloc: dict[str, int]  # NVIDIA resource -> allocatable units
    product: Product | None
    sharing: Sharing  # nvidia.com/gpu.sharing-strategy
    replicas: int  # nvidia.com/gpu.replicas
    label_count: int | None  # nvidia.com/gpu.count
    label_memory: int  # nvidia.com/gpu.memory, MiB
    mig_strategy: str  # nvidia.com/mig.strategy as labelled
    problems: list[str] = field(default_factory=list)  # labels that could not be read (appended to)

    def int_label(self, key: str) -> int | None:
        return int_label(self.labels, key, self.problems)


def int_label(node_labels: dict[str, str], key: str, problems: list[str]) -> int | None:
    """A whole-number label; None when absent, or unreadable (then said in ``problems``)."""
    value = node_labels.get(key)
    if value is None:
        return None
    try:
        return parse_count(value)
    except QuantityError:
        problems.append(f"label {key}={value!r} is not a whole number")
        return None


@dataclass(frozen=True, slots=True)
class Reading:
    """What a device makes of a node it sells from."""

    offerings: tuple[Offering, ...]
    gpu_count: int  # physical GPUs
    gpu_memory_mib: int  # per physical GPU
    expected_units: int | None  # what the labels say the device plugin should advertise (None: unknown)
    available_units: int  # what it advertises
    units_per_gpu: int = 1  # to turn missing units into missing GPUs; 0: only units can be compared
    mig_strategy: str = "none"  # none | single | mixed, as the node really sells
    health: Health | None = None  # a verdict the device settles itself (invalid MIG)


@dataclass(frozen=True, slots=True)
class DeclaredSpec:
    """An offering the webhook's config declares for a node pool not up yet (see ``webhook.config``)."""

    backing: str
    product: str
    mig_profile: str | None = None
    mig_strategy: str = "mixed"
    replicas: int | None = None
    renamed: bool = False
    fail_requests_gt_one: bool = False
    gpu_memory_mib: int = 0  # per GPU
    gpus_per_node: int = 1
    node_selector: tuple[tuple[str, str], ...] = ()


class Device(ABC):
    name: ClassVar[str]  # the backing's name in the webhook's config
    sells_whole_gpus: ClassVar[bool] = False  # N units are N whole GPUs

    # --- reading a node ----------------------------------------------------------------------------
    @abstractmethod
    def read(self, node: NodeFacts) -> Reading | None:
        """The node's offerings when it sells this way, else None."""

    @abstractmethod
    def selects(self, offering: Offering, mig_strategy: str) -> tuple[Requirement, ...]:
        """Node requirements, besides the product, that keep a pod on nodes selling ``offering`` this way."""

    # --- offering it to the webhook ----------------------------------------------------------------
    @abstractmethod
    def isolations(self, offering: Offering) -> frozenset[Isolation]:
        """The ``gpu-tailor.io/isolation`` values (besides ``any``) a unit of ``offering`` satisfies."""

    def serves(self, isolation: Isolation, offering: Offering) -> bool:
        return isolation is Isolation.ANY or isolation in self.isolations(offering)

    def nominal_memory_bytes(self, offering: Offering) -> int:
        """Memory a unit is sold as (what a ``gpu-tailor.io/gpu-memory`` ask is compared with)."""
        return offering.memory_mib * MIB

    def units_for(self, container: ContainerAsk, offering: Offering) -> int | None:
        """Units of ``offering`` that meet one container's portable ask, or None when none can."""
        gpus = container.whole_gpus
        if gpus:  # several whole GPUs: only whole backings; memory is per GPU
            if not self.sells_whole_gpus or container.memory_bytes > offering.memory_mib * MIB:
                return None
            return gpus
        if offering.fraction < Fraction(container.milli, 1000):
            return None
        if container.memory_bytes > self.nominal_memory_bytes(offering):
            return None
        return 1

    def units_add_up(self, offering: Offering) -> bool:
        """Whether N units give N times one unit's GPU (not so for replicas: they share one GPU's time)."""
        return offering.sharing is Sharing.NONE

    @abstractmethod
    def declared(self, spec: DeclaredSpec) -> tuple[Offering, PodWrite]:
        """What one node of a declared pool would sell (``allocatable``: the most per node), and its pod write."""

    def declared_problem(self, spec: DeclaredSpec) -> str | None:
        """Why ``spec`` cannot be declared this way (a config error), or None."""
        if spec.mig_profile:
            return f"migProfile is only for backing mig, not {self.name}"
        if spec.replicas is not None:
            return f"replicas is only for time-slicing or mps, not {self.name}"
        return None

    # --- counting and placing ----------------------------------------------------------------------
    @staticmethod
    def count_refusal(offering: Offering, used: int, units: int) -> Fit | None:
        """Kubernetes counts units per node: too few left of ``offering`` is a refusal, else None."""
        left = offering.allocatable - used
        if left < units:
            return Fit(False, f"{offering.label}: {max(0, left)} of {offering.allocatable} free")
        return None

    def units_refusal(self, resource: str, units: int, sharing: Sharing,
                      fails_more_than_one: bool = False) -> UnitsRefusal | None:
        """Whether ``units`` of ``resource`` asked by one container can run where it is sold this way.

        The webhook (admit or deny) and the extender (filter) both ask this, so that a pod the webhook
        admits is one the extender can place. The device plugin allocates per container.

        * Names that only ever sell replicas or MIG instances: N units are N replicas or instances,
          which the device plugin hands out from any GPUs with free ones.
        * ``nvidia.com/gpu`` is the portable way to ask for GPUs. Where it sells slices (replicas without
          ``renameByDefault``, single-strategy MIG devices), N > 1 would be N slices, not the N GPUs the
          pod was written for: AMBIGUOUS. One unit stays fine: a pod asking for "a GPU" gets one slice.
        * More than one replica fails at the kubelet where the sharing config sets
          ``failRequestsGreaterThanOne``, which MPS always does (MPS-shared MIG devices included).
        """
        if units <= 1:
            return None
        if not self.sells_whole_gpus and resource == str(WHOLE_GPU):
            return UnitsRefusal.AMBIGUOUS
        if sharing is Sharing.MPS or (sharing is not Sharing.NONE and fails_more_than_one):
            return UnitsRefusal.ONE_PER_CONTAINER
        return None

    @abstractmethod
    def fit(self, offering: Offering, gpus: NodeGpus, used: int, units: int, nvlink: bool = False,
            place: bool = True) -> Fit:
        """Whether ``units`` more fit a node selling ``offering`` that has ``used`` units taken and ``gpus``
        as its per-GPU picture; with ``place``, the GPUs each unit would get."""

    @abstractmethod
    def recorded(self, offering: Offering, gpus: NodeGpus, used: int, units: int,
                 annotation: tuple[int, ...] | None) -> Placement:
        """Where a bound pod's ``units`` sit: the GPUs bind recorded (``gpu-tailor.io/gpus``), else predicted."""

    @abstractmethod
    def fleet_share(self, offering: Offering, units: int, nvlink: bool) -> tuple[int, int, bool]:
        """The pod as the placement fleet sees it: (GPUs, milli-GPU on each, whether NVLink matters)."""

    # --- writing the pod ---------------------------------------------------------------------------
    def pod_write(self, offering: Offering, product: str, mig_strategy: str) -> PodWrite:
        """Resource, backing and node requirements for a pod sent to ``offering`` on nodes of ``product``."""
        reqs: list[Requirement] = [(labels.GPU_PRODUCT, "In", (product,))] if product else []
        return PodWrite(str(offering.resource), offering.label, (*reqs, *self.selects(offering, mig_strategy)))
