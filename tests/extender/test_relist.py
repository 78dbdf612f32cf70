"""Relists that scale: the pod projection, the memo of demands, relists as diffs handled in chunks, and
readiness that follows the watches' freshness.

Pods are the real ones of the fixtures (admission requests, ExtenderArgs, the watch stream), read
both as full dicts and lazily with simdjson the way the extender's watch reads them.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
import simdjson

from gpu_tailor.extender.cache import Cache
from gpu_tailor.extender.records import KNOWN, Demands, PodProjector, pod_record
from gpu_tailor.extender.relist import POD_CHUNK
from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.inventory import from_node, node_fields
from gpu_tailor.gpumodel.schedule import demand_of
from gpu_tailor.kube.freshness import STALE_AFTER, Freshness
from gpu_tailor.kube.podfields import slim_pod
from tests.conftest import FIXTURES, load_fixture, node_fixture
from tests.extender.builders import NODE_NAMES, cluster, gpu_pod, pod_of

HGX = "h100-hgx-0"


def fixture_pods() -> list[dict[str, Any]]:
    pods = [load_fixture("admission", p.name)["request"]["object"] for p in sorted((FIXTURES / "admission").iterdir())]
    pods += [load_fixture("extender", p.name)["Pod"] for p in sorted((FIXTURES / "extender").glob("*.json"))
             if "Pod" in load_fixture("extender", p.name)]
    pods += [orjson.loads(line)["object"] for line in (FIXTURES / "watch" / "pods-watch-create-bind-delete.ndjson")
             .read_bytes().splitlines() if b'"BOOKMARK"' not in line]
    sidecar = copy.deepcopy(pods[0])  # a native sidecar and a RuntimeClass overhead: both count
    sidecar["spec"]["initContainers"] = [{"name": "proxy", "restartPolicy": "Always", "image": "envoy",
                                          "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}}}]
    sidecar["spec"]["overhead"] = {"cpu": "100m", "memory": "32Mi"}
    return [*pods, sidecar]


def lazily(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as the watch reads it: parsed lazily by simdjson, then projected."""
    doc: Any = simdjson.Parser().parse(orjson.dumps({"object": pod}))
    try:
        return slim_pod(doc["object"])
    finally:
        del doc


@pytest.mark.parametrize("pod", fixture_pods(), ids=lambda p: f"{p['metadata'].get('name', '?')}")
def test_a_projected_pod_makes_the_same_record_as_the_whole_pod(pod: dict[str, Any]) -> None:
    slim = lazily(pod)
    assert pod_record(slim) == pod_record(pod)
    assert demand_of(slim) == demand_of(pod)
    assert len(orjson.dumps(slim)) < len(orjson.dumps(pod))
    assert slim_pod(pod) == slim  # a dict projects the same as the lazy object


def test_a_projection_ignores_what_is_not_the_expected_shape() -> None:
    odd = {"metadata": "x", "spec": {"containers": "nope", "initContainers": [1, {"name": "i"}], "overhead": []},
           "status": []}
    assert lazily(odd) == slim_pod(odd) == {"spec": {"initContainers": [{"name": "i"}]}}


def test_the_memo_of_demands_agrees_with_demand_of_for_every_pod_name_and_gpus_annotation() -> None:
    memo = Demands(size=2)
    pods = [gpu_pod(f"r{i}", 2, annotations={labels.ANN_GPUS: f"{i},{i + 1}"}) for i in range(5)]
    pods += [gpu_pod("other", 4), pod_of("filter-nodecache-true-pod-mig-1g.5gb")]
    for pod in [*pods, *pods]:  # the second round hits entries, and some were pushed out
        assert memo.of(pod) == demand_of(pod)
    assert len(memo.memo) == 2
    replicas = Demands()
    for pod in pods[:5]:
        replicas.of(pod)
    assert len(replicas.memo) == 1  # names and bind's annotation are not part of the ask


def test_a_relist_of_what_the_cache_already_has_touches_no_node() -> None:
    pods = [gpu_pod(f"p{i}", 1, node=HGX, annotations={labels.ANN_GPUS: str(i)}) for i in range(4)]
    cache = cluster(pods)
    cache.snapshot()
    records = dict(cache.pods)
    generations = dict(cache.generation)
    cache.reset_pods([*pods, pod_of("filter-nodecache-true-pod-gpu4")])
    assert cache.generation == generations
    assert all(cache.pods[k] is records[k] for k in records)  # the same records, not rebuilt
    cache.reset_pods(pods[1:])  # one deleted and the pending one gone while the watch was down
    assert sorted(cache.pods) == [f"gpu-jobs/p{i}" for i in (1, 2, 3)]
    assert {n for n, g in cache.generation.items() if g != generations[n]} == {HGX}
    assert cache._dirty == set()  # the relist copied the changed node into the read side itself
    assert cache.nodes[HGX].gpus.free_whole() == [0, 4, 5, 6, 7]


