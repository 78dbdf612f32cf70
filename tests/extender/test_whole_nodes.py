"""Keep whole nodes whole (issue 28): where the policy scores a used node and a whole free one alike, the used
node gets the strictly higher score, whatever the node names (the fixed node order decides only after)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpu_tailor.extender import verbs
from gpu_tailor.gpumodel import labels
from tests.conftest import node_fixture
from tests.extender.builders import args, cluster, gpu_pod

PAIRS = [("hgx-a", "hgx-b"), ("hgx-b", "hgx-a"), ("node-1", "node-2"), ("node-2", "node-1"), ("z", "a"),
         ("a", "z"), ("gpu-pool-7", "gpu-pool-12"), ("gpu-pool-12", "gpu-pool-7")]


def node(name: str, gpus: int = 8, topology: str = "nvswitch") -> dict[str, Any]:
    out = copy.deepcopy(node_fixture("h100-hgx-0"))
    out["metadata"]["name"] = name
    out["metadata"]["labels"].update({labels.TOPOLOGY_LABEL: topology, "kubernetes.io/hostname": name,
                                      "nvidia.com/gpu.count": str(gpus)})
    for part in ("capacity", "allocatable"):
        out["status"][part]["nvidia.com/gpu"] = str(gpus)
    return out


@pytest.mark.parametrize(("ask", "used", "gpus", "topology"), [(1, 7, 8, "nvswitch"), (2, 6, 8, "nvswitch"),
                                                              (4, 4, 8, "nvswitch"), (1, 3, 4, "pcie"),
                                                              (2, 2, 4, "pcie")])
@pytest.mark.parametrize(("busy", "idle"), PAIRS)
def test_the_used_node_scores_strictly_higher_than_a_whole_free_one(ask: int, used: int, gpus: int,
                                                                    topology: str, busy: str, idle: str) -> None:
    held = gpu_pod("held", used, node=busy, annotations={labels.ANN_GPUS: ",".join(map(str, range(used)))})
    state = cluster([held], extra_nodes=[node(busy, gpus, topology), node(idle, gpus, topology)])
    body = args("prioritize-nodecache-true-pod-gpu4", [idle, busy])
    body["Pod"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": str(ask)},
                                                         "requests": {"nvidia.com/gpu": str(ask)}}
    out = {h["Host"]: h["Score"] for h in verbs.prioritize(state.snapshot(), body)}
    assert out[busy] > out[idle] > 0, out
