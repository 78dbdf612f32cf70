"""The extender's watch of the node agents' reports (``kube.reports.report_watch``), against a stand-in API server
on the wire kubernetes-asyncio speaks: nothing is watched while the CRD is not served, the reports are listed and
watched once it is, and when it goes they are forgotten and readiness no longer waits on them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web
from kubernetes_asyncio import client

from gpu_tailor.gpumodel.report import NodeReport
from gpu_tailor.kube.freshness import Freshness
from gpu_tailor.kube.reports import report_watch
from tests.kube.fakeapi import serving

PATH = "/apis/gpu-tailor.io/v1alpha1/nodegpureports"


class Served:
    """Whether the CRD is served, what a list answers, and what the client asked."""

    def __init__(self) -> None:
        self.crd = False
        self.items: list[dict[str, Any]] = [NodeReport("gpu-node-1", "2026-11-26T12:00:00Z").object()]
        self.asked: list[str] = []

    async def get(self, request: web.Request) -> web.StreamResponse:
        kind = "watch" if request.query.get("watch") == "true" else f"list limit={request.query.get('limit')}"
        self.asked.append(kind)
        if not self.crd:
            return web.json_response({"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404},
                                     status=404)
        if kind == "watch":
            await asyncio.Event().wait()  # an idle watch, until the client goes
        return web.json_response({"kind": "NodeGPUReportList", "apiVersion": "gpu-tailor.io/v1alpha1",
                                  "metadata": {"resourceVersion": "7"}, "items": self.items})


@asynccontextmanager
async def api_server(served: Served) -> AsyncIterator[client.ApiClient]:
    app = web.Application()
    app.router.add_get(PATH, served.get)
    async with serving(app) as api:
        yield api


async def test_reports_are_watched_while_their_crd_is_served() -> None:
    served = Served()
    resets: asyncio.Queue[list[str]] = asyncio.Queue()
    freshness: dict[str, Freshness] = {}

    def reset(items: list[dict[str, Any]]) -> None:
        resets.put_nowait([i["metadata"]["name"] for i in items])

    async with api_server(served) as api:
        task = asyncio.create_task(report_watch(api, reset, lambda event, obj: None, freshness, recheck=0.01))
        try:
            served.asked.clear()
            served.crd = True  # installed after the extender started: found on a later look, no restart
            assert await asyncio.wait_for(resets.get(), 10) == ["gpu-node-1"]
            assert "nodegpureports" in freshness
            served.crd = False  # the CRD removed (the agent uninstalled)
            assert await asyncio.wait_for(resets.get(), 10) == []  # every report forgotten
            assert "nodegpureports" not in freshness  # readiness no longer waits on a watch that cannot be
            assert not task.done()  # and it keeps looking for the CRD
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert "list limit=1" in served.asked and "list limit=500" in served.asked
