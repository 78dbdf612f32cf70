"""The pod's effective request, counted the way Kubernetes counts it (issue 19).

kube-scheduler (``k8s.io/component-helpers/resource.PodRequests``) takes, per resource, the larger of
the app containers' sum plus every sidecar (an init container with ``restartPolicy: Always``, KEP-753)
and the peak of the init phase, where each plain init container runs beside the sidecars started
before it and a sidecar beside those before it; then adds ``spec.overhead``. The extender's CPU and
memory (``schedule.demand_of``) and every GPU count (``ask.from_pod``) follow that one rule.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpu_tailor.gpumodel.ask import from_pod
from gpu_tailor.gpumodel.schedule import demand_of

MIB = 2**20


def ctr(name: str, cpu: str = "0", memory: str = "0", gpu: int = 0, sidecar: bool = False) -> dict[str, Any]:
    requests: dict[str, str] = {"cpu": cpu, "memory": memory}
    limits: dict[str, str] = {}
    if gpu:
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = str(gpu)
    out: dict[str, Any] = {"name": name, "image": "x", "resources": {"requests": requests, "limits": limits}}
    if sidecar:
        out["restartPolicy"] = "Always"
    return out


def pod(apps: list[dict[str, Any]], inits: list[dict[str, Any]] | None = None,
        overhead: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": apps, "initContainers": inits or []}
    if overhead is not None:
        spec["overhead"] = overhead
    return {"metadata": {"name": "p", "namespace": "ns"}, "spec": spec}


# (apps, inits, overhead) -> (cpu milli, memory MiB), worked out by hand from PodRequests
CASES = [
    pytest.param([ctr("a", "1", "1Gi")], [], None, (1000, 1024), id="one-app"),
    pytest.param([ctr("a", "1", "1Gi")], [ctr("i", "2", "512Mi")], None, (2000, 1024), id="plain-init-peak"),
    pytest.param([ctr("a", "1", "1Gi")], [ctr("s", "500m", "256Mi", sidecar=True)], None, (1500, 1280),
                 id="sidecar-runs-beside-the-apps"),
    pytest.param([ctr("a", "1", "1Gi")], [ctr("s", "500m", "256Mi", sidecar=True), ctr("i", "2", "2Gi")], None,
                 (2500, 2304), id="init-after-a-sidecar-runs-beside-it"),
    pytest.param([ctr("a", "1", "1Gi")], [ctr("i", "2", "2Gi"), ctr("s", "500m", "256Mi", sidecar=True)], None,
                 (2000, 2048), id="init-before-the-sidecar-runs-alone"),
    pytest.param([ctr("a", "100m", "64Mi")],
                 [ctr("s1", "1", "1Gi", sidecar=True), ctr("s2", "1", "1Gi", sidecar=True), ctr("i", "100m", "64Mi")],
                 None, (2100, 2112), id="two-sidecars-then-init"),
    pytest.param([ctr("a", "1", "1Gi")], [], {"cpu": "250m", "memory": "128Mi"}, (1250, 1152), id="overhead"),
    pytest.param([ctr("a", "1", "1Gi")], [ctr("s", "500m", "256Mi", sidecar=True), ctr("i", "2", "2Gi")],
                 {"cpu": "250m", "memory": "128Mi"}, (2750, 2432), id="sidecar-init-and-overhead"),
]


@pytest.mark.parametrize(("apps", "inits", "overhead", "want"), CASES)
def test_demand_cpu_and_memory_like_kubernetes(apps: list[dict[str, Any]], inits: list[dict[str, Any]],
                                               overhead: dict[str, str] | None, want: tuple[int, int]) -> None:
    d = demand_of(pod(apps, inits, overhead))
    assert (d.cpu_milli, d.memory_mib) == want


@pytest.mark.parametrize(("apps", "inits", "overhead", "want"), [
    pytest.param([ctr("a", gpu=1)], [ctr("s", gpu=1, sidecar=True), ctr("i", gpu=2)], None, 3,
                 id="init-after-sidecar"),
    pytest.param([ctr("a", gpu=1)], [ctr("i", gpu=2), ctr("s", gpu=1, sidecar=True)], None, 2,
                 id="init-before-sidecar"),
    pytest.param([ctr("a", gpu=1)], [], {"nvidia.com/gpu": "1"}, 2, id="overhead-counts-extended-resources"),
    pytest.param([ctr("a", gpu=2)], [ctr("s", gpu=1, sidecar=True)], {"cpu": "1"}, 3, id="cpu-overhead-only"),
])
def test_gpu_units_like_kubernetes(apps: list[dict[str, Any]], inits: list[dict[str, Any]],
                                   overhead: dict[str, str] | None, want: int) -> None:
    p = pod(apps, inits, overhead)
    assert from_pod(p).effective_native == {"nvidia.com/gpu": want}
    assert demand_of(p).units == want


def test_garbage_quantities_and_shapes_count_as_nothing() -> None:
    p = pod([ctr("a", "1", "1Gi"), {"name": "b", "resources": {"requests": {"cpu": "lots"}}}, "junk"],  # type: ignore[list-item]
            [{"name": "i", "resources": None}], {"cpu": ["x"]})  # type: ignore[dict-item]
    d = demand_of(p)
    assert (d.cpu_milli, d.memory_mib) == (1000, 1024)


@pytest.mark.parametrize("p", [
    {"metadata": "x"}, {"spec": ["x"]}, {"spec": {"containers": {"name": "a"}}},
    {"spec": {"containers": [{"name": "a", "resources": ["x"]}]}},
    {"spec": {"containers": [{"name": "a", "resources": {"requests": ["x"], "limits": "1"}}]}},
    {"metadata": {"annotations": ["x"]}, "spec": {"initContainers": 3}},
], ids=["metadata-string", "spec-list", "containers-dict", "resources-list", "requests-list", "annotations-list"])
def test_malformed_shapes_read_as_asking_nothing(p: dict[str, Any]) -> None:
    ask = from_pod(p)
    assert (ask.has_gpu, ask.effective_native, ask.errors) == (False, {}, ())
    d = demand_of(p)
    assert (d.cpu_milli, d.memory_mib, d.gpu) == (0, 0, False)
