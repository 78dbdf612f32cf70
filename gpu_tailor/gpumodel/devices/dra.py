"""GPUs sold through Dynamic Resource Allocation: how a portable ask is written as a ResourceClaim for NVIDIA's DRA
driver (``gpu.nvidia.com``), and which device the scheduler's allocator would give it now.

This backing is not a ``Device`` of ``base``: a DRA pool sells nothing through ``status.allocatable`` and
kube-scheduler's DynamicResources plugin, not the device plugin, picks the device. What gpu-tailor decides is the
claim. A pod's portable ask becomes one ResourceClaimTemplate (the pod references it in ``spec.resourceClaims``, and
each GPU container names its request in ``resources.claims``); each container's request is a ``firstAvailable``
list of alternatives, *rungs*, smallest first, as choosing on device-plugin pools orders offerings: the least share
of a GPU taken, then the least memory left over. The allocator tries the rungs in order on each node, so on every
node the pod gets the smallest device there that holds it, and the scheduler's DynamicResources score (and
gpu-tailor's extender) prefer nodes where an earlier rung fits.

A rung selects devices by what identifies them, never by a memory comparison the allocator would make differently:
a MIG profile (``3g.20gb``: its name is its GiB class, as on device-plugin pools), or a product for whole GPUs.
Rungs of three kinds:

- ``mig``: a MIG device of DeviceClass ``mig.nvidia.com``, for isolation ``any`` or ``mig``;
- ``shared``: a GPU its driver publishes with ``allowMultipleAllocations`` (consumable capacity, KEP-5075): the
  claim requests ``memory`` of it, so the allocator, not a promise, keeps the pods on it within the GPU; the
  claim's opaque ``GpuConfig`` asks the driver to share it by time-slicing (or MPS for isolation ``mps``). NVIDIA's
  driver today publishes no shared GPU: more than one pod per GPU is written only where a pool says it shares;
- ``gpu``: whole GPUs (DeviceClass ``gpu.nvidia.com``), for isolation ``any`` or ``exclusive``; the only kind
  for an ask of whole GPUs.

Sources: kubernetes-sigs/dra-driver-nvidia-gpu (DeviceClasses in its Helm chart, ``GpuConfig`` in
``api/nvidia.com/resource/v1beta1``), ``resource.k8s.io/v1`` types (``firstAvailable`` at most 8 alternatives,
``DeviceSubRequest.capacity``); ``../shared/docs/dra-facts.md`` in this project's workspace.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import deque
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from enum import StrEnum
from fractions import Fraction
from typing import Any

from gpu_tailor.gpumodel.ask import ContainerAsk, Isolation, PodAsk, Topology
from gpu_tailor.gpumodel.dra import (
    DRIVER,
    ClaimHold,
    DeviceType,
    DraDevice,
    DraInventory,
    Usage,
    carvable,
    claim_hold,
    read_slices,
)
from gpu_tailor.gpumodel.fleet import Shape
from gpu_tailor.gpumodel.products import normalise
from gpu_tailor.gpumodel.quantity import MIB, format_bytes

GPU_CLASS = "gpu.nvidia.com"  # DeviceClass names of NVIDIA's chart
MIG_CLASS = "mig.nvidia.com"
CLAIM = "gpu-tailor"  # the pod's ``spec.resourceClaims`` entry
TEMPLATE_PREFIX = "gpu-tailor-"
MAX_RUNGS = 8  # firstAvailable holds at most 8 alternatives (resource.k8s.io/v1)
CHANGES = 4096  # the changes DraState.changed_since can look back on; further back, every node counts as changed
SHARING_API = "resource.nvidia.com/v1beta1"


class RungKind(StrEnum):
    MIG = "mig"
    SHARED = "shared"
    GPU = "gpu"


_KIND_ORDER = {RungKind.MIG: 0, RungKind.SHARED: 1, RungKind.GPU: 2}


@dataclass(frozen=True, slots=True)
class Rung:
    """One alternative of a container's request: ``count`` devices of one kind and identity."""

    kind: RungKind
    identity: str  # the MIG profile, or the GPU's productName
    memory_bytes: int  # the least nominal memory of a device of it
    consumed: Fraction  # share of a GPU the container takes on it
    spare: int  # memory held beyond the ask
    count: int = 1
    request_bytes: int = 0  # shared: memory the claim consumes of the GPU
    products: tuple[str, ...] = ()  # MIG: the products it may come from, where the ask names products
    split_shared: bool = False  # some pool shares GPUs: a whole-GPU rung must not select a shared one

    @property
    def name(self) -> str:
        """A DNS label naming the rung in the claim (``mig-3g-20gb``, ``gpu-nvidia-h100-80gb-hbm3``)."""
        slug = re.sub(r"[^a-z0-9]+", "-", self.identity.lower()).strip("-") or "any"
        return f"{self.kind.value}-{slug}"[:63].rstrip("-")

    def matches(self, device: DraDevice) -> bool:
        if self.kind is RungKind.MIG:
            return device.type is DeviceType.MIG and device.profile == self.identity and (
                not self.products or device.product in self.products)
        return (device.type is DeviceType.GPU and device.shared == (self.kind is RungKind.SHARED)
                and device.product == self.identity)

    def describe(self) -> str:
        what = {RungKind.MIG: f"MIG {self.identity}", RungKind.SHARED: f"{format_bytes(self.request_bytes)} of a "
                f"shared {self.identity}", RungKind.GPU: f"{self.count} x {self.identity}"}[self.kind]
        return f"{what} ({format_bytes(self.memory_bytes)})"

    def subrequest(self) -> dict[str, Any]:
        attr = f"device.attributes['{DRIVER}']"
        if self.kind is RungKind.MIG:
            cel = f"{attr}.profile == {_cel_string(self.identity)}"
            if self.products:
                cel += f" && {attr}.productName in [{', '.join(map(_cel_string, self.products))}]"
        else:
            # ``allowMultipleAllocations`` is known to CEL only where consumable capacity is on (beta from 1.36;
            # alpha and off in 1.34 and 1.35, where naming it fails the template): named only where a pool shares
            cel = f"{attr}.productName == {_cel_string(self.identity)}"
            if self.kind is RungKind.SHARED:
                cel += " && device.allowMultipleAllocations"
            elif self.split_shared:
                cel += " && !device.allowMultipleAllocations"
        out: dict[str, Any] = {"name": self.name, "deviceClassName": MIG_CLASS if self.kind is RungKind.MIG
                               else GPU_CLASS, "selectors": [{"cel": {"expression": cel}}],
                               "allocationMode": "ExactCount", "count": self.count}
        if self.kind is RungKind.SHARED:
            out["capacity"] = {"requests": {"memory": f"{self.request_bytes // MIB}Mi"}}
        return out


