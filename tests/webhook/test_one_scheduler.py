"""One scheduler per GPU node: nodes tainted ``gpu-tailor.io/managed:NoSchedule`` take only the pods the webhook sends
to gpu-tailor-scheduler (they, and only they, get the toleration), so a GPU pod of a namespace that did not opt in,
or one naming another scheduler, can never be bound there by a second scheduler counting GPUs from its own cache.

Checked here on the webhook's own patch and on ``explain`` (kube-scheduler's TaintToleration filter); the race of
both paths on a real control plane is ``tests/e2e/test_one_scheduler.py``."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch

from gpu_tailor.gpumodel import labels
from gpu_tailor.tools.explain import explain, pending_message
from gpu_tailor.tools.source import Cluster
from gpu_tailor.webhook.config import AdmissionPolicy
from gpu_tailor.webhook.mutate import decide
from gpu_tailor.webhook.state import ClusterView
from tests.conftest import node_fixture, review_fixture
from tests.tools.builders import NODES, pod

MANAGED = {"key": labels.MANAGED_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
GPU = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def admitted(request: dict[str, Any], policy: AdmissionPolicy | None = None) -> dict[str, Any]:
    view = ClusterView(policy or AdmissionPolicy())
    view.reset([node_fixture(n) for n in NODES])
    decision = decide(request, view.candidates(), policy or AdmissionPolicy())
    assert decision.allowed, decision.message
    out: dict[str, Any] = jsonpatch.apply_patch(request["object"], decision.patch)
    return out


def test_the_pods_it_routes_tolerate_the_managed_taint() -> None:
    for letter in "adeh":  # portable asks and native ones
        stored = admitted(review_fixture(letter)["request"])
        assert stored["spec"]["schedulerName"] == "gpu-tailor-scheduler"
        assert MANAGED in stored["spec"]["tolerations"] and GPU in stored["spec"]["tolerations"], letter


def test_a_pod_of_another_scheduler_and_a_cpu_only_pod_do_not() -> None:
    request = copy.deepcopy(review_fixture("a")["request"])
    request["object"]["spec"]["schedulerName"] = "my-scheduler"
    stored = admitted(request)
    assert stored["spec"]["schedulerName"] == "my-scheduler"
    assert MANAGED not in (stored["spec"].get("tolerations") or [])
    cpu = copy.deepcopy(review_fixture("a")["request"])
    for c in cpu["object"]["spec"]["containers"]:
        c["resources"] = {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}
    stored = admitted(cpu, AdmissionPolicy(cpuOnlyPods=True))
    assert stored["spec"]["schedulerName"] == "gpu-tailor-scheduler"
    assert MANAGED not in (stored["spec"].get("tolerations") or [])  # CPU pods do not go to GPU nodes for it


def tainted_cluster() -> Cluster:
    """The fixture nodes, each GPU node tainted as gpu-tailor's; team-a opted in, team-b not."""
    nodes = [copy.deepcopy(node_fixture(n)) for n in NODES]
    for node in nodes:
        if node["metadata"]["labels"].get("nvidia.com/gpu.present") == "true":
            node["spec"].setdefault("taints", []).append({"key": labels.MANAGED_TAINT_KEY, "value": "true",
                                                          "effect": "NoSchedule"})
    return Cluster(nodes, [], {"team-a": {labels.NAMESPACE_OPT_IN_LABEL: "true"}, "team-b": {}}, "tainted nodes")


def test_on_tainted_nodes_only_gpu_tailors_pods_are_bound() -> None:
    cluster = tainted_cluster()
    gpu_nodes = {n["metadata"]["name"] for n in cluster.nodes if n["spec"].get("taints")}
    assert len(gpu_nodes) >= 6
    ours = explain(pod("mine", {"nvidia.com/gpu": "1"}, namespace="team-a"), "pod", cluster, AdmissionPolicy())
    assert ours.admission.called and ours.chosen in gpu_nodes
    other = pod("theirs", {"nvidia.com/gpu": "1"}, namespace="team-b")
    other["spec"]["tolerations"] = [GPU]  # as GPU pods elsewhere do: without the taint it could land there
    theirs = explain(other, "pod", cluster, AdmissionPolicy())
    assert not theirs.admission.called and theirs.scheduler == "default-scheduler"
    assert theirs.chosen is None  # Pending, with kube-scheduler's reason, never bound beside gpu-tailor's pods
    by = {v.node: v for v in theirs.nodes}
    for name in gpu_nodes:
        assert by[name].reasons == ["node(s) had untolerated taint {gpu-tailor.io/managed: true}"], by[name]
    assert f"{len(gpu_nodes)} node(s) had untolerated taint {{gpu-tailor.io/managed: true}}" in \
        pending_message(theirs.nodes)
