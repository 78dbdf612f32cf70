"""The extender's verbs on the real ExtenderArgs from kube-scheduler v1.28.7 and the fixture nodes."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpu_tailor.extender import cache as cache_module
from gpu_tailor.extender import snapshot as snapshot_module
from gpu_tailor.extender import verbs, wire
from gpu_tailor.extender.api import ApiBinder, ApiRefused
from gpu_tailor.extender.cache import Cache
from gpu_tailor.extender.server import make_app
from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.fleet import MILLI
from gpu_tailor.gpumodel.inventory import NodeInventory, Offering
from gpu_tailor.gpumodel.schedule import Demand, Fit, NodeState, demand_of, fit, inventory_verdict
from tests.conftest import load_fixture, node_fixture
from tests.extender.builders import NODE_NAMES, RecordingBinder, args, cluster, gpu_pod, nodes_only, pod_of
from tests.kube.fakeapi import FakeApi

PREEMPT = load_fixture("extender", "preempt-nodecache-false-pod-high-gpu8.json")
VICTIMS = PREEMPT["NodeNameToVictims"]["h100-hgx-0"]["Pods"]  # two bound 4-GPU pods, as the API had them


def test_eight_gpu_ask_fails_on_degraded_and_initializing_and_passes_on_hgx() -> None:
    body = args("filter-nodecache-true-pod-high-gpu8-after-preemption", NODE_NAMES)
    out = verbs.filter_nodes(cluster().snapshot(), body)
    assert out["NodeNames"] == ["h100-hgx-0"] and out["Error"] == ""
    unresolvable = out["FailedAndUnresolvableNodes"]
    assert "3 of 8 GPUs missing (allocatable 5 < nvidia.com/gpu.count 8)" in unresolvable["h100-degraded-0"]
    assert "GPU stack initializing" in unresolvable["h100-initializing-0"]
    assert unresolvable["cpu-node-0"] == "node has no NVIDIA GPUs"
    assert "not 8 GPUs" in unresolvable["t4-timeslice-0"]  # 8 replicas are not 8 GPUs
    assert set(unresolvable) | set(out["FailedNodes"]) | {"h100-hgx-0"} == set(NODE_NAMES)


def test_mig_1g5gb_passes_only_on_the_mixed_a100() -> None:
    out = verbs.filter_nodes(cluster().snapshot(), args("filter-nodecache-true-pod-mig-1g.5gb", NODE_NAMES))
    assert out["NodeNames"] == ["a100-mig-mixed-0"]
    assert all(n in out["FailedAndUnresolvableNodes"] for n in NODE_NAMES if n != "a100-mig-mixed-0")


def test_mig_instances_are_counted_and_the_reason_names_the_profile() -> None:
    held = [gpu_pod(f"mig-{i}", 1, node="a100-mig-mixed-0", resource="nvidia.com/mig-1g.5gb") for i in range(16)]
    body = args("filter-nodecache-true-pod-mig-1g.5gb", ["a100-mig-mixed-0"])
    out = verbs.filter_nodes(cluster(held).snapshot(), body)
    assert out["NodeNames"] == []
    assert out["FailedNodes"]["a100-mig-mixed-0"] == "mig-1g.5gb: 0 of 16 free"  # preemption could help


def test_busy_gpus_are_resolvable_and_nvlink_asks_explain_the_largest_set() -> None:
    state = cluster([gpu_pod("held", 6, node="h100-hgx-0", annotations={labels.ANN_GPUS: "0,1,2,3,4,5"})])
    out = verbs.filter_nodes(state.snapshot(), args("filter-nodecache-true-pod-gpu4", ["h100-hgx-0"]))
    assert out["FailedNodes"] == {"h100-hgx-0": "4 whole GPUs asked, 2 of 8 free"}
    pairs = copy.deepcopy(node_fixture("h100-hgx-0"))
    pairs["metadata"]["name"] = "h100-pairs-0"
    pairs["metadata"]["labels"][labels.TOPOLOGY_LABEL] = "nvlink-pairs"
    body = args("filter-nodecache-true-pod-gpu4", ["h100-pairs-0"])
    body["Pod"]["metadata"]["annotations"] = {labels.ANN_TOPOLOGY: "nvlink"}
    out = verbs.filter_nodes(cluster(extra_nodes=[pairs]).snapshot(), body)
    assert out["FailedAndUnresolvableNodes"] == {"h100-pairs-0": "no NVLink-connected set of 4 GPUs on this node"}


def test_nodecache_false_answers_with_node_objects() -> None:
    body = args("filter-nodecache-false-pod-gpu4")
    out = verbs.filter_nodes(cluster().snapshot(), body)
    assert out["NodeNames"] is None
    passed = [n["metadata"]["name"] for n in out["Nodes"]["items"]]
    sent = {n["metadata"]["name"]: n for n in body["Nodes"]["items"]}
    assert passed == ["h100-degraded-0", "h100-hgx-0"]  # 5 usable GPUs still hold a 4-GPU pod
    assert out["Nodes"]["items"] == [sent[n] for n in passed]


def test_filter_never_mutates_state() -> None:
    state = cluster([gpu_pod("held", 2, node="h100-hgx-0")])
    snap = state.snapshot()  # writes the fleet rows of the nodes that changed: none after this
    before = (state.fleet.gpu.copy(), state.fleet.cpu.copy(), {k: v.placement for k, v in state.pods.items()},
              copy.deepcopy(state.nodes["h100-hgx-0"].gpus.placements))
    for name in ("filter-nodecache-true-pod-gpu4", "filter-nodecache-true-pod-mig-1g.5gb",
                 "filter-nodecache-true-pod-high-gpu8-after-preemption"):
        verbs.filter_nodes(snap, args(name, NODE_NAMES))
    assert np.array_equal(before[0], state.fleet.gpu) and np.array_equal(before[1], state.fleet.cpu)
    assert before[2] == {k: v.placement for k, v in state.pods.items()}
    assert before[3] == state.nodes["h100-hgx-0"].gpus.placements


def test_not_synced_filter_answers_error_not_a_guess() -> None:
    out = verbs.filter_nodes(Cache().snapshot(), args("filter-nodecache-true-pod-gpu4"))
    assert "not synced" in out["Error"] and out["NodeNames"] is None


def test_prioritize_prefers_an_nvlinked_free_set_and_puts_degraded_last() -> None:
    pairs = copy.deepcopy(node_fixture("h100-hgx-0"))
    pairs["metadata"]["name"] = "h100-pairs-0"
    pairs["metadata"]["labels"][labels.TOPOLOGY_LABEL] = "nvlink-pairs"
    state = cluster(extra_nodes=[pairs])
    body = args("prioritize-nodecache-true-pod-gpu4", ["h100-pairs-0", "h100-hgx-0", "h100-degraded-0"])
    scores = {h["Host"]: h["Score"] for h in verbs.prioritize(state.snapshot(), body)}
    assert all(0 <= s <= 10 and isinstance(s, int) for s in scores.values())
    assert scores["h100-hgx-0"] > scores["h100-pairs-0"]
    assert scores["h100-degraded-0"] == 0


def test_prioritize_answers_every_host_of_the_real_request() -> None:
    body = args("prioritize-nodecache-true-pod-gpu4")
    out = verbs.prioritize(cluster().snapshot(), body)
    assert [h["Host"] for h in out] == body["NodeNames"]
    assert {h["Host"]: h["Score"] for h in out}["h100-hgx-0"] == 10


def test_prioritize_reuses_the_filter_verdict_only_while_the_node_is_unchanged(
        monkeypatch: pytest.MonkeyPatch) -> None:
    held = gpu_pod("held", 6, node="h100-hgx-0", annotations={labels.ANN_GPUS: "0,1,2,3,4,5"})
    state = cluster([held])
    nodes = ["h100-hgx-0", "h100-degraded-0"]
    out = verbs.filter_nodes(state.snapshot(), args("filter-nodecache-true-pod-gpu4", nodes))
    assert out["NodeNames"] == ["h100-degraded-0"] and "h100-hgx-0" in out["FailedNodes"]
    calls: list[str] = []

    def counted(ns: NodeState, demand: Demand, place: bool = True, settled: Any = None) -> Fit:
        calls.append(ns.name)
        return fit(ns, demand, place, settled)

    monkeypatch.setattr(snapshot_module, "fit", counted)
    verbs.prioritize(state.snapshot(), args("prioritize-nodecache-true-pod-gpu4", nodes))
    assert calls == []  # kube-scheduler asks right after filter: nothing changed, nothing recomputed
    state.apply_pod("DELETED", held)  # now the 4-GPU pod fits there: the old "no" must not stand
    body = args("prioritize-nodecache-true-pod-gpu4", nodes)
    scores = {h["Host"]: h["Score"] for h in verbs.prioritize(state.snapshot(), body)}
    assert calls == ["h100-hgx-0"] and scores["h100-hgx-0"] == 10


def count_checks(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Record every inventory verdict and fit the extender's state works out, by node name."""
    calls: list[tuple[str, str]] = []

    def counted_fit(ns: NodeState, demand: Demand, place: bool = True, settled: Any = None) -> Fit:
        calls.append(("fit", ns.name))
        return fit(ns, demand, place, settled)

    def counted_inventory(inv: NodeInventory, demand: Demand) -> Fit | Offering:
        calls.append(("inventory", inv.name))
        return inventory_verdict(inv, demand)

    monkeypatch.setattr(snapshot_module, "fit", counted_fit)
    monkeypatch.setattr(snapshot_module, "inventory_verdict", counted_inventory)
    return calls


