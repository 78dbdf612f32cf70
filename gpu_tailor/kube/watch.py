"""List, then watch from the list's resourceVersion; relist on 410 Gone or any broken stream.

A 410 is normal: the API server keeps a limited window of history, and a watch resumed from a
resourceVersion that fell out of it is told to start over. Starting over means a fresh list that
*replaces* what we knew (``on_reset``, or a ``Relist`` fed page by page), so nothing the watch missed
survives as stale memory.

A watch that goes quiet is not trusted: the API server ends every window after ``timeout_seconds``,
so a stream that sends nothing for longer than that (a half-open connection, a stuck proxy) is
broken, and is dropped and relisted. Failures are retried after an exponential backoff with full
jitter (so a fleet of replicas does not relist in step after an API server restart), reset only
once a watch delivers an event or ends its window normally: a list that succeeds followed by a watch
that is refused at once (429, 403) still backs off. ``Freshness`` records when the API server was last heard from, for
readiness and the staleness metric.

A big cluster's pods are listed in pages and handed over page by page, and the consumer's work on
them may be a generator that yields between chunks: the event loop keeps answering requests during a
relist of 100,000 pods. With ``project``, list pages and watch events are parsed lazily with simdjson
and only the fields ``project`` reads are turned into Python objects (most of a pod object --
managedFields, volumes, env, status -- is never built).

With ``freeze_gc`` the objects the process holds are moved out of reach of the cyclic garbage
collector (``gc.freeze``) after each page of a relist, at its end, and every ``FREEZE_EVERY`` events.
A cache of 100,000 pods is some 440,000 tracked objects, and one full collection over them takes
170 ms of CPU: a stall of every request in flight. Frozen objects are still freed by reference
counting as soon as they are dropped; only cycles among them would never be (records hold none).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import random
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import orjson
import simdjson
from kubernetes_asyncio.client.exceptions import ApiException

from gpu_tailor.kube.freshness import QUIET_GRACE, WATCH_WINDOW, Freshness

log = logging.getLogger(__name__)
FREEZE_EVERY = 10_000  # watch events between two gc.freeze() calls, with freeze_gc

ListFn = Callable[..., Awaitable[Any]]
Project = Callable[[Any], dict[str, Any]]  # a lazily parsed object (or a dict) -> what the consumer keeps



class Relist(Protocol):
    """A relist in progress: fed each page as it arrives, then told it is complete. Both may return
    a generator; it is run a chunk at a time, with the event loop free in between."""

    def page(self, items: list[dict[str, Any]]) -> Iterable[None]: ...

    def done(self) -> Iterable[None]: ...


class _Collect:
    """A ``Relist`` for a consumer that takes the whole list at once."""

    def __init__(self, on_reset: Callable[[list[dict[str, Any]]], None]) -> None:
        self.on_reset = on_reset
        self.items: list[dict[str, Any]] = []

    def page(self, items: list[dict[str, Any]]) -> Iterable[None]:
        self.items.extend(items)
        return ()

    def done(self) -> Iterable[None]:
        self.on_reset(self.items)
        return ()


def _freeze() -> None:
    """Collect the young garbage, then freeze the rest: a cycle frozen while garbage would never be
    collected. Only the two young generations are collected (a few ms at most): a full collection here
    stalled the loop for 20-38 ms in ``benchmarks/extender_state.py``, against 8-10 ms without it. A
    garbage cycle old enough to sit in the oldest generation, and not yet collected by the automatic
    full collections between two freezes, is frozen with the rest: a bounded leak, traded for the stall."""
    gc.collect(1)
    gc.freeze()


async def _run(steps: Iterable[None], freeze_gc: bool = False) -> None:
    """Run a consumer's work, letting the event loop in between its chunks."""
    for _ in steps:
        if freeze_gc:
            _freeze()
        await asyncio.sleep(0)
    if freeze_gc:
        _freeze()


PROJECT_CHUNK = 100  # items of a list page projected between two turns of the event loop


