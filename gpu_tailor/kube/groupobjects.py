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
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from gpu_tailor.gpumodel.groups import (
    GroupObjects,
    GroupRef,
    Reader,
    coscheduling_object,
    job_object,
    podgroup_object,
    sizing_object,
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


GET_TIMEOUT = 3  # seconds a filter waits for a group's object read on the spot
ABSENT_FOR = 10.0  # seconds an object found absent (or not a group's) is not asked for again
KEPT_ABSENT = 4096


class LiveGroups:
    """Reads a group's object from the API server on the spot, for a pod that reaches the filter before the watch
    has delivered the PodGroup, Workload or Job that sizes its group (all are created before their pods, but the watch
    may lag): without it the pod would be placed as a single pod. The object read is kept as a watch event would keep
    it; the watch's own events replace it. Kinds not served (no getter) are not asked."""

    def __init__(self, store: GroupObjects, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.getters: dict[str, tuple[Callable[..., Awaitable[Any]], Reader]] = {}  # kind -> (get, reader)
        self.clock = clock
        self.asked: OrderedDict[str, float] = OrderedDict()  # object key -> when it was last read and not kept

    async def fetch(self, ref: GroupRef) -> None:
        want = sizing_object(ref)
        if want is None or (ref.source or ref.key) in self.store.objects:
            return
        kind, namespace, name = want
        found = self.getters.get(kind)
        key = ref.source or ref.key
        if found is None or self.clock() - self.asked.get(key, -math.inf) < ABSENT_FOR:
            return
        self.asked[key] = self.clock()
        self.asked.move_to_end(key)
        if len(self.asked) > KEPT_ABSENT:
            self.asked.popitem(last=False)
        get, read = found
        try:
            obj = await get(namespace=namespace, name=name, _request_timeout=GET_TIMEOUT)
        except ApiException as exc:
            if exc.status != 404:
                log.warning("reading %s %s/%s for its group's size: HTTP %s: %s", kind, namespace, name, exc.status,
                            str(exc.body)[:200])
            return
        except Exception as exc:  # never the filter's failure: the pod is then placed as the watch allows
            log.warning("reading %s %s/%s for its group's size: %s", kind, namespace, name, exc)
            return
        if isinstance(obj, dict) and (ref.source or ref.key) not in self.store.objects:  # the watch may have won
            self.store.apply(kind, read, "ADDED", obj)


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


def getter(custom: Any, group: str, version: str, plural: str) -> Callable[..., Awaitable[Any]]:
    """A GET of one object of a kind (``namespace=``, ``name=``) through ``CustomObjectsApi``."""
    return functools.partial(custom.get_namespaced_custom_object, group=group, version=version, plural=plural)


async def group_watches(api: Any, store: GroupObjects, recheck: float = RECHECK,
                        live: LiveGroups | None = None) -> None:
    """Keep ``store`` from every group API the server serves (each found when it is served, asked again meanwhile);
    ``live`` is given a getter for each once it is served."""
    from kubernetes_asyncio import client

    from gpu_tailor.kube.watch import list_and_watch

    custom = client.CustomObjectsApi(api)

    async def one(kind: str, group: str, version: str, plural: str, read: Reader) -> None:
        while not await _served(custom, group, version, plural):
            await asyncio.sleep(recheck)
        log.info("watching %s (%s/%s): the sizes of the groups of pods that name one", plural, group, version)
        if live is not None:
            live.getters[kind] = (getter(custom, group, version, plural), read)
        await list_and_watch(functools.partial(custom.list_cluster_custom_object, group, version, plural),
                             functools.partial(store.reset, kind, read), functools.partial(store.apply, kind, read))

    await asyncio.gather(*(one(*source) for source in SOURCES))
