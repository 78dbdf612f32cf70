"""Pod Security and the node agent, on a real API server: the agent's pod (a hostPath, as root) is refused in a
namespace that enforces ``baseline``, saying why, and admitted in gpu-tailor's namespace, which the manifests label
``privileged``."""

from __future__ import annotations

import pytest
import yaml

from tests.e2e.cluster import REPO, create_namespace
from tests.e2e.kube import ApiError, Obj, api_path
from tests.e2e.services import Stack

pytestmark = pytest.mark.e2e


def agent_pod(cluster: Stack, account: str = "gpu-tailor-agent") -> Obj:
    """A pod of the agent's DaemonSet as manifests/ renders it (the e2e overlay leaves the DaemonSet out)."""
    (daemonset,) = [d for d in yaml.safe_load_all(cluster.cp.kubectl("kustomize", str(REPO / "manifests")))
                    if d and d["kind"] == "DaemonSet"]
    template = daemonset["spec"]["template"]
    # a dry run, placed by hand: never run
    spec = {**template["spec"], "nodeName": "cpu-node-0", "serviceAccountName": account}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "agent-probe", "labels": template["metadata"]
                                                             ["labels"]}, "spec": spec}


def test_the_agent_is_refused_under_baseline_and_admitted_in_its_namespace(cluster: Stack) -> None:
    ns = cluster.kube.get(api_path("namespaces", name="gpu-tailor"))
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    if not cluster.kube.exists(api_path("namespaces", name="psa-baseline")):
        create_namespace(cluster.kube, "psa-baseline", {"pod-security.kubernetes.io/enforce": "baseline"})
    with pytest.raises(ApiError) as refused:
        cluster.kube.create(api_path("pods", "psa-baseline"), agent_pod(cluster, "default"), dry_run=True)
    assert refused.value.status == 403 and "hostPath" in str(refused.value), refused.value
    admitted = cluster.kube.create(api_path("pods", "gpu-tailor"), agent_pod(cluster), dry_run=True)
    assert admitted["spec"]["volumes"][0]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
