"""``gpu-tailor simulate --scheduler``: kube-scheduler alone against kube-scheduler with gpu-tailor, on a cluster dump
or on trace nodes (``simulate.kube``, ``simulate.cluster``)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import yaml

from gpu_tailor.cli import main
from gpu_tailor.extender.scores import node_order
from gpu_tailor.gpumodel.fleet import MILLI, Shape
from gpu_tailor.gpumodel.occupancy import ReplicaPolicy
from gpu_tailor.gpumodel.policies import POLICIES
from gpu_tailor.simulate.cli import time_sliced
from gpu_tailor.simulate.cluster import from_dump
from gpu_tailor.simulate.kube import DEFAULT_EXTENDER_WEIGHT, KubeModel, SimNode, SimPod, run
from gpu_tailor.simulate.trace import TraceNode, build_fleet
from tests.conftest import FIXTURES
from tests.simulate.test_trace import small_trace

DUMP = FIXTURES / "cluster" / "control-plane-dump.json"
REPO = Path(__file__).resolve().parents[2]


def hgx(name: str) -> SimNode:
    return SimNode(TraceNode(name, 96_000, 1_000_000, 8, "H100"))


def test_the_default_weight_is_the_one_the_manifest_ships() -> None:
    config = yaml.safe_load(yaml.safe_load((REPO / "manifests" / "scheduler" / "configmap.yaml").read_text())
                            ["data"]["config.yaml"])
    assert config["extenders"][0]["weight"] == DEFAULT_EXTENDER_WEIGHT


def test_the_dump_becomes_nodes_the_model_can_hold_and_says_what_it_leaves_out() -> None:
    dumped = from_dump(str(DUMP))
    nodes = {n.name: (n.node.gpus, n.replicas) for n in dumped.nodes}
    assert nodes == {"h100-hgx-0": (8, 0), "t4-timeslice-0": (4, 4), "t4-timeslice-renamed-0": (4, 4),
                     "v100-mps-0": (1, 10), "cpu-node-0": (0, 0)}
    assert set(dumped.left_out_nodes) == {"a100-mig-mixed-0", "a100-mig-single-0", "h100-degraded-0",
                                          "h100-initializing-0"}
    assert "MIG" in dumped.left_out_nodes["a100-mig-mixed-0"]
    assert dumped.left_out_nodes["h100-degraded-0"].startswith("degraded")
    shapes = {p.name: p.shape for p in dumped.pods}
    assert shapes["team-a/hold-two-0"].gpus == 2 and shapes["team-a/hold-two-0"].milli == MILLI
    # rewritten to one of four time-sliced replicas; the ask it was admitted with (250 milli) is what replays
    assert (shapes["team-a/pod-d-gpu-milli-1"].gpus, shapes["team-a/pod-d-gpu-milli-1"].milli) == (1, 250)
    assert shapes["gpu-tailor/gpu-tailor-webhook-86dd575f4c-b9srs"] == Shape(100, 128)
    assert "team-a/pod-h-mig-1g5gb-4" not in shapes
    assert dumped.left_out_pods == {"asks for MIG slices": 1}


def test_simulate_on_the_fixture_dump_prints_both_schedulers(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "runs.json"
    assert main(["simulate", "--cluster-file", str(DUMP), "--seeds", "42,43", "--json", str(runs)]) == 0
    out = capsys.readouterr().out
    written = json.loads(runs.read_text())["runs"]
    assert sorted((r["scheduler"], r["seed"]) for r in written) == [("gpu-tailor", 42), ("gpu-tailor", 43),
                                                                     ("kube-default", 42), ("kube-default", 43)]
    assert all(0 < r["alloc"]["100"] <= 100 and r["largest_node_gpus"] == 8 for r in written)
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()[:1] in (["kube-default"],
                                                                                                ["gpu-tailor"])}
    assert set(rows) == {"kube-default", "gpu-tailor"}
    assert rows["gpu-tailor"][1] == "tailor" and rows["kube-default"][2] == "2"  # policy, seeds
    assert "node a100-mig-mixed-0 left out: a MIG pool" in out
    assert "1 pod(s) left out of the workload: asks for MIG slices" in out
    assert "whole 8-GPU nodes free" in out
    assert "3 of them time-sliced or MPS, replicas handed out distributed)" in out  # the dump's nodes: no label
    assert main(["simulate", "--cluster-file", str(DUMP), "--seeds", "42", "--replica-policy", "packed"]) == 0
    assert "replicas handed out packed)" in capsys.readouterr().out


def test_packed_replicas_fill_a_gpu_before_the_next_distributed_spread_them() -> None:
    """What the model leaves on a time-sliced node of 4 GPUs after six one-replica pods, by policy."""
    for policy, left in ((ReplicaPolicy.DISTRIBUTED, [500, 500, 750, 750]),
                         (ReplicaPolicy.PACKED, [0, 500, 1000, 1000]), (ReplicaPolicy.SPREAD, [500, 500, 750, 750])):
        node = SimNode(TraceNode("ts", 64000, 262144, 4, "T4"), 4, policy)
        fleet = build_fleet([node.node], "none", 1)
        kube = KubeModel(fleet, fleet.rows(), [node], 1)
        for i in range(6):
            kube.place(0, SimPod(f"p{i}", Shape(1000, 1024, 1, 250), fractional=True), ())
        assert fleet.gpu[0, :4].tolist() == left, policy


def test_a_dump_with_nothing_to_simulate_on_is_refused_with_the_reasons(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(DUMP.read_text())
    data["items"] = [i for i in data["items"] if i["kind"] != "Node" or "mig" in i["metadata"]["name"]]
    dump = tmp_path / "mig-only.json"
    dump.write_text(json.dumps(data))
    assert main(["simulate", "--cluster-file", str(dump)]) == 2
    err = capsys.readouterr().err
    assert "no node to simulate on" in err and "a100-mig-mixed-0 left out: a MIG pool" in err
    assert main(["simulate", "--cluster-file", str(tmp_path / "absent.json")]) == 2
    assert "absent.json" in capsys.readouterr().err


def test_a_dump_whose_pods_ask_for_no_gpu_needs_a_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(DUMP.read_text())
    data["items"] = [i for i in data["items"] if i["kind"] != "Pod" or i["metadata"]["namespace"] == "gpu-tailor"]
    dump = tmp_path / "no-gpu-pods.json"
    dump.write_text(json.dumps(data))
    assert main(["simulate", "--cluster-file", str(dump)]) == 2
    assert "no pod asks for a GPU" in capsys.readouterr().err
    _, pods_csv = small_trace(tmp_path)  # a workload from elsewhere on the dump's nodes
    assert main(["simulate", "--cluster-file", str(dump), "--pods", str(pods_csv)]) == 0
    assert "kube-default" in capsys.readouterr().out


def test_bad_flags_get_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--scheduler", "volcano"])
    assert "invalid choice: 'volcano'" in capsys.readouterr().err
    assert main(["simulate", "--scheduler", "gpu-tailor", "--time-sliced", "1.5"]) == 2
    assert "--time-sliced" in capsys.readouterr().err
    assert main(["simulate", "--scheduler", "gpu-tailor", "--extender-weight", "0"]) == 2
    assert "--extender-weight" in capsys.readouterr().err


def test_a_share_of_each_models_nodes_is_time_sliced() -> None:
    nodes = [TraceNode(f"a{i}", 1000, 1000, 8, "A") for i in range(10)] + \
        [TraceNode(f"b{i}", 1000, 1000, 2, "B") for i in range(4)] + [TraceNode("cpu", 1000, 1000, 0, "")]
    out = time_sliced(nodes, 0.3, 20, 7)
    shared = [n.name for n in out if n.shared]
    assert sum(s.startswith("a") for s in shared) == 3 and sum(s.startswith("b") for s in shared) == 1
    assert all(n.replicas == 20 for n in out if n.shared) and not next(n for n in out if n.name == "cpu").shared
    assert time_sliced(nodes, 0.3, 20, 7) == out  # the seed decides which


def test_kube_scheduler_alone_spreads_one_gpu_pods_and_strands_the_whole_node_job() -> None:
    nodes = [hgx("gpu-a"), hgx("gpu-b")]
    seq = [SimPod(f"one-{i}", Shape(4000, 16_000, 1, MILLI)) for i in range(8)]
    seq.append(SimPod("eight", Shape(8000, 64_000, 8, MILLI)))
    alone = run(nodes, seq, "kube-default", 42)
    tailor = run(nodes, seq, "gpu-tailor", 42)
    assert alone.failed == {"multi": 1}  # LeastAllocated put four on each node
    assert {alone.where.count("gpu-a"), alone.where.count("gpu-b")} == {4}
    assert not tailor.failed and len(set(tailor.where[:8])) == 1 and tailor.where[8] != tailor.where[0]


@pytest.mark.parametrize("used, ask", [(7, 1), (6, 2), (4, 4)])
def test_gpu_tailor_fills_the_used_node_before_it_breaks_a_whole_one(used: int, ask: int) -> None:
    for a, b in itertools.permutations(["node-1", "node-2", "hgx-a", "zz"], 2):
        nodes = [hgx(a), hgx(b)]
        fleet = build_fleet([n.node for n in nodes], "none", 0)
        rows = fleet.rows()
        fleet.rank[rows] = [node_order(n.name) for n in nodes]  # the extender's tie order, by name
        fleet.take(0, Shape(0, 0, used, MILLI), tuple(range(used)))
        kube = KubeModel(fleet, rows, nodes, 0)
        engine = POLICIES["tailor"](fleet, 0)
        best, asked = kube.with_extender(engine, SimPod("p", Shape(1000, 1000, ask, MILLI)), DEFAULT_EXTENDER_WEIGHT)
        assert asked and best.tolist() == [0], (a, b)


def test_the_ties_flag_offers_exactly_the_policies_ties() -> None:
    from gpu_tailor.cli import build_parser
    from gpu_tailor.gpumodel.policies import TIES

    parser = build_parser()
    assert parser.parse_args(["simulate"]).ties is None  # each policy's own ties
    assert [parser.parse_args(["simulate", "--ties", t]).ties for t in TIES] == list(TIES)
    simulate = parser._subparsers._group_actions[0].choices["simulate"]  # type: ignore[union-attr,index]
    assert tuple(next(a for a in simulate._actions if a.dest == "ties").choices) == TIES


def test_ties_and_prior_reach_the_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes_csv, pods_csv = small_trace(tmp_path)
    for extra in ([], ["--ties", "rank"], ["--prior", "10:0.01"]):
        assert main(["simulate", "--nodes", str(nodes_csv), "--pods", str(pods_csv), "--policy", "tailor",
                     "--scheduler", "gpu-tailor", *extra]) == 0
        assert "gpu-tailor" in capsys.readouterr().out
    for bad in ("ten", "10:1.5", "-1"):
        assert main(["simulate", "--nodes", str(nodes_csv), "--pods", str(pods_csv), "--prior", bad]) == 2
        assert "--prior" in capsys.readouterr().err


def test_whole_free_nodes_are_counted_among_the_nodes_that_sell_whole_gpus() -> None:
    nodes = [hgx("whole-a"), SimNode(TraceNode("sliced-b", 96_000, 1_000_000, 8, "H100"), 4)]
    seq = [SimPod(f"one-{i}", Shape(1000, 1000, 1, MILLI)) for i in range(16)]
    meter = run(nodes, seq, "gpu-tailor", 42)
    # the node that sells whole GPUs is full, the other 8 pods dropped; the time-sliced node, idle, can take no
    # whole-GPU job, so no whole node is left
    assert meter.where.count("whole-a") == 8 and meter.failed == {"1gpu": 8}
    assert meter.whole_nodes == {"90": 0, "100": 0}


def test_an_arrival_target_below_90_percent_prints_what_it_has(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--cluster-file", str(DUMP), "--inflate", "0.5"]) == 0
    assert "nan" in capsys.readouterr().out  # no arrival reached 90%: said as nan, not a crash
