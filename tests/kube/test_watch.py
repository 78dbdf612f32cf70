"""list_and_watch against a fake API server replaying the real list and watch streams."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from gpu_tailor.kube.freshness import Freshness
from gpu_tailor.kube.watch import list_all, list_and_watch, watching
from tests.conftest import FIXTURES, load_fixture, node_fixture
from tests.kube.fakeapi import FakeApi

STREAM = (FIXTURES / "watch" / "pods-watch-create-bind-delete.ndjson").read_bytes().splitlines()
EXPIRED = (FIXTURES / "watch" / "pods-watch-from-rv1-410-expired.ndjson").read_bytes().splitlines()
NODE_NAMES = ["a100-mig-mixed-0", "a100-mig-single-0", "cpu-node-0", "h100-degraded-0", "h100-hgx-0",
              "h100-initializing-0", "t4-timeslice-0", "t4-timeslice-renamed-0", "v100-mps-0"]


def pod_list(rv: str, pods: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": rv}, "items": pods or []}


class Store:
    """What a single-writer consumer keeps: objects by name, plus a log of what happened."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.log: list[str] = []
        self.changed = asyncio.Event()

    def reset(self, items: list[dict[str, Any]]) -> None:
        self.objects = {i["metadata"]["name"]: i for i in items}
        self.log.append(f"reset:{len(items)}")
        self.changed.set()

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self.objects.pop(name, None)
        else:
            self.objects[name] = obj
        self.log.append(f"{kind}:{obj['metadata']['resourceVersion']}")
        self.changed.set()

    async def until(self, entry: str) -> None:
        while entry not in self.log:
            self.changed.clear()
            await self.changed.wait()


@contextmanager
def running(coro: Any) -> Iterator[asyncio.Task[None]]:
    task = asyncio.ensure_future(coro)
    try:
        yield task
    finally:
        task.cancel()


def watch_requests(api: FakeApi) -> list[dict[str, str]]:
    return [q for _, q in api.requests if q.get("watch", "").lower() == "true"]


async def test_paginated_list_collects_every_page_and_the_final_resource_version() -> None:
    first = load_fixture("watch", "nodes-list-limit-2.json")  # the real first page of `limit=2`
    rest = {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": "454"},
            "items": [node_fixture(n) for n in NODE_NAMES[2:]]}
    async with FakeApi() as api:
        api.add_list("nodes", [first, rest])
        async with api.api_client() as http:
            items, rv = await list_all(client.CoreV1Api(http).list_node, page=2)
    assert [i["metadata"]["name"] for i in items] == NODE_NAMES
    assert rv == "454"
    assert [q.get("limit") for _, q in api.requests] == ["2", "2"]
    assert "continue" not in api.requests[0][1] and api.requests[1][1]["continue"] == "1"


async def test_410_expired_relists_then_follows_create_bind_delete() -> None:
    store = Store()
    async with FakeApi() as api:
        api.add_list("pods", [pod_list("1")])
        api.add_watch("pods", EXPIRED)  # the real answer to a watch from a compacted resourceVersion
        api.add_list("pods", [pod_list("444")])
        api.add_watch("pods", STREAM, then="hang")
        async with api.api_client() as http:
            pods = client.CoreV1Api(http).list_pod_for_all_namespaces
            with running(list_and_watch(pods, store.reset, store.event, backoff=0)):
                await asyncio.wait_for(store.until("DELETED:450"), 10)
    assert store.log == ["reset:0", "reset:0", "ADDED:445", "MODIFIED:446", "MODIFIED:448",
                         "MODIFIED:449", "DELETED:450"]  # the BOOKMARK moves the rv but is no event
    assert store.objects == {}
    watches = watch_requests(api)
    assert [w["resourceVersion"] for w in watches] == ["1", "444"]
    assert all(w["allowWatchBookmarks"].lower() == "true" for w in watches)


async def test_dropped_stream_relists_and_state_comes_from_the_new_list() -> None:
    bound = json.loads(STREAM[1])["object"]  # the pod as bound to h100-degraded-0
    store = Store()
    async with FakeApi() as api:
        api.add_list("pods", [pod_list("444")])
        api.add_watch("pods", STREAM[:1], then="drop")  # the connection breaks after ADDED
        api.add_list("pods", [pod_list("446", [bound])])
        async with api.api_client() as http:
            pods = client.CoreV1Api(http).list_pod_for_all_namespaces
            with running(list_and_watch(pods, store.reset, store.event, backoff=0)):
                await asyncio.wait_for(api.wait_requests(4), 10)  # list, watch, relist, watch
    assert store.log == ["reset:0", "ADDED:445", "reset:1"]
    assert store.objects["watch-gpu1"]["spec"]["nodeName"] == "h100-degraded-0"
    assert [w["resourceVersion"] for w in watch_requests(api)] == ["444", "446"]