def _cel_string(value: str) -> str:
    return json.dumps(value)  # a CEL string literal: double quotes, backslash escapes


def _ceil_mib(value: Fraction) -> int:
    return -(-value // MIB) * MIB if value > 0 else 0


def _product_ok(products: tuple[str, ...], product: str) -> bool:
    if not products:
        return True
    p = normalise(product.replace(" ", "-"))
    return any(p.matches(w) for w in products)


def _rung(kind: RungKind, identity: str, devices: list[DraDevice], container: ContainerAsk,
          isolation: Isolation, products: tuple[str, ...]) -> Rung | None:
    """The rung of these devices that meets ``container``, or None when they cannot."""
    memory = min(d.nominal_memory_bytes for d in devices)
    want = container.memory_bytes
    whole = container.whole_gpus
    if kind is RungKind.MIG:
        fraction = min(d.fraction for d in devices)
        if whole or isolation not in (Isolation.ANY, Isolation.MIG) or memory < want \
                or fraction < Fraction(container.milli, 1000):
            return None
        named = tuple(sorted({d.product for d in devices})) if products else ()
        return Rung(kind, identity, memory, fraction, memory - want, products=named)
    if kind is RungKind.SHARED:
        if whole or isolation not in (Isolation.ANY, Isolation.TIME_SLICING, Isolation.MPS):
            return None
        need = _ceil_mib(max(Fraction(want), Fraction(container.milli, 1000) * memory))  # whole MiB, never less
        if need > memory:
            return None
        return Rung(kind, identity, memory, Fraction(need, memory), need - want, request_bytes=need)
    if isolation not in (Isolation.ANY, Isolation.EXCLUSIVE) or memory < want:
        return None
    count = whole or 1
    return Rung(kind, identity, memory, Fraction(count), memory * count - want * count, count=count)


def rungs(container: ContainerAsk, isolation: Isolation, products: tuple[str, ...], inv: DraInventory,
          classes: Iterable[str] = (GPU_CLASS, MIG_CLASS)) -> list[Rung]:
    """Every way the cluster's DRA pools can meet one container, smallest first (at most ``MAX_RUNGS``); only
    kinds whose DeviceClass exists."""
    have = set(classes)
    groups: dict[tuple[RungKind, str], list[DraDevice]] = {}
    for pool in inv.pools.values():
        for d in pool.devices.values():
            if not _product_ok(products, d.product):
                continue
            if d.type is DeviceType.MIG:
                if MIG_CLASS in have and d.profile:
                    groups.setdefault((RungKind.MIG, d.profile), []).append(d)
            elif GPU_CLASS in have and d.product:
                groups.setdefault((RungKind.SHARED if d.shared else RungKind.GPU, d.product), []).append(d)
    split = any(kind is RungKind.SHARED for kind, _ in groups)
    found = [replace(r, split_shared=split) for (kind, identity), devices in groups.items()
             if (r := _rung(kind, identity, devices, container, isolation, products)) is not None]
    found.sort(key=lambda r: (r.consumed, r.spare, _KIND_ORDER[r.kind], r.identity))
    return found[:MAX_RUNGS]


@dataclass(frozen=True, slots=True)
class Pick:
    """The devices the allocator would give a container now: its rung (position in the list) and the devices, the
    first one first."""

    rung: Rung
    position: int
    device: DraDevice
    devices: tuple[DraDevice, ...]

    @property
    def node_pool(self) -> str:
        return self.device.pool


@dataclass(frozen=True, slots=True)
class DraChoice:
    """A portable ask written for DRA: the ResourceClaimTemplate, each container's request, and what it gets now."""

    template: dict[str, Any]  # a ResourceClaimTemplate without its namespace
    requests: dict[str, str]  # container key ("init:" + name for init containers) -> request name
    rungs: dict[str, tuple[Rung, ...]]
    picks: dict[str, Pick | None]
    consumed: Fraction
    spare: int

    @property
    def name(self) -> str:
        return str(self.template["metadata"]["name"])

    @property
    def free_now(self) -> bool:
        return all(p is not None for p in self.picks.values())

    @property
    def backing(self) -> str:
        """The ``gpu-tailor.io/backing`` value: ``dra`` and the first container's best rung now."""
        first = next(iter(self.picks.values()), None)
        rung = first.rung if first is not None else next(iter(self.rungs.values()))[0]
        return f"dra:{rung.name}"


@dataclass(frozen=True, slots=True)
class DraRefusal:
    message: str


def container_key(container: ContainerAsk) -> str:
    return ("init:" if container.init else "") + container.name


Ladders = dict[str, tuple[Rung, ...]]  # request-owning container key -> its rungs, smallest first


def ladders_for(ask: PodAsk, isolation: Isolation, inv: DraInventory,
                classes: tuple[str, ...] = (GPU_CLASS, MIG_CLASS)) -> tuple[dict[str, str], Ladders] | DraRefusal:
    """Each portable container's request name, and the rungs of each request, or why no DRA device can serve.

    One request per app container and sidecar; a plain init container (it runs before the app containers, never
    beside them) uses the request of an app container whose ask holds its own, else one of its own."""
    containers = [c for c in ask.gpu_containers if c.virtual]
    if not inv.pools:
        return DraRefusal("no node that takes pods publishes GPUs through DRA (no ResourceSlices of gpu.nvidia.com)")
    if any(c.native for c in ask.gpu_containers) or any(ask.effective_native.values()):
        return DraRefusal("the pod also asks for device-plugin resources (nvidia.com/*), which DRA pools do not sell")
    owners = [c for c in containers if not c.init or c.sidecar]
    requests: dict[str, str] = {}
    ladders: Ladders = {}
    for c in [*owners, *(c for c in containers if c not in owners)]:
        host = next((o for o in owners if not o.init and o.milli >= c.milli and o.memory_bytes >= c.memory_bytes
                     and o.whole_gpus >= c.whole_gpus), None) if c.init and not c.sidecar else None
        if host is not None:
            requests[container_key(c)] = requests[container_key(host)]
            continue
        if c.whole_gpus > 1 and ask.topology is Topology.NVLINK:
            return DraRefusal(f"container {c.name}: {c.whole_gpus} GPUs joined by NVLink, but NVIDIA's DRA driver "
                              "publishes no NVLink topology to select them by")
        found = rungs(c, isolation, ask.products, inv, classes)
        if not found:
            return DraRefusal(f"container {c.name}: {_no_rung(c, isolation, ask.products, inv, classes)}")
        key = container_key(c)
        requests[key] = f"gpu-{len(ladders)}"
        ladders[key] = tuple(found)
    return requests, ladders


def choose(ask: PodAsk, isolation: Isolation, inv: DraInventory, usage: Usage,
           classes: Iterable[str] = (GPU_CLASS, MIG_CLASS),
           nodes: AbstractSet[str] | None = None) -> DraChoice | DraRefusal:
    """The claim that meets every portable container of ``ask`` on the cluster's DRA pools, or why none can.

    What the claim gets now is what the allocator would give on the best node (``claim_preference``): one claim's
    devices are all on the pod's node. ``nodes``: the nodes that take pods (not cordoned), when known; other nodes'
    pools are left out."""
    if nodes is not None:
        inv = DraInventory({n: p for n, p in inv.pools.items() if p.node in nodes}, inv.problems)
    planned = ladders_for(ask, isolation, inv, tuple(classes))
    if isinstance(planned, DraRefusal):
        return planned
    requests, ladders = planned
    best: tuple[tuple[int, Fraction, int, int], str, dict[str, Pick | None]] | None = None
    for node in sorted(inv.nodes()):
        picks = node_picks(ladders, inv, usage, node)
        if picks is not None:
            pref = _preference(picks, on_node(inv, node), usage)
            if best is None or (pref, node) < best[:2]:
                best = (pref, node, picks)
    picks = best[2] if best is not None else dict.fromkeys(ladders)
    template = claim_template({k: requests[k] for k in ladders}, ladders, isolation)
    chosen = [p.rung if p is not None else ladders[k][0] for k, p in picks.items()]
    return DraChoice(template, requests, ladders, picks, sum((r.consumed for r in chosen), Fraction(0)),
                     sum(r.spare for r in chosen))


def _picks(ladders: dict[str, tuple[Rung, ...]], inv: DraInventory, usage: Usage) -> dict[str, Pick | None]:
    """For each container, the earliest rung with a device free now in some pool, and the device the allocator
    would take there (the first free one the pool publishes), in the pool with the fewest such devices free (the
    fullest: what the extender prefers). Containers are served in turn from what the earlier ones left."""
    left = usage.scratch()
    out: dict[str, Pick | None] = {}
    for key, ladder in ladders.items():
        out[key] = None
        for position, rung in enumerate(ladder):
            best: tuple[int, str, list[DraDevice]] | None = None
            for pool in inv.pools.values():
                free = [d for d in pool.devices.values() if rung.matches(d) and (
                    left.memory_left(d) >= rung.request_bytes if rung.kind is RungKind.SHARED else left.free(d))]
                if len(free) >= rung.count and (best is None or (len(free), pool.name) < best[:2]):
                    best = (len(free), pool.name, free)
            if best is not None:
                taken: list[DraDevice] = []
                for d in best[2]:  # one by one, as the allocator does: partitions of one GPU share its counters
                    if len(taken) == rung.count:
                        break
                    if rung.kind is RungKind.SHARED or left.free(d):
                        _allocate(left, rung, d)
                        taken.append(d)
                if len(taken) < rung.count:
                    continue
                out[key] = Pick(rung, position, taken[0], tuple(taken))
                break
    return out


def _allocate(usage: Usage, rung: Rung, device: DraDevice) -> None:
    """Count ``device`` allocated to a request of ``rung``: its memory share where the rung shares, else all of it."""
    if rung.kind is RungKind.SHARED:
        usage.share(device, rung.request_bytes)
    else:
        usage.take(device)


def allocate(usage: Usage, pick: Pick) -> None:
    """Count what ``pick`` would be allocated in ``usage``, as the allocator's allocation of it will."""
    for device in pick.devices:
        _allocate(usage, pick.rung, device)


def fleet_shape(ladders: Ladders, cpu_milli: int, memory_mib: int) -> tuple[Shape, bool] | None:
    """A claim as a placement fleet's shape, where one holds it whatever node it lands on, and whether it is a share of
    a shared device: one request whose every rung takes the same number of whole GPUs, or the same share of a shared
    GPU (its memory in thousandths of the device's, rounded down as ``dra.gpu_column`` rounds what is left, so that
    a device the claim fills exactly is seen to hold it); None for anything else (MIG rungs, several requests, rungs
    of several kinds), which is ranked by ``claim_preference`` instead."""
    if len(ladders) != 1:
        return None
    ladder = next(iter(ladders.values()))
    kinds = {r.kind for r in ladder}
    if kinds == {RungKind.GPU} and len({r.count for r in ladder}) == 1:
        return Shape(cpu_milli, memory_mib, ladder[0].count, 1000), False
    if kinds == {RungKind.SHARED} and len({r.consumed for r in ladder}) == 1:
        consumed = ladder[0].consumed
        return Shape(cpu_milli, memory_mib, 1, max(1, consumed.numerator * 1000 // consumed.denominator)), True
    return None


def claim_template(requests: dict[str, str], ladders: dict[str, tuple[Rung, ...]],
                   isolation: Isolation) -> dict[str, Any]:
    """The ResourceClaimTemplate (without namespace) for these requests; its name is a digest of its spec, so the
    same ask on the same pools names the same template."""
    strategy = "MPS" if isolation is Isolation.MPS else "TimeSlicing"
    devices: dict[str, Any] = {"requests": [{"name": requests[key], "firstAvailable": [r.subrequest() for r in ladder]}
                                            for key, ladder in ladders.items()]}
    shared = [f"{requests[key]}/{r.name}" for key, ladder in ladders.items() for r in ladder
              if r.kind is RungKind.SHARED]
    if shared:
        devices["config"] = [{"requests": shared, "opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": SHARING_API, "kind": "GpuConfig", "sharing": {"strategy": strategy}}}}]
    spec = {"spec": {"devices": devices}}
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": TEMPLATE_PREFIX + digest,
                         "labels": {"app.kubernetes.io/managed-by": "gpu-tailor"}},
            "spec": spec}


