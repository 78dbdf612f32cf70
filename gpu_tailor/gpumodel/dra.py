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
  (``consumesCounters``: the whole GPU all of them, a MIG device its memory slices). A device can be allocated while
  no claim holds it and what the claims hold leaves its counters (``Usage.free``); carving a partition is what
  allocating its device does.

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


@dataclass
class Usage:
    """What allocated claims hold, summed: devices taken whole, memory consumed of shared ones, and, where the usage
    is counted against an inventory (``of(holds, inv)``), what the taken devices leave of their pools' counter sets
    (partitionable devices, KEP-4815)."""

    taken: set[Key] = field(default_factory=set)
    consumed: dict[Key, int] = field(default_factory=dict)
    left: dict[tuple[str, str, str], Fraction] = field(default_factory=dict)  # (pool, counter set, counter) -> amount
    counted: bool = False  # counted against an inventory's counter sets: else no counter is checked
    # how many holds take each device whole, and consume of each shared one: what ``add`` and ``remove`` count by
    holders: dict[Key, int] = field(default_factory=dict)
    sharers: dict[Key, int] = field(default_factory=dict)

    @classmethod
    def of(cls, holds: Iterable[ClaimHold], inv: DraInventory | None = None) -> Usage:
        usage = cls()
        if inv is not None:
            usage.counted = True
            for pool in inv.pools.values():
                for set_name, counters in pool.counter_sets.items():
                    for counter, amount in counters.items():
                        usage.left[(pool.name, set_name, counter)] = amount
        for hold in holds:
            usage.add(hold, inv)
        return usage

    def copy(self) -> Usage:
        return Usage(set(self.taken), dict(self.consumed), dict(self.left), self.counted, dict(self.holders),
                     dict(self.sharers))

    def scratch(self) -> Usage:
        """A copy to try allocations on (``take``, ``share``), without the counts ``add`` and ``remove`` need."""
        return Usage(set(self.taken), dict(self.consumed), dict(self.left), self.counted)

    def add(self, hold: ClaimHold, inv: DraInventory | None) -> None:
        """Count one more allocated claim's hold (its devices' counters against ``inv``'s pools)."""
        for key in hold.devices:
            n = self.holders.get(key, 0)
            self.holders[key] = n + 1
            if not n:
                self.taken.add(key)
                self._by_key(key, inv, -1)
        for key, memory in hold.consumed:
            self.consumed[key] = self.consumed.get(key, 0) + memory
            self.sharers[key] = self.sharers.get(key, 0) + 1

    def remove(self, hold: ClaimHold, inv: DraInventory | None) -> None:
        """Count one claim's hold no more (``add``'s inverse): a device is free once no hold has it."""
        for key in hold.devices:
            n = self.holders.get(key, 0)
            if n > 1:
                self.holders[key] = n - 1
            elif n:
                del self.holders[key]
                self.taken.discard(key)
                self._by_key(key, inv, 1)
        for key, memory in hold.consumed:
            n = self.sharers.get(key, 0)
            if n > 1:
                self.sharers[key] = n - 1
                self.consumed[key] -= memory
            elif n:
                del self.sharers[key]
                self.consumed.pop(key, None)

    def _by_key(self, key: Key, inv: DraInventory | None, sign: int) -> None:
        pool = inv.pools.get(key[1]) if inv is not None and self.counted else None
        device = pool.devices.get(key[2]) if pool is not None else None
        if device is not None:
            self._consume(device, sign)

    def _consume(self, device: DraDevice, sign: int = -1) -> None:
        """Take (``sign`` -1) or give back (+1) what ``device`` consumes of its pool's counter sets."""
        for set_name, counters in device.consumes:
            for counter, amount in counters:
                key = (device.pool, set_name, counter)
                self.left[key] = self.left.get(key, Fraction(0)) + sign * amount

    def share(self, device: DraDevice, memory: int) -> None:
        """Count ``memory`` of shared ``device`` consumed by one more claim."""
        self.consumed[device.key] = self.consumed.get(device.key, 0) + memory

    def take(self, device: DraDevice) -> None:
        """Count ``device`` taken whole by one more claim (what an allocation of it would do)."""
        self.taken.add(device.key)
        if self.counted:
            self._consume(device)

    def counters_allow(self, device: DraDevice) -> bool:
        """Whether what is left of the counter sets ``device`` consumes from holds it (True for a device that
        consumes none, and for a usage not counted against an inventory, which knows no counters)."""
        return not self.counted or all(self.left.get((device.pool, set_name, counter), 0) >= amount
                                       for set_name, counters in device.consumes for counter, amount in counters)

    def memory_left(self, device: DraDevice) -> int:
        """Memory of ``device`` no claim holds: all of it, none (taken whole, or its counters used up by partitions
        carved beside it), or what shared claims left."""
        if device.key in self.taken or not self.counters_allow(device):
            return 0
        return device.memory_bytes - self.consumed.get(device.key, 0)

    def free(self, device: DraDevice) -> bool:
        """Whether a claim could take ``device`` whole now."""
        return device.key not in self.taken and device.key not in self.consumed and self.counters_allow(device)


