"""In a cluster the webhook keeps the GPU units bound pods hold (issue 19).

It used to watch only nodes, so "prefer capacity that is free now" and the "no X is free right now"
warning worked only with ``--cluster-file``. Now it also lists and watches the pods that can hold GPUs
(``status.phase!=Succeeded,status.phase!=Failed``) through ``kube.watch.list_and_watch``, keeping per
pod only its node and units. The API side is a fake API server replaying the real watch stream of a
GPU pod created, bound and deleted on the v1.28.7 control plane.
"""

from __future__ import annotations

import asyncio
import copy
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import yaml

from gpu_tailor.webhook.config import AdmissionPolicy
from gpu_tailor.webhook.mutate import decide
from gpu_tailor.webhook.server import watches
from gpu_tailor.webhook.state import ACTIVE_PODS, ClusterView
from tests.conftest import FIXTURES, review_fixture
from tests.kube.fakeapi import FakeApi

NODES = [json.loads(p.read_text()) for p in sorted((FIXTURES / "nodes").glob("*.json"))]
STREAM = (FIXTURES / "watch" / "pods-watch-create-bind-delete.ndjson").read_bytes().splitlines()
EVENTS = [json.loads(line) for line in STREAM]  # ADDED (pending), MODIFIED (bound), ..., DELETED


