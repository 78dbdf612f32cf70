"""What the chart gives an operator to watch (issue 29): every query of the Grafana dashboard and of the alerts names
a metric that a live scrape of the services returns, and the ServiceMonitor reaches ports that exist."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from gpu_tailor.extender.server import make_app as extender_app
from gpu_tailor.gpumodel import labels
from gpu_tailor.kube.freshness import Freshness
from gpu_tailor.webhook.config import AdmissionPolicy
from gpu_tailor.webhook.server import make_app as webhook_app
from gpu_tailor.webhook.state import ClusterView
from tests.conftest import FIXTURES, helm, load_fixture, review_fixture
from tests.extender.builders import args, cluster, gpu_pod

CHART = Path(__file__).resolve().parents[1] / "charts" / "gpu-tailor"
ON = ("--set", "monitoring.dashboard.enabled=true", "--set", "monitoring.serviceMonitor.enabled=true",
      "--set", "monitoring.prometheusRule.enabled=true")
METRIC = re.compile(r"\b(gpu_tailor_[a-z_]+)\b")


def rendered() -> list[dict[str, Any]]:
    out = subprocess.run([helm(), "template", "gpu-tailor", str(CHART), "-n", "gpu-tailor", *ON],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def queries(objs: list[dict[str, Any]]) -> dict[str, str]:
    """Every PromQL expression of the dashboard and the rules, by where it is."""
    out = {}
    (board,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "gpu-tailor-dashboard"]
    dashboard = json.loads(board["data"]["gpu-tailor.json"])
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out[f"panel {panel['title']!r} {target['refId']}"] = target["expr"]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            out[f"variable {var['name']}"] = var["query"]
    (rule,) = [o for o in objs if o["kind"] == "PrometheusRule"]
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            out[f"alert {r['alert']}"] = r["expr"]
    return out


async def scrape_texts() -> list[str]:
    """Both services' /metrics, after each has done some work."""
    view = ClusterView(AdmissionPolicy())
    view.reset([json.loads(p.read_text()) for p in sorted((FIXTURES / "nodes").glob("*.json"))])
    view.freshness["pods"] = Freshness()
    cache = cluster([gpu_pod("held", 2, node="h100-hgx-0", annotations={labels.ANN_GPUS: "0,1"})])
    cache.freshness["nodes"] = Freshness()
    texts: list[str] = []
    async with TestClient(TestServer(webhook_app(view))) as webhook:
        await webhook.post("/mutate", json=review_fixture("d"))
        texts.append(await (await webhook.get("/metrics")).text())
    async with TestClient(TestServer(extender_app(cache))) as extender:
        await extender.post("/filter", json=args("filter-nodecache-true-pod-gpu4"))
        await extender.post("/prioritize", json=args("prioritize-nodecache-true-pod-gpu4"))
        # no API server here: the bind is an error outcome, counted all the same
        await extender.post("/bind", json=load_fixture("extender", "bind-pod-gpu4.json"))
        texts.append(await (await extender.get("/metrics")).text())
    return texts


async def scrape() -> set[str]:
    """The sample names of both services' /metrics."""
    return {s.name for text in await scrape_texts() for s in _samples(text)}


async def scrape_labels() -> set[str]:
    """The label names of both services' samples."""
    return {label for text in await scrape_texts() for s in _samples(text) for label in s.labels}


def _samples(text: str) -> list[Sample]:
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


async def test_every_query_names_a_metric_a_live_scrape_returns() -> None:
    exprs = queries(rendered())
    assert len(exprs) >= 15
    scraped = await scrape()
    missing = {where: name for where, expr in exprs.items() for name in METRIC.findall(expr) if name not in scraped}
    assert not missing, missing
    named = {name for expr in exprs.values() for name in METRIC.findall(expr)}
    # the pools, the verbs, admission and the watches are all shown
    assert {"gpu_tailor_pool_gpus_used", "gpu_tailor_pool_fragmentation_gpus", "gpu_tailor_extender_requests_total",
            "gpu_tailor_webhook_review_seconds_bucket", "gpu_tailor_extender_watch_staleness_seconds"} <= named


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a LabelSelector (matchLabels, and matchExpressions with In, NotIn, Exists, DoesNotExist) picks
    ``labels``."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        if not {"In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values,
                "Exists": key in labels, "DoesNotExist": key not in labels}[op]:
            return False
    return True


def test_the_service_monitor_reaches_ports_that_exist() -> None:
    objs = rendered()
    (monitor,) = [o for o in objs if o["kind"] == "ServiceMonitor"]
    services = [o for o in objs if o["kind"] == "Service"]
    selected = [s for s in services if selects(monitor["spec"]["selector"], s["metadata"].get("labels") or {})]
    assert {s["metadata"]["name"] for s in selected} == {"gpu-tailor-webhook", "gpu-tailor-scheduler-metrics"}
    ports = {p["name"] for s in selected for p in s["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports
    pods = {o["metadata"]["name"]: o["spec"]["template"]["spec"] for o in objs if o["kind"] == "Deployment"}
    container_ports = {p["name"] for spec in pods.values() for c in spec["containers"] for p in c.get("ports", [])}
    assert {p["targetPort"] for s in selected for p in s["spec"]["ports"]} <= container_ports


def test_the_dashboard_in_the_chart_is_the_file() -> None:
    (board,) = [o for o in rendered() if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "gpu-tailor-dashboard"]
    shipped = json.loads((CHART / "dashboards" / "gpu-tailor.json").read_text())
    assert json.loads(board["data"]["gpu-tailor.json"]) == shipped
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"  # what Grafana's sidecar looks for


# the labels prometheus-operator sets on every target of a ServiceMonitor
OPERATOR_TARGET_LABELS = {"job", "namespace", "service", "pod", "container", "endpoint", "instance"}


async def test_labels_the_queries_read_survive_the_service_monitor() -> None:
    """A scraped label named as one of prometheus-operator's target labels is renamed ``exported_<name>`` unless the
    endpoint honours the scraped labels; gpu_tailor_ready's ``service`` is one, and the alerts read it
    (``tests/e2e/test_prometheus.py`` sees it with a real Prometheus)."""
    (monitor,) = [o for o in rendered() if o["kind"] == "ServiceMonitor"]
    scraped = await scrape_labels()
    clashing = sorted(OPERATOR_TARGET_LABELS & scraped)
    assert clashing == ["service"]
    assert all(e.get("honorLabels") is True for e in monitor["spec"]["endpoints"]), monitor["spec"]["endpoints"]
