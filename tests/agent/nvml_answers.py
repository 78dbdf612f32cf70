"""NVML's answers for the agent's tests, replayed through ``gpu_tailor.agent.nvml.read`` by a stand-in ``pynvml``.

No GPU machine was available when these were written: the answers follow NVML's API reference (the calls the
agent makes, their return types, and the errors it documents -- NOT_SUPPORTED for NVLink on PCIe boards,
NOT_FOUND for an empty MIG slot, GPU_IS_LOST for a fallen-off GPU), for boards of the kinds the project serves.
Where a GPU machine is lent, ``test_nvml.py::test_the_real_driver`` reads the real one instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

NVML_FEATURE_ENABLED, NVML_FEATURE_DISABLED = 1, 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_NVLINK_DEVICE_TYPE_GPU, NVML_NVLINK_DEVICE_TYPE_SWITCH = 0, 2
NVML_NVLINK_MAX_LINKS = 18


class NVMLError(Exception):
    pass


class NotSupported(NVMLError):
    pass


class NotFound(NVMLError):
    pass


class GpuIsLost(NVMLError):
    pass


@dataclass
class Board:
    """One GPU as NVML would describe it."""

    uuid: str
    bus: str  # NVML writes the domain with 8 hex digits
    memory_mib: int = 81559
    links: list[tuple[int, str]] = field(default_factory=list)  # (device type, remote bus) per active link
    nvlink: bool = True  # False: NOT_SUPPORTED (a PCIe board)
    mig: list[str | None] | None = None  # MIG slots (None: empty); None: MIG not supported
    lost: bool = False


def hgx(n: int = 8, prefix: str = "GPU-a1") -> list[Board]:
    """An HGX H100 board: every GPU's 18 links go to the NVSwitches."""
    return [Board(f"{prefix}{i:02d}-0000-0000-0000-000000000000", f"00000000:{0x18 + 0x10 * i:02X}:00.0",
                  links=[(NVML_NVLINK_DEVICE_TYPE_SWITCH, "00000000:00:00.0")] * NVML_NVLINK_MAX_LINKS)
            for i in range(n)]


def pcie(n: int = 4) -> list[Board]:
    """T4s on PCIe: no NVLink at all."""
    return [Board(f"GPU-7400{i:04d}-0000-0000-0000-000000000000", f"00000000:{0x3B + i:02X}:00.0", 15360,
                  nvlink=False) for i in range(n)]


def pairs(n: int = 4) -> list[Board]:
    """A100 PCIe cards bridged in pairs (0-1, 2-3): 12 links to the partner GPU."""
    boards = [Board(f"GPU-a100{i:04d}-0000-0000-0000-000000000000", f"00000000:{0x41 + i:02X}:00.0", 40960)
              for i in range(n)]
    for i, b in enumerate(boards):
        b.links = [(NVML_NVLINK_DEVICE_TYPE_GPU, boards[i ^ 1].bus)] * 12
    return boards


class FakeNvml:
    """The parts of ``pynvml`` the agent calls, answering from ``boards``."""

    NVMLError = NVMLError
    NVML_FEATURE_ENABLED = NVML_FEATURE_ENABLED
    NVML_DEVICE_MIG_ENABLE = NVML_DEVICE_MIG_ENABLE
    NVML_NVLINK_DEVICE_TYPE_SWITCH = NVML_NVLINK_DEVICE_TYPE_SWITCH
    NVML_NVLINK_MAX_LINKS = NVML_NVLINK_MAX_LINKS

    def __init__(self, boards: list[Board], driver: str = "550.54.15") -> None:
        self.boards, self.driver = boards, driver

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        return len(self.boards)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Board:
        return self.boards[i]

    def nvmlDeviceGetUUID(self, h: Any) -> bytes:
        if isinstance(h, str):  # a MIG device's handle is its UUID here
            return h.encode()
        if h.lost:
            raise GpuIsLost("GPU is lost")
        uuid: str = h.uuid
        return uuid.encode()  # older bindings return bytes; the agent takes both

    def nvmlDeviceGetPciInfo(self, h: Board) -> Any:
        return type("PciInfo", (), {"busId": h.bus.encode()})()

    def nvmlDeviceGetMemoryInfo(self, h: Board) -> Any:
        return type("Memory", (), {"total": h.memory_mib * 2**20})()

    def nvmlDeviceGetMigMode(self, h: Board) -> list[int]:
        if h.mig is None:
            raise NotSupported("Not Supported")
        return [NVML_DEVICE_MIG_ENABLE, NVML_DEVICE_MIG_ENABLE]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Board) -> int:
        return len(h.mig or [])

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Board, j: int) -> str:
        found = (h.mig or [])[j]
        if found is None:
            raise NotFound("Not Found")
        return found

    def nvmlDeviceGetNvLinkState(self, h: Board, link: int) -> int:
        if not h.nvlink:
            raise NotSupported("Not Supported")
        return NVML_FEATURE_ENABLED if link < len(h.links) else NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: Board, link: int) -> int:
        return h.links[link][0]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: Board, link: int) -> Any:
        return type("PciInfo", (), {"busId": h.links[link][1]})()
