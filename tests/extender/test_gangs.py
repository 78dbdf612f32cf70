"""Groups placed whole by the extender: planned in one NVLink domain when the first member is filtered, the GPUs of
the members still to come held against other pods, each member filtered to its own node, the plan read back after a
restart, released past its deadline, and a group that fits nowhere bound nowhere."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from gpu_tailor.extender import verbs, wire
from gpu_tailor.extender.cache import Cache
from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.groups import podgroup_object, workload_objects
from tests.conftest import node_fixture
from tests.extender.builders import args, gpu_pod

CLIQUES, TRAYS = 3, 4  # three NVLink domains of four 4-GPU nodes


def tray(clique: int, i: int) -> dict[str, Any]:
    """An NVL72 compute tray as GFD labels one: four GPUs, its clique."""
    node = copy.deepcopy(node_fixture("h100-hgx-0"))
    name = f"gb-{clique}-{i}"
    node["metadata"]["name"] = name
    node["metadata"]["labels"].update({"kubernetes.io/hostname": name, labels.GPU_COUNT: "4",
                                       labels.GPU_PRODUCT: "NVIDIA-GB200",
                                       labels.GPU_CLIQUE: f"uuid-{clique}.{clique}"})
    for part in ("capacity", "allocatable"):
        node["status"][part][labels.GPU_RESOURCE] = "4"
    return node


NODES = [tray(c, i) for c in range(CLIQUES) for i in range(TRAYS)]
NAMES = [n["metadata"]["name"] for n in NODES]


def member(group: str, i: int, size: int, gpus: int = 4, domain: str = "required") -> dict[str, Any]:
    return gpu_pod(f"{group}-{i}", gpus, annotations={labels.ANN_GROUP: group, labels.ANN_GROUP_SIZE: str(size),
                                                      labels.ANN_GROUP_DOMAIN: domain})


def synced(pods: list[dict[str, Any]], wall: list[float] | None = None) -> Cache:
    clock = wall or [1000.0]
    cache = Cache(wall=lambda: clock[0])
    cache.reset_pods(pods)
    cache.reset_nodes(copy.deepcopy(NODES))
    return cache


def filtered(cache: Cache, pod: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    body = args("filter-nodecache-true-pod-gpu4", list(NAMES))
    body["Pod"] = pod
    ex = wire.extender_args(body)
    answer = cache.group_answer(pod, ex.demand)
    out = verbs.filter_nodes(cache.snapshot(), body, answer)
    return out["NodeNames"], {**out["FailedNodes"], **out["FailedAndUnresolvableNodes"]}


def bound(pod: dict[str, Any], node: str) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    out["spec"]["nodeName"] = node
    out["status"] = {"phase": "Running"}
    out["metadata"]["resourceVersion"] = "2"
    return out


def clique(node: str) -> str:
    return node.split("-")[1]


def test_a_group_goes_whole_to_the_partly_used_domain_that_holds_it() -> None:
    cache = synced([gpu_pod("busy", 2, node="gb-1-0")])  # clique 1 is in use, with three whole trays
    members = [member("train", i, 3) for i in range(3)]
    places = []
    for m in members:
        passed, _ = filtered(cache, m)
        assert len(passed) == 1
        places.append(passed[0])
    assert len(set(places)) == 3 and {clique(p) for p in places} == {"1"}
    assert "gb-1-0" not in places  # half used: no room for a 4-GPU member
    # asked again, a member keeps its node
    assert filtered(cache, members[1])[0] == [places[1]]


def test_a_full_domain_group_takes_an_untouched_domain_and_single_pods_keep_off_its_gpus() -> None:
    cache = synced([gpu_pod("busy", 2, node="gb-1-0")])
    first = member("big", 0, TRAYS)
    passed, _ = filtered(cache, first)
    planned = clique(passed[0])
    assert planned in {"0", "2"}
    # a single 4-GPU pod arriving before the other members can go anywhere but the planned trays
    single_passed, failed = filtered(cache, gpu_pod("single", 4))
    assert not [n for n in single_passed if clique(n) == planned]
    assert all(clique(n) != planned or n in failed for n in NAMES)


def test_a_group_too_big_for_any_domain_passes_no_node_and_says_why() -> None:
    cache = synced([])
    passed, failed = filtered(cache, member("huge", 0, TRAYS + 1))
    assert passed == []
    assert set(failed) == set(NAMES)
    assert "fits in no NVLink domain as a whole" in failed[NAMES[0]]
    assert "no pod of it is bound until all fit" in failed[NAMES[0]]
    assert not cache.groups.plans  # nothing held


def test_a_bound_member_holds_its_own_gpus_and_the_rest_stay_held() -> None:
    cache = synced([])
    members = [member("train", i, 2) for i in range(2)]
    first = filtered(cache, members[0])[0][0]
    cache.apply_pod("MODIFIED", bound(members[0], first))
    second = filtered(cache, members[1])[0][0]
    assert second != first and clique(second) == clique(first)
    plan = cache.groups.plans["default/group/train"] if "default/group/train" in cache.groups.plans else \
        next(iter(cache.groups.plans.values()))
    assert plan.slots[0].bound and not plan.slots[1].bound
    # the planned second tray is held: a single 4-GPU pod cannot have it
    assert second not in filtered(cache, gpu_pod("single", 4))[0]
    cache.apply_pod("MODIFIED", bound(members[1], second))
    assert not cache.groups.plans  # all bound: nothing held any more
    assert not [k for k in cache.pods if "~" in k]


def test_a_restarted_extender_reads_the_plan_back_and_holds_the_same_gpus() -> None:
    cache = synced([])
    first = member("train", 0, 3)
    node = filtered(cache, first)[0][0]
    plan = cache.groups.unwritten[0]
    held = sorted(s.node for s in plan.slots)
    annotated = copy.deepcopy(first)
    annotated["metadata"]["annotations"][labels.ANN_GROUP_PLAN] = plan.wire()
    assert json.loads(plan.wire())["slots"][0][0] == node
    again = synced([annotated])  # a new replica lists the pods
    single = filtered(again, gpu_pod("single", 4))[0]
    assert not set(single) & set(held)
    assert filtered(again, first)[0] == [node]  # the member its slot was for keeps it


def test_a_plan_whose_members_do_not_all_come_is_released_past_its_deadline() -> None:
    wall = [1000.0]
    cache = synced([], wall)
    node = filtered(cache, member("train", 0, 2))[0][0]
    assert node not in filtered(cache, gpu_pod("single", 4))[0]
    wall[0] += cache.groups.timeout + 1
    cache.groups.expire(cache)
    assert not cache.groups.plans
    assert "not bound within" in cache.groups.released[0][1]
    assert node in filtered(cache, gpu_pod("single", 4))[0]


@pytest.mark.parametrize(("annotations", "error"), [
    pytest.param({labels.ANN_GROUP: "g", labels.ANN_GROUP_SIZE: "many"}, "whole number", id="size"),
    pytest.param({labels.ANN_GROUP: "g", labels.ANN_GROUP_SIZE: "2", labels.ANN_GROUP_DOMAIN: "rack"},
                 "expected one of", id="domain"),
])
def test_a_bad_group_ask_fails_every_node_with_the_reason(annotations: dict[str, str], error: str) -> None:
    cache = synced([])
    passed, failed = filtered(cache, gpu_pod("bad", 4, annotations=annotations))
    assert passed == [] and all(error in why for why in failed.values())


def test_pods_of_one_group_must_ask_alike() -> None:
    cache = synced([])
    filtered(cache, member("train", 0, 3, gpus=4))
    passed, failed = filtered(cache, member("train", 1, 3, gpus=2))
    assert passed == [] and "must ask alike" in next(iter(failed.values()))


def test_pods_of_a_kube_scheduler_podgroup_are_planned_whole_in_its_clique() -> None:
    cache = synced([gpu_pod("busy", 2, node="gb-2-1")])
    cache.group_objects.reset("podgroup", podgroup_object, [{
        "metadata": {"name": "pg", "namespace": "default"},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 3}},
                 "schedulingConstraints": {"topology": [{"key": labels.GPU_CLIQUE}]}}}])
    places = []
    for i in range(3):
        pod = gpu_pod(f"pg-{i}", 4)
        pod["metadata"]["namespace"] = "default"
        pod["spec"]["schedulingGroup"] = {"podGroupName": "pg"}
        passed, _ = filtered(cache, pod)
        assert len(passed) == 1
        places.append(passed[0])
    assert len(set(places)) == 3 and {clique(p) for p in places} == {"2"}  # the clique in use that holds it
    plan = next(iter(cache.groups.plans.values()))
    assert plan.ref.domain == "required" and plan.domain == f"{labels.GPU_CLIQUE}=uuid-2.2"


def test_each_replica_of_a_1_35_workloads_pod_group_is_planned_whole_on_its_own() -> None:
    cache = synced([])
    cache.group_objects.reset("workload", workload_objects, [{
        "metadata": {"name": "train", "namespace": "default"},
        "spec": {"podGroups": [{"name": "workers", "policy": {"gang": {"minCount": 2}}}]}}])
    places: dict[str, list[str]] = {}
    for replica in ("r0", "r1"):
        for i in range(2):
            pod = gpu_pod(f"{replica}-{i}", 4)
            pod["metadata"]["namespace"] = "default"
            pod["spec"]["workloadRef"] = {"name": "train", "podGroup": "workers", "podGroupReplicaKey": replica}
            passed, _ = filtered(cache, pod)
            assert len(passed) == 1
            places.setdefault(replica, []).append(passed[0])
    assert sorted(p.ref.key for p in cache.groups.plans.values()) == [
        "default/workload/train/workers/r0", "default/workload/train/workers/r1"]
    assert all(p.ref.size == 2 for p in cache.groups.plans.values())
    assert len({n for nodes in places.values() for n in nodes}) == 4  # each member its own tray


def in_domain(cache: Cache, pod: dict[str, Any], clique_id: int) -> tuple[list[str], dict[str, str]]:
    """The filter as kube-scheduler's topology-aware scheduling (1.36) calls it: with one clique's nodes only."""
    names = [n for n in NAMES if clique(n) == str(clique_id)]
    body = args("filter-nodecache-true-pod-gpu4", names)
    body["Pod"] = pod
    answer = cache.group_answer(pod, wire.extender_args(body).demand, names)
    out = verbs.filter_nodes(cache.snapshot(), body, answer)
    return out["NodeNames"], {**out["FailedNodes"], **out["FailedAndUnresolvableNodes"]}


def clique_podgroup(cache: Cache, size: int) -> list[dict[str, Any]]:
    """A kube-scheduler PodGroup of ``size`` whose topology constraint names the clique label, and its pods."""
    cache.group_objects.reset("podgroup", podgroup_object, [{
        "metadata": {"name": "pg", "namespace": "default"},
        "spec": {"schedulingPolicy": {"gang": {"minCount": size}},
                 "schedulingConstraints": {"topology": [{"key": labels.GPU_CLIQUE}]}}}])
    pods = []
    for i in range(size):
        pod = gpu_pod(f"pg-{i}", 4)
        pod["metadata"]["namespace"] = "default"
        pod["spec"]["schedulingGroup"] = {"podGroupName": "pg"}
        pods.append(pod)
    return pods


@pytest.mark.parametrize("order", [(0, 2, 1), (1, 0, 2), (2, 1, 0)], ids=lambda o: "-".join(map(str, o)))
def test_a_podgroup_kube_scheduler_places_clique_by_clique_goes_to_the_clique_gpu_tailor_chooses(
        order: tuple[int, int, int]) -> None:
    """kube-scheduler tries each clique in turn (in no fixed order) and asks about every member with that clique's
    nodes: the group lands in the clique in use that holds it whichever clique is tried first; seen on 1.36.3 by
    tests/e2e/test_podgroups.py, where each group was planned in the first clique kube-scheduler tried."""
    cache = synced([gpu_pod("busy", 2, node="gb-2-1")])
    pods = clique_podgroup(cache, 3)
    passed: dict[int, list[str]] = {}
    for c in order:
        got = [in_domain(cache, pod, c) for pod in pods]
        passed[c] = [n for nodes, _ in got for n in nodes]
        if c != 2:  # before clique 2 is tried, the reason names it; after, each member's planned node there
            assert not passed[c]
            why = "goes whole into NVLink domain" if 2 not in passed else "its group's plan puts it on gb-2-"
            assert all(why in reason and (2 in passed or "uuid-2.2" in reason)
                       for _, failed in got for reason in failed.values()), got
    assert len(set(passed[2])) == 3 and "gb-2-1" not in passed[2]
    plan = next(iter(cache.groups.plans.values()))
    assert plan.domain == f"{labels.GPU_CLIQUE}=uuid-2.2" and not cache.groups.placements


def test_a_clique_kube_scheduler_never_asks_about_counts_no_more_once_it_has_tried_every_clique() -> None:
    """kube-scheduler's own filters pass no node of clique 2 (the pods' affinity, say), so the extender is never asked
    about it: the group waits for it one cycle, then goes to a clique kube-scheduler does ask about."""
    cache = synced([gpu_pod("busy", 2, node="gb-2-1")])
    pods = clique_podgroup(cache, 3)
    for c in (0, 1):  # the first cycle: clique 2, the best, may still be asked about
        assert not [n for pod in pods for n in in_domain(cache, pod, c)[0]]
    placed = {c: [n for pod in pods for n in in_domain(cache, pod, c)[0]] for c in (1, 0)}  # the next cycle
    assert sorted(len(nodes) for nodes in placed.values()) == [0, 3]
    assert not cache.groups.placements


def test_a_group_run_again_under_its_name_is_planned_again_once_the_last_run_is_gone() -> None:
    cache = synced([])
    first = [member("train", i, 2) for i in range(2)]
    for m in first:
        cache.apply_pod("MODIFIED", bound(m, filtered(cache, m)[0][0]))
    assert not cache.groups.plans
    done = bound(first[0], first[0]["spec"].get("nodeName") or "")
    done["status"] = {"phase": "Succeeded"}  # the first run ends: one pod succeeds, the other is deleted
    done["metadata"]["resourceVersion"] = "3"
    cache.apply_pod("MODIFIED", done)
    cache.apply_pod("DELETED", first[1])
    assert not cache.groups.settled
    again = [member("train", i, 2) for i in range(2)]
    for m in again:
        m["metadata"]["uid"] += "-again"
    passed = [filtered(cache, m)[0] for m in again]
    assert all(len(p) == 1 for p in passed) and passed[0] != passed[1]


async def test_a_released_plan_is_told_as_an_event_on_the_groups_first_pod() -> None:
    import asyncio

    from gpu_tailor.extender.server import GroupEvents

    wall = [1000.0]
    cache = synced([], wall)
    first = member("train", 0, 2)
    filtered(cache, first)
    wall[0] += cache.groups.timeout + 1
    cache.snapshot()  # a snapshot releases the plans past their deadline
    posted: list[tuple[str, str, str, str, str]] = []

    async def post(ns: str, name: str, uid: str, reason: str, message: str) -> None:
        posted.append((ns, name, uid, reason, message))

    events = GroupEvents()
    events.post = post
    events.drain(cache)
    await asyncio.gather(*events.tasks)
    meta = first["metadata"]
    ((ns, name, uid, reason, message),) = posted
    assert (ns, name, uid, reason) == (meta["namespace"], meta["name"], meta["uid"], "GroupPlanReleased")
    assert "2 of 2 pods not bound within 300s" in message
    assert not cache.groups.released and not cache.groups.plans


def test_a_members_gpus_are_predicted_as_the_device_plugin_sees_the_node_not_the_gpus_held_for_the_others() -> None:
    """The device plugin does not see the GPUs a plan holds for the members still to come: the first member on a node
    where the plan holds another member's GPUs may be handed those, and the prediction says so, both where
    kube-scheduler binds (the member seen bound) and where the extender binds (``plan_bind``). On real kubelets with
    NVIDIA's device plugin (tests/e2e/test_real_node_groups.py), the first of two members on a GB200 node was handed
    the GPUs held for the second, which the extender had predicted as sure to be the others (2 contradictions). The
    filter still keeps other pods off the GPUs held."""
    cache = synced([])
    members = [member("pair", i, 2, gpus=2) for i in range(2)]
    for m in members:
        cache.apply_pod("ADDED", m)
    node = filtered(cache, members[0])[0][0]
    assert filtered(cache, members[1])[0] == [node]  # both on one tray: 2 GPUs each
    plan = next(iter(cache.groups.plans.values()))
    other = plan.slots[1].gpus
    meta = members[0]["metadata"]
    rec = cache.pending(f"{meta['namespace']}/{meta['name']}", meta["uid"])
    assert rec is not None
    bind_plan = verbs.plan_bind(cache.snapshot(), rec, node)
    assert bind_plan.placement is not None and set(other) <= set(bind_plan.placement.maybe), bind_plan.placement
    cache.apply_pod("MODIFIED", bound(members[0], node))  # kube-scheduler bound it: the extender predicts its GPUs
    seen = cache.pods[f"{meta['namespace']}/{meta['name']}"].placement
    assert seen is not None and set(other) <= set(seen.maybe), seen
    # a single 2-GPU pod still finds no room on the tray: the second member's GPUs are held
    assert node not in filtered(cache, gpu_pod("single", 2))[0]


def test_two_groups_whose_names_join_alike_hold_apart() -> None:
    """A Workload's group key has more parts than others; joined with "-" two groups could share a reservation."""
    from gpu_tailor.extender.gangbook import Plan
    from gpu_tailor.gpumodel.groups import GroupRef
    from gpu_tailor.gpumodel.schedule import Demand

    keys = ["ns/workload/a-b/c", "ns/workload/a/b-c", "ns/workload/train/workers/0", "ns/workload/train/workers-0"]
    held = {Plan(GroupRef(k, k, 2), Demand("ns/p"), "", [], 0.0, "ns/p").reservation(0) for k in keys}
    assert len(held) == len(keys)
