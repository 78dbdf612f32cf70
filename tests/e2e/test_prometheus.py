"""A real Prometheus (Debian's ``prometheus``) scrapes the webhook and the extender on the real control plane the way
the chart's ServiceMonitor tells prometheus-operator to, loads the chart's alert rules, and answers every query of
the chart's Grafana dashboard once a GPU pod went through admission and scheduling.

The scrape configuration is what prometheus-operator generates from each endpoint of the rendered ServiceMonitor
(scheme, path, TLS against the CA in the webhook's Secret, ``honorLabels``) and the target labels it always sets
(job, namespace, service, pod, container, endpoint), with static targets where it would discover the pods: the
addresses the e2e stack serves /metrics on (``tests/e2e/services.py``). Scraped every second, rules evaluated every
second, so that nothing waits on the chart's 30 s interval.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import free_port
from tests.e2e.kube import Obj, api_path, wait_for
from tests.e2e.pods import Pods, gpu_pod, unique
from tests.e2e.services import Stack
from tests.test_chart_monitoring import rendered

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(shutil.which("prometheus") is None,
                                                  reason="no prometheus here (Debian: apt-get install prometheus)")]

NS = "gpu-tailor"  # where the chart was rendered, and where manifests/ (the e2e stack) installs
# each ServiceMonitor endpoint's port: the Service that has it (prometheus-operator's job and service labels), the
# Deployment behind it and the container
PORTS = {"metrics": ("gpu-tailor-scheduler-metrics", "gpu-tailor-scheduler", "extender"),
         "https": ("gpu-tailor-webhook", "gpu-tailor-webhook", "webhook")}
RATE_INTERVAL = "10s"  # Grafana's $__rate_interval is at least 4 scrape intervals: 4 s here


def scrape_configs(stack: Stack, monitor: Obj, workdir: Path) -> list[Obj]:
    """One scrape job per endpoint of ``monitor``, as prometheus-operator writes it, the target static."""
    address = {"metrics": stack.extender_probes.removeprefix("http://"),
               "https": urllib.parse.urlsplit(stack.webhook.ready_url).netloc}
    out = []
    for i, endpoint in enumerate(monitor["spec"]["endpoints"]):
        service, deployment, container = PORTS[endpoint["port"]]
        job: Obj = {
            "job_name": f"serviceMonitor/{NS}/{monitor['metadata']['name']}/{i}",
            "scrape_interval": "1s", "scrape_timeout": "1s",
            "scheme": endpoint.get("scheme", "http"), "metrics_path": endpoint.get("path", "/metrics"),
            "honor_labels": bool(endpoint.get("honorLabels", False)),
            "static_configs": [{"targets": [address[endpoint["port"]]], "labels": {
                "job": service, "namespace": NS, "service": service, "pod": f"{deployment}-e2e",
                "container": container, "endpoint": endpoint["port"]}}],
        }
        tls = endpoint.get("tlsConfig")
        if tls:
            ref = tls["ca"]["secret"]
            secret = stack.kube.get(api_path("secrets", NS, ref["name"]))
            ca = workdir / f"{ref['name']}-{ref['key']}"
            ca.write_bytes(base64.b64decode(secret["data"][ref["key"]]))
            job["tls_config"] = {"ca_file": str(ca), "server_name": tls["serverName"]}
        out.append(job)
    return out


class Prometheus:
    """A prometheus process on a free loopback port, and its HTTP API."""

    def __init__(self, config: Path, workdir: Path) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = workdir / "prometheus.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
                 f"--web.listen-address={self.url.removeprefix('http://')}"],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for(self.ready, 60, f"prometheus ready at {self.url}", interval=0.2, context=self.tail)
        except BaseException:
            self.stop()
            raise

    def ready(self) -> bool:
        assert self.proc.poll() is None, f"prometheus exited with {self.proc.returncode}\n{self.tail()}"
        with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
            return bool(resp.status == 200)

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        return body["data"]

    def series(self, expr: str) -> list[Obj]:
        result: list[Obj] = self.api("query", query=expr)["result"]
        return result

    def tail(self) -> str:
        return "--- prometheus:\n" + "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def chart() -> list[Obj]:
    """The chart rendered with its dashboard, ServiceMonitor and rules."""
    return rendered()


@pytest.fixture
def prometheus(cluster: Stack, chart: list[Obj], tmp_path: Path) -> Iterator[Prometheus]:
    (monitor,) = [d for d in chart if d["kind"] == "ServiceMonitor"]
    (rule,) = [d for d in chart if d["kind"] == "PrometheusRule"]
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": scrape_configs(cluster, monitor, tmp_path),
    }, sort_keys=False))
    server = Prometheus(config, tmp_path)
    try:
        yield server
    finally:
        server.stop()


def dashboard_queries(chart: list[Obj]) -> tuple[str, dict[str, str]]:
    """The dashboard's namespace variable query, and each panel's queries by where they are."""
    (board,) = [d for d in chart if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpu-tailor-dashboard"]
    dashboard = json.loads(board["data"]["gpu-tailor.json"])
    (variable,) = [v["query"] for v in dashboard["templating"]["list"] if v["name"] == "namespace"]
    panels = {f"{p['title']!r} {t['refId']}": t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])}
    return variable, panels


def evaluated_at(group: Obj) -> datetime:
    """A rule group's lastEvaluation (RFC 3339 with nanoseconds: cut to microseconds for Python)."""
    stamp = re.sub(r"(\.\d{6})\d+", r"\1", group["lastEvaluation"]).replace("Z", "+00:00")
    return datetime.fromisoformat(stamp)


