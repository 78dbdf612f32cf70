"""The webhook's HTTPS server: thin aiohttp routes around ``mutate.decide``.

``/mutate`` validates the AdmissionReview, asks the pure decision, and serialises the answer; a
malformed body is HTTP 400 and an oversized one 413 (the API server never sends more than a few
MiB for a pod). TLS material is reloaded when the files change, so cert-manager or
``gpu-tailor certs --renew-before`` can rotate it without a restart.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram
from pydantic import ValidationError

from gpu_tailor.certs.authority import Names
from gpu_tailor.gpumodel.inventory import node_fields
from gpu_tailor.kube.freshness import WATCH_WINDOW, Freshness, Staleness
from gpu_tailor.serving import CertReloader, add_probes
from gpu_tailor.webhook.mutate import Decision, decide
from gpu_tailor.webhook.state import ACTIVE_PODS, ClusterView
from gpu_tailor.webhook.wire import AdmissionReview, response

log = logging.getLogger(__name__)

MAX_BODY = 3 * 2**20


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reviews = Counter("gpu_tailor_webhook_reviews", "Admission reviews answered",
                               ["outcome", "backing"], registry=self.registry)
        self.latency = Histogram("gpu_tailor_webhook_review_seconds", "Time to answer a review",
                                 registry=self.registry,
                                 buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0))


VIEW = web.AppKey("view", ClusterView)
METRICS = web.AppKey("metrics", Metrics)


@dataclass(frozen=True, slots=True)
class Answer:
    """What ``/mutate`` sends back for a body: an HTTP status, the JSON, and the decision if one was made."""

    status: int
    body: bytes
    decision: Decision | None = None


def answer(body: bytes, view: ClusterView) -> Answer:
    """The whole of ``/mutate`` but the HTTP: parse and validate the review, decide, serialise.

    A body that is not an AdmissionReview v1 is a 400 with the reason; anything else is an
    AdmissionReview answer (a pod that cannot be read is a denial with code 400 inside it).
    """
    # orjson, then the envelope validated on the parsed dict: the Pod stays the parsed dict (``object``
    # is Any), and decide reads that dict itself rather than a model_dump copy of it
    try:
        raw = orjson.loads(body)
        review = AdmissionReview.model_validate(raw)
    except orjson.JSONDecodeError as exc:
        return _bad_request(f"body: invalid JSON: {exc}")
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        return _bad_request(f"{where}: {first['msg']}")
    decision = decide(raw["request"], view.candidates(), view.policy)
    if decision.allowed and decision.backing not in ("none", "reinvocation") and (age := view.stale()) is not None:
        decision = replace(decision, warnings=(*decision.warnings, stale_warning(age)))
    return Answer(200, orjson.dumps(response(review.request.uid, decision)), decision)


def stale_warning(age: float) -> str:
    return (f"gpu-tailor has not heard from the API server for {age:.0f}s: this GPU ask was placed by what was "
            "in use then, and 'prefer what is free now' may be out of date")


async def mutate(request: web.Request) -> web.Response:
    started = time.perf_counter()
    body = await request.read()  # over client_max_size: aiohttp answers 413 itself
    out = answer(body, request.app[VIEW])
    if out.decision is not None:
        metrics = request.app[METRICS]
        metrics.reviews.labels(out.decision.outcome, out.decision.backing).inc()
        metrics.latency.observe(time.perf_counter() - started)
    return web.Response(body=out.body, status=out.status, content_type="application/json")


def _bad_request(why: str) -> Answer:
    return Answer(400, orjson.dumps({"error": f"not an AdmissionReview v1: {why}"}))


def make_app(view: ClusterView) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY)
    app[VIEW] = view
    app[METRICS] = Metrics()
    app[METRICS].registry.register(Staleness("gpu_tailor_webhook_watch_staleness_seconds", view.freshness))
    app.router.add_post("/mutate", mutate)
    add_probes(app, _ready, "nodes and pods not listed yet", lambda a: a[METRICS].registry)
    return app


def _ready(app: web.Application) -> bool:
    view = app[VIEW]
    view.stale()  # the kubelet's probes keep the stale/current log lines on time between reviews
    return view.ready


def cluster_file_ctx(path: str) -> Any:
    from gpu_tailor.kube.clusterfile import load_cluster

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        nodes, pods = load_cluster(path)
        app[VIEW].reset(nodes, pods)
        yield

    return ctx


@dataclass
class KeptCerts:
    """``--certs-secret``: the serving certificate kept in a Secret (``kube.certkeeper``)."""

    ctx: ssl.SSLContext
    reloader: CertReloader
    directory: Path
    names: Names
    namespace: str
    secret: str
    webhook_config: str
    days: int
    renew_before_days: int
    interval: float


def watches(api: Any, view: ClusterView, window: int = WATCH_WINDOW) -> list[Coroutine[Any, Any, None]]:
    """The view's two writers: nodes, and the pods that can hold GPUs (``state.ACTIVE_PODS``)."""
    from kubernetes_asyncio import client

    from gpu_tailor.kube.podfields import slim_pod
    from gpu_tailor.kube.watch import list_and_watch

    core = client.CoreV1Api(api)
    pods = functools.partial(core.list_pod_for_all_namespaces, field_selector=ACTIVE_PODS)
    fresh_nodes = view.freshness["nodes"] = Freshness()
    fresh_pods = view.freshness["pods"] = Freshness()
    return [list_and_watch(core.list_node, view.reset_nodes, view.apply_node, project=node_fields,
                           freshness=fresh_nodes, timeout_seconds=window),
            list_and_watch(pods, None, view.apply_pod, relist=view.relist_pods, project=slim_pod,
                           freshness=fresh_pods, timeout_seconds=window)]


def watch_ctx(kubeconfig: str | None, in_cluster: bool, kept: KeptCerts | None = None,
              window: int = WATCH_WINDOW) -> Any:
    """The API client's life: the node and pod watches, and with ``kept`` the certificate keeper, whose first
    sync completes before the server listens (startup runs before the site starts)."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        from gpu_tailor.kube.certkeeper import ApiCertStore, CertKeeper
        from gpu_tailor.kube.watch import watching

        async with watching(kubeconfig, in_cluster, lambda api: watches(api, app[VIEW], window)) as api:
            if kept is None:
                yield
                return
            store = ApiCertStore(api, kept.namespace, kept.secret, kept.webhook_config)
            keeper = CertKeeper(store, kept.names, kept.directory, kept.reloader, kept.days, kept.renew_before_days)
            await keeper.start()
            task = asyncio.create_task(keeper.run(kept.interval))
            try:
                yield
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    return ctx
