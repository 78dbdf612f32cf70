"""The webhook configuration's CEL matchCondition, evaluated with cel-python on real admission requests and on
generated pods: every pod that may ask for a GPU reaches the ``Fail`` entry, and every pod CREATE the ``Ignore``
one until the first has admitted it (its label; kube-apiserver evaluates the same expressions and selectors:
tests/e2e shows it on real control planes)."""

from __future__ import annotations

import glob
from typing import Any

import celpy
from celpy.adapter import json_to_cel
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.ask import from_pod
from gpu_tailor.webhook import registration
from gpu_tailor.webhook.registration import CPU_HOOK, GPU_HOOK
from tests.conftest import FIXTURES, load_fixture
from tests.webhook.test_mutate import run

_ENV = celpy.Environment()
ALL_HOOKS = registration.webhook_configuration("gpu-tailor-webhook", "gpu-tailor")["webhooks"]
HOOKS = [h for h in ALL_HOOKS if h["name"] in (GPU_HOOK, CPU_HOOK)]  # for pods
CONDITIONS = {h["name"]: _ENV.program(_ENV.compile(h["matchConditions"][0]["expression"]))
              for h in ALL_HOOKS if "matchConditions" in h}


def reaches(operation: str, pod: dict[str, Any], old: dict[str, Any] | None = None) -> set[str]:
    """The entries whose matchCondition admits this request (rules and operations included)."""
    activation = {"request": json_to_cel({"operation": operation}), "object": json_to_cel(pod),
                  "oldObject": json_to_cel(old or {})}
    operations = {GPU_HOOK: {"CREATE", "UPDATE"}, CPU_HOOK: {"CREATE"}}
    return {h["name"] for h in HOOKS if operation in operations[h["name"]] and selects(h, pod)
            and (h["name"] not in CONDITIONS or CONDITIONS[h["name"]].evaluate(activation))}


def selects(hook: dict[str, Any], pod: dict[str, Any]) -> bool:
    """The entry's objectSelector on the pod's labels (the operators it uses)."""
    have = (pod.get("metadata") or {}).get("labels") or {}
    for e in hook["objectSelector"]["matchExpressions"]:
        if e["operator"] == "NotIn" and have.get(e["key"]) in e["values"]:
            return False
        if e["operator"] == "DoesNotExist" and e["key"] in have:
            return False
        assert e["operator"] in ("NotIn", "DoesNotExist"), e
    return True


def test_the_captured_requests_reach_the_failing_entry_exactly_when_they_ask_for_a_gpu() -> None:
    seen = []
    for path in sorted(glob.glob(str(FIXTURES / "admission" / "*.json"))):
        request = load_fixture("admission", path.rsplit("/", 1)[1])["request"]
        pod = request["object"]
        entries = reaches(request["operation"], pod)
        assert CPU_HOOK in entries  # every CREATE not yet rewritten, so that a reinvocation can reach any pod
        assert (GPU_HOOK in entries) == from_pod(pod).has_gpu, path
        seen.append(GPU_HOOK in entries)
    assert any(seen) and not all(seen)


def test_a_pod_without_containers_reaches_no_cel_error() -> None:
    """The API server's own validation says what is wrong with it, not a CEL error about a null list."""
    assert reaches("CREATE", {"metadata": {"name": "p"}, "spec": {}}) == {CPU_HOOK}


RESOURCES = st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.5gb",
                             "gpu-tailor.io/gpu-milli", "gpu-tailor.io/gpu-memory", "example.com/fpga",
                             "nvidia.com/unknown"])
QUANTITY = st.sampled_from(["0", "1", "2", "250", "500m", "10Gi"])
CONTAINER = st.builds(lambda name, req, lim, always: {
    "name": name, "resources": {k: v for k, v in (("requests", req), ("limits", lim)) if v is not None},
    **({"restartPolicy": "Always"} if always else {})},
    st.sampled_from(["a", "b", "c"]), st.none() | st.dictionaries(RESOURCES, QUANTITY, max_size=3),
    st.none() | st.dictionaries(RESOURCES, QUANTITY, max_size=3), st.booleans())
