"""The DRA half of a service's view: ResourceSlices, ResourceClaims and DeviceClasses listed and watched into a
``DraState``, where the API server serves ``resource.k8s.io/v1`` (Kubernetes 1.34 and later).

Discovery at start: a 404 for the group version means DRA is off (the state says so and is ready with nothing in
it); any other failure is retried with backoff, and the service stays unready until the API server answers. While
DRA is off, discovery is asked again every ``RECHECK`` seconds: a cluster upgraded to 1.34 while a service runs is
picked up without a restart, DRA turning on once the three lists are in (the service stays ready meanwhile). A
driver installed later needs nothing of this: its ResourceSlices arrive through the watch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from gpu_tailor.gpumodel.dra_state import DraState
from gpu_tailor.kube.freshness import WATCH_WINDOW, Freshness
from gpu_tailor.kube.podfields import mapping, pick, plain

log = logging.getLogger(__name__)

GROUP_VERSION = "resource.k8s.io/v1"
RETRY_CAP = 30.0
RECHECK = 60.0  # seconds between discoveries while the API server serves no resource.k8s.io/v1


def slim_slice(obj: Any) -> dict[str, Any]:
    """What is kept of a ResourceSlice (a dict, or as simdjson parsed it lazily): its name and spec; never its
    managedFields."""
    meta = mapping(obj.get("metadata"))
    spec = mapping(obj.get("spec"))
    return {"metadata": pick(meta, ("name",)) if meta is not None else {},
            "spec": plain(spec) if spec is not None else {}}


def slim_claim(obj: Any) -> dict[str, Any]:
    """What is kept of a ResourceClaim: its name, namespace and uid, and the devices its allocation holds
    (``status.allocation.devices.results``). Its requests, selectors, config and reservations are never built."""
    meta = mapping(obj.get("metadata"))
    out: dict[str, Any] = {"metadata": pick(meta, ("name", "namespace", "uid")) if meta is not None else {}}
    node: Any = obj
    for key in ("status", "allocation", "devices"):
        node = mapping(node.get(key)) if node is not None else None
    results = node.get("results") if node is not None else None
    if results is not None and not isinstance(results, str) and mapping(results) is None:
        kept = [plain(r) for r in results if mapping(r) is not None]
        out["status"] = {"allocation": {"devices": {"results": kept}}}
    return out


async def served(resource_api: Any) -> bool:
    """Whether the API server serves ``resource.k8s.io/v1``; retried until it answers one way or the other."""
    delay = 0.5
    while True:
        try:
            await resource_api.get_api_resources(_request_timeout=10)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            log.warning("discovery of %s: HTTP %s; retrying in %.1fs", GROUP_VERSION, exc.status, delay)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            log.warning("discovery of %s: %s; retrying in %.1fs", GROUP_VERSION, exc, delay)
        await asyncio.sleep(delay)
        delay = min(RETRY_CAP, delay * 2)


async def dra_watches(api: Any, state: DraState, freshness: dict[str, Freshness],
                      window: int = WATCH_WINDOW, recheck: float = RECHECK) -> None:
    """Keep ``state`` from the API: off while ``resource.k8s.io/v1`` is not served (asked again every ``recheck``
    seconds), else its three watches."""
    from kubernetes_asyncio import client

    from gpu_tailor.kube.watch import list_and_watch

    resource = client.ResourceV1Api(api)
    fresh = {name: Freshness() for name in ("resourceslices", "resourceclaims", "deviceclasses")}
    if await served(resource):
        state.enabled = True  # unready until the three lists are in: nothing is decided without them
        freshness.update(fresh)
        log.info("DRA is on: watching ResourceSlices, ResourceClaims and DeviceClasses (%s)", GROUP_VERSION)
    else:
        state.enabled = False
        log.info("DRA is off: the API server serves no %s (Kubernetes before 1.34); GPUs are read from "
                 "device-plugin nodes only (asking again every %.0f s)", GROUP_VERSION, recheck)
        while not await served(resource):
            await asyncio.sleep(recheck)
        log.info("DRA is on now: the API server serves %s; watching ResourceSlices, ResourceClaims and "
                 "DeviceClasses, on once they are listed", GROUP_VERSION)

    def listed(reset: Callable[[list[dict[str, Any]]], None]) -> Callable[[list[dict[str, Any]]], None]:
        def then(items: list[dict[str, Any]]) -> None:
            reset(items)
            if not state.enabled and state.synced >= set(state.KINDS):
                # found late: on with all three in, never half-listed, and readiness waits on their watches from now
                for watch in fresh.values():
                    watch.heard()
                freshness.update(fresh)
                state.enabled = True
        return then

    await asyncio.gather(
        list_and_watch(resource.list_resource_slice, listed(state.reset_slices), state.apply_slice,
                       project=slim_slice, freshness=fresh["resourceslices"], timeout_seconds=window),
        list_and_watch(resource.list_resource_claim_for_all_namespaces, listed(state.reset_claims),
                       state.apply_claim, project=slim_claim, freshness=fresh["resourceclaims"],
                       timeout_seconds=window),
        list_and_watch(resource.list_device_class, listed(state.reset_classes), state.apply_class,
                       freshness=fresh["deviceclasses"], timeout_seconds=window))
