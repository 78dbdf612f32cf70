"""Prioritize scores keep the policy's order: no outlier squeezes the rest, a fixed node order breaks ties."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu_tailor.extender import verbs, wire
from gpu_tailor.extender.scores import MAX_SCORE, extender_scores, node_order
from gpu_tailor.gpumodel import labels
from tests.conftest import node_fixture
from tests.extender.builders import args, cluster, gpu_pod

NAN = float("nan")

# (raw policy scores, fits, node order) -> the scores kube-scheduler must get
CASES = [
    pytest.param([1079, 1050, 1020, 1061, 40], [1] * 5, [0] * 5, [10, 8, 7, 9, 6],
                 id="issue-20: one PCIe node among HGX nodes squeezes nothing"),
    pytest.param([1079, 1050, 1020, 1061], [1] * 4, [0] * 4, [10, 8, 7, 9], id="the same HGX nodes alone"),
    pytest.param([5, 5, 5], [1] * 3, [4000, 1000, 2500], [8, 10, 9],
                 id="equal scores: the node first in the fixed order first"),
    pytest.param([5, 5, 4], [1] * 3, [1000, 1000, 0], [10, 10, 9], id="equal scores and order stay equal"),
    pytest.param([3, NAN, 7, 9], [1, 0, 1, 0], [0] * 4, [9, 0, 10, 0],
                 id="nodes that do not fit (or degraded ones) get 0, even with a better raw score"),
    pytest.param([2.0, 2.0 + 1e-9, 1e6], [1] * 3, [0] * 3, [8, 9, 10], id="tiny and huge gaps count the same"),
    pytest.param([NAN, NAN], [0, 0], [0, 0], [0, 0], id="nothing fits"),
    pytest.param(list(range(20)), [1] * 20, [0] * 20, [1] * 11 + list(range(2, 11)),
                 id="below the ninth best everything is 1, never 0"),
]


@pytest.mark.parametrize("raw,ok,order,want", CASES)
def test_scores(raw: list[float], ok: list[int], order: list[int], want: list[int]) -> None:
    out = extender_scores(np.array(raw, float), np.array(ok, bool), np.array(order, np.int64))
    assert out.tolist() == want


@given(st.lists(st.tuples(st.integers(-50, 2000), st.booleans(), st.integers(0, 8000)), min_size=1, max_size=300))
def test_order_is_kept(nodes: list[tuple[int, bool, int]]) -> None:
    raw = np.array([n[0] for n in nodes], float)
    ok = np.array([n[1] for n in nodes], bool)
    order = np.array([n[2] for n in nodes], np.int64)
    out = extender_scores(raw, ok, order)
    assert out.dtype == np.int64 and ((out >= 0) & (out <= MAX_SCORE)).all()
    assert (out[~ok] == 0).all() and (out[ok] >= 1).all()
    key = list(zip(-raw, order, strict=True))  # the policy's order, the fixed node order on ties
    for i in np.flatnonzero(ok):
        for j in np.flatnonzero(ok):
            if key[i] < key[j]:
                assert out[i] >= out[j]
                if out[j] > 1:  # above the floor every better node scores strictly higher
                    assert out[i] > out[j]
    if ok.any():  # the policy's first choice is the only 10
        best = min(key[i] for i in np.flatnonzero(ok))
        assert {i for i in np.flatnonzero(ok) if out[i] == MAX_SCORE} == {
            i for i in np.flatnonzero(ok) if key[i] == best}


def _hgx(name: str, topology: str = "nvswitch") -> dict[str, object]:
    node = copy.deepcopy(node_fixture("h100-hgx-0"))
    node["metadata"]["name"] = name
    node["metadata"]["labels"][labels.TOPOLOGY_LABEL] = topology
    node["metadata"]["labels"]["kubernetes.io/hostname"] = name
    return node


def test_prioritize_keeps_hgx_nodes_apart_beside_a_pcie_node() -> None:
    """The issue's case on the real wire: a 4-GPU pod, HGX nodes holding 0, 2 and 3 GPUs (the NVLink
    bonus puts their raw scores above 1000) and one PCIe node. Min-max onto 1..10 gave every HGX node
    10; their scores must follow the policy's raw order, and the PCIe node comes after them."""
    hgx = ["hgx-a", "hgx-b", "hgx-c"]
    held = [gpu_pod("two", 2, node="hgx-b", annotations={labels.ANN_GPUS: "0,1"}),
            gpu_pod("three", 3, node="hgx-c", annotations={labels.ANN_GPUS: "0,1,2"})]
    state = cluster(held, extra_nodes=[*(_hgx(n) for n in hgx), _hgx("pcie-a", "pcie")])
    names = [*hgx, "pcie-a"]
    snap = state.snapshot()
    out = {h["Host"]: h["Score"] for h in verbs.prioritize(snap, args("prioritize-nodecache-true-pod-gpu4", names))}
    shape = verbs._shape(snap, wire.extender_args(args("prioritize-nodecache-true-pod-gpu4")).demand, names)
    raw, _ = snap.policy.node_scores(shape, np.array([snap.fleet.index[n] for n in names]))
    assert min(raw[:3]) > 1000 > raw[3]  # the NVLink bonus: the squeeze's setting
    by_raw = sorted(hgx, key=lambda n: -raw[names.index(n)])
    assert [out[n] for n in by_raw] == [10, 9, 8] and out["pcie-a"] == 7


