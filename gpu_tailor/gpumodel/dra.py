"""GPUs published through Dynamic Resource Allocation by NVIDIA's DRA driver (``gpu.nvidia.com``): the devices
of each node's pools, read from ResourceSlices (``resource.k8s.io/v1``), and which of them allocated
ResourceClaims hold. The inventory layer of DRA pools (docs/admin.md, "DRA pools"): asks are routed to these
devices by ``gpumodel/devices/dra.py``.

What the driver publishes (kubernetes-sigs/dra-driver-nvidia-gpu, ``cmd/gpu-kubelet-plugin/deviceinfo.go`` and
``mig.go``; ``../shared/docs/dra-facts.md`` in this project's workspace has the details and sources):

- a whole GPU: device ``gpu-<minor>``, attributes ``type`` = "gpu", ``uuid``, ``productName``, ``brand``,
  ``architecture``, versions; capacity ``memory`` in bytes;
- a MIG device: ``gpu-<parentMinor>-mig-<profile>-<giProfileID>-<placementStart>``, attributes ``type`` = "mig",
  ``parentUUID``, ``profile`` (such as "1g.12gb"), ``uuid`` where it is created already; capacities ``memory``,
  ``multiprocessors`` and engine counts. With static MIG (the default) a GPU in MIG mode is not published whole.
- with the driver's DynamicMIG, partitionable devices (KEP-4815): per GPU a counter set ``gpu-<minor>-counter-set``
  (a counter per capacity, and ``memory-slice-<i>`` = 1 per memory slice) in the pool's ``sharedCounters``, and
  the whole GPU plus every MIG profile at every placement, each consuming its counters from the set
  (``consumesCounters``: the whole GPU all of them, a MIG device its memory slices). What allocated claims leave
  of the counters, and so which devices can still be allocated, is ``gpumodel.dra_usage``'s.

A pool is the driver's name for the devices of one node here, and may span several slices: only the slices of
its highest ``generation`` count, and until ``resourceSliceCount`` of them are seen the pool is incomplete (the
scheduler then allocates from it anyway, but may miss devices). Attribute names may be written bare or
qualified with the driver's domain (``gpu.nvidia.com/type``); both mean the same.

Nothing here raises on odd input: what cannot be read is reported in ``problems`` and left out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction
from typing import Any

from gpu_tailor.gpumodel.mig import parse_profile_name
from gpu_tailor.gpumodel.quantity import GIB, QuantityError, parse_bytes, parse_quantity

DRIVER = "gpu.nvidia.com"
API_GROUP = "resource.k8s.io"


class DeviceType(StrEnum):
    GPU = "gpu"
    MIG = "mig"


@dataclass(frozen=True, slots=True)
class DraDevice:
    """One device of a pool, as a claim would be allocated it: ``(driver, pool, name)`` names it."""

    pool: str
    name: str
    type: DeviceType
    memory_bytes: int
    product: str = ""
    profile: str = ""  # MIG devices: "1g.12gb"
    uuid: str = ""
    parent_uuid: str = ""  # MIG devices: the GPU they are cut from
    shared: bool = False  # ``allowMultipleAllocations``: several claims share it, each taking some ``memory``
    consumes: tuple[tuple[str, tuple[tuple[str, Fraction], ...]], ...] = ()  # (counter set, ((counter, amount), ...))

    @property
    def key(self) -> tuple[str, str, str]:
        return (DRIVER, self.pool, self.name)

    @property
    def nominal_memory_bytes(self) -> int:
        """The memory an ask is compared with: a MIG profile's name is its GiB class (``1g.10gb`` holds a ``10Gi``
        ask although the driver reports 9.75 GiB), as on device-plugin pools; else the published capacity."""
        parsed = parse_profile_name(self.profile) if self.type is DeviceType.MIG else None
        return max(self.memory_bytes, parsed.memory_gb * GIB) if parsed is not None else self.memory_bytes

    @property
    def fraction(self) -> Fraction:
        """The share of a GPU's compute the device is: ``g/7`` for a MIG device (NVIDIA's 7-slice GPUs), 1 whole."""
        parsed = parse_profile_name(self.profile) if self.type is DeviceType.MIG else None
        return Fraction(min(parsed.compute_slices, 7), 7) if parsed is not None else Fraction(1)


@dataclass
class DraPool:
    node: str
    name: str
    generation: int
    slice_count: int
    devices: dict[str, DraDevice] = field(default_factory=dict)
    slices_seen: int = 0
    counter_sets: dict[str, dict[str, Fraction]] = field(default_factory=dict)  # KEP-4815 ``sharedCounters``

    @property
    def complete(self) -> bool:
        return self.slices_seen >= self.slice_count


@dataclass
class DraInventory:
    """Every pool of the driver, by node, and what could not be read."""

    pools: dict[str, DraPool] = field(default_factory=dict)  # by pool name
    problems: list[str] = field(default_factory=list)
    _by_node: dict[str, list[DraPool]] | None = None

    def _index(self) -> dict[str, list[DraPool]]:
        if self._by_node is None:  # built on first use: the pools are not changed once read
            self._by_node = {}
            for p in self.pools.values():
                self._by_node.setdefault(p.node, []).append(p)
        return self._by_node

    def on_node(self, node: str) -> list[DraPool]:
        return list(self._index().get(node, ()))

    def nodes(self) -> set[str]:
        return set(self._index())


def _attribute(attributes: dict[str, Any], name: str) -> Any:
    """A device attribute's value, its name bare or qualified with the driver's domain; None when absent."""
    raw = attributes.get(name, attributes.get(f"{DRIVER}/{name}"))
    if not isinstance(raw, dict) or len(raw) != 1:
        return None
    return next(iter(raw.values()))


def _capacity(capacity: dict[str, Any], name: str) -> int | None:
    raw = capacity.get(name, capacity.get(f"{DRIVER}/{name}"))
    value = raw.get("value") if isinstance(raw, dict) else None
    return parse_bytes(value) if value is not None else None


def read_device(pool: str, raw: Any) -> DraDevice | str:
    """One published device, or why it cannot be read."""
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        return f"pool {pool}: a device without a name"
    name = raw["name"]
    consumes = _consumption(raw.get("consumesCounters"))
    if isinstance(consumes, str):
        return f"pool {pool}, device {name}: consumesCounters: {consumes}"
    if consumes and raw.get("allowMultipleAllocations") is True:
        return (f"pool {pool}, device {name}: a shared device that also consumes counters is not modelled (NVIDIA's "
                "driver publishes none); left out")
    attributes = raw.get("attributes") or {}
    capacity = raw.get("capacity") or {}
    if not isinstance(attributes, dict) or not isinstance(capacity, dict):
        return f"pool {pool}, device {name}: attributes and capacity must be objects"
    kind = _attribute(attributes, "type")
    if kind not in (DeviceType.GPU, DeviceType.MIG):
        return f"pool {pool}, device {name}: type {kind!r} is neither 'gpu' nor 'mig'"
    try:
        memory = _capacity(capacity, "memory")
    except QuantityError as exc:
        return f"pool {pool}, device {name}: memory: {exc}"
    if memory is None or memory <= 0:
        return f"pool {pool}, device {name}: no memory capacity"

    def text(attr: str) -> str:
        value = _attribute(attributes, attr)
        return value if isinstance(value, str) else ""

    return DraDevice(pool, name, DeviceType(kind), memory, text("productName"), text("profile"), text("uuid"),
                     text("parentUUID"), raw.get("allowMultipleAllocations") is True, consumes)


def _counters(raw: Any) -> dict[str, Fraction] | str:
    """``{name: {value: quantity}}`` as exact amounts (bytes for memory, plain numbers else), or what is wrong."""
    if not isinstance(raw, dict) or not raw:
        return "expected counters as {name: {value: quantity}}"
    out = {}
    for name, counter in raw.items():
        value = counter.get("value") if isinstance(counter, dict) else None
        try:
            out[str(name)] = parse_quantity(value)
        except QuantityError:
            return f"counter {name}: not a quantity"
        if out[str(name)] < 0:
            return f"counter {name}: negative"
    return out


def _consumption(raw: Any) -> tuple[tuple[str, tuple[tuple[str, Fraction], ...]], ...] | str:
    """A device's ``consumesCounters``, or what is wrong with it."""
    if not raw:
        return ()
    if not isinstance(raw, list):
        return "expected a list"
    out = []
    for entry in raw:
        name = entry.get("counterSet") if isinstance(entry, dict) else None
        counters = _counters(entry.get("counters")) if isinstance(entry, dict) else "expected an object"
        if not isinstance(name, str) or not name or isinstance(counters, str):
            return f"counter set {name!r}: {counters if isinstance(counters, str) else 'no name'}"
        out.append((name, tuple(sorted(counters.items()))))
    return tuple(out)


