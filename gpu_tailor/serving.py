"""What both services serve the same way: TLS (>= 1.2, reloaded when the files change), the
``--listen`` address, the probe and metrics routes, and running until SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import ssl
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

log = logging.getLogger(__name__)


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    return ctx


class CertReloader:
    """Reload the serving certificate into the live SSLContext when either file changes."""

    def __init__(self, ctx: ssl.SSLContext, cert: str, key: str) -> None:
        self.ctx, self.cert, self.key = ctx, cert, key
        self.stamp = self._stamp()

    def _stamp(self) -> tuple[float, float]:
        return (os.stat(self.cert).st_mtime, os.stat(self.key).st_mtime)

    def check(self) -> bool:
        """Reload if changed; a half-written pair is retried on the next check."""
        try:
            stamp = self._stamp()
            if stamp == self.stamp:
                return False
            self.ctx.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            log.warning("serving certificate not reloaded yet: %s", exc)
            return False
        self.stamp = stamp
        log.info("serving certificate reloaded")
        return True

    async def run(self, interval: float = 10.0) -> None:
        while True:
            await asyncio.sleep(interval)
            self.check()


def split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--listen {listen!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def add_probes(app: web.Application, ready: Callable[[web.Application], bool], not_ready: str,
               registry: Callable[[web.Application], CollectorRegistry]) -> None:
    """``/healthz`` (alive), ``/readyz`` (503 with ``not_ready`` until synced) and ``/metrics``."""

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(request: web.Request) -> web.Response:
        if ready(request.app):
            return web.Response(text="ok")
        return web.Response(status=503, text=not_ready)

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry(request.app)),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)


async def serve_until_stopped(app: web.Application, listen: str, ssl_ctx: ssl.SSLContext | None,
                              reloader: CertReloader | None, what: str) -> None:
    """Serve ``app`` until SIGTERM or SIGINT (the kubelet stops pods with SIGTERM), then clean up."""
    host, port = split_listen(listen)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=ssl_ctx).start()
    log.info("%s serving %s://%s:%d", what, "https" if ssl_ctx else "http", host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    rotation = asyncio.create_task(reloader.run()) if reloader is not None else None
    try:
        await stop.wait()
        log.info("shutting down")
    finally:
        if rotation is not None:
            rotation.cancel()
        await runner.cleanup()
