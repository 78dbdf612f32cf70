"""A Binding whose answer is lost (a cut connection, an API server restart) is not a refusal: the
extender reads the pod back and takes the bind as done when the pod is bound there, and keeps its GPUs
counted while nobody can tell (issue 19; tests/e2e/test_faults.py reproduces it on a real control
plane with the answer cut after the API server acted)."""

from __future__ import annotations

import copy
from typing import Any

import aiohttp
import orjson
import pytest
import simdjson

from gpu_tailor.extender.cache import Cache
from gpu_tailor.extender.records import KNOWN, PodProjector
from gpu_tailor.gpumodel import labels
from tests.extender.builders import args, cluster, pod_of

HGX = "h100-hgx-0"
ELSEWHERE = "h100-degraded-0"
KEY = "gpu-jobs/train-gpu4"


class LostAnswer:
    """Binds (the pod is bound afterwards, as the API server would have it), then the answer is lost.
    ``read``: what reading the pod back gives: "bound" (where bind put it), "elsewhere", "pending",
    "gone", or "down" (raises)."""

    def __init__(self, read: str) -> None:
        self.read = read
        self.reads = 0

    async def bind(self, namespace: str, name: str, uid: str, node: str, gpus: str | None,
                   among: str | None = None) -> None:
        raise aiohttp.ServerDisconnectedError()

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads += 1
        if self.read == "down":
            raise aiohttp.ClientConnectionError("connection refused")
        if self.read == "gone":
            return None
        pod = copy.deepcopy(pod_of("filter-nodecache-true-pod-gpu4"))
        body = args("bind-pod-gpu4")
        pod["metadata"]["uid"] = body["PodUID"]
        if self.read == "bound":
            pod["spec"]["nodeName"] = body["Node"]
        if self.read == "elsewhere":  # its first Binding went through; this one is kube-scheduler's retry
            pod["spec"]["nodeName"] = ELSEWHERE
            pod["metadata"]["annotations"] = {labels.ANN_GPUS: "4,5,6,7"}
        return pod


def held(cache: Cache) -> list[int]:
    return [i for i in range(8) if i not in cache.snapshot().nodes[HGX].state.gpus.free_whole()]


@pytest.mark.parametrize(("read", "answer", "state"), [
    pytest.param("bound", "", "confirmed", id="bound-anyway-is-done"),
    pytest.param("down", "not known yet", "assumed", id="unknown-keeps-the-gpus-counted"),
    pytest.param("pending", "Server disconnected", "pending", id="not-bound-is-refused"),
    pytest.param("gone", "Server disconnected", "pending", id="gone-is-refused"),
])
async def test_a_lost_binding_answer_is_read_back_before_the_gpus_are_freed(
        client_for: Any, read: str, answer: str, state: str) -> None:
    cache = cluster()
    binder = LostAnswer(read)
    client = await client_for(cache, binder)
    out = await (await client.post("/bind", json=args("bind-pod-gpu4"))).json()
    assert binder.reads == 1
    assert (out["Error"] == "") if not answer else (answer in out["Error"])
    rec = cache.pods[KEY]
    assert (rec.node, rec.assumed) == {"confirmed": (HGX, False), "assumed": (HGX, True), "pending": ("", False)}[state]
    assert len(held(cache)) == (0 if state == "pending" else 4)
    if state == "assumed":
        assert rec.deadline != float("inf")  # and the assumption expires unless the watch shows the pod


async def test_a_retry_refused_because_the_first_binding_went_through_counts_the_pod_where_it_is(
        client_for: Any) -> None:
    cache = cluster()
    client = await client_for(cache, LostAnswer("elsewhere"))
    out = await (await client.post("/bind", json=args("bind-pod-gpu4"))).json()
    assert f"bound to {ELSEWHERE}" in out["Error"]
    rec = cache.pods[KEY]
    assert rec.node == ELSEWHERE and not rec.assumed and rec.placement is not None
    assert rec.placement.gpus == (4, 5, 6, 7)  # its annotation, written by the Binding that went through
    assert held(cache) == []


class Retry:
    """kube-scheduler's retry of the pod (on ``ELSEWHERE`` or the same node). ``first``: where the API
    shows the pod now ("" pending; None: the API cannot be read)."""

    def __init__(self, first: str | None) -> None:
        self.first = first
        self.bound: list[str] = []

    async def bind(self, namespace: str, name: str, uid: str, node: str, gpus: str | None,
                   among: str | None = None) -> None:
        self.bound.append(node)

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self.first is None:
            raise aiohttp.ClientConnectionError("connection refused")
        pod = copy.deepcopy(pod_of("filter-nodecache-true-pod-gpu4"))
        pod["metadata"]["uid"] = args("bind-pod-gpu4")["PodUID"]
        if self.first:
            pod["spec"]["nodeName"] = self.first
            pod["metadata"]["annotations"] = {labels.ANN_GPUS: "0,1,2,3"}
        return pod