def test_equal_raw_scores_go_by_the_fixed_node_order_whatever_order_nodes_were_listed_in() -> None:
    """Empty identical nodes tie on the policy's score. The one first in ``node_order`` (a hash of the
    name) is the only 10, so every replica and every restart of the extender agrees, and placement is a
    first fit in a fixed order, as the simulator's node rank makes it (on the openb replay the fuller
    node first, the tie-break before, placed 0.1-0.9 point less; extender/scores.py)."""
    names = [f"twin-{i}" for i in range(6)]
    twins = [_hgx(n) for n in names]
    first = min(names, key=node_order)
    answers = []
    for listed in (twins, twins[::-1]):
        state = cluster(extra_nodes=listed)
        out = verbs.prioritize(state.snapshot(), args("prioritize-nodecache-true-pod-gpu4", names))
        answers.append({h["Host"]: h["Score"] for h in out})
    assert answers[0] == answers[1]
    assert [n for n, score in answers[0].items() if score == MAX_SCORE] == [first]
    assert sorted(answers[0].values(), reverse=True) == [10, 9, 8, 7, 6, 5]
    assert [n for n, _ in sorted(answers[0].items(), key=lambda kv: -kv[1])] == sorted(names, key=node_order)


def _cpu_pod_args(names: list[str]) -> dict[str, object]:
    body = args("prioritize-nodecache-true-pod-gpu4", names)
    pod = body["Pod"]
    assert isinstance(pod, dict)
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "4", "memory": "8Gi"}}
    return body


def test_a_cpu_only_pod_tied_on_the_policy_goes_to_a_node_without_gpus_and_leaves_gpu_nodes_tied() -> None:
    """Without GPUs the policy often scores every node alike. The node without GPUs comes first, however
    its name hashes, so CPU pods do not eat the CPU beside idle GPUs; the GPU nodes stay tied, for
    kube-scheduler's own plugins (its topology spread keeps a Deployment's replicas apart)."""
    twins = sorted((f"twin-{i}" for i in range(30)), key=node_order)[:4]  # first in the fixed order
    names = [*twins, "cpu-node-0"]
    state = cluster(extra_nodes=[_hgx(n) for n in twins])
    snap = state.snapshot()
    out = {h["Host"]: h["Score"] for h in verbs.prioritize(snap, _cpu_pod_args(names))}
    shape = verbs._shape(snap, wire.extender_args(_cpu_pod_args(names)).demand, names)
    raw, _ = snap.policy.node_scores(shape, np.array([snap.fleet.index[n] for n in names]))
    assert len(set(raw.tolist())) == 1  # the setting: the policy tells no node apart
    assert min(names, key=node_order) != "cpu-node-0"  # the old fixed order would not have picked it
    assert out["cpu-node-0"] == MAX_SCORE
    assert {out[n] for n in twins} == {MAX_SCORE - 1}
