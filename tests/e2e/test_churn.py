"""Pods deleted while gpu-tailor-scheduler is binding them (a Job cancelled, a user's Ctrl-C) must not leave
their GPUs counted as taken: kube-scheduler keeps a pod it was told is bound until the API shows it
gone, so an extender that reports a refused Binding as done leaves a phantom pod on the node."""

from __future__ import annotations

import copy
from functools import partial
from typing import Any

import pytest

from tests.e2e.cluster import fixture_nodes, install_node
from tests.e2e.kube import api_path, wait_for
from tests.e2e.pods import Pods, gpu_pod, unique
from tests.e2e.services import Stack, pod_events

pytestmark = pytest.mark.e2e

CHURN_NODE = "h100-churn-0"
CHURN_TAINT = {"key": "e2e.gpu-tailor.io/churn", "value": "true", "effect": "NoSchedule"}


def churn_node() -> dict[str, Any]:
    """A second healthy 8-GPU H100, tainted so that only this test's pods go there."""
    node = copy.deepcopy(next(n for n in fixture_nodes() if n["metadata"]["name"] == "h100-hgx-0"))
    node["metadata"]["name"] = CHURN_NODE
    node["metadata"]["labels"]["kubernetes.io/hostname"] = CHURN_NODE
    node["spec"]["taints"] = [*node["spec"].get("taints", []), CHURN_TAINT]
    return node


def test_pods_deleted_while_being_bound_leave_no_gpu_taken(cluster: Stack, pods: Pods) -> None:
    ns, kube = cluster.opted_in, cluster.kube
    install_node(kube, churn_node())
    try:
        names = []
        for _ in range(20):  # each deleted as soon as it is created: some while they are being bound
            pod = gpu_pod(unique("churn"), {"nvidia.com/gpu": "1"}, node=CHURN_NODE)
            pod["spec"]["tolerations"] = [{**CHURN_TAINT, "operator": "Equal"}]
            names.append(kube.create(api_path("pods", ns), pod)["metadata"]["name"])
            kube.delete(api_path("pods", ns, names[-1]), grace_seconds=0)
        for name in names:
            wait_for(partial(pods.gone, ns, name), 30, f"pod {name} deleted")

        whole = gpu_pod(unique("all-eight"), {"nvidia.com/gpu": "8"}, node=CHURN_NODE)
        whole["spec"]["tolerations"] = [{**CHURN_TAINT, "operator": "Equal"}]
        created = pods.create(ns, whole)
        # A moment's "Insufficient" while kube-scheduler still sees the deleted pods is fine: their deletion
        # sends the pod back to be tried again. A phantom pod never goes away.
        outcome = wait_for(lambda: pods.get(created)["spec"].get("nodeName"), 30, "the 8-GPU pod bound",
                           context=lambda: "\n".join([*pod_events(kube, created), cluster.context()]))
        assert outcome == CHURN_NODE
    finally:
        pods.cleanup()
        kube.delete(api_path("nodes", name=CHURN_NODE))
