"""The agent's NVML reading (``agent.nvml.read``) on the answers of boards of each kind, and on the real driver
where there is one."""

from __future__ import annotations

import pytest

from gpu_tailor.agent import nvml
from tests.agent.nvml_answers import Board, FakeNvml, hgx, pairs, pcie


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
