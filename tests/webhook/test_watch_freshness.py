"""Once synced, the webhook stays ready when its watches go quiet (an API server brown-out): the staleness
shows as the metric, a log line and a warning on the GPU pods it admits meanwhile (issue 31; issue 19 made it
unready, which with both replicas watching the same API server refused every pod create)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpu_tailor.kube.freshness import STALE_AFTER, Freshness
from gpu_tailor.webhook.config import AdmissionPolicy
from gpu_tailor.webhook.server import make_app
from gpu_tailor.webhook.state import ClusterView
from tests.conftest import node_fixture, review_fixture


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


async def admit(client: TestClient[Any, Any], letter: str) -> dict[str, Any]:
    resp = await client.post("/mutate", json=review_fixture(letter))
    assert resp.status == 200
    body: dict[str, Any] = (await resp.json())["response"]
    assert body["allowed"] is True
    return body


async def test_a_quiet_watch_leaves_the_webhook_ready_and_warns_on_gpu_pods(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    view = ClusterView(AdmissionPolicy())
    nodes, pods = view.freshness["nodes"], view.freshness["pods"] = Freshness(clock), Freshness(clock)
    async with TestClient(TestServer(make_app(view))) as client:
        resp = await client.get("/readyz")
        assert resp.status == 503 and "not listed yet" in await resp.text()  # never synced: cannot answer
        view.reset([node_fixture("t4-timeslice-0")], [])
        nodes.heard()
        pods.heard()
        assert (await client.get("/readyz")).status == 200
        assert "warnings" not in await admit(client, "d")

        clock.now += STALE_AFTER + 1
        nodes.heard()
        with caplog.at_level(logging.WARNING, logger="gpu_tailor.webhook.state"):
            assert (await client.get("/readyz")).status == 200  # still ready: it answers correctly
        assert any("no news from the API server" in r.getMessage() for r in caplog.records)
        gpu = await admit(client, "d")
        assert gpu.get("patch") and any("has not heard from the API server for 151s" in w for w in gpu["warnings"])
        cpu = await admit(client, "l")
        assert not any("API server" in w for w in cpu.get("warnings", []))
        metrics = await (await client.get("/metrics")).text()
        assert f'gpu_tailor_webhook_watch_staleness_seconds{{resource="pods"}} {STALE_AFTER + 1:.1f}' in metrics
        assert 'gpu_tailor_webhook_watch_staleness_seconds{resource="nodes"} 0.0' in metrics

        pods.heard()
        with caplog.at_level(logging.INFO, logger="gpu_tailor.webhook.state"):
            assert "warnings" not in await admit(client, "d")
        assert any("heard from again" in r.getMessage() for r in caplog.records)


async def test_a_relist_keeps_one_page_of_pods_and_replaces_what_was_held() -> None:
    """The pod watch's relist folds each page into slim records and swaps them in when complete: a pod the new
    list lacks is forgotten, and nothing is counted until the list is complete."""
    view = ClusterView(AdmissionPolicy())
    view.reset([node_fixture("t4-timeslice-0")], [])
    (node,) = view.nodes
    shared = "nvidia.com/gpu.shared"

    def pod(uid: str, units: int) -> dict[str, Any]:
        ask = {shared: str(units)}
        container = {"name": "c", "resources": {"requests": ask, "limits": ask}}
        return {"metadata": {"uid": uid, "name": uid, "namespace": "a"},
                "spec": {"nodeName": node, "containers": [container]},
                "status": {"phase": "Running"}}

    view.reset_pods([pod("old", 5)])
    assert view.used == {node: {shared: 5}}
    relist = view.relist_pods()
    list(relist.page([pod("a", 1), {"metadata": {"uid": "cpu"}, "spec": {"nodeName": node}}]))
    assert view.used == {node: {shared: 5}}  # the old view serves until the list is complete
    list(relist.page([pod("b", 2)]))
    list(relist.done())
    assert view.used == {node: {shared: 3}} and set(view.held) == {"a", "b"}