def node_list(rv: str) -> dict[str, Any]:
    return {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": rv}, "items": NODES}


def pod_list(rv: str, pods: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": rv}, "items": pods or []}


def pod_requests(api: FakeApi) -> list[dict[str, str]]:
    return [q for kind, q in api.requests if kind == "pods"]


async def pod_watches(api: FakeApi, n: int) -> None:
    """Until the fake has been asked for ``n`` pod watches."""
    while len([q for q in pod_requests(api) if q.get("watch", "").lower() == "true"]) < n:
        await api.wait_requests(len(api.requests) + 1)


@asynccontextmanager
async def webhook_watching(api: FakeApi, view: ClusterView) -> AsyncIterator[None]:
    async with api.api_client() as http:
        tasks = [asyncio.ensure_future(w) for w in watches(http, view)]
        try:
            yield
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def test_pod_watch_follows_a_pod_bound_then_deleted_and_keeps_only_its_units() -> None:
    view = ClusterView(AdmissionPolicy())
    async with FakeApi() as api:
        api.add_list("nodes", [node_list("444")])
        api.add_list("pods", [pod_list("444")])
        api.add_watch("pods", STREAM[:2])  # created (pending), then bound to h100-degraded-0
        api.add_watch("pods", STREAM[4:])  # deleted
        async with webhook_watching(api, view):
            await pod_watches(api, 2)  # the first pod watch ended (its events applied), the next began
            assert view.ready
            assert view.used == {"h100-degraded-0": {"nvidia.com/gpu": 1}}
            (key,) = view.held
            assert view.held[key] == ("h100-degraded-0", (("nvidia.com/gpu", 1),))
            assert sys.getsizeof(view.held[key]) < 100  # a slim record, not the pod
            await pod_watches(api, 3)
            assert view.used == {} and view.held == {}
    # the pod list and every pod watch ask only for pods that can still hold GPUs
    assert pod_requests(api) and all(q.get("fieldSelector") == ACTIVE_PODS for q in pod_requests(api))
    assert all("fieldSelector" not in q for kind, q in api.requests if kind == "nodes")


async def test_not_ready_until_both_nodes_and_pods_are_listed() -> None:
    view = ClusterView(AdmissionPolicy())
    async with FakeApi() as api:
        api.add_list("nodes", [node_list("444")])
        api.add_list_error("pods", 500)  # the pod list fails first: relisted after the backoff
        async with webhook_watching(api, view):
            while not any(kind == "pods" for kind, _ in api.requests) or not view.nodes_synced:
                await api.wait_requests(len(api.requests) + 1)
            assert view.nodes_synced and not view.ready


def bound(name: str, node: str, resource: str, units: int, uid: str | None = None) -> dict[str, Any]:
    res = {resource: str(units)}
    return {"metadata": {"name": name, "namespace": "team-a", "uid": uid or f"uid-{name}"},
            "spec": {"nodeName": node, "containers": [{"name": "main", "resources": {"limits": res, "requests": res}}]},
            "status": {"phase": "Running"}}


def fill(view: ClusterView, backing: str | None = None) -> list[dict[str, Any]]:
    """Bound pods that take every unit of ``backing`` (of everything when None) on every node, as watched."""
    pods = [bound(f"fill-{c.resource}-{n}", n, c.resource, c.max_units_per_node) for c in view.candidates()
            if backing in (None, c.backing) for n in c.nodes]
    for pod in pods:
        view.apply_pod("ADDED", pod)
    return pods


def test_watched_usage_steers_the_choice_and_the_warning() -> None:
    """Fixture d (a quarter of a GPU) goes to the time-sliced T4s. With them filled by watched pods, it goes
    where a unit is free now; with everything filled, the webhook says none is free; when the pods
    finish (DELETED, by the field selector), the first choice comes back without a warning."""
    view = ClusterView(AdmissionPolicy())
    view.reset_nodes(NODES)
    view.reset_pods([])
    request = review_fixture("d")["request"]
    first = decide(request, view.candidates(), view.policy)
    assert first.allowed and first.backing == "shared:time-slicing:4" and first.warnings == ()
    pods = fill(view, first.backing)
    elsewhere = decide(copy.deepcopy(request), view.candidates(), view.policy)
    assert elsewhere.allowed and elsewhere.backing != first.backing and elsewhere.warnings == ()
    pods += fill(view)
    full = decide(copy.deepcopy(request), view.candidates(), view.policy)
    assert full.allowed and full.warnings == (f"no {full.backing} is free right now; the pod waits for capacity",)
    for pod in pods:
        view.apply_pod("DELETED", pod)
    assert view.used == {}
    again = decide(copy.deepcopy(request), view.candidates(), view.policy)
    assert (again.backing, again.warnings) == (first.backing, ())


@pytest.mark.parametrize(("events", "used"), [
    pytest.param([("ADDED", bound("a", "n1", "nvidia.com/gpu", 2))], {"n1": {"nvidia.com/gpu": 2}}, id="added"),
    pytest.param([("ADDED", bound("a", "n1", "nvidia.com/gpu", 2)),
                  ("MODIFIED", bound("a", "n1", "nvidia.com/gpu", 2))],
                 {"n1": {"nvidia.com/gpu": 2}}, id="modified-counts-once"),
    pytest.param([("ADDED", bound("a", "n1", "nvidia.com/gpu", 2)), ("ADDED", bound("b", "n1", "nvidia.com/gpu", 1))],
                 {"n1": {"nvidia.com/gpu": 3}}, id="two-pods-add-up"),
    pytest.param([("ADDED", bound("a", "n1", "nvidia.com/gpu", 2)), ("DELETED", bound("a", "n1", "nvidia.com/gpu", 2))],
                 {}, id="deleted"),
    pytest.param([("ADDED", bound("a", "n1", "nvidia.com/gpu", 2)),
                  ("MODIFIED", {**bound("a", "n1", "nvidia.com/gpu", 2), "status": {"phase": "Succeeded"}})],
                 {}, id="finished"),
    pytest.param([("ADDED", bound("a", "", "nvidia.com/gpu", 2))], {}, id="pending-holds-nothing"),
    pytest.param([("ADDED", bound("a", "n1", "cpu", 2))], {}, id="no-gpu"),
    pytest.param([("ADDED", bound("a", "n1", "nvidia.com/gpu", 1, uid="u1")),
                  ("ADDED", bound("a", "n2", "nvidia.com/gpu", 1, uid="u2")),
                  ("DELETED", bound("a", "n1", "nvidia.com/gpu", 1, uid="u1"))],
                 {"n2": {"nvidia.com/gpu": 1}}, id="same-name-new-uid"),
])
def test_usage_follows_events(events: list[tuple[str, dict[str, Any]]], used: dict[str, dict[str, int]]) -> None:
    view = ClusterView(AdmissionPolicy())
    view.reset(NODES)
    for kind, pod in events:
        view.apply_pod(kind, pod)
    assert view.used == used


def test_a_relist_replaces_what_the_watch_knew() -> None:
    view = ClusterView(AdmissionPolicy())
    view.reset(NODES, [bound("a", "n1", "nvidia.com/gpu", 2)])
    view.reset_pods([bound("b", "n2", "nvidia.com/gpu", 1)])
    assert view.used == {"n2": {"nvidia.com/gpu": 1}} and len(view.held) == 1


def test_rbac_grants_the_pod_list_and_watch_and_nothing_more() -> None:
    docs = list(yaml.safe_load_all((FIXTURES.parents[1] / "manifests" / "webhook" / "rbac.yaml").read_text()))
    (role,) = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "gpu-tailor-webhook"]
    grants = {(r, tuple(rule["verbs"])) for rule in role["rules"] for r in rule["resources"]}
    assert grants == {("nodes", ("list", "watch")), ("pods", ("list", "watch")),
                      *((r, ("list", "watch")) for r in ("resourceslices", "resourceclaims", "deviceclasses")),
                      ("resourceclaimtemplates", ("create",))}