def test_nodes_of_one_kind_share_the_inventory_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool of identical nodes: the first ask reads the inventory once, and checks occupancy per node."""
    twins = []
    for name in ("t4-timeslice-0", "h100-hgx-0"):
        twin = node_fixture(name)
        twin["metadata"]["name"] = name.replace("-0", "-1")
        twins.append(twin)
    held = gpu_pod("held", 6, node="h100-hgx-1", annotations={labels.ANN_GPUS: "0,1,2,3,4,5"})
    state = cluster([held], extra_nodes=twins)
    names = [*NODE_NAMES, "t4-timeslice-1", "h100-hgx-1"]
    calls = count_checks(monkeypatch)
    out = verbs.filter_nodes(state.snapshot(), {"Pod": pod_of("filter-nodecache-true-pod-gpu4"), "NodeNames": names})
    assert len([c for c in calls if c[0] == "inventory"]) == len(NODE_NAMES)  # the twins add no kind
    assert ("fit", "h100-hgx-0") in calls and ("fit", "h100-hgx-1") in calls  # occupancy: per node
    assert "h100-hgx-0" in out["NodeNames"] and "h100-hgx-1" in out["FailedNodes"]  # 2 of 8 free there
    assert out["FailedAndUnresolvableNodes"]["t4-timeslice-1"] == out["FailedAndUnresolvableNodes"]["t4-timeslice-0"]
    demand = demand_of(pod_of("filter-nodecache-true-pod-gpu4"))
    fresh = [fit(state.nodes[n], demand, place=False) for n in names]
    assert [(f.ok, f.reason) for f in state.snapshot().fits(names, demand)] == [(f.ok, f.reason) for f in fresh]
    state.apply_node("MODIFIED", {**twins[1], "metadata": {**twins[1]["metadata"],
                                                           "labels": {**twins[1]["metadata"]["labels"],
                                                                      "nvidia.com/gpu.product": "Tesla-T4"}}})
    assert state.kind_of["h100-hgx-1"] != state.kind_of["h100-hgx-0"]  # relabelled: a kind of its own


def test_verdicts_are_kept_per_ask_across_pods_and_rechecked_only_where_a_node_changed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Replicas of one Job share an ask: the second is checked only on the node the first was bound to."""
    state = cluster()
    first = pod_of("filter-nodecache-true-pod-gpu4")
    second = copy.deepcopy(first)
    second["metadata"].update(name="train-gpu4-b", uid="uid-b")
    calls = count_checks(monkeypatch)

    def ask(pod: dict[str, Any]) -> dict[str, Any]:
        calls.clear()
        return verbs.filter_nodes(state.snapshot(), {"Pod": pod, "NodeNames": NODE_NAMES})

    assert ask(first)["NodeNames"] and sorted({n for _, n in calls}) == NODE_NAMES
    assert ask(second)["NodeNames"] and calls == []  # same ask, nothing changed
    state.assume(state.pods["gpu-jobs/train-gpu4"], "h100-hgx-0",
                 fit(state.nodes["h100-hgx-0"], demand_of(first)).placement)
    assert "h100-hgx-0" in ask(second)["NodeNames"] and calls == [("fit", "h100-hgx-0")]  # 4 of 8 GPUs free
    state.apply_pod("ADDED", second)
    state.assume(state.pods["gpu-jobs/train-gpu4-b"], "h100-hgx-0",
                 fit(state.nodes["h100-hgx-0"], demand_of(second)).placement)
    third = copy.deepcopy(second)
    third["metadata"].update(name="train-gpu4-c", uid="uid-c")
    out = ask(third)
    assert calls == [("fit", "h100-hgx-0")] and "h100-hgx-0" in out["FailedNodes"]  # full: the old "yes" is gone
    mig = pod_of("filter-nodecache-true-pod-mig-1g.5gb")
    ask(mig)
    assert sorted({n for _, n in calls}) == NODE_NAMES  # another ask is checked afresh
    state.apply_node("DELETED", node_fixture("h100-hgx-0"))
    state.snapshot()
    assert all("h100-hgx-0" not in kept.by_node for kept in state.verdicts.asks.values())  # nothing kept for nodes gone
    state.reset_nodes([node_fixture(n) for n in NODE_NAMES])  # a relist: only the node that came back is new
    ask(third)
    assert sorted({n for _, n in calls}) == ["h100-hgx-0"]
    state.reset_nodes([node_fixture(n) for n in NODE_NAMES if n != "v100-mps-0"])  # and one is gone
    assert "v100-mps-0" not in state.snapshot().nodes
    state.reset_nodes([node_fixture(n) for n in NODE_NAMES])
    for pod in (third, mig):  # what is kept is what fit() says now, reasons included
        demand = demand_of(pod)
        kept = state.snapshot().fits(NODE_NAMES, demand)
        fresh = [fit(state.nodes[n], demand, place=False) for n in NODE_NAMES]
        assert [(f.ok, f.reason) for f in kept] == [(f.ok, f.reason) for f in fresh]


