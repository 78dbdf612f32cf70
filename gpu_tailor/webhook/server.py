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
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram
from pydantic import ValidationError

from gpu_tailor.certs.authority import Names
from gpu_tailor.gpumodel.inventory import node_fields
from gpu_tailor.kube.freshness import WATCH_WINDOW, Freshness, Staleness
from gpu_tailor.serving import CertReloader, add_probes
from gpu_tailor.webhook.mutate import Decision, decide
from gpu_tailor.webhook.registration import AGENT_SERVICE_ACCOUNT
from gpu_tailor.webhook.reports import PodLookup
from gpu_tailor.webhook.reports import check as check_report
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
                                 # up to the longest timeoutSeconds (30 s): the slow-webhook alert compares to it
                                 buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5, 5.0,
                                          10.0, 30.0))


class Templates:
    """The ResourceClaimTemplates that DRA pods name, made in their namespace before the pod is admitted (never for a
    dry run). Posted for every such pod, with no memory of earlier ones: a 409 (it exists) is cheap, and a template
    someone deleted is made again by the next pod that needs it, never left missing under a pod that names it.
    Without an API client (``--cluster-file``, tests) ``create`` is None and nothing is made: DRA is off there."""

    def __init__(self, create: Callable[[str, dict[str, Any]], Awaitable[None]] | None = None) -> None:
        self.create = create

    async def ensure(self, namespace: str, template: dict[str, Any]) -> str | None:
        """Make ``template`` exist in ``namespace``; None when it does, else why it cannot be made."""
        name = str(template["metadata"]["name"])
        if self.create is None:
            return None
        try:
            await self.create(namespace, template)
        except ApiRefusal as exc:
            if exc.status != 409:  # 409: it exists already
                return f"cannot create ResourceClaimTemplate {namespace}/{name}: HTTP {exc.status}: {exc.message}"
        except (TimeoutError, OSError, aiohttp.ClientError) as exc:
            return f"cannot create ResourceClaimTemplate {namespace}/{name}: {exc or type(exc).__name__}"
        return None