def read_slices(slices: Iterable[dict[str, Any]]) -> DraInventory:
    """The driver's pools from ResourceSlices (any order, other drivers' slices ignored): per pool only the
    slices of its highest generation; node-local pools only (a slice without ``nodeName`` is reported)."""
    inv = DraInventory()
    mine = []
    for s in slices:
        spec = s.get("spec") if isinstance(s, dict) else None
        if isinstance(spec, dict) and spec.get("driver") == DRIVER:
            mine.append((str((s.get("metadata") or {}).get("name", "")), spec))
    mine.sort(key=lambda named: named[0])  # a pool's devices in the allocator's order: by slice name, as listed
    newest: dict[str, int] = {}
    for _, spec in mine:
        pool = spec.get("pool") or {}
        if isinstance(pool, dict) and isinstance(pool.get("name"), str) and isinstance(pool.get("generation"), int):
            newest[pool["name"]] = max(newest.get(pool["name"], pool["generation"]), pool["generation"])
    for slice_name, spec in mine:
        pool_spec = spec.get("pool") or {}
        name = pool_spec.get("name") if isinstance(pool_spec, dict) else None
        if not isinstance(name, str) or name not in newest:
            inv.problems.append(f"slice {slice_name}: no pool name and generation")
            continue
        if pool_spec["generation"] != newest[name]:
            continue  # superseded: the driver is replacing this pool's slices
        node = spec.get("nodeName")
        if not isinstance(node, str) or not node:
            inv.problems.append(f"slice {slice_name}: not local to one node (no nodeName); left out")
            continue
        count = pool_spec.get("resourceSliceCount")
        pool = inv.pools.setdefault(name, DraPool(node, name, newest[name], count if isinstance(count, int) else 1))
        if pool.node != node:
            inv.problems.append(f"slice {slice_name}: pool {name} is on node {pool.node}, this slice says {node}")
            continue
        pool.slices_seen += 1
        counter_sets, devices = spec.get("sharedCounters") or [], spec.get("devices") or []
        if not isinstance(counter_sets, list) or not isinstance(devices, list):
            inv.problems.append(f"slice {slice_name}: sharedCounters and devices must be lists; left out")
            continue
        for counter_set in counter_sets:
            set_name = counter_set.get("name") if isinstance(counter_set, dict) else None
            counters = _counters(counter_set.get("counters")) if isinstance(counter_set, dict) else "not an object"
            if not isinstance(set_name, str) or isinstance(counters, str) or set_name in pool.counter_sets:
                why = counters if isinstance(counters, str) else "no name, or defined twice"
                inv.problems.append(f"slice {slice_name}: counter set {set_name!r} of pool {name}: {why}; left out")
            else:
                pool.counter_sets[set_name] = counters
        for raw in devices:
            device = read_device(name, raw)
            if isinstance(device, str):
                inv.problems.append(f"slice {slice_name}: {device}")
            elif device.name in pool.devices:
                inv.problems.append(f"slice {slice_name}: device {device.name} published twice in pool {name}")
            else:
                pool.devices[device.name] = device
    for pool in inv.pools.values():
        for device in list(pool.devices.values()):  # a device whose counter set the pool lacks is never allocated
            missing = [c for c, _ in device.consumes if c not in pool.counter_sets]
            if missing:
                del pool.devices[device.name]
                inv.problems.append(f"pool {pool.name}: device {device.name} consumes counter set "
                                    f"{', '.join(missing)}, which the pool does not define; left out")
        if not pool.complete:
            inv.problems.append(f"pool {pool.name} on {pool.node}: {pool.slices_seen} of {pool.slice_count} slices "
                                "seen (the driver is still publishing it)")
    return inv