async def _parse_page(body: bytes, project: Project | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The items of one list page (projected when ``project`` is given, a chunk at a time) and the
    list's metadata."""
    if project is None:
        data = orjson.loads(body)
        return list(data.get("items") or []), dict(data.get("metadata") or {})
    doc: Any = simdjson.Parser().parse(body)
    try:
        items = []
        for i, item in enumerate(doc.get("items") or (), 1):
            items.append(project(item))
            if i % PROJECT_CHUNK == 0:
                await asyncio.sleep(0)
        meta = doc.get("metadata")
        return items, (meta.as_dict() if meta is not None else {})
    finally:
        item = meta = None
        del doc


async def list_all(list_fn: ListFn, page: int = 500, relist: Relist | None = None, project: Project | None = None,
                   timeout: aiohttp.ClientTimeout | None = None, freeze_gc: bool = False,
                   answered: Callable[[], None] | None = None) -> tuple[list[dict[str, Any]], str]:
    """All items of a paginated list, and the list's resourceVersion. With ``relist`` each page goes
    to it as it arrives (its work run between pages) and the returned list is empty; ``answered`` is
    called for every page the API server answers with success."""
    items: list[dict[str, Any]] = []
    token: str | None = None
    rv = ""
    while True:
        kwargs: dict[str, Any] = {"limit": page, "_preload_content": False}
        if token:
            kwargs["_continue"] = token
        if timeout is not None:
            kwargs["_request_timeout"] = timeout
        resp = await list_fn(**kwargs)
        try:
            body = await resp.read()
        finally:
            resp.release()
        # Without preloading the client does not check the status itself. A 5xx Status body must
        # never be mistaken for an empty list: that would wipe the state.
        if not 200 <= resp.status <= 299:
            raise ApiException(status=resp.status, reason=body[:200].decode(errors="replace"))
        if answered is not None:
            answered()
        got, meta = await _parse_page(body, project)
        del body
        if relist is not None:
            await _run(relist.page(got), freeze_gc)
        else:
            items.extend(got)
        rv = meta.get("resourceVersion", rv)
        token = meta.get("continue")
        if not token:
            return items, rv
        await asyncio.sleep(0)


async def list_and_watch(
    list_fn: ListFn,
    on_reset: Callable[[list[dict[str, Any]]], None] | None,
    on_event: Callable[[str, dict[str, Any]], object],
    *,
    relist: Callable[[], Relist] | None = None,
    project: Project | None = None,
    freshness: Freshness | None = None,
    timeout_seconds: int = WATCH_WINDOW,
    quiet_grace: float = QUIET_GRACE,
    backoff: float = 0.5,
    max_backoff: float = 30.0,
    page: int = 500,
    freeze_gc: bool = False,
) -> None:
    """Run forever (until cancelled): the single writer of one kind of object's state.

    Each (re)list goes to ``relist()`` page by page, or, without it, to ``on_reset`` whole; events go
    to ``on_event``. After a failure the next try waits a random time up to ``backoff`` seconds, the
    bound doubling with each failure in a row up to ``max_backoff``; a 410 relists at once.
    """
    if relist is None:
        if on_reset is None:
            raise ValueError("list_and_watch needs on_reset or relist")
        reset = on_reset
        relist = lambda: _Collect(reset)  # noqa: E731
    fresh = freshness or Freshness()
    list_timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=60)
    watch_timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout_seconds + quiet_grace)
    failures = 0  # in a row, with no watch event between them: a list that succeeds is not enough
    delivered = [0]  # events the current watch windows have delivered
    while True:
        try:
            consumer = relist()
            _, rv = await list_all(list_fn, page, consumer, project, list_timeout, freeze_gc, fresh.answered)
            await _run(consumer.done(), freeze_gc)
            fresh.heard()
            delivered[0] = 0
            while True:  # watch windows end normally after timeout_seconds: resume from rv
                rv = await _watch_once(list_fn, rv, on_event, timeout_seconds, watch_timeout, project, fresh,
                                       freeze_gc, delivered)
                failures = 0
        except asyncio.CancelledError:
            raise
        except ApiException as exc:
            if delivered[0]:
                failures = 0
            if exc.status == 410:
                log.info("watch expired (410 Gone): relisting")
                continue
            fresh.failed()
            failures += 1
            delay = _jittered(backoff, max_backoff, failures)
            log.warning("API error %s during list/watch: relisting in %.1fs", exc.status, delay)
            await asyncio.sleep(delay)
        except Exception as exc:  # a broken or silent stream, an outage: start over from a fresh list
            if delivered[0]:
                failures = 0
            fresh.failed()
            failures += 1
            delay = _jittered(backoff, max_backoff, failures)
            log.warning("list/watch failed (%s): relisting in %.1fs", type(exc).__name__ + (f": {exc}" if str(exc)
                        else ""), delay)
            await asyncio.sleep(delay)


