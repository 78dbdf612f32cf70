"""What allocated ResourceClaims hold of the devices of NVIDIA's DRA pools (``gpumodel.dra`` reads both), summed
in a ``Usage``: the devices taken whole, the memory consumed of shared ones, and what the taken devices leave of
their pools' counter sets (partitionable devices, KEP-4815). A device can be allocated while no claim holds it and
what the claims hold leaves its counters (``Usage.free``); carving a partition is what allocating its device does.

Read from it: what the partitionable GPUs can still carve (``can_carve``, ``carvable``), a node's GPUs as a
placement fleet row's column (``gpu_column``), and the smallest free device that holds an ask
(``smallest_holding``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from gpu_tailor.gpumodel.dra import ClaimHold, DeviceType, DraDevice, DraInventory, DraPool, Key, claim_hold


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