Key = tuple[str, str, str]  # (driver, pool, device), as an allocation result names a device


@dataclass(frozen=True, slots=True)
class ClaimHold:
    """What one allocated ResourceClaim holds of the driver's devices: devices it has alone, and memory it
    consumes of shared ones (``consumedCapacity``)."""

    devices: tuple[Key, ...] = ()
    consumed: tuple[tuple[Key, int], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.devices or self.consumed)


def claim_hold(claim: Any) -> ClaimHold:
    """The devices of ``gpu.nvidia.com`` an allocated claim holds (``status.allocation.devices.results``); an empty
    hold for a claim not allocated yet or one of other drivers."""
    status = claim.get("status") if isinstance(claim, dict) else None
    allocation = status.get("allocation") if isinstance(status, dict) else None
    devices = allocation.get("devices") if isinstance(allocation, dict) else None
    alone: list[Key] = []
    consumed: list[tuple[Key, int]] = []
    for result in (devices.get("results") if isinstance(devices, dict) else None) or []:
        if not (isinstance(result, dict) and result.get("driver") == DRIVER
                and all(isinstance(result.get(k), str) for k in ("pool", "device"))):
            continue
        if result.get("adminAccess") is True:  # monitoring access: the allocator does not count it as held
            continue
        key = (DRIVER, result["pool"], result["device"])
        taken = result.get("consumedCapacity")
        memory = taken.get("memory", taken.get(f"{DRIVER}/memory")) if isinstance(taken, dict) else None
        if result.get("shareID") or memory is not None:
            try:
                consumed.append((key, parse_bytes(memory) if memory is not None else 0))
            except QuantityError:
                consumed.append((key, 0))
        else:
            alone.append(key)
    return ClaimHold(tuple(alone), tuple(consumed))
