"""The rungs of a claim for NVIDIA's DRA driver: the alternatives, smallest first, that a container's
``firstAvailable`` request lists (``devices.dra`` writes the claim), each selecting the devices of one kind and
identity in the cluster's DRA pools, and why none meets a container where none does (``no_rung``).

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

Sources: those of ``devices/dra.py``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import StrEnum
from fractions import Fraction
from typing import Any

from gpu_tailor.gpumodel.ask import ContainerAsk, Isolation
from gpu_tailor.gpumodel.dra import DRIVER, DeviceType, DraDevice, DraInventory
from gpu_tailor.gpumodel.products import normalise
from gpu_tailor.gpumodel.quantity import MIB, format_bytes

GPU_CLASS = "gpu.nvidia.com"  # DeviceClass names of NVIDIA's chart
MIG_CLASS = "mig.nvidia.com"
MAX_RUNGS = 8  # firstAvailable holds at most 8 alternatives (resource.k8s.io/v1)


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


def no_rung(container: ContainerAsk, isolation: Isolation, products: tuple[str, ...], inv: DraInventory,
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
