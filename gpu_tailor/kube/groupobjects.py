"""The API objects that say how large a group of pods is, listed and watched where the API server serves them:
kube-scheduler's PodGroup (``scheduling.k8s.io/v1alpha2``, Kubernetes 1.36 with the ``GenericWorkload`` gate and
that version served) and Workload (``scheduling.k8s.io/v1alpha1``, 1.35 with that gate), scheduler-plugins'
coscheduling PodGroup (``scheduling.x-k8s.io/v1alpha1``, a CRD) and Jobs (an Indexed Job's ``parallelism``).

None is needed: where one is not served, discovery is asked again every ``RECHECK`` seconds, and its groups are
read from the pods alone meanwhile (``gpumodel.groups``). Their watches do not hold up readiness.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from gpu_tailor.gpumodel.groups import (
    GroupObjects,
    Reader,
    coscheduling_object,
    job_object,
    podgroup_object,
    workload_objects,
)

log = logging.getLogger(__name__)

RECHECK = 60.0  # seconds between discoveries of a group API not served yet
# (kind, API group, version, plural, reader)
SOURCES: tuple[tuple[str, str, str, str, Reader], ...] = (
    ("podgroup", "scheduling.k8s.io", "v1alpha2", "podgroups", podgroup_object),
    ("workload", "scheduling.k8s.io", "v1alpha1", "workloads", workload_objects),  # 1.35: a Workload's pod groups
    ("coscheduling", "scheduling.x-k8s.io", "v1alpha1", "podgroups", coscheduling_object),
    ("job", "batch", "v1", "jobs", job_object),  # an Indexed Job's parallelism
)


async def _served(custom: Any, group: str, version: str, plural: str) -> bool:
    try:
        found = await custom.get_api_resources(group, version, _request_timeout=10)
    except ApiException as exc:
        if exc.status != 404:
            log.warning("discovery of %s/%s: HTTP %s", group, version, exc.status)
        return False
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        log.warning("discovery of %s/%s: %s", group, version, exc)
        return False
    resources = getattr(found, "resources", None) or []
    return any(getattr(r, "name", "") == plural for r in resources)


async def group_watches(api: Any, store: GroupObjects, recheck: float = RECHECK) -> None:
    """Keep ``store`` from every group API the server serves (each found when it is served, asked again meanwhile)."""
    from kubernetes_asyncio import client

    from gpu_tailor.kube.watch import list_and_watch

    custom = client.CustomObjectsApi(api)

    async def one(kind: str, group: str, version: str, plural: str, read: Reader) -> None:
        while not await _served(custom, group, version, plural):
            await asyncio.sleep(recheck)
        log.info("watching %s (%s/%s): the sizes of the groups of pods that name one", plural, group, version)
        await list_and_watch(functools.partial(custom.list_cluster_custom_object, group, version, plural),
                             functools.partial(store.reset, kind, read), functools.partial(store.apply, kind, read))

    await asyncio.gather(*(one(*source) for source in SOURCES))
