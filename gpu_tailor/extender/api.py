"""The extender's calls to the API server: the Binding and the pod reads of bind and the record writes of
``extender.recorder`` (``ApiBinder``), and the watches that keep the cache (``watches``); ``server`` starts them
with the app (``server.watch_ctx``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Coroutine
from datetime import UTC, datetime
from typing import Any

import aiohttp

from gpu_tailor.extender.cache import Cache
from gpu_tailor.extender.recorder import Changed, Refused
from gpu_tailor.extender.records import PodProjector
from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.inventory import node_fields

ACTIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"
NODE_PAGE = 100  # a Node object is large (images, conditions): small pages keep each parse short
# a Binding or a read that hangs (a half-open connection) must end: it then counts as a lost answer
API_TIMEOUT = aiohttp.ClientTimeout(total=20, sock_connect=5)


class ApiRefused(Exception):
    """The API server answered a write or read of bind with an error status (the pod is gone, already
    bound, replaced, forbidden ...)."""

    def __init__(self, what: str, status: int, message: str) -> None:
        super().__init__(f"{what} answered {status}: {message}")
        self.status = status


def status_message(body: bytes | str | None, fallback: str) -> str:
    """The ``message`` of the API server's Status answer; else the body cut short, else ``fallback``."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body or ""
    try:
        status = json.loads(text)
    except json.JSONDecodeError:
        status = None
    if isinstance(status, dict) and isinstance(status.get("message"), str) and status["message"]:
        return str(status["message"])
    return text.strip()[:200] or fallback


class ApiBinder:
    """Binds with one call: a Binding whose annotations carry the GPUs chosen (the API server writes
    a Binding's annotations onto the pod in the same update that sets its node, so the record and the
    binding cannot part), with the pod's uid as a precondition (a pod recreated under the same name
    is not bound). Raises ``ApiRefused`` when the API server says no."""

    def __init__(self, api: Any) -> None:
        from kubernetes_asyncio import client

        self.core = client.CoreV1Api(api)

    async def bind(self, namespace: str, name: str, uid: str, node: str, gpus: str | None,
                   among: str | None = None) -> None:
        # a plain dict, as the API takes it: the client's V1Binding models cost more to build and
        # serialise than the call itself, on every pod
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid
        if gpus is not None:
            meta["annotations"] = {labels.ANN_GPUS: gpus}
            if among is not None:
                meta["annotations"][labels.ANN_GPUS_AMONG] = among
        binding: Any = {"metadata": meta, "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        # The API server answers a Binding with a Status, which the client cannot read as a V1Binding, so
        # the answer is taken raw -- and a raw answer never raises: its status is checked here.
        status, text = await _raw(self.core.create_namespaced_binding(namespace, binding, _preload_content=False,
                                                                      _request_timeout=API_TIMEOUT))
        if not 200 <= status < 300:
            raise ApiRefused("Binding", status, status_message(text, "no message"))

    async def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """A merge patch of the pod (``recorder.record_patch``); ``Refused`` when the API server says no for
        good (gone, replaced), ``ApiRefused`` for other errors (retried)."""
        status, text = await _raw(self.core.patch_namespaced_pod(
            name, namespace, patch, _preload_content=False, _request_timeout=API_TIMEOUT,
            _content_type="application/merge-patch+json"))  # type: ignore[call-arg]  # passed on to the request
        if status == 409:
            raise Changed(status_message(text, "conflict"))
        if status in (403, 404, 422):
            raise Refused(f"{status}: {status_message(text, 'no message')}")
        if not 200 <= status < 300:
            raise ApiRefused("writing the record", status, status_message(text, "no message"))

    async def pod_event(self, namespace: str, name: str, uid: str, reason: str, message: str) -> None:
        """A Warning event on the pod (kubectl describe shows it), from gpu-tailor-scheduler."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event: Any = {"metadata": {"generateName": f"{name}.", "namespace": namespace},
                 "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": namespace,
                                    "uid": uid},
                 "reason": reason, "message": message[:1024], "type": "Warning", "count": 1,
                 "firstTimestamp": now, "lastTimestamp": now, "source": {"component": "gpu-tailor-scheduler"}}
        status, text = await _raw(self.core.create_namespaced_event(namespace, event, _preload_content=False,
                                                                    _request_timeout=API_TIMEOUT))
        if not 200 <= status < 300:
            raise ApiRefused("the event", status, status_message(text, "no message"))

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        # raw, so the pod is the API's JSON (camelCase), as the watch delivers it
        status, text = await _raw(self.core.read_namespaced_pod(name, namespace, _preload_content=False,
                                                                _request_timeout=API_TIMEOUT))
        if status == 404:
            return None
        if not 200 <= status < 300:
            raise ApiRefused("reading the pod", status, status_message(text, "no message"))
        pod = json.loads(text)
        if not isinstance(pod, dict):
            raise ApiRefused("reading the pod", status, "not a Pod object")
        return pod


async def _raw(call: Awaitable[Any]) -> tuple[int, bytes]:
    """Status and body of a request made with ``_preload_content=False`` (an aiohttp response)."""
    resp = await call
    try:
        return int(resp.status), bytes(await resp.read())
    finally:
        resp.release()


def watches(api: Any, cache: Cache, dra: bool = True) -> list[Coroutine[Any, Any, None]]:
    """The cache's writers: nodes, the pods that can hold GPUs, the node agents' reports, the PodGroups that size
    groups of pods where the API server serves them, and with ``dra`` NVIDIA's DRA pools where it serves them."""
    from kubernetes_asyncio import client

    from gpu_tailor.kube.dra import dra_watches
    from gpu_tailor.kube.freshness import Freshness
    from gpu_tailor.kube.groupobjects import LiveGroups, group_watches
    from gpu_tailor.kube.reports import report_watch
    from gpu_tailor.kube.watch import list_and_watch

    core = client.CoreV1Api(api)
    nodes = cache.freshness["nodes"] = Freshness(cache.clock)
    pods = cache.freshness["pods"] = Freshness(cache.clock)
    # Finished pods hold nothing, so the API server is asked not to send them: a pod that
    # succeeds or fails leaves the selection, and the watch reports it DELETED.
    active = functools.partial(core.list_pod_for_all_namespaces, field_selector=ACTIVE_PODS)
    # on until discovery says the API server serves no resource.k8s.io/v1; off for good with ``--dra off``
    cache.dra.enabled = dra
    live = LiveGroups(cache.group_objects)
    cache.fetch_group = live.fetch
    return [*([dra_watches(api, cache.dra, cache.freshness)] if dra else []),
            report_watch(api, cache.reset_reports, cache.apply_report, cache.freshness),
            group_watches(api, cache.group_objects, live=live),
            list_and_watch(core.list_node, None, cache.apply_node, relist=cache.relist_nodes,
                           project=node_fields, freshness=nodes, page=NODE_PAGE, freeze_gc=True),
            list_and_watch(active, None, cache.apply_pod, relist=cache.relist_pods,
                           project=PodProjector(cache.holds_version),
                           freshness=pods, freeze_gc=True)]
