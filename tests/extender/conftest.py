"""Fixtures of the extender's tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gpu_tailor.extender.cache import Cache
from gpu_tailor.extender.server import make_app
from tests.e2e.cluster import Release, find_releases, release_params


@pytest.fixture
async def client_for() -> AsyncIterator[Any]:
    """``await client_for(cache, binder)``: a test client of the extender's app (closed after the test)."""
    clients: list[TestClient[web.Request, web.Application]] = []

    async def make(state: Cache, binder: Any = None) -> TestClient[web.Request, web.Application]:
        c = TestClient(TestServer(make_app(state, binder)))
        await c.start_server()
        clients.append(c)
        return c

    yield make
    for c in clients:
        await c.close()


PARAMS, IDS = release_params()


@pytest.fixture(params=PARAMS, ids=IDS)
def kube_scheduler(request: pytest.FixtureRequest) -> Path:
    """The kube-scheduler of each Kubernetes release found (tests/e2e/cluster.py says where it looks)."""
    if request.param is None:
        pytest.skip(f"no kube-scheduler to check the config with: {find_releases()[1]}")
    release: Release = request.param
    return release.bin / "kube-scheduler"