ANNOTATIONS = st.none() | st.dictionaries(st.sampled_from(["gpu-tailor.io/isolation", "gpu-tailor.io/gpus",
                                                           "example.com/x", "gpu-tailor.io/product"]),
                                          st.sampled_from(["mig", "0", "H100"]), max_size=2)


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "team-a"}
    if (annotations := draw(ANNOTATIONS)) is not None:
        meta["annotations"] = annotations
    spec: dict[str, Any] = {"containers": draw(st.lists(CONTAINER, min_size=1, max_size=3))}
    if init := draw(st.lists(CONTAINER, max_size=2)):
        spec["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def may_ask_for_gpu(pod: dict[str, Any]) -> bool:
    containers = pod["spec"]["containers"] + pod["spec"].get("initContainers", [])
    names = {r for c in containers for part in c["resources"].values() for r in part}
    ours = any(k.startswith("gpu-tailor.io/") for k in pod["metadata"].get("annotations") or {})
    return ours or any(r.startswith(("nvidia.com/", "gpu-tailor.io/")) for r in names)


@settings(max_examples=300, deadline=None)
@given(pods())
def test_every_gpu_ask_reaches_the_failing_entry(pod: dict[str, Any]) -> None:
    entries = reaches("CREATE", pod)
    assert entries == ({GPU_HOOK, CPU_HOOK} if may_ask_for_gpu(pod) else {CPU_HOOK})
    if from_pod(pod).has_gpu:  # what the webhook itself counts as a GPU ask never fails open
        assert GPU_HOOK in entries


def test_updates_reach_the_failing_entry_only_when_our_annotations_change() -> None:
    pod = {"metadata": {"name": "p", "annotations": {"team": "a"}}, "spec": {"containers": [{"name": "c"}]}}
    ours = {"metadata": {"name": "p", "annotations": {"team": "a", "gpu-tailor.io/gpus": "0"}},
            "spec": {"containers": [{"name": "c"}]}}
    assert reaches("UPDATE", pod, pod) == set()
    assert reaches("UPDATE", ours, ours) == set()  # present before and after, unchanged
    assert reaches("UPDATE", ours, pod) == {GPU_HOOK}  # added
    assert reaches("UPDATE", pod, ours) == {GPU_HOOK}  # removed


def test_only_the_agents_own_writes_of_reports_reach_the_reports_entry() -> None:
    """Nobody else's writes wait on gpu-tailor: an admin fixing or deleting a report while it is down can."""
    (hook,) = [h for h in ALL_HOOKS if h["name"] == registration.REPORTS_HOOK]
    assert hook["failurePolicy"] == "Fail" and hook["clientConfig"]["service"]["path"] == "/reports"
    condition = CONDITIONS[registration.REPORTS_HOOK]

    def reaches_reports(username: str) -> bool:
        request = {"operation": "UPDATE", "userInfo": {"username": username}}
        return bool(condition.evaluate({"request": json_to_cel(request), "object": json_to_cel({}),
                                        "oldObject": json_to_cel({})}))

    assert reaches_reports("system:serviceaccount:gpu-tailor:gpu-tailor-agent")
    assert not reaches_reports("system:serviceaccount:gpu-tailor:gpu-tailor-scheduler")
    assert not reaches_reports("kubernetes-admin")
    assert not reaches_reports("system:serviceaccount:other:gpu-tailor-agent")  # another namespace's


def test_a_pod_the_first_entry_rewrote_is_not_sent_again() -> None:
    """Every captured GPU pod the webhook admits comes out of the first entry labelled as admitted, so the second
    entry (which follows it, in the configuration's order) skips it: one call per GPU pod. A CPU-only pod is
    rewritten by the second entry alone, which writes no label: a reinvocation after a later webhook still reaches
    it."""
    seen = 0
    for letter in "abdefghijk":
        decision, pod = run(letter)
        if not decision.allowed:
            continue
        seen += 1
        assert pod["metadata"]["labels"].get(labels.POD_ADMITTED_LABEL) == "gpu", letter
        assert CPU_HOOK not in reaches("CREATE", pod), letter
    assert seen >= 8
    decision, cpu_only = run("l")
    assert decision.allowed and reaches("CREATE", cpu_only) == {CPU_HOOK}