async def test_a_watch_window_that_ends_normally_resumes_from_the_bookmark_without_relisting() -> None:
    store = Store()
    async with FakeApi() as api:
        api.add_list("pods", [pod_list("444")])
        api.add_watch("pods", STREAM, then="end")
        async with api.api_client() as http:
            pods = client.CoreV1Api(http).list_pod_for_all_namespaces
            with running(list_and_watch(pods, store.reset, store.event, backoff=0)):
                await asyncio.wait_for(api.wait_requests(3), 10)
    assert [bool(q.get("watch")) for _, q in api.requests] == [False, True, True]
    assert watch_requests(api)[1]["resourceVersion"] == "450"  # the BOOKMARK's
    assert store.log.count("reset:0") == 1


async def test_an_api_outage_on_list_is_retried_and_nothing_is_reset_until_a_list_succeeds() -> None:
    store = Store()
    async with FakeApi() as api:
        api.add_list_error("pods", 503)
        api.add_list_error("pods", 500)
        api.add_list("pods", [pod_list("444")])
        async with api.api_client() as http:
            pods = client.CoreV1Api(http).list_pod_for_all_namespaces
            with running(list_and_watch(pods, store.reset, store.event, backoff=0)):
                await asyncio.wait_for(store.until("reset:0"), 10)
                await asyncio.wait_for(api.wait_requests(4), 10)
    assert [bool(q.get("watch")) for _, q in api.requests] == [False, False, False, True]
    assert store.log == ["reset:0"]


async def test_watching_loads_a_kubeconfig_runs_the_watches_and_stops_them_on_leaving(tmp_path: Path) -> None:
    store = Store()
    async with FakeApi() as api:
        assert api.server is not None
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": str(api.server.make_url("")).rstrip("/")}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}]}))
        api.add_list("nodes", [{"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": "7"},
                                "items": [node_fixture(n) for n in NODE_NAMES]}])
        started: list[Coroutine[Any, Any, None]] = []

        def watches(http: Any) -> list[Coroutine[Any, Any, None]]:
            started.append(list_and_watch(client.CoreV1Api(http).list_node, store.reset, store.event, backoff=0))
            return started

        async with watching(str(kubeconfig), False, watches):
            await asyncio.wait_for(api.wait_requests(2), 10)  # the list, then the (idle) watch
            assert inspect.getcoroutinestate(started[0]) == inspect.CORO_SUSPENDED  # still watching
        assert sorted(store.objects) == NODE_NAMES
        assert [q.get("watch", "").lower() for _, q in api.requests] == ["", "true"]
        assert inspect.getcoroutinestate(started[0]) == inspect.CORO_CLOSED  # cancelled on leaving


async def test_a_watch_that_goes_silent_is_dropped_and_relisted() -> None:
    """A half-open stream: the API server would have ended the window after timeoutSeconds, so a
    stream quiet for longer is broken, and the state comes from a fresh list."""
    store = Store()
    bound = json.loads(STREAM[1])["object"]
    async with FakeApi() as api:
        api.add_list("pods", [pod_list("444")])
        api.add_watch("pods", STREAM[:1], then="hang")  # one event, then nothing and no end
        api.add_list("pods", [pod_list("446", [bound])])
        async with api.api_client() as http:
            pods = client.CoreV1Api(http).list_pod_for_all_namespaces
            with running(list_and_watch(pods, store.reset, store.event, backoff=0, timeout_seconds=1,
                                        quiet_grace=0.2)):
                await asyncio.wait_for(store.until("reset:1"), 10)
    assert store.log == ["reset:0", "ADDED:445", "reset:1"]
    assert [w["timeoutSeconds"] for w in watch_requests(api)][:1] == ["1"]


async def test_failures_back_off_exponentially_with_full_jitter_and_a_success_resets_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    bounds: list[tuple[float, float]] = []

    def uniform(a: float, b: float) -> float:
        bounds.append((a, b))
        return 0.0  # no real waiting in the test

    monkeypatch.setattr("gpu_tailor.kube.watch.random.uniform", uniform)
    store = Store()
    async with FakeApi() as api:
        for status in (503, 500, 503, 500):
            api.add_list_error("pods", status)
        api.add_list("pods", [pod_list("444")])
        api.add_watch("pods", STREAM[:1], then="drop")  # a failure after a good list: the bound starts over
        api.add_list("pods", [pod_list("446")])
        async with api.api_client() as http:
            pods = client.CoreV1Api(http).list_pod_for_all_namespaces
            with running(list_and_watch(pods, store.reset, store.event, backoff=0.5, max_backoff=3)):
                await asyncio.wait_for(api.wait_requests(8), 10)
    assert bounds == [(0, 0.5), (0, 1.0), (0, 2.0), (0, 3), (0, 0.5)]


def project_name_and_node(obj: Any) -> dict[str, Any]:
    meta, spec = obj.get("metadata"), obj.get("spec")
    return {"metadata": {"name": meta.get("name"), "resourceVersion": meta.get("resourceVersion")},
            "spec": {"nodeName": spec.get("nodeName")} if spec is not None else {}}