def _no_rung(container: ContainerAsk, isolation: Isolation, products: tuple[str, ...], inv: DraInventory,
             classes: tuple[str, ...]) -> str:
    needs = []
    if container.whole_gpus:
        needs.append(f"{container.whole_gpus} whole GPUs")
    elif container.milli:
        needs.append(f"{container.milli} milli-GPU")
    if container.memory_bytes:
        needs.append(f"{format_bytes(container.memory_bytes)} of GPU memory")
    head = f"needs {' and '.join(needs)}"
    if isolation is not Isolation.ANY:
        head += f" with isolation {isolation.value}"
    devices = [d for p in inv.pools.values() for d in p.devices.values() if _product_ok(products, d.product)]
    if products and not devices:
        return f"{head}; no DRA device is a {'|'.join(products)}"
    missing = [c for c in (GPU_CLASS, MIG_CLASS) if c not in classes]
    if missing:
        head += f" (DeviceClass {', '.join(missing)} does not exist)"
    if not devices:
        return f"{head}; no DRA device can be allocated"
    big = max(devices, key=lambda d: (d.nominal_memory_bytes, d.fraction))
    kind = f"MIG {big.profile}" if big.type is DeviceType.MIG else big.product
    return f"{head}; the largest DRA device is {kind} ({format_bytes(big.nominal_memory_bytes)})"