def test_a_relist_hands_the_event_loop_back_between_chunks() -> None:
    cache = cluster()
    pods = [gpu_pod(f"c{i}", 0) for i in range(2 * POD_CHUNK + 1)]
    relist = cache.relist_pods()
    steps = relist.page(pods)
    next(steps)
    assert len(cache.pods) == POD_CHUNK + 1  # the first chunk is in (the fixture's pending pod was there)
    assert sum(1 for _ in steps) == 1
    assert sum(1 for _ in relist.done()) == 1  # the pending pod is gone: one block of keys looked at
    assert len(cache.pods) == 2 * POD_CHUNK + 1 and cache.pods_synced


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_readiness_and_the_staleness_metric_follow_when_each_watch_was_last_heard(client_for: Any) -> None:
    clock = Clock()
    cache = cluster(clock=clock)
    nodes, pods = cache.freshness["nodes"], cache.freshness["pods"] = Freshness(clock), Freshness(clock)
    client = await client_for(cache)
    assert (await client.get("/readyz")).status == 503  # never heard from: not ready
    nodes.heard()
    pods.heard()
    assert (await client.get("/readyz")).status == 200
    clock.now += STALE_AFTER + 1
    pods.heard()  # the pod watch is fine, the node watch went quiet
    assert (await client.get("/readyz")).status == 503
    nodes.heard()
    assert (await client.get("/readyz")).status == 200
    assert cache.ready and Cache(clock=clock).ready is False
    clock.now += 7
    pods.heard()
    metrics = await (await client.get("/metrics")).text()
    assert 'gpu_tailor_extender_watch_staleness_seconds{resource="nodes"} 7.0' in metrics
    assert 'gpu_tailor_extender_watch_staleness_seconds{resource="pods"} 0.0' in metrics


def test_a_relist_reads_again_only_the_pods_whose_resource_version_moved(monkeypatch: pytest.MonkeyPatch) -> None:
    pods = [gpu_pod(f"v{i}", 1, node=HGX) for i in range(3)]
    for i, pod in enumerate(pods):
        pod["metadata"]["resourceVersion"] = str(100 + i)
    cache = cluster(pods)
    applied: list[str] = []
    apply = cache.apply_pod

    def counted(event: str, obj: dict[str, Any]) -> None:
        applied.append(obj["metadata"]["name"])
        apply(event, obj)

    monkeypatch.setattr(cache, "apply_pod", counted)
    moved = copy.deepcopy(pods[1])
    moved["metadata"]["resourceVersion"] = "200"
    moved["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "2"
    cache.reset_pods([pods[0], moved, pods[2]])
    assert applied == ["v1"]  # the others are at the version the cache holds
    assert cache.pods["gpu-jobs/v1"].demand.cpu_milli == 2000 and cache.pods["gpu-jobs/v1"].version == "200"


def test_a_pod_the_cache_holds_at_that_version_is_read_no_further_than_its_metadata() -> None:
    pod = gpu_pod("v", 1, node=HGX)
    pod["metadata"]["resourceVersion"] = "100"
    cache = cluster([pod])
    project = PodProjector(cache.holds_version)

    def lazily_by(pod: dict[str, Any]) -> dict[str, Any]:
        doc: Any = simdjson.Parser().parse(orjson.dumps(pod))
        try:
            return project(doc)
        finally:
            del doc

    known = lazily_by(pod)
    assert known == {"metadata": {"name": "v", "namespace": "gpu-jobs", "uid": "uid-v", "resourceVersion": "100"},
                     KNOWN: True}
    moved = copy.deepcopy(pod)
    moved["metadata"]["resourceVersion"] = "101"
    full = lazily_by(moved)
    assert pod_record(full) == pod_record(moved) and full["spec"]["nodeName"] == HGX
    cache.apply_pod("DELETED", known)  # a deletion carries the last version: the metadata is enough
    assert "gpu-jobs/v" not in cache.pods and cache.nodes[HGX].gpus.free_whole() == list(range(8))


@pytest.mark.parametrize("name", NODE_NAMES)
def test_a_projected_node_makes_the_same_inventory_as_the_whole_node(name: str) -> None:
    node = node_fixture(name)
    doc: Any = simdjson.Parser().parse(orjson.dumps(node))
    try:
        slim = node_fields(doc)
    finally:
        del doc
    assert from_node(slim) == from_node(node) == from_node(node_fields(node))
    assert len(orjson.dumps(slim)) < len(orjson.dumps(node))
