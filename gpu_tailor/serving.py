"""What both services serve the same way: TLS (>= 1.2, reloaded when the files change), the
``--listen`` address, the probe and metrics routes, and a graceful stop on SIGTERM.

The stop follows what Kubernetes does to a pod: the ``preStop`` wait lets endpoints drop it, then
SIGTERM. From SIGTERM on, ``/readyz`` answers 503 while requests are still served for
``drain`` seconds (an endpoint update can still be on its way to the API server's proxy), each answer
closing its connection (``Connection: close``) so that clients reconnect to the replicas that stay;
then the listening socket closes, the requests already taken are answered (their bodies still
read), and only then are the remaining idle connections closed and the process exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import ssl
from collections.abc import Awaitable, Callable, Iterator

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

log = logging.getLogger(__name__)


def server_context() -> ssl.SSLContext:
    """A TLS server context with no certificate yet (``load_cert_chain`` fills it)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    ctx = server_context()
    ctx.load_cert_chain(cert, key)
    return ctx


class CertReloader:
    """Reload the serving certificate into the live SSLContext when either file changes."""

    def __init__(self, ctx: ssl.SSLContext, cert: str, key: str) -> None:
        self.ctx, self.cert, self.key = ctx, cert, key
        self.stamp: tuple[int, ...] | None = None
        with contextlib.suppress(OSError):  # not written yet (a certificate kept in a Secret): load() fills it
            self.stamp = self._stamp()

    def _stamp(self) -> tuple[int, ...]:
        # the inode too: an atomic replace (or a Secret volume's symlink swap) may keep the mtime
        c, k = os.stat(self.cert), os.stat(self.key)
        return (c.st_ino, c.st_mtime_ns, c.st_size, k.st_ino, k.st_mtime_ns, k.st_size)

    def load(self) -> None:
        """Load the pair now; raises (and leaves the live context as it was) if it does not load.

        The pair is tried on a scratch context first: loading a certificate into the live context
        and then failing on a key that does not match it would leave the live context serving the
        new certificate with the old key, and every handshake would fail until the next check.
        """
        stamp = self._stamp()
        server_context().load_cert_chain(self.cert, self.key)
        self.ctx.load_cert_chain(self.cert, self.key)
        self.stamp = stamp

    def check(self) -> bool:
        """Reload if changed; a half-written pair is retried on the next check."""
        try:
            if self._stamp() == self.stamp:
                return False
            self.load()
        except (OSError, ssl.SSLError) as exc:
            log.warning("serving certificate not reloaded yet: %s", exc)
            return False
        log.info("serving certificate reloaded")
        return True

    async def run(self, interval: float = 10.0) -> None:
        while True:
            await asyncio.sleep(interval)
            self.check()


class Lifecycle:
    """Whether the process has begun to stop (``/readyz`` then answers 503), and the requests being handled."""

    def __init__(self) -> None:
        self.stopping = False
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()



LIFECYCLE = web.AppKey("lifecycle", Lifecycle)


def split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--listen {listen!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PROBE_PATHS = frozenset({"/healthz", "/readyz", "/livez", "/metrics"})


def add_probes(app: web.Application, service: str, ready: Callable[[web.Application], bool], not_ready: str,
               registry: Callable[[web.Application], CollectorRegistry],
               unhealthy: Callable[[web.Application], str | None] | None = None) -> None:
    """``/healthz`` (alive: 503 with ``unhealthy``'s reason when it gives one), ``/readyz`` (503 with
    ``not_ready`` until synced) and ``/metrics``, which says what ``/readyz`` would as ``gpu_tailor_ready{service}`` (1
    or 0), so that an alert can tell a replica that answers but is not ready."""

    async def healthz(request: web.Request) -> web.Response:
        why = unhealthy(request.app) if unhealthy is not None else None
        if why:
            return web.Response(status=503, text=why)
        return web.Response(text="ok")

    app[LIFECYCLE] = Lifecycle()

    def is_ready(app: web.Application) -> bool:
        return not app[LIFECYCLE].stopping and ready(app)

    async def readyz(request: web.Request) -> web.Response:
        if request.app[LIFECYCLE].stopping:
            return web.Response(status=503, text="shutting down")
        if ready(request.app):
            return web.Response(text="ok")
        return web.Response(status=503, text=not_ready)

    async def metrics(request: web.Request) -> web.Response:
        body = generate_latest(registry(request.app)) + generate_latest(_Ready(service, is_ready(request.app)))
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)


