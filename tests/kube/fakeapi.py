"""A small in-process fake of the API server's list and watch endpoints.

It answers exactly what kubernetes-asyncio asks for (``GET /api/v1/nodes?limit=..&continue=..``,
``GET /api/v1/pods?watch=true&resourceVersion=..``), from a script of canned answers, and records
every request so a test can assert the sequence of lists and watches the client made.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[client.ApiClient]:
    """A kubernetes-asyncio client of ``app``, served on a free port for the block."""
    server = TestServer(app)
    await server.start_server()
    api = client.ApiClient(client.Configuration(host=str(server.make_url("")).rstrip("/")))
    try:
        yield api
    finally:
        await api.close()
        await server.close()


@dataclass
class WatchAnswer:
    lines: list[bytes]
    then: str = "end"  # "end": close the stream cleanly; "drop": break the connection; "hang": stay open


@dataclass
class Resource:
    pages: deque[list[dict[str, Any]] | int] = field(default_factory=deque)  # a list answer, or an HTTP error
    watches: deque[WatchAnswer] = field(default_factory=deque)


class FakeApi:
    def __init__(self) -> None:
        self.resources: dict[str, Resource] = {"nodes": Resource(), "pods": Resource()}
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.bindings: list[dict[str, Any]] = []
        self.patches: list[tuple[str, str, Any]] = []
        self.binding_status = 201
        self.patch_status = 200
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}  # what GET /namespaces/{ns}/pods/{name} answers
        self.pod_gets: list[tuple[str, str]] = []
        self.app = web.Application()
        self.app.router.add_get("/api/v1/{kind}", self._get)
        self.app.router.add_post("/api/v1/namespaces/{ns}/bindings", self._bind)
        self.app.router.add_patch("/api/v1/namespaces/{ns}/pods/{name}", self._patch)
        self.app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}", self._get_pod)
        self.server: TestServer | None = None
        self.seen = asyncio.Condition()

    async def wait_requests(self, n: int) -> None:
        """Until the fake has received at least n list/watch requests."""
        async with self.seen:
            await self.seen.wait_for(lambda: len(self.requests) >= n)

    def add_list(self, kind: str, pages: list[dict[str, Any]]) -> None:
        self.resources[kind].pages.append(pages)

    def add_list_error(self, kind: str, status: int) -> None:
        self.resources[kind].pages.append(status)

    def add_watch(self, kind: str, lines: list[bytes], then: str = "end") -> None:
        self.resources[kind].watches.append(WatchAnswer(lines, then))

    async def __aenter__(self) -> FakeApi:
        self.server = TestServer(self.app)
        await self.server.start_server()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        await self.server.close()

    def api_client(self) -> client.ApiClient:
        assert self.server is not None
        conf = client.Configuration(host=str(self.server.make_url("")).rstrip("/"))
        return client.ApiClient(conf)

    async def _get(self, request: web.Request) -> web.StreamResponse:
        kind = request.match_info["kind"]
        query = dict(request.query)
        self.requests.append((kind, query))
        async with self.seen:
            self.seen.notify_all()
        res = self.resources[kind]
        if query.get("watch", "").lower() == "true":
            if not res.watches:
                await asyncio.Event().wait()  # nothing scripted: an idle watch, until cancelled
            answer = res.watches.popleft()
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            await resp.prepare(request)
            for line in answer.lines:
                await resp.write(line.rstrip(b"\n") + b"\n")
            if answer.then == "drop":
                assert request.transport is not None
                request.transport.close()
                return resp
            if answer.then == "hang":
                await asyncio.Event().wait()
            await resp.write_eof()
            return resp
        pages = res.pages[0]
        if isinstance(pages, int):
            res.pages.popleft()
            return web.json_response({"kind": "Status", "status": "Failure", "code": pages}, status=pages)
        token = query.get("continue")
        index = int(token) if token else 0
        page = json.loads(json.dumps(pages[index]))
        if index + 1 < len(pages):
            page.setdefault("metadata", {})["continue"] = str(index + 1)
        else:
            res.pages.popleft()
        return web.json_response(page)

    async def _bind(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bindings.append(body)
        if self.binding_status >= 300:
            return _failure(self.binding_status, str(body["metadata"]["name"]))
        return web.json_response({"kind": "Status", "status": "Success", "code": 201}, status=201)

    async def _patch(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.patches.append((request.match_info["ns"], request.match_info["name"], body))
        if self.patch_status >= 300:
            return _failure(self.patch_status, request.match_info["name"])
        return web.json_response({"kind": "Pod", "metadata": {"name": request.match_info["name"]}})

    async def _get_pod(self, request: web.Request) -> web.Response:
        key = (request.match_info["ns"], request.match_info["name"])
        self.pod_gets.append(key)
        pod = self.pods.get(key)
        if pod is None:
            return _failure(404, key[1])
        return web.json_response(pod)


def _failure(code: int, name: str) -> web.Response:
    """A Status the way the API server words it for a pod that is gone, or for a conflict."""
    message = f'pods "{name}" not found' if code == 404 else "conflict"
    reason = "NotFound" if code == 404 else "Conflict"
    return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                              "reason": reason, "code": code}, status=code)