def test_only_the_most_recent_asks_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshot_module, "KEPT_ASKS", 2)
    state = cluster()
    asks = [demand_of(gpu_pod(f"p{k}", k)) for k in (1, 2, 3)]
    for demand in asks:
        state.snapshot().fits(NODE_NAMES, demand)
    assert len(state.verdicts.asks) == 2 and all(d.key == "" for d in state.verdicts.asks)
    assert [d.units for d in state.verdicts.asks] == [2, 3]  # the least recently asked went first


def test_fit_without_placing_gives_the_same_verdicts_and_reasons() -> None:
    state = cluster([gpu_pod("held", 6, node="h100-hgx-0", annotations={labels.ANN_GPUS: "0,1,2,3,4,5"})])
    for name in ("filter-nodecache-true-pod-gpu4", "filter-nodecache-true-pod-mig-1g.5gb",
                 "filter-nodecache-true-pod-high-gpu8-after-preemption"):
        demand = demand_of(pod_of(name))
        for node in NODE_NAMES:
            full, quick = fit(state.nodes[node], demand), fit(state.nodes[node], demand, place=False)
            assert (quick.ok, quick.reason, quick.unresolvable) == (full.ok, full.reason, full.unresolvable)
            assert quick.placement is None or quick.placement == full.placement


