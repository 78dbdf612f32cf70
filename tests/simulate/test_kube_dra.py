"""``gpu-tailor simulate --scheduler ... --dra SHARE``: GPU nodes published through NVIDIA's DRA driver, placed by
kube-scheduler's DRA allocator (first fit, no device scoring), alone or with gpu-tailor's extender ranking the
nodes by the placement the allocator will make there."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gpu_tailor.cli import main
from gpu_tailor.gpumodel.fleet import MILLI, PICK_FIRST, Shape, candidates
from gpu_tailor.gpumodel.policies import POLICIES
from gpu_tailor.simulate.cli import through_dra
from gpu_tailor.simulate.kube import DEFAULT_EXTENDER_WEIGHT, KubeModel, SimNode, SimPod, run
from gpu_tailor.simulate.trace import TraceNode, build_fleet
from tests.simulate.test_trace import small_trace


def t4s(name: str, dra: bool = True) -> SimNode:
    return SimNode(TraceNode(name, 64_000, 262_144, 4, "T4"), 20, dra=dra)


def model(nodes: list[SimNode]) -> KubeModel:
    fleet = build_fleet([n.node for n in nodes], "none", 1)
    return KubeModel(fleet, fleet.rows(), nodes, 1)


def share(milli: int, name: str = "p") -> SimPod:
    return SimPod(name, Shape(1000, 1024, 1, milli), fractional=True)


def test_the_allocator_takes_the_first_shared_device_with_room_and_never_splits_a_share() -> None:
    kube = model([t4s("dra"), t4s("plugin", dra=False)])
    for at in (0, 1):
        for milli in (600, 600, 300):
            kube.place(at, share(milli), ())
    # DRA: 600 on GPU 0, 600 on GPU 1 (GPU 0 has 400), 300 back on GPU 0; the device plugin hands replicas out
    assert kube.fleet.gpu[0, :4].tolist() == [100, 400, 1000, 1000]
    assert kube.fleet.pick[0] == PICK_FIRST and kube.fleet.step[0] == 0
    kube.fleet.gpu[0, :4] = [400, 400, 400, 400]
    kube.fleet.gpu[1, :4] = [400, 400, 400, 400]
    fits = kube.fits(share(500)).tolist()
    assert fits == [False, True]  # a claim needs one device with the memory; replicas are counted over the GPUs


def test_whole_gpu_claims_need_idle_devices_and_gpus_do_not_count_in_most_allocated() -> None:
    nodes = [replace(t4s("dra"), node=TraceNode("dra", 64_000, 262_144, 4, "T4"), replicas=0),
             SimNode(TraceNode("plugin", 64_000, 262_144, 4, "T4"))]
    kube = model(nodes)
    kube.place(0, SimPod("one", Shape(1000, 1024, 1, MILLI)), (0,))
    kube.place(1, SimPod("one", Shape(1000, 1024, 1, MILLI)), (0,))
    pod = SimPod("three", Shape(1000, 1024, 3, MILLI))
    assert kube.fits(pod).tolist() == [True, True]
    scores = kube.most_allocated(pod).tolist()
    assert scores[1] > scores[0]  # the plugin's node counts its GPUs (4 of 4 used after), the DRA node its CPU alone
    assert POLICIES["tailor"](kube.fleet, 0).whole_gpus(0, Shape(0, 0, 2, MILLI)) == (1, 2)


def test_the_extenders_prediction_is_where_the_allocator_puts_every_share() -> None:
    nodes = [t4s(f"dra-{i}") for i in range(3)]
    kube = model(nodes)
    engine = POLICIES["tailor"](kube.fleet, 0)
    rng = np.random.default_rng(5)
    for i in range(40):
        pod = share(int(rng.choice([100, 250, 400, 600])), f"p{i}")
        best, _ = kube.with_extender(engine, pod, DEFAULT_EXTENDER_WEIGHT)
        if not len(best):
            continue
        at = int(best[0])
        c = candidates(kube.fleet, pod.shape, np.array([at]))
        assert len(c.gpu) == 1  # one placement per node: the allocator's
        before = kube.fleet.gpu[at].copy()
        kube.place(at, pod, ())
        (changed,) = np.flatnonzero(kube.fleet.gpu[at] != before)
        assert changed == c.gpu[0]


def test_gpu_tailor_on_dra_places_more_than_the_allocator_alone() -> None:
    # six nodes of four shared T4s, 70 claims of mixed shares (about 1.3 x the capacity), six draws: where the
    # default profile spreads and the allocator takes the first device with room, shares strand memory that
    # gpu-tailor, ranking nodes by what the allocator will leave there, fills
    alone = tailor = 0
    for seed in range(6):
        nodes = [t4s(f"dra-{i}") for i in range(6)]
        rng = np.random.default_rng(seed)
        seq = [share(int(rng.choice([150, 250, 400, 600, 700])), f"p{i}") for i in range(70)]
        alone += run(nodes, seq, "kube-default", seed).used
        tailor += run(nodes, seq, "gpu-tailor", seed).used
    assert tailor > alone * 1.02


def test_a_share_of_each_models_gpu_nodes_is_published_through_dra() -> None:
    nodes = [SimNode(TraceNode(f"a{i}", 1000, 1000, 8, "A")) for i in range(10)] + \
        [SimNode(TraceNode(f"b{i}", 1000, 1000, 2, "B"), 4) for i in range(4)] + \
        [SimNode(TraceNode("cpu", 1000, 1000, 0, ""))]
    out = through_dra(nodes, 0.5, 7)
    dra = [n.name for n in out if n.dra]
    assert sum(s.startswith("a") for s in dra) == 5 and sum(s.startswith("b") for s in dra) == 2
    assert all(n.replicas == 4 for n in out if n.name.startswith("b")) and "cpu" not in dra
    assert through_dra(nodes, 0.5, 7) == out and all(n.dra for n in through_dra(nodes, 1, 7) if n.node.gpus)


def test_simulate_on_dra_pools(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes_csv, pods_csv = small_trace(tmp_path)
    assert main(["simulate", "--nodes", str(nodes_csv), "--pods", str(pods_csv), "--dra", "1",
                 "--scheduler", "kube-default", "--scheduler", "gpu-tailor"]) == 0
    out = capsys.readouterr().out
    assert "published through DRA" in out and "kube-default" in out and "gpu-tailor" in out
    for bad in (["--dra", "1.5"], ["--dra", "1", "--cluster-file", str(tmp_path / "dump.json")]):
        assert main(["simulate", "--nodes", str(nodes_csv), "--pods", str(pods_csv), "--scheduler", "gpu-tailor",
                     *bad]) == 2
        assert "--dra" in capsys.readouterr().err
