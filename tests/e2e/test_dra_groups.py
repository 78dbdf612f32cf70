"""Groups placed whole on DRA pools, end to end, on a release that serves ``resource.k8s.io/v1`` (1.34 and later):
eight DRA trays of four H100s (NVIDIA-shaped ResourceSlices published by hand) in two NVLink cliques
(``nvidia.com/gpu.clique``), the device-plugin fixture nodes cordoned so that every portable ask goes to DRA. The real
kube-scheduler (gpu-tailor-scheduler with the extender) allocates each member's claim in its own cycle; gpu-tailor
plans the group on the DRA devices and holds the trays of the members still to come.

What is checked: a group of 4-GPU claims lands whole in the partly used clique that holds it, each member's claim
allocated the four devices of its planned tray; a single claim pod arriving while a member is still to come never
takes that member's tray; a group no clique holds stays Pending with nothing bound and the reason.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpu_tailor.gpumodel import labels
from tests.e2e.cluster import Release
from tests.e2e.invariants import pending_reason
from tests.e2e.kube import Obj
from tests.e2e.pods import Pods, gpu_pod, unique
from tests.e2e.services import Stack
from tests.e2e.test_dra import GROUP, claim_of, devices, dra_pools
from tests.e2e.test_gangs import GANG, NO_DOMAIN, Plan, nodes_of, plan_on, refusals, wait_plan
from tests.gpumodel.dra_slices import H100, gpu, plain_node, resource_slice

pytestmark = pytest.mark.e2e

CLIQUES = {"a": 4, "b": 4}  # NVLink clique -> its DRA trays of four H100s
TRAY_GPUS = 4
FOUR = {labels.GPU_MILLI: str(TRAY_GPUS * 1000)}  # a portable ask of four whole GPUs
NO_ROOM = "the GPUs free here are held for the pods of a group still to come"


def tray_name(clique: str, i: int) -> str:
    return f"dra-tray-{clique}{i}"


def clique_of(node: str) -> str:
    return node.removeprefix("dra-tray-")[0]


TRAYS = [tray_name(c, i) for c, n in CLIQUES.items() for i in range(n)]


def tray_node(name: str) -> Obj:
    node = plain_node(name)
    node["metadata"]["labels"][labels.GPU_CLIQUE] = f"5b2e8c1a-7d3f-4a6b-9c0e-1f2a3b4c5d6e.{clique_of(name)}"
    return node


@pytest.fixture
def trays(cluster: Stack, release: Release) -> Iterator[Stack]:
    if release.minor < 34:
        pytest.skip(f"{release.version} serves no {GROUP} (DRA is GA from 1.34)")
    nodes = [tray_node(n) for n in TRAYS]
    slices = [resource_slice(n, [gpu(g, H100, 80, f"GPU-{n}-{g}") for g in range(TRAY_GPUS)]) for n in TRAYS]
    with dra_pools(cluster, nodes, slices, FOUR) as ready:
        yield ready


def member(group: str, i: int, size: int) -> Obj:
    return gpu_pod(f"{group}-{i}", FOUR, labels={GANG: group}, annotations={
        labels.ANN_GROUP: group, labels.ANN_GROUP_SIZE: str(size), labels.ANN_GROUP_DOMAIN: "required"})


def assert_on_its_tray(cluster: Stack, placed: list[Obj]) -> None:
    """Each pod's claim was allocated the four devices of the tray it is bound on, and no two share a tray."""
    nodes = nodes_of(placed)
    assert len(set(nodes)) == len(nodes), f"two members on one tray: {sorted(nodes)}"
    for pod in placed:
        got = devices(claim_of(cluster, pod))
        node = pod["spec"]["nodeName"]
        assert sorted((p, d) for p, d, _ in got) == [(node, f"gpu-{g}") for g in range(TRAY_GPUS)], got


