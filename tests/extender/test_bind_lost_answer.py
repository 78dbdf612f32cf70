"""A Binding whose answer is lost (a cut connection, an API server restart) is not a refusal: the
extender reads the pod back and takes the bind as done when the pod is bound there, and keeps its GPUs
counted while nobody can tell (issue 19; tests/e2e/test_faults.py reproduces it on a real control
plane with the answer cut after the API server acted)."""

from __future__ import annotations

import copy
from typing import Any

import aiohttp
import pytest

from gpu_tailor.extender.cache import Cache
from tests.extender.builders import args, cluster, pod_of

HGX = "h100-hgx-0"
KEY = "gpu-jobs/train-gpu4"


class LostAnswer:
    """Binds (the pod is bound afterwards, as the API server would have it), then the answer is lost.
    ``read``: what reading the pod back gives: "bound", "pending", "gone", or "down" (raises)."""

    def __init__(self, read: str) -> None:
        self.read = read
        self.reads = 0

    async def bind(self, namespace: str, name: str, uid: str, node: str, gpus: str | None) -> None:
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
        return pod


def held(cache: Cache) -> list[int]:
    return [i for i in range(8) if i not in cache.snapshot().nodes[HGX].state.gpus.free_whole()]


@pytest.mark.parametrize(("read", "answer", "assumed"), [
    pytest.param("bound", "", True, id="bound-anyway-is-done"),
    pytest.param("down", "not known yet", True, id="unknown-keeps-the-gpus-counted"),
    pytest.param("pending", "Server disconnected", False, id="not-bound-is-refused"),
    pytest.param("gone", "Server disconnected", False, id="gone-is-refused"),
])
async def test_a_lost_binding_answer_is_read_back_before_the_gpus_are_freed(
        client_for: Any, read: str, answer: str, assumed: bool) -> None:
    cache = cluster()
    binder = LostAnswer(read)
    client = await client_for(cache, binder)
    out = await (await client.post("/bind", json=args("bind-pod-gpu4"))).json()
    assert binder.reads == 1
    assert (out["Error"] == "") if not answer else (answer in out["Error"])
    assert (KEY in cache.assumed) is assumed
    assert len(held(cache)) == (4 if assumed else 0)
    if assumed:
        assert cache.pods[KEY].deadline != float("inf")  # and the assumption expires unless the watch shows it