async def test_the_mix_is_learnt_from_the_pods_the_api_shows_each_once(client_for: Any) -> None:
    """A restarted extender knows the cluster's mix from the list, not from memory; prioritize teaches it
    the pods it scores (the server does, the verb itself changes nothing)."""
    bound = [gpu_pod("two", 2, node="h100-hgx-0"), gpu_pod("one", 1, node="h100-hgx-0")]
    cpu_only = copy.deepcopy(bound[1])
    cpu_only["metadata"].update(name="cpu", uid="uid-cpu")
    cpu_only["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "2"}}
    state = cluster([*bound, cpu_only])
    mix = state.policy.mix
    assert mix.total == 2 and mix.counts[(0, MILLI, 2, frozenset())] == 1  # CPU-only pods of others: not counted
    state.reset_pods([*bound, cpu_only, pod_of("filter-nodecache-true-pod-gpu4")])  # a relist
    state.apply_node("MODIFIED", node_fixture("h100-hgx-0"))  # its pods are placed again
    assert mix.total == 2
    body = args("prioritize-nodecache-true-pod-gpu4", ["h100-hgx-0"])
    verbs.prioritize(state.snapshot(), body)
    assert mix.total == 2
    client = await client_for(state)
    for _ in range(2):  # asked again about the same pod: still one pod
        assert (await client.post("/prioritize", json=body)).status == 200
    assert mix.total == 3
    pending = state.pods["gpu-jobs/train-gpu4"]
    state.assume(pending, "h100-hgx-0", None)
    assert mix.total == 3 and mix.counts[(pending.demand.cpu_milli, MILLI, 4, frozenset())] == 1
    state.apply_pod("DELETED", bound[0])
    assert "uid-two" not in state.seen and mix.total == 3  # the mix keeps its history


def test_preempt_keeps_nodes_where_eviction_frees_the_gpus_and_drops_the_rest() -> None:
    state = cluster(VICTIMS)
    out = verbs.preempt(state.snapshot(), PREEMPT)["NodeNameToMetaVictims"]
    assert {p["UID"] for p in out["h100-hgx-0"]["Pods"]} == {v["metadata"]["uid"] for v in VICTIMS}
    # evicting only one of the two 4-GPU pods does not free 8 GPUs: the node is removed
    meta = {"Pod": PREEMPT["Pod"], "NodeNameToMetaVictims": {
        "h100-hgx-0": {"Pods": [{"UID": VICTIMS[0]["metadata"]["uid"]}], "NumPDBViolations": 0}}}
    assert verbs.preempt(state.snapshot(), meta) == {"NodeNameToMetaVictims": {}}


def test_preempt_keeps_every_victim_kube_scheduler_proposed() -> None:
    """kube-scheduler proposes only victims its in-tree filters need gone: none is dropped, even where
    fewer would free enough GPUs (tests/extender/test_preempt.py has the CPU and memory cases)."""
    state = cluster(VICTIMS)  # two 4-GPU pods fill the node
    four = copy.deepcopy(PREEMPT)
    four["Pod"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "4"},
                                                           "requests": {"nvidia.com/gpu": "4"}}
    both = {"Pods": [{"UID": v["metadata"]["uid"]} for v in VICTIMS], "NumPDBViolations": 0}
    out = verbs.preempt(state.snapshot(), {"Pod": four["Pod"], "NodeNameToMetaVictims": {"h100-hgx-0": both}})
    assert out["NodeNameToMetaVictims"]["h100-hgx-0"] == both