def test_prometheus_scrapes_both_services_answers_the_dashboard_and_loads_the_alerts(
        cluster: Stack, chart: list[Obj], prometheus: Prometheus, pods: Pods) -> None:
    def targets_up() -> list[Obj]:
        active: list[Obj] = prometheus.api("targets")["activeTargets"]
        return active if len(active) == 2 and all(t["health"] == "up" for t in active) else []

    try:
        wait_for(targets_up, 30, "both scrape targets up", context=prometheus.tail)
    except AssertionError as exc:
        exc.add_note(json.dumps(prometheus.api("targets")["activeTargets"], indent=1))
        raise

    # traffic: a GPU pod admitted (rewritten) and placed and bound through the extender
    pods.wait_bound(pods.create(cluster.opted_in, gpu_pod(unique("scraped"), {"gpu-tailor.io/gpu-milli": "250"})))

    variable, queries = dashboard_queries(chart)
    parsed = re.fullmatch(r"label_values\((\w+), (\w+)\)", variable)
    assert parsed, variable
    metric, label = parsed.groups()
    namespaces = wait_for(lambda: prometheus.api(f"label/{label}/values", **{"match[]": metric}), 30,
                          f"the dashboard's namespace variable ({variable}) to list a namespace")
    assert namespaces == [NS]

    def answered() -> dict[str, int]:
        return {where: len(prometheus.series(expr.replace("$namespace", NS)
                                             .replace("$__rate_interval", RATE_INTERVAL)))
                for where, expr in queries.items()}

    last: dict[str, int] = {}

    def all_answered() -> bool:
        last.update(answered())
        return all(last.values())

    try:
        wait_for(all_answered, 60, "every dashboard query to return a series")
    except AssertionError as exc:
        exc.add_note("no series: " + ", ".join(w for w, n in last.items() if not n))
        raise

    # the chart's rules: loaded, and evaluated without error after both services were scraped ready
    wait_for(lambda: len(prometheus.series(f'gpu_tailor_ready{{namespace="{NS}"}} == 1')) == 2, 30,
             "both services scraped ready")
    ready = datetime.now(UTC)

    def evaluated_since_ready() -> list[Obj]:
        groups: list[Obj] = prometheus.api("rules")["groups"]
        return groups if groups and all(evaluated_at(g) > ready for g in groups) else []

    groups = wait_for(evaluated_since_ready, 30, "the rule groups evaluated after both services were ready")
    loaded = {r["name"]: (r["health"], r.get("lastError", "")) for g in groups for r in g["rules"]}
    (rule,) = [d for d in chart if d["kind"] == "PrometheusRule"]
    assert set(loaded) == {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert all(health == ("ok", "") for health in loaded.values()), loaded
    # with both services up, ready and binding, no alert is pending or firing
    alerts = prometheus.api("alerts")["alerts"]
    assert not alerts, [(a["labels"]["alertname"], a["state"]) for a in alerts]
