"""Pod GPU asks read from the real AdmissionReviews (a..l) and from built pods."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_tailor.gpumodel.ask import Isolation, Mismatch, Topology, from_pod
from tests.conftest import review_fixture

# letter -> (effective milli, effective memory bytes, effective native, per-container problems)
FIXTURE_ASKS: dict[str, tuple[int, int, dict[str, int]]] = {
    "a": (0, 0, {"nvidia.com/gpu": 2}),
    "b": (0, 0, {"nvidia.com/gpu": 1}),
    "c": (0, 0, {"nvidia.com/gpu": 2}),
    "d": (250, 0, {}),
    "e": (0, 10 * 2**30, {}),
    "f": (250, 0, {}),
    "g": (0, 0, {"nvidia.com/gpu.shared": 2}),
    "h": (0, 0, {"nvidia.com/mig-1g.5gb": 1}),
    "i": (500, 0, {}),
    "j": (250, 0, {}),
    "k": (300, 0, {"nvidia.com/gpu": 1}),
    "l": (0, 0, {}),
}


@pytest.mark.parametrize("letter", sorted(FIXTURE_ASKS))
def test_fixture_review_ask(letter: str) -> None:
    ask = from_pod(review_fixture(letter)["request"]["object"])
    milli, memory, native = FIXTURE_ASKS[letter]
    assert (ask.effective_milli, ask.effective_memory_bytes, ask.effective_native) == (milli, memory, native)
    assert ask.errors == ()
    assert ask.has_gpu is (letter != "l")


def test_requests_only_reports_missing_limit() -> None:
    ask = from_pod(review_fixture("b")["request"]["object"])
    (main,) = ask.gpu_containers
    assert main.missing_limits == ("nvidia.com/gpu",)
    assert main.mismatches == ()


def test_mismatch_names_both_values() -> None:
    (main,) = from_pod(review_fixture("c")["request"]["object"]).gpu_containers
    assert main.mismatches == (Mismatch("nvidia.com/gpu", "1", "2"),)


def test_annotations_of_f() -> None:
    ask = from_pod(review_fixture("f")["request"]["object"])
    assert ask.isolation is Isolation.MIG
    assert ask.products == ("A100", "H100")
    assert ask.topology is Topology.PREFER_NVLINK


def test_init_container_and_app_containers_k() -> None:
    ask = from_pod(review_fixture("k")["request"]["object"])
    init, trainer = ask.gpu_containers
    assert (init.name, init.init, init.path) == ("init-gpu", True, "/spec/initContainers/0")
    assert (trainer.name, trainer.init, trainer.milli, trainer.path) == ("trainer", False, 300, "/spec/containers/0")
    assert len(ask.containers) == 3  # the sidecar without resources is still listed


def pod(containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None,
        annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "p", "annotations": annotations or {}},
            "spec": {"containers": containers, "initContainers": init or []}}


def c(name: str, limits: dict[str, str] | None = None, requests: dict[str, str] | None = None,
      restart: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "resources": {"limits": limits or {}, "requests": requests or {}}}
    if restart:
        out["restartPolicy"] = restart
    return out


@pytest.mark.parametrize(("containers", "init", "want"), [
    pytest.param([c("a", {"nvidia.com/gpu": "1"}), c("b", {"nvidia.com/gpu": "2"})], [], 3, id="app-sum"),
    pytest.param([c("a", {"nvidia.com/gpu": "1"})], [c("i", {"nvidia.com/gpu": "4"})], 4, id="init-max-wins"),
    pytest.param([c("a", {"nvidia.com/gpu": "3"})], [c("i", {"nvidia.com/gpu": "2"})], 3, id="app-wins"),
    pytest.param([c("a", {"nvidia.com/gpu": "1"})],
                 [c("s", {"nvidia.com/gpu": "1"}, restart="Always"), c("i", {"nvidia.com/gpu": "2"})],
                 3, id="sidecar-adds-to-later-init"),
    pytest.param([c("a", {"nvidia.com/gpu": "2"})], [c("s", {"nvidia.com/gpu": "1"}, restart="Always")],
                 3, id="sidecar-adds-to-app"),
])
def test_effective_request_like_kubernetes(containers: list[dict[str, Any]], init: list[dict[str, Any]],
                                           want: int) -> None:
    assert from_pod(pod(containers, init)).effective_native == {"nvidia.com/gpu": want}


@pytest.mark.parametrize(("limits", "code", "fragment"), [
    pytest.param({"gpu-tailor.io/gpu-milli": "0"}, "invalid-value", "1..1000", id="milli-zero"),
    pytest.param({"gpu-tailor.io/gpu-milli": "1500"}, "invalid-value", "multiple of 1000", id="milli-1500"),
    pytest.param({"gpu-tailor.io/gpu-milli": "abc"}, "invalid-value", "not a quantity", id="milli-garbage"),
    pytest.param({"gpu-tailor.io/gpu-milli": "0.5"}, "invalid-value", "whole number", id="milli-fraction"),
    pytest.param({"gpu-tailor.io/gpu-memory": "lots"}, "invalid-value", "not a quantity", id="memory-garbage"),
    pytest.param({"gpu-tailor.io/gpu-cores": "2"}, "unknown-resource", "not a gpu-tailor.io resource", id="unknown"),
    pytest.param({"nvidia.com/mig-9x.5gb": "1"}, "unknown-resource", "not an NVIDIA GPU resource", id="bad-mig"),
    pytest.param({"gpu-tailor.io/gpu-milli": "250", "nvidia.com/gpu": "1"}, "ambiguous", "mixes", id="mixed"),
])
def test_invalid_asks_are_structured_errors(limits: dict[str, str], code: str, fragment: str) -> None:
    ask = from_pod(pod([c("main", limits)]))
    assert [e.code for e in ask.errors] == [code]
    assert fragment in ask.errors[0].message
    assert ask.errors[0].container == "main"


@pytest.mark.parametrize(("annotations", "field"), [
    ({"gpu-tailor.io/isolation": "strong"}, "gpu-tailor.io/isolation"),
    ({"gpu-tailor.io/topology": "mesh"}, "gpu-tailor.io/topology"),
    ({"gpu-tailor.io/gpu-product": "A100||H100"}, "gpu-tailor.io/gpu-product"),
])
def test_invalid_annotations(annotations: dict[str, str], field: str) -> None:
    ask = from_pod(pod([c("main", {"gpu-tailor.io/gpu-milli": "100"})], annotations=annotations))
    assert [(e.code, e.field) for e in ask.errors] == [("invalid-annotation", field)]


def test_annotation_values_are_case_insensitive() -> None:
    ask = from_pod(pod([c("m", {"gpu-tailor.io/gpu-milli": "2000"})],
                       annotations={"gpu-tailor.io/isolation": "MPS", "gpu-tailor.io/topology": "NVLink"}))
    assert (ask.isolation, ask.topology, ask.errors) == (Isolation.MPS, Topology.NVLINK, ())
    assert ask.gpu_containers[0].whole_gpus == 2


def test_equal_quantities_in_different_spellings_are_not_a_mismatch() -> None:
    ask = from_pod(pod([c("m", {"gpu-tailor.io/gpu-memory": "1Gi"}, {"gpu-tailor.io/gpu-memory": "1024Mi"})]))
    assert ask.gpu_containers[0].mismatches == ()


def test_canonical_form_is_stable() -> None:
    ask = from_pod(review_fixture("k")["request"]["object"])
    assert ask.canonical() == {
        "containers": {"init:init-gpu": {"native": {"nvidia.com/gpu": 1}}, "trainer": {"gpuMilli": 300}},
        "isolation": "any", "topology": "prefer-nvlink"}


def test_garbage_pod_shapes_do_not_raise() -> None:
    assert from_pod({}).containers == ()
    assert from_pod({"spec": {"containers": ["nope", {"name": "x", "resources": None}]}}).has_gpu is False
