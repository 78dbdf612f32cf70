"""DRA discovered live (``kube.dra.dra_watches``), against a stand-in API server on the wire kubernetes-asyncio
speaks: while ``resource.k8s.io/v1`` is not served DRA is off and the service ready; once the cluster serves it
(upgraded to 1.34 or later), the three lists are taken and DRA turns on with all of them in, without a restart."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client

from gpu_tailor.extender import api as extender
from gpu_tailor.extender.cache import Cache
from gpu_tailor.gpumodel.dra_state import DraState
from gpu_tailor.kube.dra import dra_watches
from gpu_tailor.kube.freshness import Freshness
from gpu_tailor.webhook import server as webhook
from gpu_tailor.webhook.config import AdmissionPolicy
from gpu_tailor.webhook.state import ClusterView
from tests.gpumodel.dra_slices import device_classes, hgx
from tests.kube.fakeapi import serving

BASE = "/apis/resource.k8s.io/v1"
KINDS = {"resourceslices": "ResourceSliceList", "resourceclaims": "ResourceClaimList",
         "deviceclasses": "DeviceClassList"}


def watching(request: web.Request) -> bool:
    return request.query.get("watch", "").lower() in ("true", "1")


class Served:
    """Whether the group is served, what each list answers, and what the client asked."""

    def __init__(self) -> None:
        self.group = False
        self.items: dict[str, list[dict[str, Any]]] = {"resourceslices": [hgx()], "resourceclaims": [],
                                                       "deviceclasses": device_classes()}
        self.asked: list[str] = []
        self.hold_claims = asyncio.Event()  # set: the claims list may answer
        self.hold_claims.set()

    async def discovery(self, request: web.Request) -> web.Response:
        self.asked.append("discovery")
        if not self.group:
            return web.json_response({"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404},
                                     status=404)
        return web.json_response({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "resource.k8s.io/v1",
                                  "resources": [{"name": k, "singularName": "", "namespaced": k == "resourceclaims",
                                                 "kind": v[:-4], "verbs": ["list", "watch"]}
                                                for k, v in KINDS.items()]})

    async def core(self, request: web.Request) -> web.StreamResponse:
        """Nodes, pods and gpu-tailor's reports: empty lists, idle watches."""
        watch = watching(request)
        self.asked.append(f"{request.path} {'watch' if watch else 'list'}")
        if watch:
            await asyncio.Event().wait()
        return web.json_response({"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": "3"},
                                  "items": []})

    async def listing(self, request: web.Request) -> web.StreamResponse:
        kind = request.match_info["kind"]
        watch = watching(request)
        self.asked.append(f"{kind} {'watch' if watch else 'list'}")
        if watch:
            await asyncio.Event().wait()  # an idle watch, until the client goes
        if kind == "resourceclaims":
            await self.hold_claims.wait()
        return web.json_response({"kind": KINDS[kind], "apiVersion": "resource.k8s.io/v1",
                                  "metadata": {"resourceVersion": "3"}, "items": self.items[kind]})


@asynccontextmanager
async def api_server(served: Served) -> AsyncIterator[client.ApiClient]:
    app = web.Application()
    app.router.add_get(BASE + "/", served.discovery)
    app.router.add_get(BASE, served.discovery)
    app.router.add_get(BASE + "/{kind}", served.listing)
    app.router.add_get("/api/v1/{kind}", served.core)
    app.router.add_get("/apis/gpu-tailor.io/{version}/{kind}", served.core)
    async with serving(app) as api:
        yield api


async def until(predicate: Any) -> None:
    while not predicate():
        await asyncio.sleep(0.01)


async def test_a_cluster_upgraded_to_dra_is_picked_up_without_a_restart() -> None:
    served = Served()
    state = DraState(enabled=True)  # as the services start: on until discovery says otherwise
    freshness: dict[str, Freshness] = {}
    async with api_server(served) as api:
        task = asyncio.create_task(dra_watches(api, state, freshness, recheck=0.01))
        try:
            await asyncio.wait_for(until(lambda: served.asked.count("discovery") >= 2), 10)
            assert not state.enabled and state.ready and not freshness  # off, and ready: nothing to wait for
            served.hold_claims.clear()
            served.group = True  # the control plane upgraded to 1.34+
            await asyncio.wait_for(until(lambda: state.synced >= {"slices", "classes"}), 10)
            assert not state.enabled and state.ready  # two of three listed: still off, still ready
            assert not freshness  # readiness waits on no watch of DRA until it is on
            served.hold_claims.set()
            await asyncio.wait_for(until(lambda: state.enabled), 10)
            assert state.ready and set(freshness) == set(KINDS) and all(f.fresh() for f in freshness.values())
            assert list(state.inventory().pools) == ["dra-h100-hgx-0"] and "gpu.nvidia.com" in state.classes
            assert not task.done()  # watching
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_a_cluster_that_serves_dra_at_start_is_unready_until_it_is_listed() -> None:
    served = Served()
    served.group = True
    served.hold_claims.clear()
    state = DraState(enabled=True)
    freshness: dict[str, Freshness] = {}
    async with api_server(served) as api:
        task = asyncio.create_task(dra_watches(api, state, freshness, recheck=0.01))
        try:
            await asyncio.wait_for(until(lambda: "resourceclaims list" in served.asked), 10)
            assert state.enabled and not state.ready and set(freshness) == set(KINDS)
            served.hold_claims.set()
            await asyncio.wait_for(until(lambda: state.ready), 10)
            assert served.asked.count("discovery") == 1
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


@pytest.mark.parametrize("dra", [True, False], ids=["auto", "off"])
async def test_with_dra_off_the_services_never_ask_for_resource_k8s_io(dra: bool) -> None:
    """``--dra off``: on a cluster that serves DRA, neither service asks for it, and both stay on device-plugin
    pools with nothing of DRA to wait on; with ``auto`` (the default) the same cluster's DRA is read."""
    served = Served()
    served.group = True
    cache, view = Cache(), ClusterView(AdmissionPolicy())
    async with api_server(served) as api:
        tasks = [asyncio.create_task(w) for w in [*extender.watches(api, cache, dra),
                                                    *webhook.watches(api, view, dra=dra)]]
        try:
            lists = ("/api/v1/nodes list", "/api/v1/pods list")
            await asyncio.wait_for(until(lambda: all(served.asked.count(k) == 2 for k in lists)), 10)
            if dra:
                await asyncio.wait_for(until(lambda: cache.dra.enabled and view.dra.enabled
                                             and cache.dra.ready and view.dra.ready), 10)
                assert served.asked.count("discovery") == 2
                return
            assert not [a for a in served.asked if "resource" in a or a == "discovery"]
            assert not cache.dra.enabled and not view.dra.enabled
            assert not set(KINDS) & (set(cache.freshness) | set(view.freshness))  # readiness waits on none
            assert not cache.dra.inventory().pools and not view.dra.inventory().pools
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
