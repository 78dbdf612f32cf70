"""Admission through a real kube-apiserver: the captured pods (fixtures a..l) created for real in the opted-in
namespace, read back as the API server stored them; opt-in and opt-out; server-side dry run.

Expected values are written out by hand from what a person asks for on the fixture nodes, never computed
with gpu-tailor's own code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.e2e.kube import ApiError, api_path, wait_for
from tests.e2e.pods import Pods, gpu_pod, limits_of, pod_from_review, requests_of, unique
from tests.e2e.services import SCHEDULER_NAME, Stack, event_sources, pod_events

pytestmark = pytest.mark.e2e

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
H100, A100_40, T4_SHARED = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB", "Tesla-T4-SHARED"


@dataclass(frozen=True)
class Admitted:
    """What the stored pod must hold: per container its limits (requests must equal them), the backing
    annotation, required node-affinity values by key, and a warning the API server passed on."""

    limits: dict[str, dict[str, str]]
    backing: str | None = None
    affinity: dict[str, list[str]] = field(default_factory=dict)
    warning: str = ""
    scheduler: str = SCHEDULER_NAME
    gpu: bool = True


ADMITTED = {
    "a": Admitted({"main": {"nvidia.com/gpu": "2"}}),
    # requests only: the webhook adds the limit the API server would otherwise refuse the pod for
    "b": Admitted({"main": {"nvidia.com/gpu": "1"}}),
    "d": Admitted({"main": {"nvidia.com/gpu": "1"}}, "shared:time-slicing:4", {
        "nvidia.com/gpu.product": [T4_SHARED], "nvidia.com/gpu.sharing-strategy": ["time-slicing"],
        "nvidia.com/gpu.replicas": ["4"]}),
    "e": Admitted({"main": {"nvidia.com/mig-2g.10gb": "1"}}, "mig-2g.10gb", {
        "nvidia.com/gpu.product": [A100_40], "nvidia.com/mig.strategy": ["mixed"]}),
    "f": Admitted({"main": {"nvidia.com/mig-2g.10gb": "1"}}, "mig-2g.10gb", {
        "nvidia.com/gpu.product": [A100_40], "nvidia.com/mig.strategy": ["mixed"]}),
    "g": Admitted({"main": {"nvidia.com/gpu.shared": "2"}}, warning="not combined into more GPU"),
    "h": Admitted({"main": {"nvidia.com/mig-1g.5gb": "1"}}),
    "i": Admitted({"main": {"nvidia.com/gpu": "1"}}, "whole", {"nvidia.com/gpu.product": [H100]}),
    "k": Admitted({"init-gpu": {"nvidia.com/gpu": "1"}, "trainer": {"nvidia.com/gpu": "1"}, "sidecar": {}}, "whole",
                  {"nvidia.com/gpu.product": [H100]}),
    # no GPU ask: only the scheduler changes (the webhook's cpuOnlyPods), no GPU toleration
    "l": Admitted({"main": {}}, gpu=False),
}


def required_affinity(pod: dict[str, Any]) -> dict[str, list[str]]:
    terms = (((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [{}]
    return {e["key"]: e.get("values", []) for e in terms[0].get("matchExpressions") or []}


@pytest.mark.parametrize("letter", sorted(ADMITTED))
def test_fixture_pod_is_stored_as_the_webhook_rewrote_it(letter: str, cluster: Stack, pods: Pods) -> None:
    want = ADMITTED[letter]
    sent = pod_from_review(letter)
    if letter == "a":  # the user sent limits only; the API server defaults requests to them
        sent["spec"]["containers"][0]["resources"].pop("requests")
    created = pods.create(cluster.opted_in, sent)
    warnings = list(cluster.kube.warnings)
    stored = pods.get(created)

    for container, limits in want.limits.items():
        assert limits_of(stored, container) == limits, f"{letter}: container {container} limits"
        assert requests_of(stored, container) == limits, f"{letter}: container {container} requests != limits"
    annotations = stored["metadata"].get("annotations") or {}
    assert annotations.get("gpu-tailor.io/backing") == want.backing
    assert stored["spec"]["schedulerName"] == want.scheduler
    affinity = required_affinity(stored)
    for key, values in want.affinity.items():
        assert affinity.get(key) == values, f"{letter}: required node affinity {key} in {affinity}"
    assert (GPU_TOLERATION in stored["spec"].get("tolerations", [])) == want.gpu
    if want.warning:
        assert any(want.warning in w for w in warnings), f"API server warnings: {warnings}"
    else:
        assert warnings == []


def test_mismatched_requests_and_limits_are_denied_with_a_reason(cluster: Stack, pods: Pods) -> None:
    sent = pod_from_review("c")
    with pytest.raises(ApiError) as denied:
        pods.create(cluster.opted_in, sent)
    message = denied.value.message
    assert 'admission webhook "pods.gpu-tailor.io" denied the request' in message
    assert "container main: nvidia.com/gpu requests (1) must equal limits (2)" in message
    assert denied.value.status == 422
    assert not cluster.kube.exists(api_path("pods", cluster.opted_in, sent["metadata"]["name"]))


def test_dry_run_answers_the_rewritten_pod_and_stores_nothing(cluster: Stack) -> None:
    sent = pod_from_review("j")
    answer = cluster.kube.create(api_path("pods", cluster.opted_in), sent, dry_run=True)
    assert limits_of(answer, "main") == requests_of(answer, "main") == {"nvidia.com/gpu": "1"}
    assert answer["metadata"]["annotations"]["gpu-tailor.io/backing"] == "shared:time-slicing:4"
    assert answer["spec"]["schedulerName"] == SCHEDULER_NAME
    assert not cluster.kube.exists(api_path("pods", cluster.opted_in, sent["metadata"]["name"]))
    names = [p["metadata"]["name"] for p in cluster.kube.list(api_path("pods", cluster.opted_in))]
    assert sent["metadata"]["name"] not in names


def assert_untouched_and_pending(cluster: Stack, pods: Pods, namespace: str, labels: dict[str, str]) -> None:
    """Not mutated: the portable ask reaches the default scheduler, which finds no node offering it."""
    created = pods.create(namespace, gpu_pod(unique("portable"), {"gpu-tailor.io/gpu-milli": "250"}, labels=labels))
    stored = pods.get(created)
    assert limits_of(stored, "main") == requests_of(stored, "main") == {"gpu-tailor.io/gpu-milli": "250"}
    assert stored["spec"]["schedulerName"] == "default-scheduler"
    assert not any(k.startswith("gpu-tailor.io/") for k in stored["metadata"].get("annotations") or {})
    assert GPU_TOLERATION not in stored["spec"].get("tolerations", [])
    events = wait_for(lambda: [e for e in pod_events(cluster.kube, stored) if e.startswith("FailedScheduling")], 30,
                      "the default scheduler's FailedScheduling event", context=cluster.context)
    assert "Insufficient gpu-tailor.io/gpu-milli" in events[0]
    assert set(event_sources(cluster.kube, stored, "FailedScheduling")) == {"default-scheduler"}
    assert not pods.get(created)["spec"].get("nodeName")


def test_namespace_without_the_label_is_left_alone(cluster: Stack, pods: Pods) -> None:
    assert_untouched_and_pending(cluster, pods, cluster.plain, {})


def test_skip_label_opts_a_pod_out_in_an_opted_in_namespace(cluster: Stack, pods: Pods) -> None:
    assert_untouched_and_pending(cluster, pods, cluster.opted_in, {"gpu-tailor.io/skip": "true"})