class PagedStore(Store):
    """A consumer fed page by page, whose work on each page yields: a ``kube.watch.Relist``."""

    def __init__(self) -> None:
        super().__init__()
        self.pages: list[int] = []

    def relist(self) -> PagedStore:
        self.pages = []
        self.incoming: list[dict[str, Any]] = []
        return self

    def page(self, items: list[dict[str, Any]]) -> Iterator[None]:
        self.pages.append(len(items))
        for item in items:
            self.incoming.append(item)
            yield

    def done(self) -> Iterator[None]:
        self.reset(self.incoming)
        yield


async def test_a_projected_list_arrives_page_by_page_and_events_are_projected_too() -> None:
    store = PagedStore()
    pods = [json.loads(STREAM[i])["object"] for i in (1, 2)]
    pods[1]["metadata"]["name"] = "second"
    async with FakeApi() as api:
        api.add_list("pods", [pod_list("1", pods[:1]), pod_list("1", pods[1:])])
        api.add_watch("pods", EXPIRED)  # the ERROR event is read through the lazy parser as well
        api.add_list("pods", [pod_list("444", pods)])
        api.add_watch("pods", STREAM, then="hang")
        async with api.api_client() as http:
            list_pods = client.CoreV1Api(http).list_pod_for_all_namespaces
            with running(list_and_watch(list_pods, None, store.event, relist=store.relist,
                                        project=project_name_and_node, backoff=0)):
                await asyncio.wait_for(store.until("DELETED:450"), 10)
    assert store.log[:2] == ["reset:2", "reset:2"] and store.pages == [2]
    added = json.loads(STREAM[0])["object"]
    assert store.log[2:] == ["ADDED:445", "MODIFIED:446", "MODIFIED:448", "MODIFIED:449", "DELETED:450"]
    assert project_name_and_node(added) != added and "watch-gpu1" not in store.objects
    assert [q.get("limit") for _, q in api.requests if not q.get("watch")] == ["500", "500", "500"]


def test_list_and_watch_needs_somewhere_to_put_the_list() -> None:
    with pytest.raises(ValueError, match="on_reset or relist"):
        asyncio.run(list_and_watch(lambda **_: None, None, lambda *_: None))  # type: ignore[arg-type]


async def test_a_watch_refused_after_every_good_list_still_backs_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """A list that succeeds is no progress if the watch after it is refused at once (an API server
    shedding load, an RBAC change): without a watch event between them the bound keeps growing."""
    bounds: list[tuple[float, float]] = []

    def uniform(a: float, b: float) -> float:
        bounds.append((a, b))
        return 0.0

    monkeypatch.setattr("gpu_tailor.kube.watch.random.uniform", uniform)
    refused = [json.dumps({"type": "ERROR", "object": {"kind": "Status", "code": 500, "reason": "InternalError",
                                                       "message": "etcd leader changed"}}).encode()]
    store = Store()
    async with FakeApi() as api:
        for rv in ("1", "2", "3"):
            api.add_list("pods", [pod_list(rv)])
            api.add_watch("pods", refused)
        api.add_list("pods", [pod_list("4")])
        async with api.api_client() as http:
            pods = client.CoreV1Api(http).list_pod_for_all_namespaces
            with running(list_and_watch(pods, store.reset, store.event, backoff=0.5, max_backoff=30)):
                await asyncio.wait_for(api.wait_requests(7), 10)
    assert bounds == [(0, 0.5), (0, 1.0), (0, 2.0)]


async def test_a_list_answered_after_a_run_of_failures_clears_failing_since() -> None:
    """What the extender's --unhealthy-after reads: since when every try has failed; a page answered ends it."""
    store = Store()
    async with FakeApi() as api:
        fresh = Freshness(lambda: 5.0 * len(api.requests))  # the clock: 5 s per request made so far
        for status in (503, 500, 500):
            api.add_list_error("pods", status)
        api.add_list("pods", [pod_list("444")])
        async with api.api_client() as http:
            pods = client.CoreV1Api(http).list_pod_for_all_namespaces
            with running(list_and_watch(pods, store.reset, store.event, freshness=fresh, backoff=0)):
                await asyncio.wait_for(store.until("reset:0"), 10)
    assert fresh.failing_since is None and fresh.failing_for() == 0.0


async def test_failing_since_is_kept_through_a_run_of_failures() -> None:
    async with FakeApi() as api:
        fresh = Freshness(lambda: 5.0 * len(api.requests))
        for status in (503, 500, 500, 500):
            api.add_list_error("pods", status)
        async with api.api_client() as http:
            pods = client.CoreV1Api(http).list_pod_for_all_namespaces
            with running(list_and_watch(pods, Store().reset, Store().event, freshness=fresh, backoff=0)):
                await asyncio.wait_for(api.wait_requests(3), 10)
                assert fresh.failing_since == 5.0  # set by the first failure (request 1), kept since
                assert fresh.failing_for() >= 10.0