@dataclass
class DraState:
    """What a service keeps of DRA from the API: the driver's slices, each allocated claim's hold, the DeviceClasses
    that exist (and the extended resources they serve, KEP-5004). ``inventory`` and ``usage`` are recomputed only
    after a change. ``enabled`` is False where the API server serves no ``resource.k8s.io/v1``."""

    enabled: bool = True
    slices: dict[str, dict[str, Any]] = field(default_factory=dict)  # by name
    holds: dict[str, ClaimHold] = field(default_factory=dict)  # claim uid -> ClaimHold
    classes: dict[str, str] = field(default_factory=dict)  # DeviceClass name -> its extendedResourceName ("")
    synced: set[str] = field(default_factory=set)  # "slices", "claims", "classes" once listed
    version: int = 0  # counts changes to the slices, the claims' holds and the classes
    layout: int = 0  # counts changes to the slices and the classes alone: what each node's pools are and serve
    _inventory: DraInventory | None = None
    _usage: Usage | None = None
    # (version, the nodes whose devices' use it changed, or None: any node may have changed), the last CHANGES of them
    _changes: deque[tuple[int, frozenset[str] | None]] = field(default_factory=lambda: deque(maxlen=CHANGES))
    _free: dict[str, int] = field(default_factory=dict)  # node -> whole GPUs free there (``free_gpus``)

    KINDS = ("slices", "claims", "classes")

    def _changed(self, nodes: frozenset[str] | None = None) -> None:
        self.version += 1
        self._changes.append((self.version, nodes))
        if nodes is None:
            self.layout += 1
            self._free.clear()
        else:
            for node in nodes:
                self._free.pop(node, None)

    def free_gpus(self, node: str) -> int:
        """The GPUs a claim could take whole on ``node`` now (devices of type gpu, not shared, not held), kept until
        a change reaches the node."""
        free = self._free.get(node)
        if free is None:
            usage = self.usage()
            free = self._free[node] = sum(1 for p in self.inventory().on_node(node) for d in p.devices.values()
                                          if d.type is DeviceType.GPU and not d.shared and usage.free(d))
        return free

    def changed_since(self, version: int) -> set[str] | None:
        """The nodes whose DRA devices or their use changed after ``version``: an allocated or released claim
        changes its devices' nodes alone. None where any node may have (slices or classes changed, or ``version`` is
        older than the changes kept)."""
        if version == self.version:
            return set()
        if not self._changes or self._changes[0][0] > version + 1:
            return None
        out: set[str] = set()
        for at, nodes in reversed(self._changes):
            if at <= version:
                break
            if nodes is None:
                return None
            out |= nodes
        return out

    @property
    def ready(self) -> bool:
        return not self.enabled or self.synced >= set(self.KINDS)

    def inventory(self) -> DraInventory:
        if self._inventory is None:
            self._inventory = read_slices(self.slices.values())
        return self._inventory

    def usage(self) -> Usage:
        if self._usage is None:
            self._usage = Usage.of(self.holds.values(), self.inventory())  # counted against the pools' counters
        return self._usage

    def extended(self) -> dict[str, str]:
        """Extended resource -> the DeviceClass that serves it through DRA on nodes that do not sell it."""
        return {r: c for c, r in sorted(self.classes.items()) if r}

    def reset_slices(self, items: list[dict[str, Any]]) -> None:
        self.slices = {_name(s): s for s in items if _driver(s) == DRIVER}
        self.synced.add("slices")
        self._inventory = self._usage = None
        self._changed()

    def apply_slice(self, event: str, obj: dict[str, Any]) -> None:
        name = _name(obj)
        if event == "DELETED" or _driver(obj) != DRIVER:
            if self.slices.pop(name, None) is None:
                return
        else:
            self.slices[name] = obj
        self._inventory = self._usage = None
        self._changed()

    def reset_claims(self, items: list[dict[str, Any]]) -> None:
        self.holds = {_uid(c): h for c in items if (h := claim_hold(c))}
        self.synced.add("claims")
        self._usage = None
        self._changed()

    def apply_claim(self, event: str, obj: dict[str, Any]) -> None:
        hold = claim_hold(obj) if event != "DELETED" else None
        before = self.holds.pop(_uid(obj), None)
        if hold:
            self.holds[_uid(obj)] = hold
        if before == (hold or None):
            return
        if self._usage is not None:  # this claim alone counted again, on a copy: a usage handed out stays as it was
            usage, inv = self._usage.copy(), self.inventory()
            if before:
                usage.remove(before, inv)
            if hold:
                usage.add(hold, inv)
            self._usage = usage
        pools = self.inventory().pools
        self._changed(frozenset(pools[pool].node for h in (before, hold) if h
                                for _, pool, _ in (*h.devices, *(key for key, _ in h.consumed)) if pool in pools))

    def reset_classes(self, items: list[dict[str, Any]]) -> None:
        self.classes = dict(filter(None, map(_device_class, items)))
        self.synced.add("classes")
        self._changed()

    def apply_class(self, event: str, obj: dict[str, Any]) -> None:
        entry = _device_class(obj)
        if entry is None:
            return
        if event == "DELETED":
            self.classes.pop(entry[0], None)
        else:
            self.classes[entry[0]] = entry[1]
        self._changed()