def test_a_group_of_claims_lands_whole_in_the_partly_used_clique_and_its_trays_are_held(trays: Stack,
                                                                                        pods: Pods) -> None:
    ns = trays.opted_in
    # a single 2-GPU claim first: the clique it lands in is the partly used one, with three whole trays left
    (holder,) = [pods.wait_bound(pods.create(ns, gpu_pod(unique("holder"), {labels.GPU_MILLI: "2000"})), 60)]
    used = clique_of(holder["spec"]["nodeName"])
    group = unique("train")
    # two of the group's three pods: planned in the partly used clique, bound on two of its trays
    first = [pods.create(ns, member(group, i, 3)) for i in range(2)]
    placed = [pods.wait_bound(p, 60) for p in first]
    plan: Plan = wait_plan(trays, pods, first)
    assert plan.group == f"{ns}/group/{group}" and plan.domain.endswith(f".{used}")
    assert {clique_of(n) for n in plan.nodes} == {used} and holder["spec"]["nodeName"] not in plan.nodes
    assert set(nodes_of(placed)) <= set(plan.nodes)
    assert_on_its_tray(trays, placed)
    (waiting,) = set(plan.nodes) - set(nodes_of(placed))
    # a single 4-GPU claim that may go only to the tray held for the third pod: it stays Pending, the tray held
    single = gpu_pod(unique("single"), FOUR)
    single["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [waiting]}]}]}}}
    single = pods.create(ns, single)
    (reason,) = refusals(trays, [single])
    assert NO_ROOM in reason, reason
    assert not pods.get(single)["spec"].get("nodeName")
    # the third pod comes: it takes its tray, the group whole in one clique
    third = pods.wait_bound(pods.create(ns, member(group, 2, 3)), 60)
    assert third["spec"]["nodeName"] == waiting
    assert_on_its_tray(trays, [*placed, third])
    assert plan_on(pods, [*first, third]) == plan  # written once, on the first member
    assert not pods.get(single)["spec"].get("nodeName")  # no GPU left for it in that tray


def test_a_group_of_claims_no_clique_holds_stays_pending_with_nothing_bound(trays: Stack, pods: Pods) -> None:
    ns = trays.opted_in
    created = [pods.create(ns, member(unique("wide"), i, CLIQUES["a"] + 1)) for i in range(CLIQUES["a"] + 1)]
    for reason in refusals(trays, created):
        assert NO_DOMAIN in reason and "the most any domain holds now is 4" in reason, reason
        assert "4 GPUs (DRA)" in reason and "no pod of it is bound until all fit" in reason
    now = [pods.get(p) for p in created]
    assert not [p["metadata"]["name"] for p in now if p["spec"].get("nodeName")], "a member was bound"
    assert all(NO_DOMAIN in pending_reason(trays.kube, p) for p in now)
    assert plan_on(pods, created) is None


@pytest.mark.parametrize("before", [1, 2], ids=["first-member-bound", "two-members-bound"])
def test_a_restarted_extender_keeps_a_claim_groups_plan(trays: Stack, pods: Pods, before: int) -> None:
    """The plan is read back from the first member after a restart; a member bound before is known by its tray (its
    claim's devices say nothing of its group), and the trays of the members still to come stay held."""
    ns = trays.opted_in
    group, size = unique("resumed"), 3
    first = [pods.wait_bound(pods.create(ns, member(group, i, size)), 60) for i in range(before)]
    plan = wait_plan(trays, pods, first)
    assert plan.anchor == first[0]["metadata"]["name"] and first[0]["spec"]["nodeName"] == plan.nodes[0]
    trays.extender.restart()
    # a single 4-GPU claim that may go anywhere in the planned clique keeps off the trays held for the group
    clique = clique_of(plan.nodes[0])
    single = gpu_pod(unique("single"), FOUR)
    single["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                                     "values": [t for t in TRAYS if clique_of(t) == clique]}]}]}}}
    single = pods.wait_bound(pods.create(ns, single), 60)
    assert single["spec"]["nodeName"] not in plan.nodes, f"a planned tray taken: {plan}"
    rest = [pods.wait_bound(pods.create(ns, member(group, i, size)), 60) for i in range(before, size)]
    placed = [*first, *rest]
    assert sorted(nodes_of(placed)) == sorted(plan.nodes)
    assert_on_its_tray(trays, placed)
