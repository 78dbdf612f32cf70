"""A man in the middle between one gpu-tailor service and the API server, for the fault tests: it can cut
the connections of a watch mid-stream, hold a client's next list or watch until the test lets it go,
answer a resumed watch with ``410 Gone`` as kube-apiserver answers one whose resourceVersion fell out of
its window, and let a write reach the API server but cut its answer off (an API server that crashed
right after the write).

Why the 410 is written here and not provoked: kube-apiserver answers from its watch cache, whose window
starts where the cache was filled (at the API server's start) and grows with traffic (up to 100 x 1,024
events within 75 s), so no resourceVersion is reliably out of it on a young control plane -- a watch from
resourceVersion 1 was served, not refused, on a fresh one. What it writes for an expired one is what
``expired_watch`` writes: HTTP 200, one ERROR event whose Status has code 410 and reason Expired, and
the end of the stream.

It terminates TLS with the API server's own serving certificate (its SANs name 127.0.0.1 and it is
signed by the cluster CA, which the service's kubeconfig already trusts) and opens a TLS connection of
its own to the API server for each client connection. Requests are parsed (HTTP/1.1, bodies by
Content-Length, which is all kubernetes-asyncio sends), so the proxy knows what each connection is
doing; answers are relayed byte for byte. The bearer token passes through, so the API server still
sees the service's own ServiceAccount.

It runs an asyncio loop on a thread of its own; its methods are called from the test's thread.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from tests.e2e.kube import wait_for

T = TypeVar("T")
_RV = re.compile(r"(?:^|&)resourceVersion=([^&]*)")


def expired_watch(query: str) -> bytes:
    """kube-apiserver v1.28's answer to a watch from a resourceVersion out of its watch cache's window."""
    asked = m.group(1) if (m := _RV.search(query)) else "0"
    oldest = int(asked) + 1 if asked.isdigit() else 1  # the window's start: anything after what was asked
    event = json.dumps({"type": "ERROR", "object": {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": f"too old resource version: {asked} ({oldest})", "reason": "Expired", "code": 410}},
        separators=(",", ":")).encode() + b"\n"
    head = (b"HTTP/1.1 200 OK\r\nCache-Control: no-cache, private\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    return head + f"{len(event):x}\r\n".encode() + event + b"\r\n0\r\n\r\n"


@dataclass(frozen=True)
class Request:
    """One request the client sent: ``path`` without the query, ``watch`` for a watch."""

    method: str
    path: str
    query: str

    @property
    def watch(self) -> bool:
        return "watch=true" in self.query.lower()

    def lists(self, resource: str) -> bool:
        """A cluster-wide list or watch of ``resource`` (``/api/v1/pods``, ``/api/v1/nodes``)."""
        return self.method == "GET" and self.path == f"/api/v1/{resource}"

    def watches(self, resource: str) -> bool:
        return self.lists(resource) and self.watch

    def __str__(self) -> str:
        return f"{self.method} {self.path}{'?' + self.query if self.query else ''}"


Match = Callable[[Request], bool]


@dataclass(eq=False)
class _Conn:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    request: Request | None = None
    drop_answer: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def close(self) -> None:
        for w in (self.client, self.upstream):
            w.transport.abort()


class ApiProxy:
    """``start()`` it, point a kubeconfig at ``server``; ``cut``, ``hold``/``release``, ``expire_next``."""

    def __init__(self, upstream: str, ca_pem: bytes, cert: Path, key: Path) -> None:
        url = urlsplit(upstream)
        self.upstream_host, self.upstream_port = url.hostname or "127.0.0.1", url.port or 443
        self.server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.server_ctx.load_cert_chain(str(cert), str(key))
        self.client_ctx = ssl.create_default_context(cadata=ca_pem.decode())
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="apiproxy", daemon=True)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._conns: set[_Conn] = set()
        self._held: list[tuple[Match, asyncio.Event]] = []
        self._expire: list[Match] = []
        self._drop: list[Match] = []
        self._lock = threading.Lock()
        self.log: list[Request] = []  # every request, in order
        self.gone: list[Request] = []  # watches answered with 410 Gone
        self.gone_at: list[int] = []  # how many requests ``log`` held when each was answered
        self.dropped: list[Request] = []  # requests the API server answered and whose answer was cut
        self.notes: list[str] = []  # what happened to each request, for a failing test's message

    # ----- the test's side -----
    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.thread.start()
        self._call(self._listen())

    def stop(self) -> None:
        self._call(self._close_all())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()

    def cut(self, match: Match) -> list[Request]:
        """Close, mid-stream, every connection whose current request matches; what was cut."""
        cut: list[Request] = self._call(self._cut(match))
        return cut

    def hold(self, match: Match) -> None:
        """From now on requests that match wait, unsent, until ``release``."""
        self._call(self._hold(match))

    def release(self) -> None:
        self._call(self._release())

    def expire_next(self, match: Match) -> None:
        """The next matching watch is answered 410 Gone (``expired_watch``), as if its resourceVersion
        had fallen out of the API server's window; it never reaches the API server."""
        self._call(self._arm(match))

    def drop_answer(self, match: Match) -> None:
        """The next matching request reaches the API server, which acts on it; its answer is cut off
        before the client gets it (an API server that crashed right after it wrote the change)."""
        self._call(self._arm_drop(match))

    def seen(self, match: Match, after: int = 0) -> list[Request]:
        """Requests since the ``after``-th that match."""
        with self._lock:
            return [r for r in self.log[after:] if match(r)]

    def describe(self, last: int = 25) -> str:
        with self._lock:
            return "apiproxy, the last requests:\n" + "\n".join(self.notes[-last:])

    def _note(self, text: str) -> None:
        with self._lock:
            self.notes.append(text)

    def count(self) -> int:
        with self._lock:
            return len(self.log)

    def wait_seen(self, match: Match, after: int, what: str, timeout: float = 60,
                  context: Callable[[], str] | None = None) -> list[Request]:
        return wait_for(lambda: self.seen(match, after), timeout, what, context=context)

    def live(self, match: Match) -> int:
        """Open connections whose current request matches (e.g. a watch that is streaming now)."""
        n: int = self._call(self._live(match))
        return n

    def _call(self, coro: Any) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout=30)

    # ----- on the loop -----
    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.server_ctx)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _close_all(self) -> None:
        await self._release()
        if self._server is not None:
            self._server.close()
        for c in list(self._conns):
            c.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _cut(self, match: Match) -> list[Request]:
        hit = [c for c in self._conns if c.request is not None and match(c.request)]
        for c in hit:
            self._note(f"cut: {c.request}")
            c.close()
        return [c.request for c in hit if c.request is not None]

    async def _hold(self, match: Match) -> None:
        self._held.append((match, asyncio.Event()))

    async def _release(self) -> None:
        held, self._held = self._held, []
        for _, event in held:
            event.set()

    async def _arm(self, match: Match) -> None:
        self._expire.append(match)

    async def _arm_drop(self, match: Match) -> None:
        self._drop.append(match)

    async def _live(self, match: Match) -> int:
        return sum(1 for c in self._conns if c.request is not None and match(c.request))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(
                self.upstream_host, self.upstream_port, ssl=self.client_ctx, server_hostname=self.upstream_host)
        except OSError:
            writer.transport.abort()
            return
        conn = _Conn(writer, up_writer)
        self._conns.add(conn)
        down = asyncio.create_task(self._answers(up_reader, conn))
        try:
            await self._requests(reader, conn)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ssl.SSLError):
            pass
        finally:
            conn.close()
            down.cancel()
            self._conns.discard(conn)

    async def _requests(self, reader: asyncio.StreamReader, conn: _Conn) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            line, _, rest = head.partition(b"\r\n")
            method, target, version = line.split(b" ", 2)
            length = 0
            for h in rest.split(b"\r\n"):
                name, _, value = h.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
                elif name.strip().lower() == b"transfer-encoding":
                    raise AssertionError("apiproxy: chunked request bodies are not relayed")
            body = await reader.readexactly(length) if length else b""
            path, _, query = target.decode().partition("?")
            req = Request(method.decode(), path, query)
            with self._lock:
                self.log.append(req)
            for match, event in list(self._held):
                if match(req):
                    self._note(f"held: {req}")
                    await event.wait()
            if req.watch and (expire := next((m for m in self._expire if m(req)), None)):
                self._expire.remove(expire)
                conn.request = req
                with self._lock:
                    self.gone.append(req)
                    self.gone_at.append(len(self.log))
                self._note(f"answered 410 Gone: {req}")
                conn.client.write(expired_watch(req.query))
                await conn.client.drain()
                continue
            for match in list(self._drop):
                if match(req):
                    self._drop.remove(match)
                    conn.drop_answer = True
                    break
            conn.request = req
            self._note(f"sent: {req}")
            conn.upstream.write(b" ".join((method, target, version)) + b"\r\n" + rest + body)
            await conn.upstream.drain()

    async def _answers(self, up_reader: asyncio.StreamReader, conn: _Conn) -> None:
        try:
            while data := await up_reader.read(65536):
                if data.startswith(b"HTTP/"):
                    status = data.split(b"\r\n", 1)[0].decode(errors="replace")
                    self._note(f"answer to {conn.request}: {status}")
                if conn.drop_answer and conn.request is not None:
                    with self._lock:
                        self.dropped.append(conn.request)
                    self._note(f"answer cut off: {conn.request}")
                    return  # the finally closes both sides: the client never reads the answer
                if b'"type":"ERROR"' in data:
                    self._note(f"ERROR event to {conn.request}: {data[-300:]!r}")
                conn.client.write(data)
                await conn.client.drain()
        except (OSError, ssl.SSLError):
            pass
        finally:
            conn.close()
