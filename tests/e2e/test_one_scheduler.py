"""One scheduler per GPU node, on a real control plane (issue 32): GPU pods arrive by both paths in one burst --
half from the opted-in namespace (the webhook sends them to gpu-tailor-scheduler, with the toleration), half from a
namespace that did not opt in (default-scheduler) -- onto nodes tainted ``gpu-tailor.io/managed:NoSchedule`` with
fewer GPUs than asked for. At the end no node has more GPUs bound than it allocates, the routed pods that could not
fit and every other pod are Pending with kube-scheduler's reason, and none is Failed.

Without the taint the same burst over-commits nodes: both schedulers count ``nvidia.com/gpu`` from their own caches
and neither sees the other's binds in flight (seen on v1.28.7 and v1.36.3 with the fixture fleet, issue 32)."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest

from gpu_tailor.gpumodel import labels
from tests.e2e.cluster import fixture_nodes, install_node
from tests.e2e.kube import Obj, api_path, wait_for
from tests.e2e.pods import Pods, gpu_pod, unique
from tests.e2e.services import Stack, failed_scheduling

pytestmark = pytest.mark.e2e

NODES = ("race-a", "race-b")
GPUS = 4  # each: 8 GPUs to share between 24 one-GPU pods


def tainted(name: str) -> Obj:
    (hgx,) = [n for n in fixture_nodes() if n["metadata"]["name"] == "h100-hgx-0"]
    node = copy.deepcopy(hgx)
    node["metadata"]["name"] = name
    node["metadata"]["labels"].update({"kubernetes.io/hostname": name, "nvidia.com/gpu.count": str(GPUS)})
    for part in ("capacity", "allocatable"):
        node["status"][part]["nvidia.com/gpu"] = str(GPUS)
    node["spec"]["taints"] = [*node["spec"].get("taints", []),
                              {"key": labels.MANAGED_TAINT_KEY, "value": "true", "effect": "NoSchedule"}]
    return node


@pytest.fixture
def race_nodes(cluster: Stack) -> Iterator[tuple[str, ...]]:
    try:
        for name in NODES:
            install_node(cluster.kube, tainted(name))
        yield NODES
    finally:
        for name in NODES:
            if cluster.kube.exists(api_path("nodes", name=name)):
                cluster.kube.delete(api_path("nodes", name=name))


def racer(prefix: str) -> Obj:
    """A one-GPU pod that may go only to the race nodes, tolerating the GPU operator's taint as GPU pods do."""
    pod = gpu_pod(unique(prefix), {"nvidia.com/gpu": "1"})
    pod["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": list(NODES)}]}]}}}
    return pod


def test_a_burst_by_both_paths_never_over_commits_a_node(cluster: Stack, pods: Pods,
                                                        race_nodes: tuple[str, ...]) -> None:
    burst: list[tuple[str, Obj]] = []
    for _ in range(12):  # interleaved, as two teams' jobs arrive
        burst.append((cluster.opted_in, pods.create(cluster.opted_in, racer("routed"))))
        burst.append((cluster.plain, pods.create(cluster.plain, racer("other"))))
    routed = [p for ns, p in burst if ns == cluster.opted_in]
    other = [p for ns, p in burst if ns == cluster.plain]
    assert all(p["spec"]["schedulerName"] == "gpu-tailor-scheduler" for p in routed)
    assert all(p["spec"]["schedulerName"] == "default-scheduler" for p in other)

    def settled() -> list[Obj]:
        now = [pods.get(p) for _, p in burst]
        waiting = [p for p in now if not p["spec"].get("nodeName")]
        return now if len(now) - len(waiting) == 2 * GPUS and all(failed_scheduling(cluster.kube, p)
                                                                    for p in waiting) else []

    final = wait_for(settled, 60, f"{2 * GPUS} pods bound and the rest reported unschedulable",
                     context=cluster.context)
    bound = [p for p in final if p["spec"].get("nodeName")]
    assert {p["metadata"]["namespace"] for p in bound} == {cluster.opted_in}  # only gpu-tailor's pods
    for name in race_nodes:
        held = sum(1 for p in bound if p["spec"]["nodeName"] == name)
        assert held <= GPUS, f"{name}: {held} GPUs bound, {GPUS} allocatable"
    assert not [p for p in final if (p.get("status") or {}).get("phase") == "Failed"]
    # kube-scheduler 1.28 names the taint; 1.36 says "had untolerated taint(s)" without naming it
    said = "untolerated taint {gpu-tailor.io/managed: true}" if cluster.cp.release.minor <= 28 else "untolerated taint"
    for p in (p for p in final if p["metadata"]["namespace"] == cluster.plain):
        assert said in failed_scheduling(cluster.kube, p)[-1]