def test_preempt_agrees_with_a_cluster_that_never_had_the_evicted_pods() -> None:
    """Preempt tries evictions on a private copy of the node; the answer must be what a cluster without
    those pods would say (the node with all its victims, or left out), and the real state must be left
    as it was. A victim the extender does not count on that node (unknown, or on another node as far
    as its watch knows) is left as kube-scheduler listed it: the extender cannot tell what evicting it
    frees."""
    rng = random.Random(5)
    node = "h100-hgx-0"
    for case in range(20):
        free = list(range(8))
        rng.shuffle(free)
        bound: list[dict[str, Any]] = []
        while free:
            k = min(len(free), rng.choice((1, 1, 2, 3)))
            taken, free = free[:k], free[k:]
            bound.append(gpu_pod(f"w{case}-{len(bound)}", k, node=node,
                                 annotations={labels.ANN_GPUS: ",".join(map(str, sorted(taken)))}))
        cpu = gpu_pod(f"cpu{case}", 1, node=node)
        cpu["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
        elsewhere = gpu_pod(f"far{case}", 1, node="h100-degraded-0")
        pods = [*bound, cpu, elsewhere]
        victims = [p["metadata"]["uid"] for p in rng.sample(pods, rng.randint(1, len(pods)))] + ["uid-unknown"]
        ask = gpu_pod(f"ask{case}", rng.randint(1, 8))
        demand = demand_of(ask)

        def fits_without(evicted: list[str], demand: Demand = demand, pods: list[Any] = pods) -> bool:
            kept = cluster([p for p in pods if p["metadata"]["uid"] not in evicted])
            return fit(kept.nodes[node], demand, place=False).ok

        expected: dict[str, Any] = {}
        if fits_without(victims):
            expected[node] = {"Pods": [{"UID": u} for u in victims], "NumPDBViolations": 0}
        state = cluster(pods)
        before = dict(state.nodes[node].gpus.placements)
        body = {"Pod": ask, "NodeNameToMetaVictims": {node: {"Pods": [{"UID": u} for u in victims]}}}
        assert verbs.preempt(state.snapshot(), body) == {"NodeNameToMetaVictims": expected}, case
        assert state.nodes[node].gpus.placements == before and state.nodes[node].gpus.free_whole() == []


async def test_bind_is_visible_to_the_next_filter(client_for: Any) -> None:
    state, binder = cluster(), RecordingBinder()
    client = await client_for(state, binder)
    resp = await client.post("/bind", json=args("bind-pod-gpu4"))
    assert resp.status == 200 and (await resp.json()) == {"Error": ""}
    assert binder.calls == [("gpu-jobs", "train-gpu4", "6c13e19b-2f1e-4262-ab21-f43017d2e42d", "h100-hgx-0",
                             "0,1,2,3")]
    resp = await client.post("/filter", json=args("filter-nodecache-true-pod-high-gpu8-after-preemption"))
    out = await resp.json()
    assert out["NodeNames"] == [] and out["FailedNodes"]["h100-hgx-0"] == "8 whole GPUs asked, 4 of 8 free"


async def test_a_failed_binding_drops_the_assumption(client_for: Any) -> None:
    state = cluster()
    client = await client_for(state, RecordingBinder(fail=True))
    out = await (await client.post("/bind", json=args("bind-pod-gpu4"))).json()
    assert "failed" in out["Error"] and "409" in out["Error"]
    assert state.nodes["h100-hgx-0"].gpus.free_whole() == list(range(8))


async def test_watch_shows_the_pod_bound_elsewhere_and_the_assumption_goes(client_for: Any) -> None:
    state = cluster()
    client = await client_for(state, RecordingBinder())
    await client.post("/bind", json=args("bind-pod-gpu4"))
    assert len(state.nodes["h100-hgx-0"].gpus.free_whole()) == 4
    moved = copy.deepcopy(pod_of("filter-nodecache-true-pod-gpu4"))
    moved["spec"]["nodeName"], moved["status"] = "h100-degraded-0", {"phase": "Running"}
    state.apply_pod("MODIFIED", moved)
    assert len(state.nodes["h100-hgx-0"].gpus.free_whole()) == 8
    assert not state.pods["gpu-jobs/train-gpu4"].assumed


async def test_api_binder_binds_with_one_call_that_carries_the_gpus() -> None:
    async with FakeApi() as api, api.api_client() as http:
        await ApiBinder(http).bind("gpu-jobs", "train-gpu4", "u-1", "h100-hgx-0", "0,1,2,3")
        await ApiBinder(http).bind("gpu-jobs", "cpu-only", "u-2", "cpu-node-0", None)
    # one request per pod: the API server writes the Binding's annotations onto the pod as it binds it,
    # and the uid is a precondition (a pod recreated under the same name is not bound)
    assert api.patches == []
    assert api.bindings[0] == {"metadata": {"name": "train-gpu4", "namespace": "gpu-jobs", "uid": "u-1",
                                            "annotations": {labels.ANN_GPUS: "0,1,2,3"}},
                               "target": {"apiVersion": "v1", "kind": "Node", "name": "h100-hgx-0"}}
    assert "annotations" not in api.bindings[1]["metadata"]


@pytest.mark.parametrize("status", [404, 409, 500])
async def test_api_binder_raises_when_the_binding_is_refused(status: int) -> None:
    """The Binding is posted without deserialising its answer (the API server answers a Status, not a
    Binding), so the status must be checked by hand: a pod deleted after filter gets 404."""
    async with FakeApi() as api, api.api_client() as http:
        api.binding_status = status
        with pytest.raises(ApiRefused) as refused:
            await ApiBinder(http).bind("gpu-jobs", "train-gpu4", "u-1", "h100-hgx-0", "0,1,2,3")
    assert refused.value.status == status
    assert str(refused.value) == (f'Binding answered {status}: pods "train-gpu4" not found' if status == 404
                                  else f"Binding answered {status}: conflict")


async def test_a_pod_deleted_mid_bind_is_an_error_and_its_gpus_are_free(client_for: Any) -> None:
    """kube-scheduler keeps a pod it was told is bound in its cache until the API shows it gone -- which a
    deleted pod never does: a refused Binding answered as done leaves its GPUs taken for good."""
    state = cluster()
    async with FakeApi() as api, api.api_client() as http:
        api.binding_status = 404
        client = await client_for(state, ApiBinder(http))
        out = await (await client.post("/bind", json=args("bind-pod-gpu4"))).json()
    assert out == {"Error": 'binding gpu-jobs/train-gpu4 to h100-hgx-0 failed: Binding answered 404: '
                            'pods "train-gpu4" not found'}
    assert state.nodes["h100-hgx-0"].gpus.free_whole() == list(range(8))
    assert not state.pods["gpu-jobs/train-gpu4"].assumed


async def test_api_binder_reads_a_pod_or_says_it_is_gone() -> None:
    pod = pod_of("filter-nodecache-true-pod-gpu4")
    async with FakeApi() as api, api.api_client() as http:
        api.pods[("gpu-jobs", "train-gpu4")] = pod
        binder = ApiBinder(http)
        assert await binder.read_pod("gpu-jobs", "train-gpu4") == pod  # as the API has it: camelCase keys
        assert await binder.read_pod("gpu-jobs", "gone") is None
    assert api.pod_gets == [("gpu-jobs", "train-gpu4"), ("gpu-jobs", "gone")]


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
async def test_bind_before_the_watch_saw_the_pod_uses_the_pod_it_was_asked_about(client_for: Any,
                                                                                 verb: str) -> None:
    """kube-scheduler's informer can see a pod before the extender's watch does (2 cores, a busy API
    server): the pod filter or prioritize was sent is what bind places."""
    state, binder = nodes_only(), RecordingBinder()
    client = await client_for(state, binder)
    assert (await client.post(f"/{verb}", json=args(f"{verb}-nodecache-true-pod-gpu4"))).status == 200
    assert (await (await client.post("/bind", json=args("bind-pod-gpu4"))).json()) == {"Error": ""}
    assert binder.calls == [("gpu-jobs", "train-gpu4", "6c13e19b-2f1e-4262-ab21-f43017d2e42d", "h100-hgx-0",
                             "0,1,2,3")]
    assert binder.reads == []  # no GET needed
    assert state.nodes["h100-hgx-0"].gpus.free_whole() == [4, 5, 6, 7]  # the next filter sees it
    out = await (await client.post("/filter", json=args("filter-nodecache-true-pod-high-gpu8-after-preemption"))).json()
    assert out["FailedNodes"]["h100-hgx-0"] == "8 whole GPUs asked, 4 of 8 free"
    # the watch catches up: first the pod still pending (the assumption stands), then bound
    pod = pod_of("filter-nodecache-true-pod-gpu4")
    state.apply_pod("ADDED", pod)
    assert state.pods["gpu-jobs/train-gpu4"].assumed and state.nodes["h100-hgx-0"].gpus.free_whole() == [4, 5, 6, 7]
    bound = copy.deepcopy(pod)
    bound["spec"]["nodeName"], bound["status"] = "h100-hgx-0", {"phase": "Running"}
    bound["metadata"]["annotations"] = {labels.ANN_GPUS: "0,1,2,3"}
    state.apply_pod("MODIFIED", bound)
    assert not state.pods["gpu-jobs/train-gpu4"].assumed and state.nodes["h100-hgx-0"].gpus.free_whole() == [4, 5, 6, 7]
    assert "gpu-jobs/train-gpu4" not in state.asked  # bound, and the watch has it


async def test_bind_of_a_pod_nobody_has_seen_reads_it_from_the_api(client_for: Any) -> None:
    state, binder = nodes_only(), RecordingBinder(pods=[pod_of("filter-nodecache-true-pod-gpu4")])
    client = await client_for(state, binder)
    assert (await (await client.post("/bind", json=args("bind-pod-gpu4"))).json()) == {"Error": ""}
    assert binder.reads == [("gpu-jobs", "train-gpu4")]
    assert binder.calls[0][4] == "0,1,2,3" and state.nodes["h100-hgx-0"].gpus.free_whole() == [4, 5, 6, 7]


async def test_bind_of_a_pod_the_api_does_not_have_binds_nothing(client_for: Any) -> None:
    state, binder = nodes_only(), RecordingBinder()
    client = await client_for(state, binder)
    out = await (await client.post("/bind", json=args("bind-pod-gpu4"))).json()
    assert out == {"Error": "binding gpu-jobs/train-gpu4 to h100-hgx-0 failed: the pod is gone (not in the API)"}
    assert binder.calls == [] and state.nodes["h100-hgx-0"].gpus.free_whole() == list(range(8))


async def test_a_pod_asked_about_under_another_uid_is_not_the_one_bound(client_for: Any) -> None:
    """A pod deleted and created again under the same name (a StatefulSet's) is another pod."""
    state = nodes_only()
    again = pod_of("filter-nodecache-true-pod-gpu4")
    again["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "2"},
                                                   "requests": {"nvidia.com/gpu": "2"}}
    again["metadata"]["uid"] = "uid-again"
    binder = RecordingBinder(pods=[again])
    client = await client_for(state, binder)
    await client.post("/filter", json=args("filter-nodecache-true-pod-gpu4"))  # the old pod, 4 GPUs
    bind = {**args("bind-pod-gpu4"), "PodUID": "uid-again"}
    assert (await (await client.post("/bind", json=bind)).json()) == {"Error": ""}
    assert binder.reads == [("gpu-jobs", "train-gpu4")] and binder.calls[0][4] == "0,1"
    read_back = {**again, "metadata": {**again["metadata"], "uid": "uid-other"}}
    binder.pods[("gpu-jobs", "train-gpu4")] = read_back  # what the API has now is yet another pod
    state2 = nodes_only()
    client2 = await client_for(state2, binder)
    out = await (await client2.post("/bind", json={**args("bind-pod-gpu4"), "PodUID": "uid-again"})).json()
    assert "was replaced" in out["Error"] and len(binder.calls) == 1


def test_the_pods_asked_about_are_kept_for_the_most_recent_few(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_module, "KEPT_PENDING", 2)
    state = nodes_only()
    for name in ("a", "b", "c"):
        state.remember(gpu_pod(name, 1))
    assert list(state.asked) == ["gpu-jobs/b", "gpu-jobs/c"]  # the least recently asked went first
    state.apply_pod("ADDED", gpu_pod("c", 1))  # the watch delivered it: nothing to remember any more
    assert list(state.asked) == ["gpu-jobs/b"]


async def test_restart_rebuilds_placements_from_annotations() -> None:
    held = gpu_pod("held", 2, node="h100-hgx-0", annotations={labels.ANN_GPUS: "6,7"})
    state = cluster([held])
    assert state.nodes["h100-hgx-0"].gpus.free_whole() == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("payload,status", [(b"{not json", 400), (b"[1,2]", 400), (b'{"Pod": {}}', 400),
                                            (b'{"Pod": {"metadata": {}}, "NodeNames": [1]}', 400)])
async def test_malformed_bodies_are_400(client_for: Any, payload: bytes, status: int) -> None:
    client = await client_for(cluster())
    for verb in ("filter", "prioritize"):
        resp = await client.post(f"/{verb}", data=payload)
        assert resp.status == status
        assert "Error" in await resp.json()


async def test_body_cap_is_413_and_probes_and_metrics(client_for: Any) -> None:
    state = Cache()
    client = TestClient(TestServer(make_app(state, max_body=64 * 1024)))
    await client.start_server()
    try:
        assert (await client.post("/filter", data=b"x" * 128 * 1024)).status == 413
        assert (await client.get("/readyz")).status == 503
        state.reset_nodes([])
        state.reset_pods([])
        assert (await client.get("/readyz")).status == 200
        await client.post("/filter", json=args("filter-nodecache-true-pod-gpu4"))
        text = await (await client.get("/metrics")).text()
        assert 'gpu_tailor_extender_requests_total{outcome="ok",verb="filter"} 1.0' in text, text
    finally:
        await client.close()


def test_real_filter_payloads_round_trip_as_json() -> None:
    for name in ("filter-nodecache-true-pod-gpu4", "filter-nodecache-false-pod-gpu4"):
        out = verbs.filter_nodes(cluster().snapshot(), args(name))
        assert set(out) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
        json.dumps(out)


def two_containers(pod: dict[str, Any], resource: str) -> dict[str, Any]:
    """The pod with a second container that asks for one unit of ``resource`` as well."""
    second = copy.deepcopy(pod["spec"]["containers"][0])
    second["name"] = "sidecar"
    second["resources"] = {"limits": {resource: "1"}, "requests": {resource: "1"}}
    pod["spec"]["containers"].append(second)
    return pod


async def test_replicas_of_one_ask_take_free_replicas_of_several_gpus(client_for: Any) -> None:
    """Kubernetes counts nvidia.com/gpu.shared per node and the device plugin hands out any free replicas: a
    2-replica pod fits a node with one free replica on each of two GPUs, and each replica is counted on its GPU."""
    node = "t4-timeslice-renamed-0"
    held = [gpu_pod(f"r{g}-{i}", 1, node=node, resource=labels.GPU_SHARED_RESOURCE,
                    annotations={labels.ANN_GPUS: str(g)}) for g in range(4) for i in range(3)]
    state, binder = cluster(held), RecordingBinder()
    client = await client_for(state, binder)
    for name, gpus in (("two-a", "0,1"), ("two-b", "2,3")):
        pod = gpu_pod(name, 2, resource=labels.GPU_SHARED_RESOURCE)
        out = await (await client.post("/filter", json={"Pod": pod, "NodeNames": [node]})).json()
        assert out["NodeNames"] == [node], out
        bind = {"PodName": name, "PodNamespace": "gpu-jobs", "PodUID": f"uid-{name}", "Node": node}
        assert (await (await client.post("/bind", json=bind)).json()) == {"Error": ""}
        assert binder.calls[-1][4] == gpus
    assert [s.replicas_used for s in state.nodes[node].gpus.slots] == [4, 4, 4, 4]
    out = await (await client.post("/filter", json={"Pod": gpu_pod("two-c", 2, resource=labels.GPU_SHARED_RESOURCE),
                                                     "NodeNames": [node]})).json()
    assert out["FailedNodes"] == {node: "shared:time-slicing:4: 0 of 16 free"}


@pytest.mark.parametrize(("node", "resource", "gpus"), [
    ("t4-timeslice-renamed-0", labels.GPU_SHARED_RESOURCE, (0, 1)),
    ("a100-mig-mixed-0", "nvidia.com/mig-1g.5gb", (0, 0)),
], ids=["replicas", "mig-instances"])
def test_several_units_sit_where_that_many_one_unit_pods_would(node: str, resource: str,
                                                               gpus: tuple[int, ...]) -> None:
    """One model for one unit and for several: each unit goes where a one-unit pod would, and each is
    counted there: on an idle node MIG instances stack on one GPU, replicas spread (the device plugin's
    default ``distributed`` policy hands out a GPU with the fewest replicas)."""
    state = cluster()
    two = fit(state.nodes[node], demand_of(gpu_pod("two", 2, resource=resource)))
    ones = state.nodes[node].gpus.copy()
    for i in range(2):
        one = fit(state.nodes[node], demand_of(gpu_pod(f"one-{i}", 1, resource=resource)))
        assert one.placement is not None
        state.nodes[node].gpus.place(f"gpu-jobs/one-{i}", one.placement)
    assert two.ok and two.placement is not None and two.placement.gpus == gpus
    ones.place("gpu-jobs/two", two.placement)
    assert [(s.milli_used, s.mig) for s in ones.slots] == [(s.milli_used, s.mig) for s in state.nodes[node].gpus.slots]


def test_mps_replicas_are_one_per_container() -> None:
    """The device plugin fails a container's request for more than one MPS replica, renamed or not."""
    mps = copy.deepcopy(node_fixture("v100-mps-0"))
    mps["metadata"]["name"] = "v100-mps-renamed-0"
    mps["status"]["allocatable"].update({"nvidia.com/gpu": "0", "nvidia.com/gpu.shared": "10"})
    state = cluster(extra_nodes=[mps])
    two = gpu_pod("two", 2, resource=labels.GPU_SHARED_RESOURCE)
    out = verbs.filter_nodes(state.snapshot(), {"Pod": two, "NodeNames": ["v100-mps-renamed-0"]})
    assert out["FailedAndUnresolvableNodes"] == {"v100-mps-renamed-0": (
        "node sells nvidia.com/gpu.shared as shared:mps:10: the device plugin fails a container's request "
        "for more than one replica")}
    pair = two_containers(gpu_pod("pair", 1, resource=labels.GPU_SHARED_RESOURCE), labels.GPU_SHARED_RESOURCE)
    out = verbs.filter_nodes(state.snapshot(), {"Pod": pair, "NodeNames": ["v100-mps-renamed-0"]})
    assert out["NodeNames"] == ["v100-mps-renamed-0"]  # one replica in each of two containers runs


def test_one_gpu_per_container_is_one_replica_each_where_nvidia_com_gpu_sells_replicas() -> None:
    """The plain name is ambiguous only when one container asks for several: then it means GPUs."""
    pair = two_containers(gpu_pod("pair", 1), labels.GPU_RESOURCE)
    out = verbs.filter_nodes(cluster().snapshot(), {"Pod": pair, "NodeNames": ["t4-timeslice-0", "h100-hgx-0"]})
    assert out["NodeNames"] == ["t4-timeslice-0", "h100-hgx-0"]


def test_prioritize_right_after_filter_reuses_the_demand_read_for_the_same_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[str] = []

    def read(pod: dict[str, Any]) -> Demand:
        reads.append(pod["metadata"]["name"])
        return demand_of(pod)

    monkeypatch.setattr(wire, "demand_of", read)
    body = args("filter-nodecache-true-pod-gpu4")
    first = wire.extender_args(body)
    again = wire.extender_args(copy.deepcopy(body), first)
    assert again.demand is first.demand and len(reads) == 1

    changed = copy.deepcopy(body)  # the same pod, at the same version even, asking for something else: read again
    changed["Pod"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "2"},
                                                            "requests": {"nvidia.com/gpu": "2"}}
    assert wire.extender_args(changed, again).demand.units == 2 and len(reads) == 2
    annotated = copy.deepcopy(body)
    annotated["Pod"]["metadata"]["annotations"] = {"gpu-tailor.io/topology": "nvlink"}
    assert wire.extender_args(annotated, again).demand.nvlink and len(reads) == 3
    other = copy.deepcopy(body)  # another pod with the same spec: read
    other["Pod"]["metadata"]["uid"] = "another-uid"
    wire.extender_args(other, again)
    assert len(reads) == 4
