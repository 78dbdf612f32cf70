"""The extender steps down when it cannot reach the API server (issue 31): ``/healthz`` and ``/livez`` answer
503 once every list and watch has failed for ``--unhealthy-after`` seconds, or no first sync came that long after
start; ``/livez`` also asks the kube-scheduler beside it. The probes and ``/metrics`` are served on a listener of
their own, which serves nothing else."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gpu_tailor.extender.cache import Cache
from gpu_tailor.extender.server import make_app
from gpu_tailor.kube.freshness import STALE_AFTER, Freshness
from gpu_tailor.serving import serve_until_stopped
from tests.conftest import free_port
from tests.extender.builders import cluster


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@contextlib.asynccontextmanager
async def client(cache: Cache, **kwargs: Any) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    c = TestClient(TestServer(make_app(cache, **kwargs)))
    await c.start_server()
    try:
        yield c
    finally:
        await c.close()


def synced() -> tuple[Clock, Cache, Freshness, Freshness]:
    """A cache listed once, whose node and pod watches have just heard from the API server, on a test clock."""
    clock = Clock()
    cache = cluster(clock=clock)
    nodes, pods = cache.freshness["nodes"], cache.freshness["pods"] = Freshness(clock), Freshness(clock)
    nodes.heard()
    pods.heard()
    return clock, cache, nodes, pods


async def test_healthz_fails_once_the_api_server_has_been_unreachable_for_unhealthy_after() -> None:
    clock, cache, _nodes, pods = synced()
    async with client(cache, unhealthy_after=30) as c:
        assert (await c.get("/healthz")).status == 200
        pods.failed()  # the stream broke; the retries keep failing
        clock.now += 20
        pods.failed()
        assert (await c.get("/healthz")).status == 200  # within the window: retrying is normal
        clock.now += 11
        resp = await c.get("/healthz")
        assert resp.status == 503 and "every list and watch of pods has failed for 31s" in await resp.text()
        assert (await c.get("/livez")).status == 503
        pods.heard()  # a list went through again
        assert (await c.get("/healthz")).status == 200 and (await c.get("/livez")).status == 200


async def test_healthz_fails_when_no_first_sync_comes() -> None:
    clock = Clock()
    cache = Cache(clock=clock)  # nothing listed yet
    async with client(cache, unhealthy_after=30) as c:
        assert (await c.get("/healthz")).status == 200  # starting
        clock.now += 31
        resp = await c.get("/healthz")
        assert resp.status == 503 and "not synced with the API server 31s after start" in await resp.text()


async def test_livez_asks_the_kube_scheduler_beside_it() -> None:
    answer = {"status": 200}

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(status=answer["status"], text="ok" if answer["status"] == 200 else "leaderElection")

    scheduler = web.Application()
    scheduler.router.add_get("/healthz", healthz)
    async with TestServer(scheduler) as server:
        url = str(server.make_url("/healthz"))
        async with client(cluster(), scheduler_healthz=url) as c:
            assert (await c.get("/livez")).status == 200
            answer["status"] = 500
            resp = await c.get("/livez")
            assert resp.status == 503 and "answered 500" in await resp.text()
            assert (await c.get("/healthz")).status == 200  # the extender itself is fine: not restarted
    gone = f"http://127.0.0.1:{free_port()}/healthz"
    async with client(cluster(), scheduler_healthz=gone) as c:
        resp = await c.get("/livez")
        assert resp.status == 503 and "did not answer" in await resp.text()


async def test_the_metrics_listener_serves_the_probes_and_metrics_and_nothing_else() -> None:
    """Verbs on loopback (127.0.0.1), probes and metrics on the 'pod IP' (127.0.0.2 here)."""
    verbs_port, probes_port = free_port(), free_port()
    app = make_app(cluster(), probes_port=probes_port)
    stop = asyncio.Event()
    server = asyncio.create_task(serve_until_stopped(app, f"127.0.0.1:{verbs_port}", None, None, "extender",
                                                     drain=0, stop=stop, probes_listen=f"127.0.0.2:{probes_port}"))
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(200):
                with contextlib.suppress(aiohttp.ClientConnectionError):
                    async with session.get(f"http://127.0.0.2:{probes_port}/readyz") as resp:
                        break
                await asyncio.sleep(0.01)
            public = f"http://127.0.0.2:{probes_port}"
            async with session.get(f"{public}/metrics") as resp:
                assert resp.status == 200 and "gpu_tailor_extender_watch_staleness_seconds" in await resp.text()
            for path in ("/healthz", "/readyz", "/livez"):
                async with session.get(f"{public}{path}") as resp:
                    assert resp.status == 200, path
            async with session.post(f"{public}/filter", json={}) as resp:
                assert resp.status == 404
            async with session.post(f"http://127.0.0.1:{verbs_port}/filter", json={}) as resp:
                assert resp.status == 400  # the verb is there, on loopback (and this body is no ExtenderArgs)
            with pytest.raises(aiohttp.ClientConnectionError):
                async with session.get(f"http://127.0.0.2:{verbs_port}/metrics"):
                    pass
    finally:
        stop.set()
        await server


async def test_an_api_server_that_hangs_is_caught_by_no_news_and_an_idle_one_is_not() -> None:
    """A hung API server never refuses, so nothing fails for a while: no news at all for longer than both
    --unhealthy-after and the freshness window steps down too; a quiet minute of a healthy idle cluster does not."""
    clock, cache, nodes, _pods = synced()
    async with client(cache, unhealthy_after=30) as c:
        clock.now += 60  # an idle watch window: news comes at its end
        assert (await c.get("/healthz")).status == 200
        nodes.heard()
        clock.now += STALE_AFTER - 59
        resp = await c.get("/healthz")
        assert resp.status == 503 and f"no news from the API server about pods for {STALE_AFTER + 1:.0f}s" in \
            await resp.text()
