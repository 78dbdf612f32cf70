"""Groups placed whole on DRA pools: kube-scheduler's allocator picks each pod's devices in that pod's own cycle, so
the extender plans the group on the DRA nodes' fleet rows (the devices in the allocator's order), passes each member on
its planned node only, and holds the GPUs of the members still to come in its own books: those nodes' rows count them
taken, and another claim pod (or a native ask DRA serves) passes there only where its devices leave them free."""

from __future__ import annotations

import copy
import json
from typing import Any

from gpu_tailor.extender import verbs, wire
from gpu_tailor.extender.cache import Cache
from gpu_tailor.extender.gangbook import Answer
from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.dra_state import DraState
from gpu_tailor.gpumodel.fleet import MILLI
from gpu_tailor.tools.explain_groups import groups_said
from tests.extender.builders import cluster, gpu_pod
from tests.extender.test_dra import DRA_NODES, claim_pod, dra_cache, held
from tests.gpumodel.dra_slices import H100, device_classes, gpu, plain_node, resource_slice, shared_t4

TRAYS = {"a": 4, "b": 4}  # clique -> its DRA trays of four H100s
WHOLE = "dra:gpu-nvidia-h100-80gb-hbm3"


def tray(clique: str, i: int) -> str:
    return f"dra-{clique}{i}"


ALL = [tray(c, i) for c, n in TRAYS.items() for i in range(n)]


def trays(claims_held: list[dict[str, Any]] = ()) -> Cache:  # type: ignore[assignment]
    """Eight DRA trays of four H100s in two NVLink cliques, with ``claims_held`` allocated."""
    nodes = []
    for name in ALL:
        node = plain_node(name)
        node["metadata"]["labels"][labels.GPU_CLIQUE] = f"4c1d0b7e-2f6a-4e1b-8d2c-5a9e3f7b1c0d.{name[4]}"
        nodes.append(node)
    cache = cluster([], extra_nodes=nodes)
    state = DraState()
    state.reset_slices([resource_slice(n, [gpu(g, H100, 80, f"GPU-{n}-{g}") for g in range(4)]) for n in ALL])
    state.reset_claims(list(claims_held))
    state.reset_classes(device_classes())
    cache.dra = state
    return cache


def member(group: str, i: int, size: int, gpus: int = 4, domain: str = "required") -> dict[str, Any]:
    pod = claim_pod(f"{group}-{i}", {"gpuMilli": gpus * MILLI}, WHOLE)
    pod["metadata"]["annotations"].update({labels.ANN_GROUP: group, labels.ANN_GROUP_SIZE: str(size),
                                           labels.ANN_GROUP_DOMAIN: domain})
    return pod


def answer(cache: Cache, pod: dict[str, Any], names: list[str] = ALL) -> Answer | None:
    return cache.group_answer(pod, wire.extender_args({"Pod": pod, "NodeNames": names}).demand, names)


def passed(cache: Cache, pod: dict[str, Any], names: list[str] = ALL) -> tuple[list[str], dict[str, str]]:
    out = verbs.filter_nodes(cache.snapshot(), {"Pod": pod, "NodeNames": names},
                             answer(cache, pod, names))
    return out["NodeNames"], out["FailedNodes"]


def free(cache: Cache, node: str) -> list[int]:
    snap = cache.snapshot()
    at = snap.fleet.index[node]
    return [int(v) for v in snap.fleet.gpu[at, : snap.fleet.ngpu[at]]]


def bound(cache: Cache, pod: dict[str, Any], node: str) -> None:
    """The allocator gave the member the first free devices of ``node`` and it was bound there."""
    taken = [g for g, f in enumerate(free(cache, node)) if f == MILLI] or list(range(4))
    cache.dra.apply_claim("ADDED", held(node, *(f"gpu-{g}" for g in range(len(taken)))))
    pod = copy.deepcopy(pod)
    pod["spec"]["nodeName"] = node
    pod["metadata"]["resourceVersion"] = str(int(pod["metadata"]["resourceVersion"]) + 1)  # the binding's update
    cache.apply_pod("MODIFIED", pod)


