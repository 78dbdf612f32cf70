"""The node agents' reports (``NodeGPUReport``) for the extender: watched where the CRD is installed.

The agent is optional. Where the API server does not serve ``gpu-tailor.io/v1alpha1`` ``nodegpureports``
(the CRD is not installed), nothing is watched and the extender predicts as before; it looks again every
``RECHECK`` seconds, so installing the agent later needs no restart. Once found, the watch counts toward
readiness like the others (its freshness joins ``freshness``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from gpu_tailor.gpumodel.report import GROUP, PLURAL, VERSION
from gpu_tailor.kube.freshness import WATCH_WINDOW, Freshness

log = logging.getLogger(__name__)

RECHECK = 300.0  # seconds between looks for the CRD while it is not installed


async def installed(custom: Any) -> bool:
    """Whether the API server serves the reports (a list of one answers); False on 404, retried otherwise."""
    delay = 0.5
    while True:
        try:
            await custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, limit=1, _request_timeout=10)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            log.warning("looking for %s.%s: HTTP %s; retrying in %.1fs", PLURAL, GROUP, exc.status, delay)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            log.warning("looking for %s.%s: %s; retrying in %.1fs", PLURAL, GROUP, exc, delay)
        await asyncio.sleep(delay)
        delay = min(30.0, delay * 2)


async def report_watch(api: Any, reset: Callable[[list[dict[str, Any]]], None],
                       apply: Callable[[str, dict[str, Any]], object], freshness: dict[str, Freshness],
                       window: int = WATCH_WINDOW, recheck: float = RECHECK) -> None:
    """Watch the reports while their CRD is installed; when it goes (the agent uninstalled), forget them, leave
    readiness alone, and look for it again every ``recheck`` seconds."""
    from kubernetes_asyncio import client

    from gpu_tailor.kube.watch import list_and_watch

    custom = client.CustomObjectsApi(api)
    while True:
        said = False
        while not await installed(custom):
            if not said:
                log.info("no %s.%s served (the node agent's CRD is not installed): GPUs within nodes are predicted",
                         PLURAL, GROUP)
                said = True
            await asyncio.sleep(recheck)
        log.info("watching %s.%s: the node agents' reports win over predictions", PLURAL, GROUP)
        fresh = freshness[PLURAL] = Freshness()
        watch = asyncio.create_task(list_and_watch(
            functools.partial(custom.list_cluster_custom_object, GROUP, VERSION, PLURAL), reset, apply,
            freshness=fresh, timeout_seconds=window))
        try:
            while await installed(custom):  # the watch relists on its own; only the CRD's removal ends it
                await asyncio.sleep(recheck)
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
        freshness.pop(PLURAL, None)
        reset([])  # the agents' word is gone with their CRD: back to predictions
        log.info("%s.%s no longer served: GPUs within nodes are predicted again", PLURAL, GROUP)
