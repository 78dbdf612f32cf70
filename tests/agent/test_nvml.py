"""The agent's NVML reading (``agent.nvml.read``) on the answers of boards of each kind, on NVIDIA's mock NVML
(``k8s-test-infra``'s ``libnvidia-ml.so``, configured by its GPU profiles) where it is built, and on the real driver
where there is one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpu_tailor.agent import nvml
from tests.agent.nvml_answers import Board, FakeNvml, hgx, pairs, pcie
from tests.e2e import realnode


def test_an_hgx_board_is_one_nvswitch_fabric() -> None:
    r = nvml.read(FakeNvml(hgx()))
    assert [g.index for g in r.gpus] == list(range(8)) and r.driver == "550.54.15" and not r.problems
    assert all(g.peers == tuple(i for i in range(8) if i != g.index) for g in r.gpus)
    assert r.gpus[3].uuid.startswith("GPU-a103") and r.gpus[3].bus_id == "0000:48:00.0"
    assert r.gpus[0].memory_mib == 81559


def test_pcie_boards_have_no_peers_and_bridged_pairs_have_their_partner() -> None:
    assert [g.peers for g in nvml.read(FakeNvml(pcie())).gpus] == [(), (), (), ()]
    assert [g.peers for g in nvml.read(FakeNvml(pairs())).gpus] == [(1,), (0,), (3,), (2,)]


def test_mig_devices_name_their_gpu_and_a_lost_gpu_is_unhealthy() -> None:
    boards = pcie(3)
    boards[0].mig = ["MIG-1111", None, "MIG-2222"]  # an empty slot in between: NOT_FOUND
    boards[2].lost = True
    r = nvml.read(FakeNvml(boards))
    assert r.gpus[0].mig == ("MIG-1111", "MIG-2222") and r.gpus[1].mig == ()
    assert [g.healthy for g in r.gpus] == [True, True, False] and "GPU is lost" in r.gpus[2].reason


def test_a_link_to_no_listed_gpu_is_said() -> None:
    boards = pairs(2)
    boards[0].links = [(0, "00000000:99:00.0")]
    r = nvml.read(FakeNvml(boards))
    assert r.gpus[0].peers == () and r.problems == ("GPU 0: NVLink to 0000:99:00.0, which is no GPU NVML lists",)


def test_a_board_as_bytes_or_text_reads_the_same() -> None:
    one = Board("GPU-x", "00000000:0A:00.0", nvlink=False)
    assert nvml.read(FakeNvml([one])).gpus[0].bus_id == "0000:0a:00.0"


def test_the_real_driver() -> None:
    """Where NVML loads (a GPU machine), what it says must read without problems."""
    try:
        real = nvml.load()
    except nvml.NvmlUnavailable as exc:
        pytest.skip(f"no NVIDIA driver here: {exc}")
    r = nvml.read(real)
    assert r.gpus and r.driver and not r.problems
    assert all(g.uuid.startswith("GPU-") for g in r.gpus if g.healthy)


MOCK_READ = """
import json, sys
from gpu_tailor.agent import nvml
r = nvml.read(nvml.load())
json.dump({"driver": r.driver, "problems": list(r.problems), "gpus": [
    {"index": g.index, "uuid": g.uuid, "healthy": g.healthy, "peers": list(g.peers), "mig_enabled": g.mig_enabled,
     "memory_mib": g.memory_mib} for g in r.gpus]}, sys.stdout)
"""


def read_mock(profile: str, overrides: Path | None = None) -> dict[str, Any]:
    """``nvml.read`` in a process of its own (NVML is loaded once per process) on NVIDIA's mock NVML with one of
    its GPU profiles; skipped where the mock is not built (``tests/e2e/realnode.py`` says where it is looked for)."""
    lib, config = realnode.nvidia_home() / "bin" / "libnvidia-ml.so.1", realnode.mock_profile(profile)
    if not lib.is_file() or not config.is_file():
        pytest.skip(f"no mock NVML here: {lib} or {config} is absent")
    env = {**os.environ, "LD_LIBRARY_PATH": str(lib.parent), "MOCK_NVML_CONFIG": str(config)}
    if overrides is not None:
        env["MOCK_NVML_OVERRIDES"] = str(overrides)
    proc = subprocess.run([sys.executable, "-c", MOCK_READ], env=env, capture_output=True, text=True, timeout=60,
                          check=True)
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def test_nvidias_mock_hgx_board_is_one_nvswitch_fabric() -> None:
    """The mock's 8x H100 reports every NVLink as going to an NVSwitch (remote PCI FFFFFFFF:FF:FF.0): the GPUs are
    all each other's peers, as on a real HGX board."""
    r = read_mock("h100")
    assert r["driver"] and not r["problems"] and len(r["gpus"]) == 8
    assert all(g["peers"] == [i for i in range(8) if i != g["index"]] for g in r["gpus"])
    assert all(g["uuid"].startswith("GPU-") and g["healthy"] and g["memory_mib"] == 81920 for g in r["gpus"])


def test_nvidias_mock_t4s_are_on_pcie() -> None:
    r = read_mock("t4")
    assert not r["problems"] and [g["peers"] for g in r["gpus"]] == [[], [], [], []]


def test_nvidias_mock_in_mig_mode_and_a_lost_gpu(tmp_path: Path) -> None:
    """MIG mode on GPUs 0-3 and GPU 7 lost, through the mock's runtime overrides: the four in MIG mode read as such
    (the mock lists no MIG device in them), GPU 7 as unhealthy."""
    overrides = tmp_path / "overrides.yaml"
    mig = {"mig": {"mode_current": "enabled", "mode_pending": "enabled", "max_gpu_instances": 7}}
    overrides.write_text(json.dumps({"version": 1, "devices": {**{str(i): mig for i in range(4)},
                                                               "7": {"failure": {"mode": "lost"}}}}))
    r = read_mock("h100", overrides)
    assert [g["mig_enabled"] for g in r["gpus"][:7]] == [True] * 4 + [False] * 3
    assert [g["healthy"] for g in r["gpus"]] == [True] * 7 + [False]