def test_a_group_of_claims_goes_whole_into_the_partly_used_clique_and_holds_its_trays() -> None:
    # clique a has a tray half used: its three whole trays hold the group; clique b stays whole for the next one
    cache = trays([held(tray("a", 0), "gpu-0", "gpu-1")])
    pods = [member("train", i, 3) for i in range(3)]
    planned = [answer(cache, p) for p in pods]
    nodes = [a.node for a in planned if a is not None and a.node is not None]
    assert len(nodes) == 3 and len(set(nodes)) == 3 and {n[4] for n in nodes} == {"a"}
    assert all(free(cache, n) == [0, 0, 0, 0] for n in nodes)  # held for the members still to come
    assert free(cache, tray("a", 0)) == [0, 0, MILLI, MILLI]
    # each member passes its own tray only, and a member too many passes none
    ok, failed = passed(cache, pods[1])
    assert ok == [nodes[1]] and set(failed) == set(ALL) - {nodes[1]}
    extra = answer(cache, member("train", 3, 3))
    assert extra is not None and extra.node is None and "one too many" in extra.reason
    # a single claim pod keeps off the held trays (kube-scheduler's DynamicResources keeps it off the half-used one);
    # one that fits beside them passes there
    ok, failed = passed(cache, claim_pod("single", {"gpuMilli": 4000}, WHOLE))
    assert set(failed) == set(nodes) and set(ok) == set(ALL) - set(nodes)
    assert failed[nodes[0]] == verbs.HELD
    ok, _ = passed(cache, claim_pod("pair", {"gpuMilli": 2000}, WHOLE))
    assert tray("a", 0) in ok and not set(nodes) & set(ok)
    said = groups_said(cache, pods[1], wire.extender_args({"Pod": pods[1], "NodeNames": ALL}).demand,
                       answer(cache, pods[1]))
    assert said[0].startswith("group gpu-jobs/train: 3 pods (required one NVLink domain), planned in NVLink domain ")
    assert f"this pod: {nodes[1]}" in said[0]
    # per clique: clique a has the half-used tray's two GPUs left, clique b its four whole trays
    assert any(line.startswith("NVLink domain ") and line.endswith("still fits there: 4") for line in said[1:])
    assert any(line.startswith("NVLink domain ") and line.endswith("still fits there: 0") for line in said[1:])
    # a member bound: its devices are the claim's now, and the tray stays full with nothing held there
    bound(cache, pods[0], nodes[0])
    assert free(cache, nodes[0]) == [0, 0, 0, 0] and nodes[0] not in cache.groups.dra.by_node
    assert set(cache.groups.dra.by_node) == set(nodes[1:])


def test_a_group_of_claims_no_clique_holds_passes_no_node_and_says_why() -> None:
    cache = trays([held(tray(c, 0), "gpu-0") for c in TRAYS])
    got = answer(cache, member("big", 0, 4))
    assert got is not None and got.node is None
    assert "big (4 pods of 4 GPUs (DRA)) fits in no NVLink domain as a whole" in got.reason
    assert "the most any domain holds now is 3" in got.reason
    assert not cache.groups.dra.by_node  # nothing held
    ok, failed = passed(cache, member("big", 1, 4))
    assert ok == [] and len(failed) == len(ALL)


def test_members_of_a_claim_group_must_ask_alike() -> None:
    cache = trays()
    first = answer(cache, member("mixed", 0, 2))
    assert first is not None and first.node is not None
    other = answer(cache, member("mixed", 1, 2, gpus=2))
    assert other is not None and other.node is None
    assert "ask for different GPUs (4 GPUs (DRA) and 2 GPUs (DRA))" in other.reason


def test_a_claim_groups_plan_is_read_back_with_the_gpus_it_holds() -> None:
    """A restarted extender, or its standby, reads the plan off the pod it was written on and holds the same trays."""
    cache = trays()
    pods = [member("keep", i, 2) for i in range(2)]
    first = answer(cache, pods[0])
    assert first is not None and first.node is not None
    (plan,) = cache.groups.plans.values()
    wire_form = json.loads(plan.wire())
    assert wire_form["claim"] == [4, MILLI]
    written = copy.deepcopy(pods[0])
    written["metadata"]["annotations"][labels.ANN_GROUP_PLAN] = plan.wire()
    again = trays()
    again.reset_pods([written])
    assert set(again.groups.dra.by_node) == {s.node for s in plan.slots}
    ok, failed = passed(again, claim_pod("single", {"gpuMilli": 4000}, WHOLE))
    assert not {s.node for s in plan.slots} & set(ok) and set(failed) == {s.node for s in plan.slots}
    second = answer(again, pods[1])
    assert second is not None and second.node in {s.node for s in plan.slots}