def can_carve(pool: DraPool, usage: Usage) -> dict[str, int]:
    """How many more of each partition the free counters of a pool's partitionable GPUs can still carve, each profile
    counted on its own (carving one takes from the others): ``{"1g.10gb": 5, "3g.40gb": 1, "whole GPU": 0}``, taken
    first fit in the pool's order, as the allocator would take them one after another. Empty for a pool without
    counter sets."""
    out: dict[str, int] = {}
    kinds: dict[str, list[DraDevice]] = {}
    for device in pool.devices.values():
        if device.consumes:
            kinds.setdefault(device.profile or "whole GPU", []).append(device)
    for kind, devices in kinds.items():
        left = usage.scratch()
        for device in devices:
            if left.free(device):
                left.take(device)
        out[kind] = sum(1 for d in devices if d.key in left.taken and d.key not in usage.taken)
    return out


def counted_memory(pool: DraPool, usage: Usage) -> tuple[int, int]:
    """Memory of a pool's partitionable GPUs (their counter sets' ``memory``), and what the carved partitions leave
    of it: what a list of the devices would count many times over."""
    total = sum((c.get("memory", Fraction(0)) for c in pool.counter_sets.values()), Fraction(0))
    left = sum((usage.left.get((pool.name, name, "memory"), c.get("memory", Fraction(0)))
                for name, c in pool.counter_sets.items()), Fraction(0))
    return int(total), int(left)


def carvable(pool: DraPool, usage: Usage) -> int:
    """What is still carvable of a pool's partitionable GPUs: for each counter set (a GPU), the most memory slices
    one free device consuming from it would take, summed. A 1g partition carved where this drops least leaves the
    larger profiles possible; 0 for a pool without counter sets."""
    best: dict[str, int] = {}
    for device in pool.devices.values():
        if not device.consumes or not usage.free(device):
            continue
        for set_name, counters in device.consumes:
            slices = sum(1 for counter, _ in counters if counter.startswith("memory-slice-"))
            best[set_name] = max(best.get(set_name, 0), slices)
    return sum(best.values())


@dataclass(frozen=True, slots=True)
class GpuColumn:
    """A node's DRA GPUs as a placement fleet row holds GPUs: the free share of each (milli, 1000 = idle), in the
    order kube-scheduler's allocator searches them (pool, then slice, then as the slice lists them), and whether
    they are shared devices (a claim consumes memory of one) or devices a claim takes whole. MIG devices are not in
    it: a GPU in MIG mode is not published whole."""

    free: tuple[int, ...]
    shared: bool
    product: str
    names: tuple[str, ...] = ()  # the devices, in the same order


def gpu_column(pools: Iterable[DraPool], usage: Usage) -> GpuColumn | None:
    """The GPUs of one node's pools (``DraInventory.on_node``) as a fleet row's column; None where it has none, or
    has both shared devices and devices taken whole (a row holds one kind)."""
    devices = [d for p in sorted(pools, key=lambda p: p.name) for d in p.devices.values() if d.type is DeviceType.GPU]
    kinds = {d.shared for d in devices}
    if len(kinds) != 1:
        return None
    free = tuple(max(0, usage.memory_left(d)) * 1000 // d.memory_bytes if d.shared else 1000 * usage.free(d)
                 for d in devices)
    return GpuColumn(free, kinds.pop(), devices[0].product, tuple(d.name for d in devices))


def allocated(claims: Iterable[dict[str, Any]], inv: DraInventory | None = None) -> Usage:
    """What allocated ResourceClaims hold of the driver's devices (counted against ``inv``'s counter sets, where
    given)."""
    return Usage.of((claim_hold(c) for c in claims), inv)


def smallest_holding(pools: Iterable[DraPool], memory_bytes: int, usage: Usage | None = None) -> DraDevice | None:
    """The free device with the least memory that still holds ``memory_bytes``: a MIG device before a whole GPU
    of the same memory (the slice leaves the rest of its GPU to others), ties by pool and name as the
    allocator searches."""
    usage = usage or Usage()
    fits = [d for p in pools for d in p.devices.values()
            if not d.shared and d.nominal_memory_bytes >= memory_bytes and usage.free(d)]
    if not fits:
        return None
    return min(fits, key=lambda d: (d.nominal_memory_bytes, d.type != DeviceType.MIG, d.pool, d.name))
