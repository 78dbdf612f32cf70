"""Bodies kube-scheduler never sends are answered 400, with the field that is wrong, never a 200 that
acts on them or an exception (tests/extender/test_fuzz_extender.py found each of these).

kube-scheduler sends what its own types encode: a Pod the API server decoded, Node objects with
names, ExtenderBindingArgs that name a pod and a node. So a value of the wrong JSON type is a broken
client, and the extender says so instead of guessing (a pod with ``status: true`` used to raise deep
in the cache, a Binding to node "" was made).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.conftest import load_fixture
from tests.extender.builders import RecordingBinder, cluster

Change = tuple[tuple[str | int, ...], Any]
DROP = object()


def changed(fixture: str, *changes: Change) -> dict[str, Any]:
    body: dict[str, Any] = copy.deepcopy(load_fixture("extender", f"{fixture}.json"))
    for path, value in changes:
        at: Any = body
        for step in path[:-1]:
            at = at[step]
        if value is DROP:
            del at[path[-1]]
        else:
            at[path[-1]] = value
    return body


def deep(depth: int) -> Any:
    out: Any = "x"
    for _ in range(depth):
        out = [out]
    return out


GPU4 = "filter-nodecache-true-pod-gpu4"
NOCACHE = "filter-nodecache-false-pod-gpu4"
PREEMPT = "preempt-nodecache-true-pod-high-gpu8"
CONTAINER = ("Pod", "spec", "containers", 0)

POD_CASES = [
    pytest.param((("Pod", "status"), True), id="status-not-an-object"),  # was a 200 with an AttributeError
    pytest.param((("Pod", "spec"), ["x"]), id="spec-a-list"),
    pytest.param((("Pod", "metadata", "annotations"), {"gpu-tailor.io/gpus": 1}), id="annotation-not-a-string"),
    pytest.param((("Pod", "metadata", "uid"), {"a": 1}), id="uid-not-a-string"),
    pytest.param((("Pod", "spec", "nodeName"), 5), id="node-name-not-a-string"),
    pytest.param((("Pod", "status", "phase"), ["Running"]), id="phase-not-a-string"),
    pytest.param((("Pod", "spec", "containers"), {"name": "x"}), id="containers-not-a-list"),
    pytest.param(((*CONTAINER, "resources"), ["4"]), id="resources-a-list"),
    pytest.param(((*CONTAINER, "resources", "requests"), [{"cpu": "1"}]), id="requests-a-list"),
    pytest.param(((*CONTAINER, "resources", "limits", "nvidia.com/gpu"), True), id="quantity-a-boolean"),
    pytest.param((("Pod", "spec", "overhead"), "1"), id="overhead-not-an-object"),
    pytest.param((("Pod", "spec", "initContainers"), ["x"]), id="init-container-not-an-object"),
]


@pytest.mark.parametrize("change", POD_CASES)
@pytest.mark.parametrize("verb,fixture", [("filter", GPU4), ("prioritize", GPU4), ("preempt", PREEMPT)])
async def test_a_pod_of_the_wrong_shape_is_400(client_for: Any, verb: str, fixture: str, change: Change) -> None:
    client = await client_for(cluster())
    resp = await client.post(f"/{verb}", json=changed(fixture, change))
    assert resp.status == 400
    assert (await resp.json())["Error"].startswith("Pod.")


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
@pytest.mark.parametrize("change", [
    pytest.param((("Nodes", "items", 0, "metadata"), DROP), id="node-without-metadata"),  # was a node named ""
    pytest.param((("Nodes", "items", 0, "metadata"), ["x"]), id="metadata-a-list"),  # was an AttributeError
    pytest.param((("Nodes", "items", 0, "metadata", "name"), 7), id="name-a-number"),  # was a node named "7"
    pytest.param((("Nodes", "items", 0, "metadata", "uid"), deep(300)), id="nested-past-what-can-be-sent-back"),
])
async def test_a_node_list_kube_scheduler_could_not_have_sent_is_400(client_for: Any, verb: str,
                                                                      change: Change) -> None:
    client = await client_for(cluster())
    resp = await client.post(f"/{verb}", json=changed(NOCACHE, change))
    assert resp.status == 400 and "node" in (await resp.json())["Error"].lower()


@pytest.mark.parametrize("change", [
    pytest.param((("Node",), ""), id="no-node"),  # was bound, to node ""
    pytest.param((("PodName",), ""), id="no-pod-name"),
    pytest.param((("PodNamespace",), ""), id="no-namespace"),
    pytest.param((("PodUID",), 5), id="uid-a-number"),  # was bound with uid "5" as the precondition
])
async def test_binding_args_without_a_pod_or_a_node_bind_nothing(client_for: Any, change: Change) -> None:
    binder = RecordingBinder()
    client = await client_for(cluster(), binder)
    resp = await client.post("/bind", json=changed("bind-pod-gpu4", change))
    assert resp.status == 400 and "ExtenderBindingArgs" in (await resp.json())["Error"]
    assert binder.calls == []
