"""Requests against limits of GPU resources are compared as exact Kubernetes quantities (issue 19).

Rounding before comparing hid real mismatches: ``500m`` against ``1`` rounded up to 1 and 1, so a
pod asking half a GPU and limited to one was reported as consistent.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpu_tailor.gpumodel.ask import Mismatch, from_pod
from gpu_tailor.webhook.config import AdmissionPolicy
from gpu_tailor.webhook.mutate import decide
from gpu_tailor.webhook.state import ClusterView
from tests.conftest import FIXTURES, load_fixture


def one_container(resource: str, request: str, limit: str) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "team-a"},
            "spec": {"containers": [{"name": "main", "image": "x",
                                     "resources": {"requests": {resource: request}, "limits": {resource: limit}}}]}}


@pytest.mark.parametrize(("resource", "request_", "limit"), [
    pytest.param("nvidia.com/gpu", "500m", "1", id="gpu-500m-vs-1"),
    pytest.param("nvidia.com/gpu", "1", "1001m", id="gpu-1-vs-1001m"),
    pytest.param("gpu-tailor.io/gpu-milli", "250", "250001m", id="milli-fraction-above"),
    pytest.param("gpu-tailor.io/gpu-memory", "1Gi", "1073741823.5", id="memory-half-byte-below"),
    pytest.param("gpu-tailor.io/gpu-memory", "1Gi", "1025Mi", id="memory-1Gi-vs-1025Mi"),
])
def test_different_quantities_are_a_mismatch(resource: str, request_: str, limit: str) -> None:
    (main,) = from_pod(one_container(resource, request_, limit)).containers
    assert main.mismatches == (Mismatch(resource, request_, limit),)


@pytest.mark.parametrize(("resource", "request_", "limit"), [
    pytest.param("nvidia.com/gpu", "1", "1000m", id="gpu-1-vs-1000m"),
    pytest.param("nvidia.com/gpu", "2", "2e0", id="gpu-exponent"),
    pytest.param("gpu-tailor.io/gpu-memory", "1Gi", "1024Mi", id="memory-1Gi-vs-1024Mi"),
    pytest.param("gpu-tailor.io/gpu-memory", "0.5Gi", "512Mi", id="memory-half-Gi"),
    pytest.param("gpu-tailor.io/gpu-memory", "1Gi", "1073741824", id="memory-bytes"),
    pytest.param("gpu-tailor.io/gpu-milli", "250", "0.25k", id="milli-kilo"),
])
def test_equal_quantities_in_other_spellings_are_not_a_mismatch(resource: str, request_: str, limit: str) -> None:
    (main,) = from_pod(one_container(resource, request_, limit)).containers
    assert main.mismatches == ()


def test_webhook_denies_500m_against_1_naming_both() -> None:
    view = ClusterView(AdmissionPolicy())
    view.reset([load_fixture("nodes", p.name) for p in sorted((FIXTURES / "nodes").glob("*.json"))])
    request = {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
               "namespace": "team-a", "object": one_container("nvidia.com/gpu", "500m", "1")}
    d = decide(request, view.candidates(), view.policy)
    assert not d.allowed and d.code == 422
    assert "requests (500m) must equal limits (1)" in d.message
