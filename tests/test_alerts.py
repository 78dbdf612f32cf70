"""The chart's alerts evaluated by Prometheus' own rule engine (``promtool test rules``, Debian's ``prometheus``
package) on series shaped as the services export them: each fires when it should, and not otherwise; with the
chart's ServiceMonitor off, nothing fires for series nobody scrapes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import helm

CHART = Path(__file__).resolve().parents[1] / "charts" / "gpu-tailor"
NS = "gpu-tailor"


def rules(tmp_path: Path, service_monitor: bool) -> tuple[Path, dict[str, dict[str, Any]]]:
    """The rendered PrometheusRule's groups as a rules file, and each alert by name."""
    if shutil.which("promtool") is None:
        pytest.skip("no promtool here (Debian: apt-get install prometheus)")
    out = subprocess.run([helm(), "template", "gpu-tailor", str(CHART), "-n", NS, "--set",
                          "monitoring.prometheusRule.enabled=true", "--set",
                          f"monitoring.serviceMonitor.enabled={str(service_monitor).lower()}"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    (rule,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "PrometheusRule"]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    check = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    return path, {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


def expect(alerts: dict[str, dict[str, Any]], name: str, **labels: str) -> dict[str, Any]:
    return {"exp_labels": {**alerts[name]["labels"], **labels}, "exp_annotations": alerts[name]["annotations"]}


def run(tmp_path: Path, path: Path, tests: list[dict[str, Any]]) -> None:
    spec = tmp_path / "tests.yaml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(path)], "evaluation_interval": "1m", "tests": tests}))
    proc = subprocess.run(["promtool", "test", "rules", str(spec)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def bucket(le: str, values: str) -> dict[str, str]:
    return {"series": f'gpu_tailor_webhook_review_seconds_bucket{{namespace="{NS}", le="{le}"}}', "values": values}


def staleness(values: str) -> dict[str, str]:
    return {"series": f'gpu_tailor_extender_watch_staleness_seconds{{namespace="{NS}", pod="e-0", resource="pods"}}',
            "values": values}


def binds(outcome: str, values: str) -> dict[str, str]:
    return {"series": f'gpu_tailor_extender_requests_total{{namespace="{NS}", verb="bind", outcome="{outcome}"}}',
            "values": values}


def records(outcome: str, values: str) -> dict[str, str]:
    return {"series": f'gpu_tailor_extender_records_written_total{{namespace="{NS}", pod="e-0", outcome="{outcome}"}}',
            "values": values}


def ready(service: str, values: str) -> dict[str, str]:
    return {"series": f'gpu_tailor_ready{{service="{service}", namespace="{NS}", pod="{service}-0"}}',
            "values": values}


def test_each_alert_fires_when_it_should_and_not_otherwise(tmp_path: Path) -> None:
    path, alerts = rules(tmp_path, service_monitor=True)
    names = ("GpuTailorWebhookDown", "GpuTailorExtenderNotReady", "GpuTailorWatchStale", "GpuTailorBindsFailing",
             "GpuTailorWebhookSlow", "GpuTailorRecordsFailing")
    assert set(alerts) == set(names)
    quiet = [{"eval_time": "20m", "alertname": n, "exp_alerts": []} for n in names]
    run(tmp_path, path, [
        # all well: both ready, watches fresh, binds succeed, answers fast
        {"interval": "1m", "input_series": [
            ready("webhook", "1x30"), ready("extender", "1x30"),
            staleness("5x30"), binds("ok", "0+10x30"), records("written", "0+10x30"), records("retried", "0x30"),
            bucket("0.01", "0+100x30"),
            bucket("+Inf", "0+100x30"),
        ], "alert_rule_test": quiet},
        # both answer /metrics but are not ready; a watch quiet for 400 s; half the binds fail; answers near 5 s
        {"interval": "1m", "input_series": [
            ready("webhook", "0x30"), ready("extender", "0x30"),
            staleness("400x30"), binds("ok", "0+10x30"), binds("error", "0+10x30"), records("retried", "0+3x30"),
            bucket("2.5", "0+0x30"),
            bucket("5.0", "0+100x30"),
            bucket("+Inf", "0+100x30"),
        ], "alert_rule_test": [
            {"eval_time": "1m", "alertname": "GpuTailorWebhookDown", "exp_alerts": []},  # not for 2m yet
            {"eval_time": "20m", "alertname": "GpuTailorWebhookDown",
             "exp_alerts": [expect(alerts, "GpuTailorWebhookDown")]},
            {"eval_time": "20m", "alertname": "GpuTailorExtenderNotReady",
             "exp_alerts": [expect(alerts, "GpuTailorExtenderNotReady")]},
            {"eval_time": "20m", "alertname": "GpuTailorWatchStale",
             "exp_alerts": [expect(alerts, "GpuTailorWatchStale", pod="e-0", resource="pods")]},
            {"eval_time": "25m", "alertname": "GpuTailorBindsFailing",
             "exp_alerts": [expect(alerts, "GpuTailorBindsFailing")]},
            {"eval_time": "25m", "alertname": "GpuTailorWebhookSlow",
             "exp_alerts": [expect(alerts, "GpuTailorWebhookSlow")]},
            {"eval_time": "10m", "alertname": "GpuTailorRecordsFailing", "exp_alerts": []},  # not for 15m yet
            {"eval_time": "28m", "alertname": "GpuTailorRecordsFailing",
             "exp_alerts": [expect(alerts, "GpuTailorRecordsFailing")]},
        ]},
        # nothing scraped at all (the chart's ServiceMonitor is on): no replica is ready
        {"interval": "1m", "input_series": [], "alert_rule_test": [
            {"eval_time": "10m", "alertname": "GpuTailorWebhookDown",
             "exp_alerts": [expect(alerts, "GpuTailorWebhookDown")]},
            {"eval_time": "10m", "alertname": "GpuTailorExtenderNotReady",
             "exp_alerts": [expect(alerts, "GpuTailorExtenderNotReady")]},
        ]},
    ])


def test_without_the_service_monitor_nothing_fires_for_what_nobody_scrapes(tmp_path: Path) -> None:
    path, alerts = rules(tmp_path, service_monitor=False)
    run(tmp_path, path, [
        {"interval": "1m", "input_series": [], "alert_rule_test": [
            {"eval_time": "30m", "alertname": n, "exp_alerts": []} for n in alerts]},
        {"interval": "1m", "input_series": [ready("extender", "0x30")], "alert_rule_test": [
            {"eval_time": "20m", "alertname": "GpuTailorExtenderNotReady",
             "exp_alerts": [expect(alerts, "GpuTailorExtenderNotReady")]}]},
    ])
