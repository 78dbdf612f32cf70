"""Builders for the extender's tests: real ExtenderArgs fixtures, GPU pods, a synced cache, a binder."""

from __future__ import annotations

import copy
from typing import Any

from gpu_tailor.extender.cache import Cache
from gpu_tailor.gpumodel import labels
from tests.conftest import FIXTURES, load_fixture, node_fixture

NODE_NAMES = sorted(p.stem for p in (FIXTURES / "nodes").glob("*.json"))


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


def cluster(pods: list[dict[str, Any]] = (), extra_nodes: list[dict[str, Any]] = (),  # type: ignore[assignment]
            **kwargs: Any) -> Cache:
    state = Cache(**kwargs)
    state.reset_pods([*pods, pod_of("filter-nodecache-true-pod-gpu4")])  # the pending pod is known too
    state.reset_nodes([node_fixture(n) for n in NODE_NAMES] + list(extra_nodes))
    return state


def nodes_only() -> Cache:
    """Synced, with the fixture nodes, before the pod watch delivered any pod."""
    state = Cache()
    state.reset_pods([])
    state.reset_nodes([node_fixture(n) for n in NODE_NAMES])
    return state


class RecordingBinder:
    def __init__(self, fail: bool = False, pods: list[dict[str, Any]] = ()) -> None:  # type: ignore[assignment]
        self.calls: list[tuple[str, str, str, str, str | None]] = []
        self.fail = fail
        self.pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
        self.reads: list[tuple[str, str]] = []
        self.among: list[str | None] = []  # the gpus-among annotation of each call

    async def bind(self, namespace: str, name: str, uid: str, node: str, gpus: str | None,
                   among: str | None = None) -> None:
        self.calls.append((namespace, name, uid, node, gpus))
        self.among.append(among)
        if self.fail:
            raise RuntimeError("409 Conflict: pod already bound")

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads.append((namespace, name))
        return self.pods.get((namespace, name))