def _jittered(base: float, cap: float, failures: int) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2**(failures-1))]."""
    return random.uniform(0, min(cap, base * 2 ** min(failures - 1, 30)))


async def _watch_once(list_fn: ListFn, rv: str, on_event: Callable[[str, dict[str, Any]], object],
                      timeout_seconds: int, timeout: aiohttp.ClientTimeout, project: Project | None,
                      fresh: Freshness, freeze_gc: bool = False, delivered: list[int] | None = None) -> str:
    """One watch window from ``rv``; returns the resourceVersion to resume from.

    The stream is read here, one event a line, each parsed once (kubernetes-asyncio's ``Watch``
    parses every event, writes it back to JSON and parses it again: a third of the extender's watch
    time in a scheduling burst, by py-spy). An ERROR event carries a Status: 410 for a resourceVersion
    that fell out of the API server's window. A read that waits longer than ``timeout``'s
    ``sock_read`` raises: the server would have ended the window by then.
    """
    resp = await list_fn(watch=True, resource_version=rv, allow_watch_bookmarks=True,
                         timeout_seconds=timeout_seconds, _preload_content=False, _request_timeout=timeout)
    try:
        if not 200 <= resp.status <= 299:
            body = await resp.read()
            raise ApiException(status=resp.status, reason=body[:200].decode(errors="replace"))
        fresh.heard()
        events = 0
        while line := await resp.content.readline():
            if not line.strip():
                continue
            kind, obj, new_rv = _parse_event(line, project)
            fresh.heard()
            if new_rv:
                rv = new_rv
            if delivered is not None:
                delivered[0] += 1
            if kind != "BOOKMARK":
                on_event(kind, obj)
                events += 1
                if freeze_gc and events % FREEZE_EVERY == 0:
                    _freeze()
        fresh.heard()
    finally:
        resp.release()
    return rv


def _parse_event(line: bytes, project: Project | None) -> tuple[str, dict[str, Any], str]:
    """(type, object, resourceVersion) of one watch event; raises ``ApiException`` for an ERROR."""
    if project is None:
        event = orjson.loads(line)
        kind = str(event.get("type"))
        obj = event.get("object") or {}
        if kind == "ERROR":
            raise ApiException(status=obj.get("code"), reason=f"{obj.get('reason')}: {obj.get('message')}")
        return kind, obj, str((obj.get("metadata") or {}).get("resourceVersion") or "")
    doc: Any = simdjson.Parser().parse(line)
    try:
        kind = str(doc.get("type"))
        raw = doc.get("object")
        if kind == "ERROR":
            status = raw.as_dict() if raw is not None else {}
            raise ApiException(status=status.get("code"), reason=f"{status.get('reason')}: {status.get('message')}")
        meta = raw.get("metadata") if raw is not None else None
        new_rv = str((meta.get("resourceVersion") if meta is not None else None) or "")
        del meta
        obj = project(raw) if kind != "BOOKMARK" and raw is not None else {}
        del raw
        return kind, obj, new_rv
    finally:
        del doc


def _nothing_to_trust() -> bool:
    """No proxy variable set and no netrc file: what aiohttp's ``trust_env`` reads is absent."""
    if urllib.request.getproxies():
        return False
    try:
        netrc = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    except RuntimeError:  # no home directory to look in
        return True
    return not netrc.exists()


@asynccontextmanager
async def watching(kubeconfig: str | None, in_cluster: bool,
                   watches: Callable[[Any], list[Coroutine[Any, Any, None]]]) -> AsyncIterator[Any]:
    """An API client (in-cluster config, or ``kubeconfig``) with ``watches(api)`` running as tasks;
    leaving cancels them and closes the client."""
    from kubernetes_asyncio import client, config

    if in_cluster or not kubeconfig:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    else:
        await config.load_kube_config(config_file=kubeconfig)
    api = client.ApiClient()
    if _nothing_to_trust():
        # kubernetes-asyncio opens its session with trust_env=True, and aiohttp then looks for a proxy
        # and a ~/.netrc entry on every request, in a thread of the default executor: a thread hop
        # and a file stat per Binding (py-spy during schedbench). With no proxy variable and no
        # netrc file there is nothing to find, so the session is told not to look.
        api.rest_client.pool_manager._trust_env = False
    tasks = [asyncio.create_task(w) for w in watches(api)]
    try:
        yield api
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await api.close()
