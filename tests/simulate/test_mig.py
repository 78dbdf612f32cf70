"""``gpu-tailor simulate --mig``: H100 nodes on DRA carved on demand (DynamicMIG) or cut into a static layout, the
single-GPU pods of a workload placed by gpu-tailor or by kube-scheduler alone (``simulate.mig``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_tailor.cli import main
from gpu_tailor.gpumodel.dra import read_slices
from gpu_tailor.gpumodel.fleet import MILLI, Shape
from gpu_tailor.gpumodel.mig import H100_80GB
from gpu_tailor.simulate.mig import pool_slices, run, share_ask, static_layout
from gpu_tailor.simulate.trace import TracePod
from tests.simulate.test_trace import small_trace


def test_static_layouts_are_mig_parteds_cut_at_valid_placements() -> None:
    assert static_layout(H100_80GB, "all-1g.10gb") == [("1g.10gb", s) for s in range(7)]
    assert static_layout(H100_80GB, "all-balanced") == [("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3),
                                                        ("3g.40gb", 4)]
    with pytest.raises(ValueError, match="unknown MIG layout"):
        static_layout(H100_80GB, "all-8g")


def test_a_dynamic_node_is_published_as_the_driver_publishes_it() -> None:
    inv = read_slices(pool_slices("n", 2, "dynamic"))
    assert inv.problems == []
    pool = inv.pools["n"]
    assert set(pool.counter_sets) == {"gpu-0-counter-set", "gpu-1-counter-set"}
    per_gpu = 1 + sum(len(p.placements) for p in H100_80GB.profiles)  # the whole GPU and every placement
    assert len(pool.devices) == 2 * per_gpu and pool.devices["gpu-1"].consumes[0][0] == "gpu-1-counter-set"
    static = read_slices(pool_slices("n", 2, "all-balanced")).pools["n"]
    assert not static.counter_sets and sorted({d.profile for d in static.devices.values()}) == [
        "1g.10gb", "2g.20gb", "3g.40gb"]


def pods(*milli: int) -> list[TracePod]:
    return [TracePod(f"p{i:03d}", Shape(1000, 1024, 1, m)) for i, m in enumerate(milli)]


def test_whole_gpu_asks_need_a_gpu_no_static_layout_publishes_whole() -> None:
    workload = pods(*([MILLI] * 6 + [300] * 6))
    assert share_ask(TracePod("multi", Shape(0, 0, 2, MILLI))) is None
    assert share_ask(workload[0], "shares") is None and share_ask(workload[-1], "shares") == 300
    dynamic = run("dynamic", "gpu-tailor", workload, 1, nodes=1, gpus=8, inflate=1.0)
    balanced = run("all-balanced", "gpu-tailor", workload, 1, nodes=1, gpus=8, inflate=1.0)
    assert dynamic.carved["whole GPU"] + dynamic.carved["7g.80gb"] >= 4  # whole GPUs, carved whole
    assert balanced.failed["1000m"] >= 4 and not {"whole GPU", "7g.80gb"} & set(balanced.carved)


def test_carving_where_the_larger_partitions_stay_possible_places_more_than_spreading() -> None:
    # two nodes of one H100, shares of a 1g, then whole GPUs: kube-scheduler alone spreads the 1g partitions one per
    # GPU and has no whole GPU left; gpu-tailor carves them on one
    workload = pods(100, 120, 130, MILLI)
    placed = {}
    for scheduler in ("gpu-tailor", "kube-default"):
        # the arrival order is the seed's shuffle: every seed, so that both see the same orders
        placed[scheduler] = sum(run("dynamic", scheduler, workload, seed, nodes=2, gpus=1, inflate=0.7).failed.total()
                                for seed in range(8))
    assert placed["gpu-tailor"] < placed["kube-default"]


def test_simulate_mig_prints_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes_csv, pods_csv = small_trace(tmp_path)
    assert main(["simulate", "--mig", "--mig-nodes", "2", "--pods", str(pods_csv), "--nodes", str(nodes_csv),
                 "--seeds", "42"]) == 0
    out = capsys.readouterr().out
    assert "2 nodes of 8 x H100 80GB on DRA" in out
    for row in ("dynamic", "all-1g.10gb", "all-balanced", "kube-default", "shares"):
        assert row in out
    for bad in (["--scheduler", "gpu-tailor"], ["--dra", "1"], ["--mig-nodes", "0"]):
        assert main(["simulate", "--mig", *bad]) == 2
        assert "--mig" in capsys.readouterr().err