def test_a_group_of_shared_claims_holds_its_shares() -> None:
    # two T4 nodes that share their GPUs; a group of two 5 GiB shares on one node (the node is its own domain)
    cache = dra_cache(slices=[shared_t4("dra-t4-x"), shared_t4("dra-t4-y")])
    cache.apply_node("ADDED", plain_node("dra-t4-x"))
    cache.apply_node("ADDED", plain_node("dra-t4-y"))
    names = ["dra-t4-x", "dra-t4-y"]
    pods = []
    for i in range(2):
        pod = claim_pod(f"duo-{i}", {"gpuMemory": "5Gi"}, "dra:shared-tesla-t4")
        pod["metadata"]["annotations"].update({labels.ANN_GROUP: "duo", labels.ANN_GROUP_SIZE: "2"})
        pods.append(pod)
    first = answer(cache, pods[0], names)
    assert first is not None and first.node in names
    node = first.node
    held_milli = sum(milli * len(gpus) for gpus, milli in cache.groups.dra.on(node))
    assert held_milli == 2 * (5 * 1000 // 15)
    assert sum(MILLI - f for f in free(cache, node)) == held_milli
    second = answer(cache, pods[1], names)
    assert second is not None and second.node == node


def test_a_group_of_native_asks_only_dra_serves_is_planned_on_the_dra_nodes() -> None:
    """A native ask a DeviceClass maps (``extendedResourceName``) on nodes whose device plugin sells none: the group is
    planned on the DRA nodes' devices, and a single pod's native ask keeps off the GPUs held for it."""
    group = {labels.ANN_GROUP: "pair", labels.ANN_GROUP_SIZE: "2"}
    pod = gpu_pod("pair-0", 2, annotations=group)
    cache = dra_cache()
    got = answer(cache, pod, DRA_NODES)
    assert got == Answer("dra-h100-hgx-0")  # the only DRA node of whole GPUs: one node, its own domain
    assert free(cache, "dra-h100-hgx-0") == [0, 0, 0, 0, MILLI, MILLI, MILLI, MILLI]
    ok, failed = passed(cache, gpu_pod("eight", 8), DRA_NODES)
    assert "dra-h100-hgx-0" not in ok and failed["dra-h100-hgx-0"] == verbs.HELD
    ok, _ = passed(cache, gpu_pod("four", 4), DRA_NODES)
    assert "dra-h100-hgx-0" in ok
    plain = cluster([], extra_nodes=[plain_node(n) for n in DRA_NODES])  # no DRA: nothing serves it there
    refused = answer(plain, pod, DRA_NODES)
    assert refused is not None and refused.node is None and "no node serves 2 x nvidia.com/gpu" in refused.reason


def test_a_member_bound_before_its_claim_groups_plan_is_read_back_keeps_its_tray() -> None:
    """After a restart the pods may be listed in any order: a member bound on its tray, listed before the pod that
    carries the plan, is known by its node (its claim's devices say nothing of its group), so its slot is not held
    again, and the plan ends once the last member is bound."""
    cache = trays()
    pods = [member("late", i, 2) for i in range(2)]
    first = answer(cache, pods[0])
    second = answer(cache, pods[1])
    assert first is not None and second is not None and first.node and second.node
    (plan,) = cache.groups.plans.values()
    anchor = copy.deepcopy(pods[0])
    anchor["metadata"]["annotations"][labels.ANN_GROUP_PLAN] = plan.wire()
    on_tray = copy.deepcopy(pods[1])
    on_tray["spec"]["nodeName"] = second.node
    again = trays([held(second.node, *(f"gpu-{g}" for g in range(4)))])
    again.reset_pods([on_tray, anchor])  # the member bound first, the plan after
    assert set(again.groups.dra.by_node) == {first.node}  # only the slot of the member still to come is held
    assert free(again, second.node) == [0, 0, 0, 0]  # its claim's devices, counted once
    bound(again, anchor, first.node)
    assert not again.groups.plans and not again.groups.dra.by_node


def test_a_member_of_a_native_dra_group_bound_before_the_plan_is_read_back_keeps_its_gpus() -> None:
    """The same for a native ask only DRA serves: its pod holds no GPUs gpu-tailor could match to a slot."""
    group = {labels.ANN_GROUP: "pair", labels.ANN_GROUP_SIZE: "2"}
    pods = [gpu_pod(f"pair-{i}", 2, annotations=group) for i in range(2)]
    cache = dra_cache()
    for pod in pods:
        assert answer(cache, pod, DRA_NODES) == Answer("dra-h100-hgx-0")
    (plan,) = cache.groups.plans.values()
    anchor = copy.deepcopy(pods[0])
    anchor["metadata"]["annotations"][labels.ANN_GROUP_PLAN] = plan.wire()
    on_node = copy.deepcopy(pods[1])
    on_node["spec"]["nodeName"] = "dra-h100-hgx-0"
    for order in ([on_node, anchor], [anchor, on_node]):
        again = dra_cache(claims=[held("dra-h100-hgx-0", "gpu-0", "gpu-1")])
        again.reset_pods(order)
        # the bound member's two devices are its claim's; only the other member's two are held
        assert free(again, "dra-h100-hgx-0") == [0, 0, 0, 0, MILLI, MILLI, MILLI, MILLI], order
        assert sum(len(g) for g, _ in again.groups.dra.on("dra-h100-hgx-0")) == 2