@pytest.mark.parametrize(("first", "retry", "bound", "node"), [
    pytest.param(HGX, ELSEWHERE, [], HGX, id="first-binding-went-through"),
    pytest.param(None, ELSEWHERE, [], HGX, id="still-unknown"),
    pytest.param("", ELSEWHERE, [ELSEWHERE], ELSEWHERE, id="first-binding-failed"),
    pytest.param(HGX, HGX, [], HGX, id="retried-on-the-same-node-where-it-went-through"),
])
async def test_a_retry_asks_the_api_before_it_replaces_an_unconfirmed_assumption(
        client_for: Any, first: str | None, retry: str, bound: list[str], node: str) -> None:
    """The first Binding's outcome was unknown (the API server was down), so its GPUs on HGX stay counted;
    kube-scheduler retries the pod on another node. Moving the assumption at once would free HGX's GPUs
    while the pod may run there: the retry reads the pod first."""
    cache = cluster()
    client = await client_for(cache, LostAnswer("down"))
    assert "not known yet" in (await (await client.post("/bind", json=args("bind-pod-gpu4"))).json())["Error"]
    binder = Retry(first)
    client = await client_for(cache, binder)
    body = {**args("bind-pod-gpu4"), "Node": retry}
    out = await (await client.post("/bind", json=body)).json()
    assert binder.bound == bound
    assert (out["Error"] == "") is (node == retry)
    assert cache.pods[KEY].node == node
    assert held(cache) == ([0, 1, 2, 3] if node == HGX else [])  # the GPUs the first Binding recorded


@pytest.mark.parametrize("retry", [HGX, ELSEWHERE])
async def test_a_retry_of_a_pod_the_api_has_shown_bound_sends_no_binding(client_for: Any, retry: str) -> None:
    """After an API server restart the relist may show a pod bound before kube-scheduler's retry of it
    arrives: bind answers from what the API showed and leaves its GPUs where its Binding put them."""
    pod = copy.deepcopy(pod_of("filter-nodecache-true-pod-gpu4"))
    pod["metadata"]["uid"] = args("bind-pod-gpu4")["PodUID"]
    pod["spec"]["nodeName"] = HGX
    pod["metadata"]["annotations"] = {labels.ANN_GPUS: "4,5,6,7"}
    pod["metadata"]["resourceVersion"] = "999"  # the write that bound it
    pod["status"] = {"phase": "Running"}
    cache = cluster()
    cache.apply_pod("MODIFIED", pod)
    binder = Retry(HGX)
    client = await client_for(cache, binder)
    out = await (await client.post("/bind", json={**args("bind-pod-gpu4"), "Node": retry})).json()
    assert binder.bound == []
    refused = f"binding {KEY} to {retry} failed: the pod is already bound to {HGX}"
    assert out["Error"] == ("" if retry == HGX else refused)
    assert held(cache) == [4, 5, 6, 7] and cache.pods[KEY].node == HGX


async def test_the_watch_event_of_a_pod_bind_read_back_does_not_free_its_gpus(client_for: Any) -> None:
    """The read-back confirmed the pod at its version; the watch then delivers that same version,
    which the projection reads no further than its metadata. It must change nothing."""
    cache = cluster()
    binder = LostAnswer("bound")
    client = await client_for(cache, binder)
    assert (await (await client.post("/bind", json=args("bind-pod-gpu4"))).json()) == {"Error": ""}
    shown = await binder.read_pod("gpu-jobs", "train-gpu4")
    assert shown is not None
    doc: Any = simdjson.Parser().parse(orjson.dumps(shown))
    try:
        event = PodProjector(cache.holds_version)(doc)
    finally:
        del doc
    assert event.get(KNOWN) is True
    cache.apply_pod("MODIFIED", event)
    assert cache.pods[KEY].node == HGX and held(cache) == [0, 1, 2, 3]
    stale = {**event, "metadata": {**event["metadata"], "resourceVersion": "1"}}  # projected before a newer write
    cache.apply_pod("MODIFIED", stale)
    assert cache.pods[KEY].node == HGX and held(cache) == [0, 1, 2, 3]


class DeletedDuringRead(LostAnswer):
    """The watch delivers the pod's deletion while bind waits for its read-back."""

    def __init__(self, cache: Cache) -> None:
        super().__init__("bound")
        self.cache = cache

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        pod = await super().read_pod(namespace, name)
        assert pod is not None
        self.cache.apply_pod("DELETED", pod)
        return pod


async def test_a_pod_deleted_while_bind_reads_it_back_stays_deleted(client_for: Any) -> None:
    cache = cluster()
    client = await client_for(cache, DeletedDuringRead(cache))
    await client.post("/bind", json=args("bind-pod-gpu4"))
    assert KEY not in cache.pods and held(cache) == []


async def test_a_retry_on_the_same_node_plans_without_its_own_stale_assumption(client_for: Any) -> None:
    cache = cluster()
    client = await client_for(cache, LostAnswer("down"))
    await client.post("/bind", json=args("bind-pod-gpu4"))  # outcome unknown: GPUs 0-3 stay counted
    binder = Retry("")  # the read shows it pending: the first Binding did not go through
    client = await client_for(cache, binder)
    assert (await (await client.post("/bind", json=args("bind-pod-gpu4"))).json()) == {"Error": ""}
    assert binder.bound == [HGX] and held(cache) == [0, 1, 2, 3]  # the same GPUs, not 4-7 beside a ghost
