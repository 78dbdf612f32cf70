"""The GPUs of the pods kube-scheduler binds itself, written on them after the bind.

With ``bindVerb`` kube-scheduler hands the bind to the extender, whose Binding carries the pod's
``gpu-tailor.io/gpus`` annotation; that costs the scheduling of every pod an extra HTTP call and a
Binding written by Python. Without it kube-scheduler binds (its own binding cycle, off its critical
path), and the extender learns the node from the pod watch. Its record is then written after the
bind, once per pod, by the replica that scored the pod -- the one whose kube-scheduler holds the
leader Lease, since only that kube-scheduler asks its extender -- as a merge patch of the two
annotations with the pod's uid as a precondition (a pod recreated under the same name is not
written). Between prioritize and the watch's news the cache counts the pod on the node it ranked
first (``Cache.assume(..., scored=True)``), so the next filter sees its GPUs taken.

A write that fails for want of the API server is retried with a growing delay while the pod stays
bound and unrecorded; a refusal (the pod gone or replaced) ends it. Nothing depends on the record
having been written: until it is, the cache holds the same GPUs, and a restarted extender predicts
unrecorded pods afresh, as it does for pods other schedulers bind; a node agent's report, where one
runs, replaces both.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from gpu_tailor.extender.cache import Cache
from gpu_tailor.extender.records import PodRecord
from gpu_tailor.extender.verbs import BindPlan
from gpu_tailor.gpumodel import labels

log = logging.getLogger(__name__)

Patch = Callable[[str, str, dict[str, Any]], Awaitable[None]]  # (namespace, name, merge patch); raises on failure
WRITERS = 8  # writes in flight at once: one at a time would trail a burst of binds at the API's round trip
QUIET = 0.5  # seconds without a filter or prioritize call before records are written
OVERDUE = 30.0  # seconds a record may wait for quiet; older ones are written one at a time, busy or not
OUTCOMES = ("written", "conflict", "retried", "refused", "skipped")
RETRY_FIRST, RETRY_MAX = 0.5, 30.0  # seconds before retrying a write the API server did not take


class Refused(Exception):
    """The API server refused the write for good (404: gone; 422: replaced, a uid that differs; 403)."""


class Changed(Exception):
    """409 Conflict: the pod is not at the resourceVersion the write was made for (another replica wrote its
    record, or the kubelet its status)."""


def record_patch(uid: str, version: str, gpus: str, among: str | None) -> dict[str, Any]:
    """The merge patch that writes a pod's record, with its uid and the resourceVersion it was chosen at as
    preconditions: a record is written once, by one replica, on the pod it was chosen for."""
    annotations = {labels.ANN_GPUS: gpus}
    if among is not None:
        annotations[labels.ANN_GPUS_AMONG] = among
    return {"metadata": {"uid": uid, "resourceVersion": version, "annotations": annotations}}


class Recorder:
    """Drains ``cache.unrecorded`` with ``patch`` (set once the API client exists); ``run`` until cancelled.

    A write costs the extender's one core about what a Binding did, and the watch's news of it a pod
    event more, so records wait for kube-scheduler to go quiet (``quiet`` seconds without a filter or
    prioritize call): in a burst of pods they are written after it, ``writers`` at a time, not between
    its scheduling cycles. Under load that never lets up, a record older than ``overdue`` is written
    anyway, one at a time."""

    def __init__(self, cache: Cache, patch: Patch | None, registry: CollectorRegistry | None = None,
                 writers: int = WRITERS, quiet: float = QUIET, overdue: float = OVERDUE,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.cache, self.patch, self.writers = cache, patch, writers
        self.quiet, self.overdue, self.sleep = quiet, overdue, sleep
        self.wake = asyncio.Event()
        self.writes = Counter("gpu_tailor_extender_records_written", "Records of pods kube-scheduler bound, "
                              "written after the bind, by outcome (written, refused, retried, conflict, skipped)",
                              ["outcome"], registry=registry)
        for outcome in OUTCOMES:  # each series from zero, so that a rate over the first write is not lost
            self.writes.labels(outcome)
        self.pending = Gauge("gpu_tailor_extender_records_pending", "GPU pods this replica scored whose GPUs are not "
                             "written on them yet (not seen bound yet, or waiting for their write)", registry=registry)
        self.pending.set_function(lambda: cache.expected_binds() + len(cache.unrecorded) + self.writing)
        self.writing = 0  # writes taken from the queue and not finished
        cache.on_unrecorded = self.wake.set

    def take(self, busy: bool = False) -> tuple[str, str, dict[str, Any]] | None:
        """The next pod to write and its patch; None when none is left (``busy``: none overdue). Pods that
        moved on since (deleted, replaced, recorded by the watch's news, placed otherwise) are dropped here."""
        cache = self.cache
        while cache.unrecorded:
            key = next(iter(cache.unrecorded))  # the oldest
            uid, since = cache.unrecorded[key]
            if busy and cache.clock() - since < self.overdue:
                return None
            del cache.unrecorded[key]
            patch = self._patch(key, uid)
            if patch is None:
                self.writes.labels("skipped").inc()
                continue
            return key, uid, patch
        return None

    def _needing(self, key: str, uid: str) -> PodRecord | None:
        """The pod's record while it is still bound, the same pod, and without its written record; else None."""
        rec = self.cache.pods.get(key)
        if rec is None or rec.uid != uid or not rec.node or rec.assumed or rec.recorded is not None:
            return None
        return rec

    def _patch(self, key: str, uid: str) -> dict[str, Any] | None:
        """The write of the pod's record as the cache holds it now (a node agent's report may have moved its GPUs);
        None when it needs none, or its GPUs are not known (counted, not placed)."""
        rec = self._needing(key, uid)
        plan = BindPlan(rec.placement) if rec is not None else None
        if rec is None or plan is None or plan.gpus is None:
            return None
        return record_patch(uid, rec.version, plan.gpus, plan.among)

    async def run(self) -> None:
        workers = [asyncio.create_task(self._worker(i)) for i in range(self.writers)]
        try:
            await asyncio.gather(*workers)
        finally:
            for w in workers:
                w.cancel()

    async def _worker(self, i: int) -> None:
        cache = self.cache
        while True:
            if not cache.unrecorded:
                self.wake.clear()
                await self.wake.wait()
                continue
            busy_for = self.quiet - (cache.clock() - cache.last_asked)
            busy = busy_for > 0
            item = self.take(busy) if i == 0 or not busy else None
            if item is None:
                # busy (and nothing overdue, or not this worker's turn): look again once quiet could have come
                await self.sleep(max(busy_for, 0.05))
                continue
            self.writing += 1
            try:
                await self._write(*item)
            finally:
                self.writing -= 1

    async def _write(self, key: str, uid: str, patch: dict[str, Any]) -> None:
        assert self.patch is not None, "run without a way to write"
        namespace, _, name = key.partition("/")
        delay = RETRY_FIRST
        while True:
            tried = patch["metadata"]["resourceVersion"]
            try:
                await self.patch(namespace, name, patch)
                self.writes.labels("written").inc()
                return
            except Changed:  # written by another replica, or the kubelet wrote its status: look again
                self.writes.labels("conflict").inc()
                wait = "lagging"
                for _ in range(int(RETRY_MAX / RETRY_FIRST)):  # until the watch brings the version that changed
                    await self.sleep(RETRY_FIRST)
                    if (wait := self._newer(key, uid, tried)) != "lagging":
                        break
            except Refused as exc:
                log.info("the record of pod %s was not written: %s", key, exc)
                self.writes.labels("refused").inc()
                return
            except Exception as exc:  # the API server out of reach: retry while the pod still needs it
                log.warning("writing the record of pod %s failed (%s); retrying in %.1fs", key, exc, delay)
                self.writes.labels("retried").inc()
                await self.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
                wait = self._newer(key, uid, "")
            new = self._patch(key, uid) if wait == "write" else None
            if new is None:
                return
            patch = new

    def _newer(self, key: str, uid: str, tried: str) -> str:
        """"write" when the pod still needs its record and is held at another version than ``tried``; "lagging"
        when it still needs it but the watch has not brought the version the API server holds; "done" else."""
        rec = self._needing(key, uid)
        if rec is None:
            return "done"
        return "lagging" if rec.version == tried else "write"
