"""The extender's verbs on the real ExtenderArgs from kube-scheduler v1.28.7 and the fixture nodes."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gpu_tailor.extender import state as state_module
from gpu_tailor.extender import verbs
from gpu_tailor.extender.server import ApiBinder, make_app
from gpu_tailor.extender.state import ClusterState
from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.inventory import NodeInventory, Offering
from gpu_tailor.gpumodel.packing import MILLI
from gpu_tailor.gpumodel.schedule import Demand, Fit, NodeState, demand_of, fit, inventory_verdict
from tests.conftest import FIXTURES, load_fixture, node_fixture
from tests.kube.fakeapi import FakeApi

NODE_NAMES = sorted(p.stem for p in (FIXTURES / "nodes").glob("*.json"))
PREEMPT = load_fixture("extender", "preempt-nodecache-false-pod-high-gpu8.json")
VICTIMS = PREEMPT["NodeNameToVictims"]["h100-hgx-0"]["Pods"]  # two bound 4-GPU pods, as the API had them


def args(name: str, node_names: list[str] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = load_fixture("extender", f"{name}.json")
    if node_names is not None:
        body["NodeNames"] = node_names
    return body


def pod_of(name: str) -> dict[str, Any]:
    pod: dict[str, Any] = args(name)["Pod"]
    return pod


def gpu_pod(name: str, gpus: int, *, node: str = "", annotations: dict[str, str] | None = None,
            resource: str = labels.GPU_RESOURCE) -> dict[str, Any]:
    pod = copy.deepcopy(pod_of("filter-nodecache-true-pod-gpu4"))
    pod["metadata"].update(name=name, uid=f"uid-{name}", annotations=annotations or {})
    pod["spec"]["containers"][0]["resources"] = {"limits": {resource: str(gpus)}, "requests": {resource: str(gpus)}}
    if node:
        pod["spec"]["nodeName"] = node
        pod["status"] = {"phase": "Running"}
    return pod


def cluster(pods: list[dict[str, Any]] = (), extra_nodes: list[dict[str, Any]] = ()) -> ClusterState:  # type: ignore[assignment]
    state = ClusterState()
    state.reset_pods([*pods, pod_of("filter-nodecache-true-pod-gpu4")])  # the pending pod is known too
    state.reset_nodes([node_fixture(n) for n in NODE_NAMES] + list(extra_nodes))
    return state


def test_eight_gpu_ask_fails_on_degraded_and_initializing_and_passes_on_hgx() -> None:
    out = verbs.filter_nodes(cluster(), args("filter-nodecache-true-pod-high-gpu8-after-preemption", NODE_NAMES))
    assert out["NodeNames"] == ["h100-hgx-0"] and out["Error"] == ""
    unresolvable = out["FailedAndUnresolvableNodes"]
    assert "3 of 8 GPUs missing (allocatable 5 < nvidia.com/gpu.count 8)" in unresolvable["h100-degraded-0"]
    assert "GPU stack initializing" in unresolvable["h100-initializing-0"]
    assert unresolvable["cpu-node-0"] == "node has no NVIDIA GPUs"
    assert "not 8 GPUs" in unresolvable["t4-timeslice-0"]  # 8 replicas are not 8 GPUs
    assert set(unresolvable) | set(out["FailedNodes"]) | {"h100-hgx-0"} == set(NODE_NAMES)


def test_mig_1g5gb_passes_only_on_the_mixed_a100() -> None:
    out = verbs.filter_nodes(cluster(), args("filter-nodecache-true-pod-mig-1g.5gb", NODE_NAMES))
    assert out["NodeNames"] == ["a100-mig-mixed-0"]
    assert all(n in out["FailedAndUnresolvableNodes"] for n in NODE_NAMES if n != "a100-mig-mixed-0")


def test_mig_instances_are_counted_and_the_reason_names_the_profile() -> None:
    held = [gpu_pod(f"mig-{i}", 1, node="a100-mig-mixed-0", resource="nvidia.com/mig-1g.5gb") for i in range(16)]
    out = verbs.filter_nodes(cluster(held), args("filter-nodecache-true-pod-mig-1g.5gb", ["a100-mig-mixed-0"]))
    assert out["NodeNames"] == []
    assert out["FailedNodes"]["a100-mig-mixed-0"] == "mig-1g.5gb: 0 of 16 free"  # preemption could help


def test_busy_gpus_are_resolvable_and_nvlink_asks_explain_the_largest_set() -> None:
    state = cluster([gpu_pod("held", 6, node="h100-hgx-0", annotations={labels.ANN_GPUS: "0,1,2,3,4,5"})])
    out = verbs.filter_nodes(state, args("filter-nodecache-true-pod-gpu4", ["h100-hgx-0"]))
    assert out["FailedNodes"] == {"h100-hgx-0": "4 whole GPUs asked, 2 of 8 free"}
    pairs = copy.deepcopy(node_fixture("h100-hgx-0"))
    pairs["metadata"]["name"] = "h100-pairs-0"
    pairs["metadata"]["labels"][labels.TOPOLOGY_LABEL] = "nvlink-pairs"
    body = args("filter-nodecache-true-pod-gpu4", ["h100-pairs-0"])
    body["Pod"]["metadata"]["annotations"] = {labels.ANN_TOPOLOGY: "nvlink"}
    out = verbs.filter_nodes(cluster(extra_nodes=[pairs]), body)
    assert out["FailedAndUnresolvableNodes"] == {"h100-pairs-0": "no NVLink-connected set of 4 GPUs on this node"}


def test_nodecache_false_answers_with_node_objects() -> None:
    body = args("filter-nodecache-false-pod-gpu4")
    out = verbs.filter_nodes(cluster(), body)
    assert out["NodeNames"] is None
    passed = [n["metadata"]["name"] for n in out["Nodes"]["items"]]
    sent = {n["metadata"]["name"]: n for n in body["Nodes"]["items"]}
    assert passed == ["h100-degraded-0", "h100-hgx-0"]  # 5 usable GPUs still hold a 4-GPU pod
    assert out["Nodes"]["items"] == [sent[n] for n in passed]


def test_filter_never_mutates_state() -> None:
    state = cluster([gpu_pod("held", 2, node="h100-hgx-0")])
    before = (state.fleet.gpu.copy(), state.fleet.cpu.copy(), {k: v.placement for k, v in state.pods.items()},
              copy.deepcopy(state.nodes["h100-hgx-0"].gpus.placements))
    for name in ("filter-nodecache-true-pod-gpu4", "filter-nodecache-true-pod-mig-1g.5gb",
                 "filter-nodecache-true-pod-high-gpu8-after-preemption"):
        verbs.filter_nodes(state, args(name, NODE_NAMES))
    assert np.array_equal(before[0], state.fleet.gpu) and np.array_equal(before[1], state.fleet.cpu)
    assert before[2] == {k: v.placement for k, v in state.pods.items()}
    assert before[3] == state.nodes["h100-hgx-0"].gpus.placements


def test_not_synced_filter_answers_error_not_a_guess() -> None:
    out = verbs.filter_nodes(ClusterState(), args("filter-nodecache-true-pod-gpu4"))
    assert "not synced" in out["Error"] and out["NodeNames"] is None


def test_prioritize_prefers_an_nvlinked_free_set_and_puts_degraded_last() -> None:
    pairs = copy.deepcopy(node_fixture("h100-hgx-0"))
    pairs["metadata"]["name"] = "h100-pairs-0"
    pairs["metadata"]["labels"][labels.TOPOLOGY_LABEL] = "nvlink-pairs"
    state = cluster(extra_nodes=[pairs])
    body = args("prioritize-nodecache-true-pod-gpu4", ["h100-pairs-0", "h100-hgx-0", "h100-degraded-0"])
    scores = {h["Host"]: h["Score"] for h in verbs.prioritize(state, body)}
    assert all(0 <= s <= 10 and isinstance(s, int) for s in scores.values())
    assert scores["h100-hgx-0"] > scores["h100-pairs-0"]
    assert scores["h100-degraded-0"] == 0


def test_prioritize_answers_every_host_of_the_real_request() -> None:
    body = args("prioritize-nodecache-true-pod-gpu4")
    out = verbs.prioritize(cluster(), body)
    assert [h["Host"] for h in out] == body["NodeNames"]
    assert {h["Host"]: h["Score"] for h in out}["h100-hgx-0"] == 10


def test_prioritize_reuses_the_filter_verdict_only_while_the_node_is_unchanged(
        monkeypatch: pytest.MonkeyPatch) -> None:
    held = gpu_pod("held", 6, node="h100-hgx-0", annotations={labels.ANN_GPUS: "0,1,2,3,4,5"})
    state = cluster([held])
    nodes = ["h100-hgx-0", "h100-degraded-0"]
    out = verbs.filter_nodes(state, args("filter-nodecache-true-pod-gpu4", nodes))
    assert out["NodeNames"] == ["h100-degraded-0"] and "h100-hgx-0" in out["FailedNodes"]
    calls: list[str] = []

    def counted(ns: NodeState, demand: Demand, place: bool = True, settled: Any = None) -> Fit:
        calls.append(ns.name)
        return fit(ns, demand, place, settled)

    monkeypatch.setattr(state_module, "fit", counted)
    verbs.prioritize(state, args("prioritize-nodecache-true-pod-gpu4", nodes))
    assert calls == []  # kube-scheduler asks right after filter: nothing changed, nothing recomputed
    state.apply_pod("DELETED", held)  # now the 4-GPU pod fits there: the old "no" must not stand
    scores = {h["Host"]: h["Score"] for h in verbs.prioritize(state, args("prioritize-nodecache-true-pod-gpu4", nodes))}
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

    monkeypatch.setattr(state_module, "fit", counted_fit)
    monkeypatch.setattr(state_module, "inventory_verdict", counted_inventory)
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
    out = verbs.filter_nodes(state, {"Pod": pod_of("filter-nodecache-true-pod-gpu4"), "NodeNames": names})
    assert len([c for c in calls if c[0] == "inventory"]) == len(NODE_NAMES)  # the twins add no kind
    assert ("fit", "h100-hgx-0") in calls and ("fit", "h100-hgx-1") in calls  # occupancy: per node
    assert "h100-hgx-0" in out["NodeNames"] and "h100-hgx-1" in out["FailedNodes"]  # 2 of 8 free there
    assert out["FailedAndUnresolvableNodes"]["t4-timeslice-1"] == out["FailedAndUnresolvableNodes"]["t4-timeslice-0"]
    demand = demand_of(pod_of("filter-nodecache-true-pod-gpu4"))
    fresh = [fit(state.nodes[n], demand, place=False) for n in names]
    assert [(f.ok, f.reason) for f in state.fits(names, demand)] == [(f.ok, f.reason) for f in fresh]
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
        return verbs.filter_nodes(state, {"Pod": pod, "NodeNames": NODE_NAMES})

    assert ask(first)["NodeNames"] and sorted({n for _, n in calls}) == NODE_NAMES
    assert ask(second)["NodeNames"] and calls == []  # same ask, nothing changed
    state.assume("gpu-jobs/train-gpu4", "h100-hgx-0", fit(state.nodes["h100-hgx-0"], demand_of(first)).placement)
    assert "h100-hgx-0" in ask(second)["NodeNames"] and calls == [("fit", "h100-hgx-0")]  # 4 of 8 GPUs free
    state.apply_pod("ADDED", second)
    state.assume("gpu-jobs/train-gpu4-b", "h100-hgx-0",
                 fit(state.nodes["h100-hgx-0"], demand_of(second)).placement)
    third = copy.deepcopy(second)
    third["metadata"].update(name="train-gpu4-c", uid="uid-c")
    out = ask(third)
    assert calls == [("fit", "h100-hgx-0")] and "h100-hgx-0" in out["FailedNodes"]  # full: the old "yes" is gone
    mig = pod_of("filter-nodecache-true-pod-mig-1g.5gb")
    ask(mig)
    assert sorted({n for _, n in calls}) == NODE_NAMES  # another ask is checked afresh
    state.apply_node("DELETED", node_fixture("h100-hgx-0"))
    assert all("h100-hgx-0" not in kept.by_node for kept in state.verdicts.values())  # nothing kept for nodes gone
    state.reset_nodes([node_fixture(n) for n in NODE_NAMES])  # a relist replaces every node
    ask(third)
    assert sorted({n for _, n in calls}) == NODE_NAMES
    for pod in (third, mig):  # what is kept is what fit() says now, reasons included
        demand = demand_of(pod)
        kept = state.fits(NODE_NAMES, demand)
        fresh = [fit(state.nodes[n], demand, place=False) for n in NODE_NAMES]
        assert [(f.ok, f.reason) for f in kept] == [(f.ok, f.reason) for f in fresh]


def test_only_the_most_recent_asks_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_module, "KEPT_ASKS", 2)
    state = cluster()
    asks = [demand_of(gpu_pod(f"p{k}", k)) for k in (1, 2, 3)]
    for demand in asks:
        state.fits(NODE_NAMES, demand)
    assert len(state.verdicts) == 2 and all(d.key == "" for d in state.verdicts)
    assert [d.units for d in state.verdicts] == [2, 3]  # the least recently asked went first


def test_fit_without_placing_gives_the_same_verdicts_and_reasons() -> None:
    state = cluster([gpu_pod("held", 6, node="h100-hgx-0", annotations={labels.ANN_GPUS: "0,1,2,3,4,5"})])
    for name in ("filter-nodecache-true-pod-gpu4", "filter-nodecache-true-pod-mig-1g.5gb",
                 "filter-nodecache-true-pod-high-gpu8-after-preemption"):
        demand = demand_of(pod_of(name))
        for node in NODE_NAMES:
            full, quick = fit(state.nodes[node], demand), fit(state.nodes[node], demand, place=False)
            assert (quick.ok, quick.reason, quick.unresolvable) == (full.ok, full.reason, full.unresolvable)
            assert quick.placement is None or quick.placement == full.placement


def test_the_mix_is_learnt_from_the_pods_the_api_shows_each_once() -> None:
    """A restarted extender knows the cluster's mix from the list, not from memory."""
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
    verbs.prioritize(state, body)
    verbs.prioritize(state, body)  # asked again about the same pod: still one pod
    pending = state.pods["gpu-jobs/train-gpu4"]
    state.assume(pending.key, "h100-hgx-0", None)
    assert mix.total == 3 and mix.counts[(pending.demand.cpu_milli, MILLI, 4, frozenset())] == 1
    state.apply_pod("DELETED", bound[0])
    assert "uid-two" not in state.seen and mix.total == 3  # the mix keeps its history


