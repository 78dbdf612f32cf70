"""Pair scores, set scores and best free sets, worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.fleet import MILLI, OTHER_NVLINK, Fleet
from gpu_tailor.gpumodel.inventory import from_node
from gpu_tailor.gpumodel.topology import GpuTopology, Link, infer, nvlink_pairs, nvswitch, pcie
from tests.conftest import node_fixture


def test_pcie_two_sockets() -> None:
    t = pcie(4)
    assert t.scores[0][1] == Link.SAME_CPU and t.scores[0][2] == Link.CROSS_CPU and t.scores[2][2] == 0
    assert t.set_score((0, 1, 2)) == 20 + 10 + 10


def test_nvswitch_all_pairs_nvlinked() -> None:
    t = nvswitch(8, lanes=18)
    assert t.scores[0][7] == 1800
    assert t.all_nvlinked(range(8))
    assert t.set_score((0, 1, 2, 3)) == 6 * 1800


def test_best_set_prefers_nvlink_pairs() -> None:
    t = nvlink_pairs(8, lanes=4)
    # free GPUs 1,2,3,5: the only NVLink pair among them is 2-3
    assert t.best_set([1, 2, 3, 5], 2) == (2, 3)
    # 4 of 0..7 all free: two NVLink pairs on one socket beat anything spanning sockets
    assert t.best_set(range(8), 4) == (0, 1, 2, 3)
    assert t.best_set([0, 1], 3) is None
    assert t.best_set([4, 2], 1) == (2,)


def test_largest_nvlink_set() -> None:
    pairs = nvlink_pairs(8)
    assert pairs.largest_nvlink_set([0, 2, 4, 6]) == 1
    assert pairs.largest_nvlink_set([0, 1, 4]) == 2
    assert nvswitch(8).largest_nvlink_set([0, 3, 5, 6]) == 4
    assert pcie(8).largest_nvlink_set([]) == 0


def test_greedy_path_for_large_nodes() -> None:
    t = nvlink_pairs(16)
    best = t.best_set(range(16), 8)  # C(16,8) = 12870: exhaustive; 32 GPUs forces greedy
    assert best is not None and len(best) == 8
    big = nvlink_pairs(32)
    chosen = big.best_set(range(32), 16)
    assert chosen is not None and len(chosen) == 16
    assert sum(1 for g in chosen if g ^ 1 in chosen) == 16  # greedy keeps NVLink pairs together


def test_inferred_platforms() -> None:
    hgx = from_node(node_fixture("h100-hgx-0"))
    assert infer(hgx.model, hgx.product.raw if hgx.product else "", hgx.gpu_count, hgx.labels).kind == "nvswitch"
    t4 = from_node(node_fixture("t4-timeslice-0"))
    assert infer(t4.model, "Tesla-T4", t4.gpu_count, t4.labels).kind == "pcie"
    assert infer("T4", "Tesla-T4", 4, {labels.TOPOLOGY_LABEL: "nvlink-pairs"}).kind == "nvlink-pairs"


@pytest.mark.parametrize(("model", "product", "count", "kind"), [
    ("A100", "NVIDIA-A100-SXM4-80GB", 8, "nvswitch"),
    ("H200", "NVIDIA-H200", 8, "nvswitch"),
    ("A100", "NVIDIA-A100-PCIE-40GB", 8, "pcie"),
    ("H100", "NVIDIA-H100-80GB-HBM3", 4, "pcie"),
])
def test_hgx_inference_needs_eight_sxm_gpus(model: str, product: str, count: int, kind: str) -> None:
    assert infer(model, product, count, {}).kind == kind


def test_fleet_answers_for_all_rows_what_the_device_plugin_pick_would() -> None:
    """``Fleet.nvlinked`` (vectorised by link shape) agrees with ``nvlink_set`` row by row."""
    ring = GpuTopology("ring", tuple(tuple(0 if a == b else 400 if (a - b) % 4 in (1, 3) else 20
                                           for b in range(4)) for a in range(4)))
    kinds = [nvswitch(8), nvlink_pairs(8), pcie(8), nvlink_pairs(4), nvswitch(2), ring, None]
    rng = np.random.default_rng(0)
    fleet = Fleet()
    for i in range(400):
        topo = kinds[i % len(kinds)]
        n = topo.size if topo is not None else 8
        fleet.upsert(f"n{i}", 1000, 1000, [int(x) for x in rng.choice([0, 500, MILLI, MILLI], n)], topology=topo)
    rows = fleet.rows()
    assert (fleet.link[rows] == OTHER_NVLINK).sum() == sum(kinds[i % len(kinds)] is ring for i in range(400))
    for k in range(0, 6):
        expected = [fleet.nvlink_set(int(r), k) is not None for r in rows]
        assert fleet.nvlinked(rows, k).tolist() == expected, k
    assert fleet.nvlinked(rows, 2).any() and not fleet.nvlinked(rows, 2).all()
