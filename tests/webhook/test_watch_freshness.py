"""The webhook's view is trusted only while its watches are heard from: readiness and the staleness
metric follow when each watch last heard from the API server (issue 19)."""

from __future__ import annotations

from aiohttp.test_utils import TestClient, TestServer

from gpu_tailor.kube.freshness import STALE_AFTER, Freshness
from gpu_tailor.webhook.config import AdmissionPolicy
from gpu_tailor.webhook.server import make_app
from gpu_tailor.webhook.state import ClusterView
from tests.conftest import node_fixture


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


async def test_not_ready_while_a_watch_has_gone_quiet_and_the_metric_says_which() -> None:
    clock = Clock()
    view = ClusterView(AdmissionPolicy())
    view.reset([node_fixture("t4-timeslice-0")], [])
    nodes, pods = view.freshness["nodes"], view.freshness["pods"] = Freshness(clock), Freshness(clock)
    async with TestClient(TestServer(make_app(view))) as client:
        assert (await client.get("/readyz")).status == 503  # listed, but never heard from by a watch
        nodes.heard()
        pods.heard()
        assert (await client.get("/readyz")).status == 200
        clock.now += STALE_AFTER + 1
        nodes.heard()
        resp = await client.get("/readyz")
        assert resp.status == 503 and "gone quiet" in await resp.text()
        metrics = await (await client.get("/metrics")).text()
        assert f'gpu_tailor_webhook_watch_staleness_seconds{{resource="pods"}} {STALE_AFTER + 1:.1f}' in metrics
        assert 'gpu_tailor_webhook_watch_staleness_seconds{resource="nodes"} 0.0' in metrics
        pods.heard()
        assert (await client.get("/readyz")).status == 200
