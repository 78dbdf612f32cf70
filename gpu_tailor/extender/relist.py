"""Relists of the extender's cache (``extender.cache``): after a 410, a dropped or silent watch or an outage,
every listed object is applied as the watch would apply it, then what the list lacks is deleted, except assumed
pods still within their deadline, which the list may simply predate (kube-scheduler's informer can be ahead of our
watch).

``kube.watch.Relist`` feeds a relist page by page (``Cache.relist_nodes``, ``Cache.relist_pods``); a cluster file
or a test hands it the whole list at once (``Cache.reset_nodes``, ``Cache.reset_pods``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from gpu_tailor.extender.records import live, pod_uid, pod_version
from gpu_tailor.gpumodel.schedule import pod_key

if TYPE_CHECKING:
    from gpu_tailor.extender.cache import Cache

POD_CHUNK = 100  # pods a relist handles between two turns of the event loop (a few ms)
NODE_CHUNK = 25  # nodes, likewise
REFRESH_CHUNK = 100  # changed nodes copied into the read side per turn at the end of a relist


class NodeRelist:
    """A node relist: each listed node is applied as the watch would apply it (a node whose inventory
    is unchanged is left as it is, with its pods and their GPUs); nodes the list lacks are deleted once
    it is complete. Pages are handled ``NODE_CHUNK`` nodes at a time, with the event loop free in
    between; requests answered meanwhile see each node either as it was or as listed."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache
        self.listed: set[str] = set()

    def page(self, items: list[dict[str, Any]]) -> Iterator[None]:
        for i, obj in enumerate(items, 1):
            self.cache.apply_node("ADDED", obj)
            self.listed.add(str((obj.get("metadata") or {}).get("name", "")))
            if i % NODE_CHUNK == 0:
                yield

    def done(self) -> Iterator[None]:
        cache = self.cache
        for i, name in enumerate(cache.nodes.keys() - self.listed, 1):
            cache.apply_node("DELETED", {"metadata": {"name": name}})
            if i % NODE_CHUNK == 0:
                yield
        while cache.refresh(REFRESH_CHUNK):
            yield
        cache.nodes_synced = True


class PodRelist:
    """A pod relist: every listed pod is applied as a watch event would be -- a pod unchanged since
    we last saw it costs a record and a comparison, one that changed is moved, and its GPUs stay
    unless its node or its annotation says otherwise. Pods the list lacks are deleted once it is
    complete, except assumptions still within their deadline (the list may predate a Binding). So a
    relist after a dropped watch touches only the nodes whose pods really changed.

    Pages are handled ``POD_CHUNK`` pods at a time with the event loop free in between: a request
    answered meanwhile sees each pod either as it was or as listed, as it would with a watch that
    has delivered some events and not yet others."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache
        self.listed: set[str] = set()
        self.uids: set[str] = set()

    def page(self, items: list[dict[str, Any]]) -> Iterator[None]:
        pods = self.cache.pods
        for i, obj in enumerate(items, 1):
            key, uid = pod_key(obj), pod_uid(obj)
            old = pods.get(key)
            # The API server gives every write a new resourceVersion: a listed pod at the version we
            # hold is exactly what we have (a relist after a dropped watch lists mostly these).
            if old is None or old.assumed or old.uid != uid or not old.version or old.version != pod_version(obj):
                self.cache.apply_pod("MODIFIED", obj)
            self.listed.add(key)
            self.uids.add(uid)
            if i % POD_CHUNK == 0:
                yield

    def done(self) -> Iterator[None]:
        cache = self.cache
        keys = list(cache.pods)
        for start in range(0, len(keys), 10 * POD_CHUNK):
            for key in keys[start:start + 10 * POD_CHUNK]:
                if key in self.listed or (rec := cache.pods.get(key)) is None:
                    continue
                if not live(rec, cache.clock()):  # deleted while the watch was down
                    cache._drop(rec)
                    cache._deleted(rec.uid)
                    cache.seen.discard(rec.uid)
                else:
                    self.uids.add(rec.uid)  # an assumption the list may predate
            yield
        cache.seen &= self.uids  # and forget the pods scored but never bound
        while cache.refresh(REFRESH_CHUNK):
            yield
        cache.pods_synced = True


def at_once(relist: NodeRelist | PodRelist, items: list[dict[str, Any]]) -> None:
    """Run a relist over one page holding every item, with no pause between its chunks."""
    for _ in relist.page(items):
        pass
    for _ in relist.done():
        pass
