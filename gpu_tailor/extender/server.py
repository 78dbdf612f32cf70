"""aiohttp app of the scheduler extender: /filter /prioritize /bind /preempt, probes and metrics.

Each handler parses the request, takes the cache's snapshot, calls the pure verb, and serialises its
answer; what changes the cache (bind's assume/forget, the pods asked about, the policy's mix) and the
API calls (the Binding) happen here, around the verbs.

Bind answers ``{"Error": ""}`` only once the API server has taken the Binding: kube-scheduler keeps a
pod it was told is bound in its cache until the API shows it gone, so a refused Binding reported as
done (a pod deleted mid-bind) would leave its GPUs counted as taken for good.

Errors go where kube-scheduler's HTTP extender client (v1.28 ``HTTPExtender.send``) reads them: a
body it could not have sent is 400; an unexpected failure is 200 with ``Error`` for filter and bind
(their result types have that field) and 500 for prioritize and preempt (theirs do not, and any
status but 200 fails the call); preempt before the cache is synced is 503.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram

from gpu_tailor.extender import verbs, wire
from gpu_tailor.extender.api import ApiBinder, watches
from gpu_tailor.extender.cache import Cache
from gpu_tailor.extender.pools import AgentMetrics, PoolGauges
from gpu_tailor.extender.recorder import Recorder
from gpu_tailor.extender.records import PodRecord, pod_record, pod_uid
from gpu_tailor.extender.scores import MAX_SCORE
from gpu_tailor.extender.snapshot import Snapshot
from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.schedule import pod_key
from gpu_tailor.kube.freshness import STALE_AFTER, Staleness
from gpu_tailor.serving import add_probes, probes_only

log = logging.getLogger(__name__)
DEFAULT_MAX_BODY = 64 * 2**20  # a full NodeList of a big cluster is large


class Binder(Protocol):
    """The API side of bind; both raise when the API server cannot be asked or refuses."""

    async def bind(self, namespace: str, name: str, uid: str, node: str, gpus: str | None,
                   among: str | None = None) -> None: ...

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod as the API has it now, None when it is gone."""
        ...



class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("gpu_tailor_extender_requests", "Extender requests by verb and outcome",
                                ["verb", "outcome"], registry=self.registry)
        self.latency = Histogram("gpu_tailor_extender_seconds", "Extender request latency", ["verb"],
                                 buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.25, 1.0),
                                 registry=self.registry)


class BinderSlot:
    """Filled once the API client exists (after startup), or by tests."""

    def __init__(self, binder: Binder | None = None) -> None:
        self.binder = binder


CACHE = web.AppKey("cache", Cache)
BINDER = web.AppKey("binder", BinderSlot)
METRICS = web.AppKey("metrics", Metrics)
RECORDER = web.AppKey("recorder", Recorder)


class GroupEvents:
    """Posts an event on a group's first pod when its plan is released (``GroupBook.released``); ``post`` is set
    once the API client exists."""

    def __init__(self) -> None:
        self.post: Callable[[str, str, str, str, str], Awaitable[None]] | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    def drain(self, cache: Cache) -> None:
        released, cache.groups.released = cache.groups.released, []
        if self.post is None:
            return
        for plan, why in released:
            ns, _, name = plan.anchor.partition("/")
            task = asyncio.create_task(self._post(ns, name, plan.anchor_uid, why))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _post(self, ns: str, name: str, uid: str, why: str) -> None:
        assert self.post is not None
        try:
            await self.post(ns, name, uid, "GroupPlanReleased", why)
        except Exception as exc:  # the log has it too: an event is for people, never worth a retry loop
            log.warning("the event on %s/%s could not be posted: %s", ns, name, exc)


GROUP_EVENTS = web.AppKey("group_events", GroupEvents)


async def _body(request: web.Request) -> Any:
    try:
        return orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise wire.WireError(f"malformed JSON: {exc}") from exc


def _json(result: Any, status: int = 200) -> web.Response:
    """``web.json_response`` with orjson: a prioritize answer is a few hundred {Host, Score} objects,
    which the standard library's encoder takes several times longer to write."""
    return web.Response(body=orjson.dumps(result), status=status, content_type="application/json")