class _Ready:
    """``gpu_tailor_ready``, as a registry of its own appended to a scrape: the services' registries are theirs."""

    def __init__(self, service: str, ready: bool) -> None:
        self.service, self.ready = service, ready

    def collect(self) -> Iterator[Metric]:
        g = GaugeMetricFamily("gpu_tailor_ready", "1 while /readyz answers 200 (synced, not shutting down), else 0",
                              labels=["service"])
        g.add_metric([self.service], 1.0 if self.ready else 0.0)
        yield g


def _counting(lifecycle: Lifecycle) -> Middleware:
    """Middleware: counts each request from its headers to its answer (its body is read in between), and
    while stopping marks the answer ``Connection: close``."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        lifecycle.in_flight += 1
        lifecycle.idle.clear()
        try:
            response = await handler(request)
            if lifecycle.stopping:
                response.force_close()
            return response
        finally:
            lifecycle.in_flight -= 1
            if not lifecycle.in_flight:
                lifecycle.idle.set()

    return middleware


def probes_only(port: int) -> Middleware:
    """Middleware: on the listener at ``port`` only the probes and ``/metrics`` are served (404 for the rest),
    so that a port opened to the pod network for Prometheus and the kubelet exposes nothing else."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        sock = request.transport.get_extra_info("sockname") if request.transport is not None else None
        if (sock is None or sock[1] == port) and request.path not in PROBE_PATHS:  # unknown: closed, not open
            raise web.HTTPNotFound(text=f"only {', '.join(sorted(PROBE_PATHS))} are served on this port")
        return await handler(request)

    return middleware


async def serve_until_stopped(app: web.Application, listen: str, ssl_ctx: ssl.SSLContext | None,
                              reloader: CertReloader | None, what: str, *, drain: float = 2.0,
                              grace: float = 20.0, stop: asyncio.Event | None = None,
                              probes_listen: str | None = None) -> None:
    """Serve ``app`` until SIGTERM or SIGINT (or ``stop``), then stop gracefully (module docstring):
    not ready at once, still serving for ``drain`` seconds, then in-flight requests get ``grace``
    seconds to finish. With ``probes_listen`` the probes and ``/metrics`` are also served there, over plain
    HTTP, and nothing else is (``app`` must carry ``probes_only`` for that address's port)."""
    host, port = split_listen(listen)
    loop = asyncio.get_running_loop()
    lifecycle = app.get(LIFECYCLE)
    if lifecycle is not None:
        app.middlewares.append(_counting(lifecycle))
    runner = web.AppRunner(app, shutdown_timeout=grace)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, ssl_context=ssl_ctx).start()
        log.info("%s serving %s://%s:%d", what, "https" if ssl_ctx else "http", host, port)
        if probes_listen:
            p_host, p_port = split_listen(probes_listen)
            await web.TCPSite(runner, p_host, p_port).start()
            log.info("%s serving probes and metrics on http://%s:%d", what, p_host, p_port)
        stop = stop or asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        rotation = asyncio.create_task(reloader.run()) if reloader is not None else None
        try:
            await stop.wait()
            if LIFECYCLE in app:
                app[LIFECYCLE].stopping = True
            log.info("stopping: not ready any more; serving %.1fs more, then %.0fs for requests in flight",
                     drain, grace)
            if drain > 0:
                await asyncio.sleep(drain)
        finally:
            if rotation is not None:
                rotation.cancel()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
    finally:
        await _finish(runner, lifecycle, grace)
    log.info("%s stopped", what)


async def _finish(runner: web.AppRunner, lifecycle: Lifecycle | None, grace: float) -> None:
    """Close the listeners, let the requests already taken finish, then close what is left.

    aiohttp's own cleanup stops reading from every connection at once, so a request whose headers had
    arrived but not yet all of its body would wait for the rest until ``grace`` ran out, and its client
    would time out. Waiting for the handlers first, with the connections still read, avoids that."""
    for site in list(runner.sites):
        await site.stop()
    if lifecycle is not None and lifecycle.in_flight:
        log.info("waiting for %d request(s) in flight", lifecycle.in_flight)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(lifecycle.idle.wait(), grace)
    await runner.cleanup()
