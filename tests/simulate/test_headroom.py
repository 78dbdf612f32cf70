"""The GPU-only packing references printed under the simulator's table."""

from __future__ import annotations

import pytest

from gpu_tailor.gpumodel.fleet import Shape
from gpu_tailor.simulate.headroom import headroom
from gpu_tailor.simulate.trace import TraceNode


def gpus(count: int) -> list[TraceNode]:
    """One node with ``count`` GPUs, CPU and memory for anything these tests ask."""
    return [TraceNode("n0", 64000, 262144, count, "T4")]


def asks(*millis: int) -> list[Shape]:
    return [Shape(1000, 1024, 1, m) if m <= 1000 else Shape(1000, 1024, m // 1000, 1000) for m in millis]


def test_online_best_fit_cannot_undo_an_early_choice_that_offline_packing_avoids() -> None:
    # 300 opens a GPU, the second 300 joins it (best fit), the first 700 opens the other GPU and
    # the second 700 finds no room; knowing everything, 700+300 twice fills both GPUs
    ref = headroom(asks(300, 300, 700, 700), gpus(2))
    assert ref.online == pytest.approx(65.0)
    assert ref.offline == pytest.approx(100.0)


def test_best_fit_picks_the_gpu_with_least_left_over() -> None:
    # GPUs at 600 and 400 used; a 400 fits both, best fit takes the one with 400 free and so the
    # 600 still finds room
    assert headroom(asks(600, 400, 400, 600), gpus(2)).online == pytest.approx(100.0)


def test_only_asks_up_to_the_fleet_capacity_count() -> None:
    # 1000 + 500 + 500 reach 2000 milli = capacity; the final 1000 arrives after 100%
    ref = headroom(asks(500, 1000, 500, 1000), gpus(2))
    assert ref.online == pytest.approx(100.0) and ref.offline == pytest.approx(100.0)
    ref = headroom(asks(600, 2000), gpus(2))  # the 2-GPU ask would pass capacity: only the 600 counts
    assert ref.online == pytest.approx(30.0)


def test_whole_gpu_asks_need_idle_gpus() -> None:
    # three 600s open three of four GPUs, so the 2-GPU ask finds one idle GPU online; offline it
    # goes first and two of the 600s still fit
    ref = headroom(asks(600, 600, 600, 2000), gpus(4))
    assert ref.online == pytest.approx(45.0)
    assert ref.offline == pytest.approx(80.0)


def test_cpu_only_asks_do_not_count() -> None:
    ref = headroom([Shape(4000, 1024), *asks(1000)], gpus(1))
    assert ref.online == pytest.approx(100.0)


def test_asks_no_node_could_ever_hold_fail_here_too() -> None:
    # a 2-GPU ask on 1-GPU nodes, one wanting more CPU than any node has, and one for a model the
    # fleet lacks arrive (4000 milli = capacity) but can never be placed; only the last ask fits
    fleet = [TraceNode(f"n{i}", 8000, 65536, 1, "T4") for i in range(4)]
    impossible = [Shape(1000, 1024, 2, 1000), Shape(9000, 1024, 1, 500),
                  Shape(1000, 1024, 1, 500, frozenset({"V100"}))]
    ref = headroom([*impossible, Shape(1000, 1024, 1, 1000, frozenset({"T4"}))], fleet)
    assert ref.online == pytest.approx(25.0) and ref.offline == pytest.approx(25.0)
