"""What the node's driver says of its GPUs, through NVML (``nvidia-ml-py``, imported as ``pynvml``): index,
UUID, PCI bus id, memory, MIG devices (their UUIDs name the GPU they are cut from) and NVLink peers.

NVML numbers GPUs as ``nvidia-smi`` does (PCI bus order), which is also the index the device plugin's
``index`` device-id strategy and ``nvidia.com/gpu.count`` refer to. A link whose far end is an NVSwitch
joins the GPU to the switch fabric: every GPU on the fabric reaches every other.

``read`` takes the module as an argument so that tests replay recorded answers through the same code;
``load`` imports the real one and says why not where there is no driver.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SWITCH = "switch"  # an NVLink peer that is an NVSwitch, not a GPU


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    uuid: str
    bus_id: str = ""
    memory_mib: int = 0
    healthy: bool = True
    reason: str = ""  # why not healthy
    mig: tuple[str, ...] = ()  # UUIDs of the MIG devices cut from it
    mig_enabled: bool = False  # MIG mode on (a GPU not cut yet offers the kubelet no device)
    peers: tuple[int, ...] = ()  # GPUs it reaches over NVLink (directly or through NVSwitch)


@dataclass(frozen=True, slots=True)
class Reading:
    gpus: tuple[Gpu, ...] = ()
    driver: str = ""
    problems: tuple[str, ...] = field(default=())


class NvmlUnavailable(Exception):
    """No NVML here (no driver, no library): the agent reports what the kubelet says alone."""


def load() -> Any:
    try:
        import pynvml
    except ImportError as exc:  # the image has it; a bare install may not
        raise NvmlUnavailable(f"nvidia-ml-py is not installed: {exc}") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML: {exc} (no NVIDIA driver on this node, or libnvidia-ml.so.1 not mounted)") from exc
    return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bus(value: Any) -> str:
    """PCI bus ids as NVML writes them vary in case and domain width: ``00000000:07:00.0`` and ``0000:07:00.0``."""
    text = _text(value).lower()
    domain, _, rest = text.partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else text


def read(nvml: Any) -> Reading:
    """Every GPU NVML sees, and problems met on the way (a GPU that cannot be read is reported unhealthy)."""
    problems: list[str] = []
    try:
        count = int(nvml.nvmlDeviceGetCount())
        driver = _text(nvml.nvmlSystemGetDriverVersion())
    except nvml.NVMLError as exc:
        return Reading(problems=(f"NVML: {exc}",))
    raw: list[tuple[int, str, str, int, tuple[str, ...] | None, list[str], bool, str]] = []
    for i in range(count):
        try:
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            uuid = _text(nvml.nvmlDeviceGetUUID(h))
            bus = _bus(nvml.nvmlDeviceGetPciInfo(h).busId)
            memory = int(nvml.nvmlDeviceGetMemoryInfo(h).total) // 2**20
        except nvml.NVMLError as exc:  # GPU_IS_LOST and the like: the GPU is there and unusable
            raw.append((i, "", "", 0, None, [], False, f"NVML: {exc}"))
            continue
        raw.append((i, uuid, bus, memory, _mig(nvml, h), _links(nvml, h), True, ""))
    by_bus = {bus: i for i, _, bus, *_ in raw if bus}
    fabric = {i for i, *_, links, ok, _ in raw if SWITCH in links}
    gpus: list[Gpu] = []
    for i, uuid, bus, memory, mig, links, ok, reason in raw:
        peers = {by_bus[b] for b in links if b in by_bus and by_bus[b] != i}
        if i in fabric:
            peers |= fabric - {i}
        unknown = [b for b in links if b != SWITCH and b not in by_bus]
        if unknown:
            problems.append(f"GPU {i}: NVLink to {', '.join(sorted(set(unknown)))}, which is no GPU NVML lists")
        gpus.append(Gpu(i, uuid, bus, memory, ok, reason, mig or (), mig_enabled=mig is not None,
                        peers=tuple(sorted(peers))))
    return Reading(tuple(gpus), driver, tuple(problems))


def _mig(nvml: Any, h: Any) -> tuple[str, ...] | None:
    """The UUIDs of the GPU's MIG devices; None when MIG mode is off (or the GPU cannot do MIG)."""
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(h)
    except nvml.NVMLError:  # not MIG-capable
        return None
    if current != nvml.NVML_DEVICE_MIG_ENABLE:
        return None
    out: list[str] = []
    for j in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(h))):
        try:
            out.append(_text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, j))))
        except nvml.NVMLError:  # NOT_FOUND: no MIG device in that slot
            continue
    return tuple(out)


def _links(nvml: Any, h: Any) -> list[str]:
    """The far end of each active NVLink: a GPU's PCI bus id, or ``SWITCH``."""
    out: list[str] = []
    for link in range(int(nvml.NVML_NVLINK_MAX_LINKS)):
        try:
            if nvml.nvmlDeviceGetNvLinkState(h, link) != nvml.NVML_FEATURE_ENABLED:
                continue
        except nvml.NVMLError:  # NOT_SUPPORTED (PCIe boards) or INVALID_ARGUMENT (no such link)
            continue
        try:
            kind = nvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, link)
        except (nvml.NVMLError, AttributeError):
            kind = None
        if kind == getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", object()):
            out.append(SWITCH)
            continue
        try:
            out.append(_bus(nvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId))
        except nvml.NVMLError:
            continue
    return out