def _name(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _uid(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}")


def _driver(obj: dict[str, Any]) -> Any:
    spec = obj.get("spec")
    return spec.get("driver") if isinstance(spec, dict) else None


def _device_class(obj: dict[str, Any]) -> tuple[str, str] | None:
    name = _name(obj)
    if not name:
        return None
    spec = obj.get("spec")
    resource = spec.get("extendedResourceName") if isinstance(spec, dict) else None
    return name, resource if isinstance(resource, str) else ""


def on_node(inv: DraInventory, node: str) -> DraInventory:
    """The pools of one node."""
    return DraInventory({p.name: p for p in inv.on_node(node)})


def node_picks(ladders: dict[str, tuple[Rung, ...]], inv: DraInventory, usage: Usage,
               node: str) -> dict[str, Pick | None] | None:
    """What the allocator would give each container on ``node`` now; None where it cannot allocate the claim."""
    picks = _picks(ladders, on_node(inv, node), usage)
    return picks if picks and all(p is not None for p in picks.values()) else None


def claim_preference(ladders: dict[str, tuple[Rung, ...]], inv: DraInventory, usage: Usage,
                     node: str) -> tuple[int, Fraction, int, int] | None:
    """How much a claim pod of these ladders should like ``node`` (lower is better), as choosing orders offerings:
    the earliest rungs the allocator would take there (the smallest devices), then the share of a GPU taken, then, on
    partitionable GPUs (DynamicMIG), how much the carve takes of the larger partitions still possible there (a 1g
    partition where a 3g or 4g can still be carved after it beats one where none can), then the devices the node's
    pools keep free after it (fewer first: fill a node before opening another, so whole GPUs and whole nodes stay
    whole). None where the claim cannot be allocated there now."""
    picks = node_picks(ladders, inv, usage, node)
    return _preference(picks, on_node(inv, node), usage) if picks is not None else None


def _preference(picks: dict[str, Pick | None], pools: DraInventory, usage: Usage) -> tuple[int, Fraction, int, int]:
    """``claim_preference`` of picks that all found a device on the node of ``pools``: the rungs' positions, the share
    of a GPU taken, what the carve takes of the larger partitions still possible (``carvable``; 0 where no device is
    partitionable), and the devices left free."""
    chosen = [p for p in picks.values() if p is not None]
    after = usage.scratch()
    for pick in chosen:
        allocate(after, pick)
    loss = sum(carvable(p, usage) - carvable(p, after) for p in pools.pools.values())
    free = sum(1 for p in pools.pools.values() for d in p.devices.values() if after.free(d))
    return (sum(p.position for p in chosen), sum((p.rung.consumed for p in chosen), Fraction(0)), loss, free)


def native_preference(dra: DraState, node: str, units: int) -> int | None:
    """For ``units`` whole GPUs of an extended resource a DeviceClass serves (KEP-5004) on ``node``: the GPUs its
    pools keep free after them (fewer first: best fit), or None when fewer than ``units`` are free."""
    free = dra.free_gpus(node)
    return free - units if free >= units else None
