"""The graceful stop both services share: not ready first, still serving while endpoints catch up,
then requests in flight finish before the process exits."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from gpu_tailor.serving import add_probes, serve_until_stopped
from tests.conftest import free_port


class Slow:
    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def handler(self, request: web.Request) -> web.Response:
        self.entered.set()
        await self.release.wait()
        return web.Response(text="done")


def app_with(slow: Slow) -> web.Application:
    app = web.Application()
    app.router.add_get("/slow", slow.handler)
    registry = CollectorRegistry()
    add_probes(app, "test", lambda a: True, "never", lambda a: registry)
    return app


async def until_listening(session: aiohttp.ClientSession, base: str) -> None:
    for _ in range(200):  # bounded: the site starts within a few event-loop turns
        try:
            async with session.get(f"{base}/healthz") as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientConnectionError:
            await asyncio.sleep(0.01)
    raise AssertionError("server never listened")


def serve(slow: Slow, stop: asyncio.Event, port: int, drain: float, grace: float) -> asyncio.Task[None]:
    return asyncio.create_task(serve_until_stopped(app_with(slow), f"127.0.0.1:{port}", None, None, "test",
                                                   drain=drain, grace=grace, stop=stop))


async def test_stop_turns_readiness_off_but_keeps_serving_during_the_drain() -> None:
    slow, stop, port = Slow(), asyncio.Event(), free_port()
    base = f"http://127.0.0.1:{port}"
    server = serve(slow, stop, port, drain=30.0, grace=5.0)
    async with aiohttp.ClientSession() as session:
        await until_listening(session, base)
        async with session.get(f"{base}/readyz") as resp:
            assert resp.status == 200
        async with session.get(f"{base}/metrics") as resp:
            assert 'gpu_tailor_ready{service="test"} 1.0' in await resp.text()
        stop.set()
        await asyncio.sleep(0)  # let the server see the stop
        async with session.get(f"{base}/readyz") as resp:
            assert resp.status == 503 and await resp.text() == "shutting down"
        async with session.get(f"{base}/metrics") as resp:  # what /readyz says, for alerts
            assert 'gpu_tailor_ready{service="test"} 0.0' in await resp.text()
        async with session.get(f"{base}/healthz") as resp:  # still alive and serving
            assert resp.status == 200
    server.cancel()
    await asyncio.gather(server, return_exceptions=True)


async def test_requests_in_flight_finish_after_the_listener_closes() -> None:
    slow, stop, port = Slow(), asyncio.Event(), free_port()
    base = f"http://127.0.0.1:{port}"
    server = serve(slow, stop, port, drain=0.0, grace=10.0)
    async with aiohttp.ClientSession() as session:
        await until_listening(session, base)
        in_flight = asyncio.create_task(session.get(f"{base}/slow"))
        await slow.entered.wait()
        stop.set()
        await until_refused(port)  # the listener closes while the request is still held
        assert not server.done()
        slow.release.set()
        resp = await in_flight
        assert resp.status == 200 and await resp.text() == "done"
        resp.release()
    await asyncio.wait_for(server, 10)


async def until_refused(port: int) -> None:
    for _ in range(500):  # bounded: the listener closes within a few event-loop turns of the stop
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            await writer.wait_closed()
            await asyncio.sleep(0.01)
        except OSError:
            return
    raise AssertionError("the listener never closed")


async def test_a_request_whose_body_is_still_arriving_at_the_stop_is_read_and_answered() -> None:
    # aiohttp's cleanup stops reading every connection at once: this request's body would never be read
    # and its client would wait until the grace ran out, then see the connection closed
    entered, stop, port = asyncio.Event(), asyncio.Event(), free_port()

    async def echo_length(request: web.Request) -> web.Response:
        entered.set()
        return web.Response(text=str(len(await request.read())))

    app = web.Application()
    app.router.add_post("/review", echo_length)
    registry = CollectorRegistry()
    add_probes(app, "test", lambda a: True, "never", lambda a: registry)
    server = asyncio.create_task(serve_until_stopped(app, f"127.0.0.1:{port}", None, None, "test",
                                                     drain=0.0, grace=10.0, stop=stop))
    async with aiohttp.ClientSession() as session:
        await until_listening(session, f"http://127.0.0.1:{port}")
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = b"x" * 4000
    writer.write(b"POST /review HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body[:1000])
    await writer.drain()
    await entered.wait()
    stop.set()
    await until_refused(port)
    writer.write(body[1000:])
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"Connection: close" in head  # stopping: the client reconnects elsewhere
    assert await reader.read() == b"4000"  # and then the connection is closed
    writer.close()
    await asyncio.wait_for(server, 10)
