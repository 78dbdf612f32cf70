"""Which GPU a replica gets is the device plugin's call (``--shared-devices-allocation-policy``): explain and
the extender predict it under the pool's policy, and name the set where the plugin may pick any of several."""

from __future__ import annotations

import copy

import pytest

from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.inventory import from_node
from gpu_tailor.gpumodel.occupancy import ReplicaPolicy
from gpu_tailor.tools.explain import explain, table
from gpu_tailor.tools.source import Cluster
from gpu_tailor.webhook.config import AdmissionPolicy
from tests.conftest import node_fixture
from tests.tools.builders import NODES, pod, review_pod

T4 = "t4-timeslice-0"  # 4 T4s, time-sliced 4 ways, selling nvidia.com/gpu


def held(name: str, gpu: int) -> dict[str, object]:
    """A one-replica pod bound to the T4 node, on ``gpu`` as bind recorded it."""
    return pod(name, {"nvidia.com/gpu": "1"}, node=T4, annotations={labels.ANN_GPUS: str(gpu)})


def cluster(policy: str | None) -> Cluster:
    """The fixture nodes, the T4 pool labelled with ``policy``; its GPUs hold 2, 1, 0 and 0 replicas."""
    nodes = [copy.deepcopy(node_fixture(n)) for n in NODES]
    for node in nodes:
        if node["metadata"]["name"] == T4 and policy is not None:
            node["metadata"]["labels"][labels.REPLICA_POLICY_LABEL] = policy
    return Cluster(nodes, [held("r0", 0), held("r1", 0), held("r2", 1)], None, "the fixture nodes")


@pytest.mark.parametrize(("policy", "gpus", "maybe", "said"), [
    (None, [2], [2, 3], "GPU 2 or 3 (the device plugin picks)"),  # distributed, the plugin's default
    ("distributed", [2], [2, 3], "GPU 2 or 3 (the device plugin picks)"),
    ("packed", [0], None, "GPU 0"),  # the GPU with the most replicas that has a free one
    ("spread", [2], [2, 3], "GPU 2 or 3 (the device plugin picks)"),  # one replica: as distributed
])
def test_a_one_replica_pod_on_gpus_holding_2_1_0_0(policy: str | None, gpus: list[int], maybe: list[int] | None,
                                                    said: str) -> None:
    e = explain(review_pod("d"), "pod", cluster(policy), AdmissionPolicy())  # a quarter GPU: one T4 replica
    assert e.admission.allowed and e.chosen == T4
    assert (e.gpus, e.maybe) == (gpus, maybe)
    assert f"would bind to {T4}, {said}" in table(e)


def test_an_unknown_policy_label_is_reported_and_read_as_the_default() -> None:
    node = copy.deepcopy(node_fixture(T4))
    node["metadata"]["labels"][labels.REPLICA_POLICY_LABEL] = "tight"
    inv = from_node(node)
    assert inv.replica_policy is ReplicaPolicy.DISTRIBUTED
    assert inv.problems == ("label gpu-tailor.io/replica-policy='tight' is not one of distributed, packed, spread: "
                            "read as distributed",)