def test_preempt_keeps_nodes_where_eviction_frees_the_gpus_and_drops_the_rest() -> None:
    state = cluster(VICTIMS)
    out = verbs.preempt(state, PREEMPT)["NodeNameToMetaVictims"]
    assert {p["UID"] for p in out["h100-hgx-0"]["Pods"]} == {v["metadata"]["uid"] for v in VICTIMS}
    # evicting only one of the two 4-GPU pods does not free 8 GPUs: the node is removed
    meta = {"Pod": PREEMPT["Pod"], "NodeNameToMetaVictims": {
        "h100-hgx-0": {"Pods": [{"UID": VICTIMS[0]["metadata"]["uid"]}], "NumPDBViolations": 0}}}
    assert verbs.preempt(state, meta) == {"NodeNameToMetaVictims": {}}


def test_preempt_drops_victims_whose_gpus_are_not_needed() -> None:
    state = cluster(VICTIMS)  # two 4-GPU pods fill the node
    four = copy.deepcopy(PREEMPT)
    four["Pod"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "4"},
                                                           "requests": {"nvidia.com/gpu": "4"}}
    both = {"Pods": [{"UID": v["metadata"]["uid"]} for v in VICTIMS], "NumPDBViolations": 0}
    out = verbs.preempt(state, {"Pod": four["Pod"], "NodeNameToMetaVictims": {"h100-hgx-0": both}})
    assert len(out["NodeNameToMetaVictims"]["h100-hgx-0"]["Pods"]) == 1  # one 4-GPU victim is enough


