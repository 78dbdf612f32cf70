"""Admission of a group's pods: a group ask that cannot be read, or one NVLink domain asked of a group larger than any
domain, is refused with the reason; the others pass, and the largest domain is read from the node labels."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.dra_state import DraState
from gpu_tailor.webhook.config import AdmissionPolicy
from gpu_tailor.webhook.mutate import decide
from gpu_tailor.webhook.state import ClusterView
from tests.conftest import FIXTURES, review_fixture
from tests.gpumodel.dra_slices import H100, device_classes, gpu, plain_node, resource_slice

NODES = [json.loads(p.read_text()) for p in sorted((FIXTURES / "nodes").glob("*.json"))]
LARGEST_NODE = 8  # the HGX fixture: no node carries a clique label, so a domain is one node


def with_cliques(count: int) -> list[dict[str, Any]]:
    """The fixture nodes and ``count`` 4-GPU trays sharing one clique."""
    (hgx,) = [n for n in NODES if n["metadata"]["name"] == "h100-hgx-0"]
    out = list(NODES)
    for i in range(count):
        node = copy.deepcopy(hgx)
        node["metadata"]["name"] = f"gb-{i}"
        node["metadata"]["labels"].update({labels.GPU_COUNT: "4", labels.GPU_CLIQUE: "uuid.1"})
        for part in ("capacity", "allocatable"):
            node["status"][part][labels.GPU_RESOURCE] = "4"
        out.append(node)
    return out


def grouped(annotations: dict[str, str], gpus: int = 1) -> dict[str, Any]:
    review = review_fixture("a")
    pod = review["request"]["object"]
    pod["metadata"]["annotations"] = annotations
    pod["spec"]["containers"][0]["resources"] = {"limits": {labels.GPU_RESOURCE: str(gpus)}}
    return review


def decided(review: dict[str, Any], nodes: list[dict[str, Any]]) -> Any:
    view = ClusterView(AdmissionPolicy())
    view.reset(nodes, [])
    return decide(review["request"], view.candidates(), view.policy, largest_domain=view.largest_domain())


def ask(size: int, domain: str = "required") -> dict[str, str]:
    return {labels.ANN_GROUP: "train", labels.ANN_GROUP_SIZE: str(size), labels.ANN_GROUP_DOMAIN: domain}


def test_the_largest_domain_is_a_clique_of_nodes_or_a_node_alone() -> None:
    view = ClusterView(AdmissionPolicy())
    view.reset(NODES, [])
    assert view.largest_domain() == LARGEST_NODE
    view.reset(with_cliques(18), [])
    assert view.largest_domain() == 72
    view.apply_node("DELETED", {"metadata": {"name": "gb-0"}})
    assert view.largest_domain() == 68


@pytest.mark.parametrize(("annotations", "gpus", "nodes", "code", "says"), [
    pytest.param(ask(3, "required"), 4, NODES, 403, "largest domain here has 8", id="required-beyond-a-node"),
    pytest.param(ask(2, "required"), 4, NODES, 200, "", id="required-within-a-node"),
    pytest.param(ask(3, "preferred"), 4, NODES, 200, "", id="preferred-anywhere"),
    pytest.param(ask(18, "required"), 4, with_cliques(18), 200, "", id="required-a-full-clique"),
    pytest.param(ask(19, "required"), 4, with_cliques(18), 403, "need 76 GPUs", id="required-beyond-the-clique"),
    pytest.param({labels.ANN_GROUP: "train"}, 1, NODES, 422, "say how many pods", id="no-size"),
    pytest.param(ask(2, "rack"), 1, NODES, 422, "expected one of", id="bad-domain-ask"),
])
def test_group_asks_are_checked_at_admission(annotations: dict[str, str], gpus: int, nodes: list[dict[str, Any]],
                                             code: int, says: str) -> None:
    d = decided(grouped(annotations, gpus), nodes)
    assert d.allowed == (code == 200)
    if code != 200:
        assert d.code == code and says in d.message


def dra_clique(trays: int) -> tuple[ClusterView, list[dict[str, Any]]]:
    """The fixture nodes and ``trays`` DRA trays of four H100s in one clique, with DRA's slices; and the slices."""
    nodes = []
    for i in range(trays):
        node = plain_node(f"dra-gb-{i}")
        node["metadata"]["labels"][labels.GPU_CLIQUE] = "uuid.7"
        nodes.append(node)
    view = ClusterView(AdmissionPolicy())
    view.reset([*NODES, *nodes], [])
    slices = [resource_slice(f"dra-gb-{i}", [gpu(g, H100, 80, f"GPU-{i}-{g}") for g in range(4)])
              for i in range(trays)]
    view.dra = DraState()
    view.dra.reset_slices(slices)
    view.dra.reset_claims([])
    view.dra.reset_classes(device_classes())
    return view, slices


def test_a_dra_nodes_gpus_are_the_gpu_devices_its_pools_publish() -> None:
    """DRA trays carry no GPU count label: their clique counts the GPU devices their slices publish, and a slice
    published or withdrawn later changes the count."""
    view, slices = dra_clique(4)
    view.dra.enabled = False
    assert view.largest_domain() == LARGEST_NODE  # DRA off: the trays have no GPUs to count
    view.dra.enabled = True
    state = view.dra
    assert view.largest_domain() == 16
    state.apply_slice("DELETED", slices[0])
    assert view.largest_domain() == 12


def test_a_native_group_is_held_to_the_device_plugins_domains_where_they_sell_gpus() -> None:
    """Beside a DRA clique of 16 GPUs, a native group that needs 12 GPUs in one domain is refused (its pods go to the
    device plugin's nodes, the largest of 8), and the same group as a portable ask, which may go to DRA, is not."""
    view, _ = dra_clique(4)
    assert (view.largest_domain(), view.largest_domain(dra=False)) == (16, LARGEST_NODE)

    def decided_here(review: dict[str, Any]) -> Any:
        return decide(review["request"], view.candidates(), view.policy, largest_domain=view.largest_domain(),
                      plugin_domain=view.largest_domain(dra=False))

    native = decided_here(grouped(ask(3), 4))
    assert native.code == 403 and "the largest domain here has 8" in native.message
    portable = grouped(ask(3), 4)
    portable["request"]["object"]["spec"]["containers"][0]["resources"] = {"limits": {labels.GPU_MILLI: "4000"}}
    assert decided_here(portable).code != 403