# Verbs whose answer has no ``Error`` field (HostPriorityList, ExtenderPreemptionResult): kube-scheduler's
# HTTPExtender.send fails a call on any status but 200 (without reading the body), so their errors must
# be HTTP errors; an ``Error`` sent with 200 would be dropped as an unknown field and the answer read as
# "every score 0" or "no candidate". Filter and bind answer 200 with ``Error``, which kube-scheduler reads.
NO_ERROR_FIELD = frozenset({"prioritize", "preempt"})


def _verb(name: str, fn: Callable[[web.Request, Any], Awaitable[Any]]) -> Callable[[web.Request],
                                                                                    Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        metrics = request.app[METRICS]
        start = time.perf_counter()
        outcome = "ok"
        try:
            body = await _body(request)
            result = await fn(request, body)
            if isinstance(result, dict) and result.get("Error"):
                outcome = "error"
            return _json(result)
        except wire.WireError as exc:
            outcome = "bad-request"
            return _json({"Error": str(exc)}, status=400)
        except verbs.NotSynced as exc:
            outcome = "error"
            return _json({"Error": str(exc)}, status=503)
        except web.HTTPException:
            outcome = "bad-request"
            raise
        except Exception as exc:  # never a stack trace to the scheduler
            log.exception("%s failed", name)
            outcome = "error"
            error = {"Error": f"{name} failed: {type(exc).__name__}: {exc}"}
            return _json(error, status=500 if name in NO_ERROR_FIELD else 200)
        finally:
            metrics.requests.labels(name, outcome).inc()
            metrics.latency.labels(name).observe(time.perf_counter() - start)

    return handler


class LastArgs:
    """The last filter's or prioritize's request, read: the next one about the same pod reuses its demand."""

    def __init__(self) -> None:
        self.args: wire.ExtenderArgs | None = None

    def read(self, body: Any) -> wire.ExtenderArgs:
        self.args = wire.extender_args(body, self.args)
        return self.args


LAST_ARGS = web.AppKey("last_args", LastArgs)


async def _filter(request: web.Request, body: Any) -> Any:
    cache = request.app[CACHE]
    args = request.app[LAST_ARGS].read(body)
    key, uid = pod_key(args.pod), pod_uid(args.pod)
    cache.unscore(key, uid)  # asked again: where it was ranked first last time did not take it
    if cache.fetch_group is not None and (ref := cache.group_ref(args.pod, args.demand)) is not None:
        await cache.fetch_group(ref)  # its PodGroup, Workload or Job, where the watch has not brought it yet
    member = cache.group_answer(args.pod, args.demand, args.names)
    if cache.groups.unwritten:
        await _write_plans(request.app, cache)
    out = verbs.filter_nodes(cache.snapshot(), args, member)
    cache.remember(args.pod, args.demand)  # a valid body: for a bind that beats the watch
    if cache.groups.released:
        request.app[GROUP_EVENTS].drain(cache)
    return out


async def _write_plans(app: web.Application, cache: Cache) -> None:
    """Write each new group plan on the pod it was made for (``gpu-tailor.io/group-plan``), before any member can
    be bound: a restarted extender, or its standby, reads it back and holds the same GPUs."""
    patch = app[RECORDER].patch
    while cache.groups.unwritten:
        plan = cache.groups.unwritten.pop()
        if patch is None:
            continue
        ns, _, name = plan.anchor.partition("/")
        try:
            await patch(ns, name, {"metadata": {"annotations": {labels.ANN_GROUP_PLAN: plan.wire()}}})
            plan.written = True
        except Exception as exc:  # the plan holds in this replica; only a restart before the bind loses it
            log.warning("%s: its plan could not be written on %s: %s", plan.ref.name, plan.anchor, exc)


async def _prioritize(request: web.Request, body: Any) -> Any:
    cache = request.app[CACHE]
    args = request.app[LAST_ARGS].read(body)
    key, uid = pod_key(args.pod), pod_uid(args.pod)
    cache.unscore(key, uid)
    snap = cache.snapshot()
    member = cache.group_answer(args.pod, args.demand)
    asked = verbs.shape_asked(snap, args)
    if asked is not None:
        cache.observe(*asked)  # the policy learns the mix from the pods it scores, this one included
    out = verbs.prioritize(snap, args, member)
    cache.remember(args.pod, args.demand)
    if args.demand.gpu and member is None:  # a member's GPUs are held for it already
        # scores go by rank with ties broken by a fixed node order: the policy's first choice is the only MAX_SCORE,
        # and the extender's weight makes it kube-scheduler's
        first = next((o["Host"] for o in out if o["Score"] == MAX_SCORE), None)
        if first is not None:
            _expect(cache, snap, key, uid, first)
    return out


def _expect(cache: Cache, snap: Snapshot, key: str, uid: str, node: str) -> None:
    """Count a GPU pod on the node it is expected to be bound to (``Cache.assume(..., scored=True)``): the
    next filter then sees its GPUs taken while kube-scheduler binds it, and, bound there without a Binding
    of ours, its GPUs are recorded after the bind (``extender.recorder``)."""
    rec = cache.pending(key, uid)
    if rec is None or not rec.demand.gpu or (rec.node and not rec.scored):
        return
    plan = verbs.plan_bind(snap, rec, node)
    if plan.placement is not None and not plan.error:
        cache.assume(rec, node, plan.placement, scored=True)


async def _preempt(request: web.Request, body: Any) -> Any:
    return verbs.preempt(request.app[CACHE].snapshot(), body)


async def _bind(request: web.Request, body: Any) -> Any:
    args = wire.bind_args(body)
    cache = request.app[CACHE]
    binder = request.app[BINDER].binder
    if binder is None:
        return {"Error": "bind needs the API server (offline --cluster-file mode cannot bind)"}
    failed = f"binding {args.key} to {args.node} failed"
    rec = cache.pending(args.key, args.uid)
    if rec is not None and rec.scored:  # ranked first by prioritize: the bind verb binds it after all
        if rec.node == args.node and rec.placement is not None:
            return await _bind_planned(cache, binder, args, rec, verbs.BindPlan(rec.placement), failed)
        cache.forget(rec.key, rec.uid)
        rec = cache.pending(args.key, args.uid)
    if rec is None:  # neither the watch nor filter has shown us this pod: ask the API, never bind blind
        try:
            pod = await binder.read_pod(args.namespace, args.name)
        except Exception as exc:
            return {"Error": f"{failed}: reading the pod: {exc}"}
        if pod is None:
            return {"Error": f"{failed}: the pod is gone (not in the API)"}
        rec = cache.pending(args.key, args.uid)  # the watch may have caught up meanwhile
        if rec is None:
            rec = pod_record(pod)
            if rec.node and (not args.uid or rec.uid == args.uid):
                cache.apply_pod("MODIFIED", pod)  # bound already: counted as the API shows it
        if args.uid and rec.uid != args.uid:
            return {"Error": f"{failed}: the pod was replaced (uid {rec.uid}, not {args.uid})"}
    if rec.node and not rec.assumed:
        # the API has shown the pod bound already: kube-scheduler retries a pod whose Binding went
        # through while it could not tell (an API server restart); binding again would replace its GPUs
        return {"Error": "" if rec.node == args.node else f"{failed}: the pod is already bound to {rec.node}"}
    if rec.assumed and rec.node:
        # kube-scheduler retries a pod whose earlier Binding (to rec.node) we could not confirm: if that
        # one went through, replacing the assumption now would free its GPUs while it runs there (and
        # the GPUs its annotation names would be handed out again, to the same node or another)
        try:
            pod = await binder.read_pod(args.namespace, args.name)
        except Exception as exc:
            return {"Error": f"{failed}: whether its Binding to {rec.node} went through is not known yet ({exc})"}
        node = _bound_to(pod, args)
        if node:
            _apply_read_back(cache, rec, pod)
            return {"Error": "" if node == args.node else f"{failed}: the pod is bound to {node}"}
        cache.forget(rec.key, rec.uid)  # it did not go through: the old assumption must not count in the plan
        rec = cache.pending(args.key, args.uid) or rec
    plan = verbs.plan_bind(cache.snapshot(), rec, args.node)
    if plan.error:
        return {"Error": plan.error}
    return await _bind_planned(cache, binder, args, rec, plan, failed)


async def _bind_planned(cache: Cache, binder: Binder, args: wire.BindArgs, rec: PodRecord, plan: verbs.BindPlan,
                        failed: str) -> dict[str, str]:
    cache.assume(rec, args.node, plan.placement)  # the very next filter sees it
    try:
        await binder.bind(args.namespace, args.name, args.uid, args.node, plan.gpus, plan.among)
    except Exception as exc:
        return await _after_failed_binding(cache, binder, args, rec, f"{failed}: {exc}")
    cache.finish_binding(rec.key, rec.uid)  # from now on, the watch has ``ttl`` seconds to show it
    return {"Error": ""}


def _bound_to(pod: dict[str, Any] | None, args: wire.BindArgs) -> str:
    """The node a pod read back is bound to ("" when it is not, is gone, or is another pod of that name)."""
    if pod is None or (args.uid and (pod.get("metadata") or {}).get("uid") != args.uid):
        return ""
    return str((pod.get("spec") or {}).get("nodeName") or "")


def _apply_read_back(cache: Cache, rec: PodRecord, pod: dict[str, Any] | None) -> None:
    """Count a pod read back from the API as it is there, but only while the cache still holds our
    assumption of it: the watch may have shown it bound, or deleted, during the read."""
    now = cache.pods.get(rec.key)
    if pod is not None and now is not None and now.uid == rec.uid and now.assumed:
        cache.apply_pod("MODIFIED", pod)


async def _after_failed_binding(cache: Cache, binder: Binder, args: wire.BindArgs, rec: PodRecord,
                                error: str) -> dict[str, str]:
    """A Binding failed: the pod is read back before anything is freed.

    Taking a lost answer (a cut connection, an API server restart, after the API server acted) for a
    refusal would free the pod's GPUs while it runs, and kube-scheduler would forget it too: with the
    watch lagging, the next pods would get the same GPUs. So: bound where we bound it -> done; bound
    elsewhere (a retry of a pod whose first Binding went through: 409 already assigned) -> counted
    there as the API shows it, its annotation naming its GPUs; not bound, or gone -> refused; the API
    cannot say -> refused to kube-scheduler, but its GPUs stay counted until the watch shows the pod
    or the assumption's deadline passes."""
    try:
        pod = await binder.read_pod(args.namespace, args.name)
    except Exception:
        cache.finish_binding(rec.key, rec.uid)
        return {"Error": f"{error} (whether it is bound is not known yet: its GPUs stay counted until the API "
                         "shows the pod)"}
    node = _bound_to(pod, args)
    if not node:
        cache.forget(rec.key, rec.uid)
        return {"Error": error}
    _apply_read_back(cache, rec, pod)  # bound: as the API shows it, as the watch soon will
    if node == args.node:
        log.warning("%s, but the pod is bound there: taken as done", error)
        return {"Error": ""}
    return {"Error": f"{error} (the pod is bound to {node})"}


UNHEALTHY_AFTER = 300.0  # seconds without the API server before /healthz gives up (--unhealthy-after)


class StepDown:
    """``/healthz``'s verdict. The extender is alive until it has been cut off from the API server for longer
    than ``after`` seconds: every list and watch of some kind failing for that long (refused, cut, timed out;
    a page of a list answered clears it), no first sync that long after start, or -- an API server that
    hangs rather than refuses -- no news at all for longer than both ``after`` and the freshness window.
    Then the kubelet restarts it, and ``/livez`` (what its kube-scheduler's liveness probe asks) fails too,
    so that kube-scheduler restarts and its leader-election Lease goes to a replica whose extender can reach
    the API server. A stuck extender must not keep the Lease: every pod the profile schedules would wait.
    In an outage of the whole control plane every replica restarts every ``after`` seconds or so (and the
    kubelet's back-off grows): nothing could be bound then anyway."""

    def __init__(self, cache: Cache, after: float = UNHEALTHY_AFTER) -> None:
        self.cache, self.after = cache, after
        self.started = cache.clock()

    def why(self) -> str | None:
        """Why the extender is not healthy, or None."""
        cache, now = self.cache, self.cache.clock()
        if not (cache.nodes_synced and cache.pods_synced) and now - self.started > self.after:
            return f"not synced with the API server {now - self.started:.0f}s after start (--unhealthy-after " \
                   f"{self.after:.0f})"
        for resource, fresh in sorted(cache.freshness.items()):
            if (failing := fresh.failing_for()) > self.after:
                return f"every list and watch of {resource} has failed for {failing:.0f}s (--unhealthy-after " \
                       f"{self.after:.0f})"
            if (quiet := fresh.staleness()) > max(self.after, STALE_AFTER) and math.isfinite(quiet):
                return f"no news from the API server about {resource} for {quiet:.0f}s (--unhealthy-after " \
                       f"{self.after:.0f})"
        return None


STEP_DOWN = web.AppKey("step_down", StepDown)
SCHEDULER_HEALTHZ = web.AppKey("scheduler_healthz", str)


async def livez(request: web.Request) -> web.Response:
    """This replica can schedule: the extender is healthy (``StepDown``) and, with ``--scheduler-healthz``,
    the kube-scheduler beside it answers its own ``/healthz``. kube-scheduler's liveness probe asks this."""
    why = request.app[STEP_DOWN].why()
    url = request.app.get(SCHEDULER_HEALTHZ)
    if why is None and url:
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session, \
                    session.get(url, ssl=False) as resp:
                if resp.status != 200:
                    why = f"kube-scheduler's {url} answered {resp.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            why = f"kube-scheduler's {url} did not answer: {type(exc).__name__} {exc}".rstrip()
    if why:
        return web.Response(status=503, text=why)
    return web.Response(text="ok")


def make_app(cache: Cache, binder: Binder | None = None, max_body: int = DEFAULT_MAX_BODY, *,
             unhealthy_after: float = UNHEALTHY_AFTER, scheduler_healthz: str | None = None,
             probes_port: int | None = None) -> web.Application:
    """The extender's routes. ``probes_port``: the port of ``--metrics-listen``, where only the probes and
    ``/metrics`` are served (``serving.probes_only``)."""
    app = web.Application(client_max_size=max_body,
                          middlewares=[probes_only(probes_port)] if probes_port is not None else [])
    app[CACHE] = cache
    app[STEP_DOWN] = StepDown(cache, unhealthy_after)
    if scheduler_healthz:
        app[SCHEDULER_HEALTHZ] = scheduler_healthz
    app[METRICS] = Metrics()
    app[METRICS].registry.register(Staleness("gpu_tailor_extender_watch_staleness_seconds", cache.freshness))
    app[METRICS].registry.register(PoolGauges(cache))
    app[METRICS].registry.register(AgentMetrics(cache))
    app[BINDER] = BinderSlot(binder)
    app[RECORDER] = Recorder(cache, None, app[METRICS].registry)
    app[GROUP_EVENTS] = GroupEvents()
    app[LAST_ARGS] = LastArgs()
    app.router.add_post("/filter", _verb("filter", _filter))
    app.router.add_post("/prioritize", _verb("prioritize", _prioritize))
    app.router.add_post("/bind", _verb("bind", _bind))
    app.router.add_post("/preempt", _verb("preempt", _preempt))
    add_probes(app, "extender", lambda a: a[CACHE].ready,
               "not synced with the API server yet, or a watch has gone quiet",
               lambda a: a[METRICS].registry, lambda a: a[STEP_DOWN].why())
    app.router.add_get("/livez", livez)
    return app




def watch_ctx(cache: Cache, kubeconfig: str | None, in_cluster: bool, dra: bool = True) -> Any:
    """The API client's life: the watches (``watches``), the binder and the recorder."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        from gpu_tailor.kube.watch import watching

        # what the process made to start: frozen once, so that the collections the watches' freezes start
        # with (kube.watch) visit only what came after
        gc.collect()
        gc.freeze()
        async with watching(kubeconfig, in_cluster, lambda api: watches(api, cache, dra)) as api:
            binder = ApiBinder(api)
            app[BINDER].binder = binder
            app[RECORDER].patch = binder.patch_pod
            app[GROUP_EVENTS].post = binder.pod_event
            recorder = asyncio.create_task(app[RECORDER].run())
            try:
                yield
            finally:
                recorder.cancel()

    return ctx