def test_preempt_agrees_with_a_cluster_that_never_had_the_evicted_pods() -> None:
    """Preempt tries evictions on a private copy of the node; the answer must be what a cluster without
    those pods would say (greedy, in the order kube-scheduler lists the victims), and the real state
    must be left as it was."""
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
            keep = list(victims)
            for uid in victims:
                if uid.startswith("uid-w") or uid.startswith("uid-far"):  # GPU pods known to the extender
                    rest = [u for u in keep if u != uid]
                    if fits_without(rest):
                        keep = rest
            expected[node] = {"Pods": [{"UID": u} for u in keep], "NumPDBViolations": 0}
        state = cluster(pods)
        before = dict(state.nodes[node].gpus.placements)
        body = {"Pod": ask, "NodeNameToMetaVictims": {node: {"Pods": [{"UID": u} for u in victims]}}}
        assert verbs.preempt(state, body) == {"NodeNameToMetaVictims": expected}, case
        assert state.nodes[node].gpus.placements == before and state.nodes[node].gpus.free_whole() == []


class RecordingBinder:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, str, str, str, str | None]] = []
        self.fail = fail

    async def bind(self, namespace: str, name: str, uid: str, node: str, gpus: str | None) -> None:
        self.calls.append((namespace, name, uid, node, gpus))
        if self.fail:
            raise RuntimeError("409 Conflict: pod already bound")


@pytest.fixture
async def client_for() -> AsyncIterator[Any]:
    clients: list[TestClient[web.Request, web.Application]] = []

    async def make(state: ClusterState, binder: Any = None) -> TestClient[web.Request, web.Application]:
        c = TestClient(TestServer(make_app(state, binder)))
        await c.start_server()
        clients.append(c)
        return c

    yield make
    for c in clients:
        await c.close()


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


async def test_api_binder_patches_the_annotation_then_posts_the_binding() -> None:
    async with FakeApi() as api, api.api_client() as http:
        await ApiBinder(http).bind("gpu-jobs", "train-gpu4", "u-1", "h100-hgx-0", "0,1,2,3")
    assert api.patches == [("gpu-jobs", "train-gpu4", {"metadata": {"annotations": {labels.ANN_GPUS: "0,1,2,3"}}})]
    assert api.bindings[0]["target"] == {"apiVersion": "v1", "kind": "Node", "name": "h100-hgx-0"}
    assert api.bindings[0]["metadata"]["name"] == "train-gpu4"


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
    state = ClusterState()
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
        out = verbs.filter_nodes(cluster(), args(name))
        assert set(out) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
        json.dumps(out)
