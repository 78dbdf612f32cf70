"""Preempt on the wire kube-scheduler v1.28 reads: which nodes stay candidates, with which victims.

kube-scheduler's DefaultPreemption proposes, per node, the victims its in-tree filters need gone
(``SelectVictimsOnNode``: evict every lower-priority pod, then reprieve them one by one while the pod
still fits). ``callExtenders`` then sends them to the extender and reads back
``NodeNameToMetaVictims``: a node left out is no longer a candidate, and a node mapped to an empty
victim list fails the whole preemption ("expected at least one victim pod on node") when the
extender is not ignorable, as ours is not. These cases pin what the extender answers for each.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpu_tailor.extender import verbs, wire
from gpu_tailor.extender.cache import Cache
from gpu_tailor.gpumodel import labels
from tests.conftest import load_fixture
from tests.extender.builders import RecordingBinder, cluster, gpu_pod

NODE = "h100-hgx-0"  # 8 x H100, 96 CPUs, about 1890 GiB allocatable


def pod(name: str, gpus: int = 0, *, cpu: str = "", memory: str = "", node: str = "",
        on: str = "") -> dict[str, Any]:
    """A pod asking ``gpus`` whole GPUs and ``cpu``/``memory``; bound to ``node`` (holding the GPUs
    ``on`` names, as its gpu-tailor.io/gpus annotation) when given."""
    p = gpu_pod(name, gpus, node=node, annotations={labels.ANN_GPUS: on} if on else None)
    res: dict[str, dict[str, str]] = {"limits": {}, "requests": {}}
    if gpus:
        res["limits"][labels.GPU_RESOURCE] = res["requests"][labels.GPU_RESOURCE] = str(gpus)
    if cpu:
        res["requests"]["cpu"] = cpu
    if memory:
        res["requests"]["memory"] = memory
    p["spec"]["containers"][0]["resources"] = res
    return p


def meta(preemptor: dict[str, Any], victims: dict[str, list[str]], pdb: int = 0) -> dict[str, Any]:
    """ExtenderPreemptionArgs as a nodeCacheCapable kube-scheduler sends them: victims by UID."""
    return {"Pod": preemptor, "NodeNameToVictims": None, "NodeNameToMetaVictims": {
        n: {"Pods": [{"UID": f"uid-{v}"} for v in vs], "NumPDBViolations": pdb} for n, vs in victims.items()}}


def answer(victims: dict[str, list[str]], pdb: int = 0) -> dict[str, Any]:
    return {"NodeNameToMetaVictims": {n: {"Pods": [{"UID": f"uid-{v}"} for v in vs], "NumPDBViolations": pdb}
                                      for n, vs in victims.items()}}


# Two GPU pods hold all 96 CPUs and 4 of the 8 GPUs: the GPUs a 1-GPU pod needs are idle, its CPUs are not.
CPU_HELD = [pod("a", 2, cpu="48", node=NODE, on="0,1"), pod("b", 2, cpu="48", node=NODE, on="2,3")]
MEM_HELD = [pod("a", 2, memory="1800Gi", node=NODE, on="0,1"), pod("b", 2, memory="80Gi", node=NODE, on="2,3")]
THIRDS = [pod(x, 2, cpu="32", node=NODE, on=on) for x, on in (("a", "0,1"), ("b", "2,3"), ("c", "4,5"))]
FULL = [pod("a", 4, node=NODE, on="0,1,2,3"), pod("b", 4, node=NODE, on="4,5,6,7")]

CASES = [
    # (id, bound pods, preemptor, victims kube-scheduler proposes, answer)
    pytest.param(CPU_HELD, pod("p", 1, cpu="40"), {NODE: ["a", "b"]}, {NODE: ["a", "b"]},
                 id="cpu-held-by-gpu-victims-is-freed-by-them"),  # was {NODE: []}
    pytest.param(CPU_HELD, pod("p", 1, cpu="40"), {NODE: ["b"]}, {NODE: ["b"]},
                 id="the-one-victim-kube-scheduler-chose-for-cpu-stays"),  # was {NODE: []}
    pytest.param(MEM_HELD, pod("p", 1, memory="100Gi"), {NODE: ["a"]}, {NODE: ["a"]},
                 id="memory-held-by-a-gpu-victim-is-freed-by-it"),
    pytest.param(THIRDS, pod("p", 1, cpu="70"), {NODE: ["a"]}, {},
                 id="victims-that-free-gpus-but-not-enough-cpu-drop-the-node"),  # was {NODE: []}
    pytest.param(MEM_HELD, pod("p", 1, memory="200Gi"), {NODE: ["b"]}, {},
                 id="victims-that-free-gpus-but-not-enough-memory-drop-the-node"),
    pytest.param(FULL, pod("p", 8), {NODE: ["a"]}, {},
                 id="victims-that-free-too-few-gpus-drop-the-node"),
    pytest.param(FULL, pod("p", 8), {NODE: ["a", "b"]}, {NODE: ["a", "b"]},
                 id="victims-that-free-the-gpus-stay"),
    pytest.param(FULL, pod("p", 4), {NODE: ["a", "b"]}, {NODE: ["a", "b"]},
                 id="more-victims-than-the-gpus-need-are-kept-as-kube-scheduler-chose"),
    pytest.param(FULL[:1], pod("p", 1), {NODE: []}, {},
                 id="a-node-without-victims-is-left-out-not-answered-empty"),  # was {NODE: []}
    pytest.param(FULL, pod("p", 8), {NODE: ["a", "b", "unknown"]}, {NODE: ["a", "b", "unknown"]},
                 id="a-victim-the-extender-does-not-count-stays-as-listed"),
    pytest.param(FULL, pod("p", 8), {NODE: ["a", "b"], "node-nobody-knows": ["x"]}, {NODE: ["a", "b"]},
                 id="a-node-the-extender-does-not-know-is-left-out-for-a-gpu-pod"),
    pytest.param(FULL, pod("p", 0, cpu="1"), {"node-nobody-knows": ["x"]}, {"node-nobody-knows": ["x"]},
                 id="a-node-the-extender-does-not-know-stays-for-a-cpu-only-pod"),
    pytest.param([*FULL, pod("c", 0, cpu="90", node=NODE)], pod("p", 8, cpu="10"), {NODE: ["a", "b", "c"]},
                 {NODE: ["a", "b", "c"]}, id="a-cpu-only-victim-frees-its-cpu"),
    pytest.param([*FULL, pod("c", 0, cpu="90", node=NODE)], pod("p", 8, cpu="10"), {NODE: ["a", "b"]}, {},
                 id="cpu-held-by-a-pod-that-is-not-a-victim-drops-the-node"),
]


@pytest.mark.parametrize("bound,preemptor,victims,expected", CASES)
def test_preempt_keeps_a_node_with_all_its_victims_only_when_they_free_what_the_pod_needs(
        bound: list[dict[str, Any]], preemptor: dict[str, Any], victims: dict[str, list[str]],
        expected: dict[str, list[str]]) -> None:
    state = cluster(bound)
    before = {k: (r.node, r.placement) for k, r in state.pods.items()}
    used = (state.nodes[NODE].cpu_used, state.nodes[NODE].mem_used_mib, dict(state.nodes[NODE].units_used))
    assert verbs.preempt(state.snapshot(), meta(preemptor, victims)) == answer(expected)
    assert {k: (r.node, r.placement) for k, r in state.pods.items()} == before  # what-ifs on a copy
    assert (state.nodes[NODE].cpu_used, state.nodes[NODE].mem_used_mib, dict(state.nodes[NODE].units_used)) == used


def test_pdb_violations_are_passed_back() -> None:
    assert verbs.preempt(cluster(FULL).snapshot(), meta(pod("p", 8), {NODE: ["a", "b"]}, pdb=1)) == \
        answer({NODE: ["a", "b"]}, pdb=1)


def test_a_pod_no_node_can_take_is_no_candidate_anywhere() -> None:
    """Two NVIDIA resources in one pod: filter fails every node as unresolvable, so does preempt."""
    two = pod("p", 1)
    two["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu.shared"] = "1"
    two["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu.shared"] = "1"
    assert verbs.preempt(cluster(FULL).snapshot(), meta(two, {NODE: ["a", "b"]})) == answer({})


@pytest.mark.parametrize("fixture", ["preempt-nodecache-true-pod-high-gpu8", "preempt-nodecache-false-pod-high-gpu8"])
def test_the_real_requests_keep_both_victims(fixture: str) -> None:
    """kube-scheduler v1.28.7's own requests (UIDs with nodeCacheCapable, whole pods without)."""
    body = load_fixture("extender", f"{fixture}.json")
    source = body["NodeNameToMetaVictims"] or body["NodeNameToVictims"]
    victims = source[NODE]["Pods"]
    uids = [v.get("UID") or v["metadata"]["uid"] for v in victims]
    bound = load_fixture("extender", "preempt-nodecache-false-pod-high-gpu8.json")["NodeNameToVictims"][NODE]["Pods"]
    for victim, uid in zip(bound, uids, strict=True):  # the two captures ran on two clusters: same pods
        victim["metadata"]["uid"] = uid
    out = verbs.preempt(cluster(bound).snapshot(), body)
    assert out == {"NodeNameToMetaVictims": {NODE: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": 0}}}


@pytest.mark.parametrize("victims", [
    pytest.param({NODE: {"Pods": [{"UID": 5}]}}, id="uid-not-a-string"),
    pytest.param({NODE: {"Pods": [{}]}}, id="victim-without-uid"),
    pytest.param({NODE: {"Pods": {"UID": "x"}}}, id="pods-not-a-list"),
    pytest.param({NODE: ["uid-a"]}, id="victims-not-an-object"),
    pytest.param({NODE: {"Pods": [], "NumPDBViolations": "one"}}, id="pdb-count-not-a-number"),
    pytest.param([NODE], id="map-not-an-object"),
])
def test_malformed_victims_are_a_bad_request(victims: Any) -> None:
    body = {"Pod": pod("p", 8), "NodeNameToMetaVictims": victims}
    with pytest.raises(wire.WireError):
        verbs.preempt(cluster(FULL).snapshot(), body)


def test_full_victims_without_a_uid_are_a_bad_request() -> None:
    body = {"Pod": pod("p", 8), "NodeNameToVictims": {NODE: {"Pods": [copy.deepcopy(FULL[0])]}}}
    del body["NodeNameToVictims"][NODE]["Pods"][0]["metadata"]["uid"]
    with pytest.raises(wire.WireError):
        verbs.preempt(cluster(FULL).snapshot(), body)


async def test_preempt_errors_are_not_http_200(client_for: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """kube-scheduler's HTTPExtender.send fails a call on any status but 200 (it never reads the body
    then), and ExtenderPreemptionResult has no Error field: an error answered with 200 would be decoded
    as "no candidates" and preemption would quietly do nothing."""
    body = meta(pod("p", 8), {NODE: ["a", "b"]})
    client = await client_for(Cache())  # not synced yet
    resp = await client.post("/preempt", json=body)
    assert resp.status == 503 and "not synced" in (await resp.json())["Error"]

    client = await client_for(cluster(FULL))
    resp = await client.post("/preempt", data=b"[1]")
    assert resp.status == 400 and "Error" in await resp.json()

    def boom(*_: Any) -> Any:
        raise RuntimeError("surprise")

    monkeypatch.setattr(verbs, "preempt", boom)
    resp = await client.post("/preempt", json=body)
    assert resp.status == 500 and (await resp.json()) == {"Error": "preempt failed: RuntimeError: surprise"}


@pytest.mark.parametrize("verb,fixture,status", [
    ("filter", "filter-nodecache-true-pod-gpu4", 200),  # ExtenderFilterResult.Error, which kube-scheduler reads
    ("bind", "bind-pod-gpu4", 200),  # ExtenderBindingResult.Error, likewise
    ("prioritize", "prioritize-nodecache-true-pod-gpu4", 500),  # HostPriorityList has no Error field
])
async def test_other_verbs_report_errors_where_kube_scheduler_reads_them(
        client_for: Any, monkeypatch: pytest.MonkeyPatch, verb: str, fixture: str, status: int) -> None:
    def boom(*_: Any) -> Any:
        raise RuntimeError("surprise")

    for name in ("filter_nodes", "prioritize", "plan_bind"):
        monkeypatch.setattr(verbs, name, boom)
    client = await client_for(cluster(), RecordingBinder())
    resp = await client.post(f"/{verb}", json=load_fixture("extender", f"{fixture}.json"))
    assert resp.status == status
    assert (await resp.json())["Error"] == f"{verb} failed: RuntimeError: surprise"