class ApiRefusal(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


def api_template_creator(api: Any) -> Callable[[str, dict[str, Any]], Awaitable[None]]:
    """``Templates.create`` through the API (``resource.k8s.io/v1``), 2 s at most: well inside the webhook's own 5 s,
    so that a slow API server gets the pod a denial with the reason, not the API server's timeout."""
    from kubernetes_asyncio import client
    from kubernetes_asyncio.client.exceptions import ApiException

    resource = client.ResourceV1Api(api)

    async def create(namespace: str, template: dict[str, Any]) -> None:
        try:
            # the client serialises a dict as it is: the template needs no model round trip
            await resource.create_namespaced_resource_claim_template(
                namespace, template, _request_timeout=2)  # type: ignore[arg-type]
        except ApiException as exc:
            raise ApiRefusal(exc.status or 0, _status_message(exc.body) or str(exc.reason)) from None

    return create


def _status_message(body: Any) -> str:
    try:
        return str(orjson.loads(body).get("message", ""))
    except (orjson.JSONDecodeError, TypeError, AttributeError):
        return ""


VIEW = web.AppKey("view", ClusterView)
TEMPLATES = web.AppKey("templates", Templates)
METRICS = web.AppKey("metrics", Metrics)


@dataclass(frozen=True, slots=True)
class Answer:
    """What ``/mutate`` sends back for a body: an HTTP status, the JSON, and the decision if one was made."""

    status: int
    body: bytes
    decision: Decision | None = None
    uid: str = ""
    namespace: str = ""
    dry_run: bool = False


def answer(body: bytes, view: ClusterView) -> Answer:
    """The whole of ``/mutate`` but the HTTP: parse and validate the review, decide, serialise.

    A body that is not an AdmissionReview v1 is a 400 with the reason; anything else is an
    AdmissionReview answer (a pod that cannot be read is a denial with code 400 inside it).
    """
    parsed = parse_review(body)
    if isinstance(parsed, Answer):
        return parsed
    raw, review = parsed
    decision = decide(raw["request"], view.candidates(), view.policy, view.dra, view.nodes_taking_pods(),
                      view.largest_domain(), view.largest_domain(dra=False))
    if decision.allowed and decision.backing not in ("none", "reinvocation") and (age := view.stale()) is not None:
        decision = replace(decision, warnings=(*decision.warnings, stale_warning(age)))
    return Answer(200, orjson.dumps(response(review.request.uid, decision)), decision, review.request.uid,
                  str(raw["request"].get("namespace") or ""), review.request.dryRun)


def parse_review(body: bytes) -> tuple[dict[str, Any], AdmissionReview] | Answer:
    """The review as parsed and validated, or the 400 a body that is not an AdmissionReview v1 gets.

    orjson, then the envelope validated on the parsed dict: the object stays the parsed dict (``object`` is Any),
    and the handlers read that dict itself rather than a model_dump copy of it."""
    try:
        raw = orjson.loads(body)
        return raw, AdmissionReview.model_validate(raw)
    except orjson.JSONDecodeError as exc:
        return _bad_request(f"body: invalid JSON: {exc}")
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        return _bad_request(f"{where}: {first['msg']}")


def _counted(app: web.Application, decision: Decision, started: float) -> None:
    metrics = app[METRICS]
    metrics.reviews.labels(decision.outcome, decision.backing).inc()
    metrics.latency.observe(time.perf_counter() - started)


def stale_warning(age: float) -> str:
    return (f"gpu-tailor has not heard from the API server for {age:.0f}s: this GPU ask was placed by what was "
            "in use then, and 'prefer what is free now' may be out of date")


async def mutate(request: web.Request) -> web.Response:
    started = time.perf_counter()
    body = await request.read()  # over client_max_size: aiohttp answers 413 itself
    out = answer(body, request.app[VIEW])
    if out.decision is not None and out.decision.template is not None and not out.dry_run:
        why = await request.app[TEMPLATES].ensure(out.namespace, out.decision.template)
        if why is not None:  # the pod would wait for a claim nothing can make: refuse it now, with the reason
            denied = Decision(allowed=False, code=500, outcome="denied", backing=out.decision.backing,
                              message=f"pod cannot get its GPU ask: {why}")
            out = replace(out, body=orjson.dumps(response(out.uid, denied)), decision=denied)
    if out.decision is not None:
        _counted(request.app, out.decision, started)
    return _respond(out)


@dataclass
class ReportCheck:
    """``/reports``' needs: the namespace the agents run in, their ServiceAccount, and a way to read a pod (None: no
    API client)."""

    namespace: str = "gpu-tailor"
    account: str = AGENT_SERVICE_ACCOUNT
    pods: PodLookup | None = None


REPORTS = web.AppKey("reports", ReportCheck)


async def review_report(request: web.Request) -> web.Response:
    """``/reports``: an agent writes its own node's NodeGPUReport only (``webhook.reports``)."""
    started = time.perf_counter()
    parsed = parse_review(await request.read())
    if isinstance(parsed, Answer):
        return _respond(parsed)
    raw, review = parsed
    setup = request.app[REPORTS]
    decision = await check_report(raw["request"], setup.namespace, setup.pods, setup.account)
    _counted(request.app, decision, started)
    return _respond(Answer(200, orjson.dumps(response(review.request.uid, decision)), decision))


def _respond(out: Answer) -> web.Response:
    return web.Response(body=out.body, status=out.status, content_type="application/json")


def api_pod_lookup(api: Any) -> PodLookup:
    """Read a pod's uid and node from the API server (``/reports`` on Kubernetes before 1.32)."""
    from kubernetes_asyncio import client
    from kubernetes_asyncio.client.exceptions import ApiException

    core = client.CoreV1Api(api)

    async def lookup(namespace: str, name: str) -> tuple[str, str] | None:
        try:
            pod = await core.read_namespaced_pod(name, namespace, _request_timeout=3)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return str(pod.metadata.uid or ""), str(pod.spec.node_name or "")

    return lookup


def _bad_request(why: str) -> Answer:
    return Answer(400, orjson.dumps({"error": f"not an AdmissionReview v1: {why}"}))


def make_app(view: ClusterView, templates: Templates | None = None, agents: str = "gpu-tailor",
             agent_account: str = AGENT_SERVICE_ACCOUNT) -> web.Application:
    """The webhook's routes; ``agents`` and ``agent_account``: the node agents' namespace and ServiceAccount
    (``/reports``)."""
    app = web.Application(client_max_size=MAX_BODY)
    app[VIEW] = view
    app[TEMPLATES] = templates or Templates()
    app[METRICS] = Metrics()
    app[METRICS].registry.register(Staleness("gpu_tailor_webhook_watch_staleness_seconds", view.freshness))
    app[REPORTS] = ReportCheck(agents, agent_account)
    app.router.add_post("/mutate", mutate)
    app.router.add_post("/reports", review_report)
    add_probes(app, "webhook", _ready, "nodes and pods not listed yet", lambda a: a[METRICS].registry)
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


def watches(api: Any, view: ClusterView, window: int = WATCH_WINDOW,
            dra: bool = True) -> list[Coroutine[Any, Any, None]]:
    """The view's writers: nodes, the pods that can hold GPUs (``state.ACTIVE_PODS``), and with ``dra`` NVIDIA's DRA
    pools where the API server serves them."""
    from kubernetes_asyncio import client

    from gpu_tailor.kube.dra import dra_watches
    from gpu_tailor.kube.podfields import slim_pod
    from gpu_tailor.kube.watch import list_and_watch

    core = client.CoreV1Api(api)
    pods = functools.partial(core.list_pod_for_all_namespaces, field_selector=ACTIVE_PODS)
    fresh_nodes = view.freshness["nodes"] = Freshness()
    fresh_pods = view.freshness["pods"] = Freshness()
    # on until discovery says the API server serves no resource.k8s.io/v1; off for good with ``--dra off``
    view.dra.enabled = dra
    return [list_and_watch(core.list_node, view.reset_nodes, view.apply_node, project=node_fields,
                           freshness=fresh_nodes, timeout_seconds=window),
            list_and_watch(pods, None, view.apply_pod, relist=view.relist_pods, project=slim_pod,
                           freshness=fresh_pods, timeout_seconds=window),
            *([dra_watches(api, view.dra, view.freshness, window)] if dra else [])]


def watch_ctx(kubeconfig: str | None, in_cluster: bool, kept: KeptCerts | None = None,
              window: int = WATCH_WINDOW, dra: bool = True) -> Any:
    """The API client's life: the watches (``watches``), and with ``kept`` the certificate keeper, whose first
    sync completes before the server listens (startup runs before the site starts)."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        from gpu_tailor.kube.certkeeper import ApiCertStore, CertKeeper
        from gpu_tailor.kube.watch import watching

        async with watching(kubeconfig, in_cluster, lambda api: watches(api, app[VIEW], window, dra)) as api:
            app[TEMPLATES].create = api_template_creator(api)
            app[REPORTS].pods = api_pod_lookup(api)
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
