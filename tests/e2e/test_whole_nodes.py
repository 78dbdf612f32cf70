"""Keep whole nodes whole, on a real kube-scheduler with the shipped profile (issue 28): two identical GPU nodes,
one partly used and one whole and free; a pod that fits both goes to the used one, with the node names either
way round, on 8-GPU HGX nodes and on a 4-GPU PCIe pair."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest

from gpu_tailor.gpumodel import labels
from tests.e2e.cluster import fixture_nodes, install_node
from tests.e2e.kube import Obj, api_path
from tests.e2e.pods import Pods, gpu_pod, unique
from tests.e2e.services import Stack

pytestmark = pytest.mark.e2e


def twin(name: str, gpus: int, topology: str) -> Obj:
    (hgx,) = [n for n in fixture_nodes() if n["metadata"]["name"] == "h100-hgx-0"]
    node = copy.deepcopy(hgx)
    node["metadata"]["name"] = name
    node["metadata"]["labels"].update({"kubernetes.io/hostname": name, "nvidia.com/gpu.count": str(gpus),
                                       labels.TOPOLOGY_LABEL: topology})
    for part in ("capacity", "allocatable"):
        node["status"][part]["nvidia.com/gpu"] = str(gpus)
    return node


@pytest.fixture
def pairs(cluster: Stack) -> Iterator[dict[int, tuple[str, str]]]:
    """Two pairs of identical nodes: 8-GPU NVSwitch boards and 4-GPU PCIe boards."""
    made = {8: ("whole-hgx-a", "whole-hgx-b"), 4: ("whole-pcie-a", "whole-pcie-b")}
    try:
        for gpus, names in made.items():
            for name in names:
                install_node(cluster.kube, twin(name, gpus, "nvswitch" if gpus == 8 else "pcie"))
        yield made
    finally:
        for names in made.values():
            for name in names:
                if cluster.kube.exists(api_path("nodes", name=name)):
                    cluster.kube.delete(api_path("nodes", name=name))


def only_on(pod: Obj, nodes: tuple[str, str]) -> Obj:
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": list(nodes)}]}]}}}
    return pod


@pytest.mark.parametrize(("gpus", "ask", "used"), [(8, 1, 7), (8, 2, 6), (8, 4, 4), (4, 1, 3), (4, 2, 2)])
def test_the_partly_used_node_is_filled_before_a_whole_free_one(cluster: Stack, pods: Pods,
                                                               pairs: dict[int, tuple[str, str]], gpus: int,
                                                               ask: int, used: int) -> None:
    """Each time with a fresh extender: it learns the pod mix from what is bound now (the holder) and what it is
    asked to place, so for ``ask == used`` the policy cannot tell the two nodes apart (issue 28's setting), and
    only the tie-break keeps the whole node whole."""
    ns = cluster.opted_in
    names = pairs[gpus]
    for busy in names:  # each name order
        cluster.extender.restart()
        holder = pods.wait_bound(pods.create(ns, gpu_pod(unique("holder"), {"nvidia.com/gpu": str(used)},
                                                         node=busy)))
        assert holder["spec"]["nodeName"] == busy
        placed = pods.wait_bound(pods.create(ns, only_on(gpu_pod(unique("fits-both"), {"nvidia.com/gpu": str(ask)}),
                                                         names)))
        assert placed["spec"]["nodeName"] == busy, f"{ask} GPU(s) broke the whole node beside {busy}"
        pods.cleanup()
