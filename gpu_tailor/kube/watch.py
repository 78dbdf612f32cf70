"""List, then watch from the list's resourceVersion; relist on 410 Gone or any broken stream.

A 410 is normal: the API server keeps a limited window of history, and a watch resumed from a
resourceVersion that fell out of it is told to start over. Starting over means a fresh list that
*replaces* what we knew (``on_reset``), so nothing the watch missed survives as stale memory.
"""

from __future__ import annotations

import asyncio
import logging
import os
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger(__name__)

ListFn = Callable[..., Awaitable[Any]]


async def list_all(list_fn: ListFn, page: int = 500) -> tuple[list[dict[str, Any]], str]:
    """All items of a paginated list as plain dicts, and the list's resourceVersion."""
    items: list[dict[str, Any]] = []
    token: str | None = None
    rv = ""
    while True:
        kwargs: dict[str, Any] = {"limit": page, "_preload_content": False}
        if token:
            kwargs["_continue"] = token
        resp = await list_fn(**kwargs)
        body = await resp.read()
        # Without preloading the client does not check the status itself. A 5xx Status body must
        # never be mistaken for an empty list: that would wipe the state.
        if not 200 <= resp.status <= 299:
            raise ApiException(status=resp.status, reason=body[:200].decode(errors="replace"))
        data = orjson.loads(body)
        items.extend(data.get("items") or [])
        meta = data.get("metadata") or {}
        rv = meta.get("resourceVersion", rv)
        token = meta.get("continue")
        if not token:
            return items, rv


async def list_and_watch(
    list_fn: ListFn,
    on_reset: Callable[[list[dict[str, Any]]], None],
    on_event: Callable[[str, dict[str, Any]], None],
    *,
    timeout_seconds: int = 300,
    backoff: float = 1.0,
) -> None:
    """Run forever (until cancelled): the single writer of one kind of object's state."""
    while True:
        try:
            items, rv = await list_all(list_fn)
            on_reset(items)
            while True:  # watch windows end normally after timeout_seconds: resume from rv
                rv = await _watch_once(list_fn, rv, on_event, timeout_seconds)
        except asyncio.CancelledError:
            raise
        except ApiException as exc:
            if exc.status == 410:
                log.info("watch expired (410 Gone): relisting")
            else:
                log.warning("API error %s during list/watch: relisting in %.0fs", exc.status, backoff)
                await asyncio.sleep(backoff)
        except Exception as exc:  # a broken stream or an outage: start over from a fresh list
            log.warning("list/watch failed (%s): relisting in %.0fs", exc, backoff)
            await asyncio.sleep(backoff)


async def _watch_once(list_fn: ListFn, rv: str, on_event: Callable[[str, dict[str, Any]], None],
                      timeout_seconds: int) -> str:
    """One watch window from ``rv``; returns the resourceVersion to resume from.

    The stream is read here, one event a line, each parsed once into plain dicts (kubernetes-asyncio's
    ``Watch`` parses every event, writes it back to JSON and parses it again: a third of the
    extender's watch time in a scheduling burst, by py-spy). An ERROR event carries a Status: 410 for
    a resourceVersion that fell out of the API server's window.
    """
    resp = await list_fn(watch=True, resource_version=rv, allow_watch_bookmarks=True,
                         timeout_seconds=timeout_seconds, _preload_content=False)
    try:
        if not 200 <= resp.status <= 299:
            body = await resp.read()
            raise ApiException(status=resp.status, reason=body[:200].decode(errors="replace"))
        while line := await resp.content.readline():
            if not line.strip():
                continue
            event = orjson.loads(line)
            kind = str(event.get("type"))
            obj = event.get("object") or {}
            if kind == "ERROR":
                raise ApiException(status=obj.get("code"), reason=f"{obj.get('reason')}: {obj.get('message')}")
            new_rv = (obj.get("metadata") or {}).get("resourceVersion")
            if new_rv:
                rv = new_rv
            if kind != "BOOKMARK":
                on_event(kind, obj)
    finally:
        resp.release()
    return rv


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
