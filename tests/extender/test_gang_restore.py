"""A group's plan read back by a restarted extender (or a standby) when its first member, which carries the plan, is
bound already: kube-scheduler binds a member within milliseconds of its filter, so that is how a restart finds it.
The plan names that member only; members bound before the read-back are known by the GPUs they hold, whichever order
the pods and nodes are listed in, or claim their slot when they are listed after it."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpu_tailor.extender.cache import Cache
from gpu_tailor.extender.gangbook import Plan, reserved
from gpu_tailor.gpumodel import labels
from tests.extender.builders import gpu_pod
from tests.extender.test_gangs import NAMES, NODES, bound, clique, filtered, member

SIZE = 3  # of the four trays of a clique: one stays free


def relisted(pods: list[dict[str, Any]], nodes_first: bool) -> Cache:
    """A new replica's cache, listing pods and nodes in either order (its two relists race)."""
    cache = Cache(wall=lambda: 1000.0)
    if nodes_first:
        cache.reset_nodes(copy.deepcopy(NODES))
    cache.reset_pods(pods)
    if not nodes_first:
        cache.reset_nodes(copy.deepcopy(NODES))
    return cache


def first_members(cache: Cache, members: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], Plan]:
    """``members`` filtered and bound as kube-scheduler does, the first carrying the plan as written at its filter
    (naming that member only); the pods as a new replica lists them, and the plan."""
    seen = []
    wire = ""
    for m in members:
        (node,), _ = filtered(cache, m)
        if not wire:
            wire = next(iter(cache.groups.plans.values())).wire()
        seen.append(bound(m, node))
    plan = next(iter(cache.groups.plans.values()))
    seen[0]["metadata"]["annotations"][labels.ANN_GROUP_PLAN] = wire
    return seen, plan


@pytest.mark.parametrize("before", [1, 2], ids=["first-bound", "two-bound"])
@pytest.mark.parametrize("first_listed", [True, False], ids=["carrier-listed-first", "carrier-listed-last"])
@pytest.mark.parametrize("nodes_first", [True, False], ids=["nodes-first", "pods-first"])
def test_a_plan_on_a_bound_first_member_is_read_back_with_the_members_bound_before(
        before: int, first_listed: bool, nodes_first: bool) -> None:
    cache = Cache(wall=lambda: 1000.0)
    cache.reset_pods([])
    cache.reset_nodes(copy.deepcopy(NODES))
    members = [member("train", i, SIZE) for i in range(SIZE)]
    seen, plan = first_members(cache, members[:before])
    for i, pod in enumerate(seen):  # what a bound member shows: the GPUs recorded on it
        pod["metadata"]["annotations"][labels.ANN_GPUS] = ",".join(map(str, plan.slots[i].gpus))
    planned = {s.node for s in plan.slots}
    waiting = {s.node for s in plan.slots[before:]}

    again = relisted(seen if first_listed else seen[::-1], nodes_first)
    assert [k for k in again.pods if reserved(k)] and again.groups.plans
    # a single pod anywhere in the planned clique keeps off the trays still held
    in_clique = [n for n in NAMES if clique(n) == clique(plan.slots[0].node)]
    passed = filtered(again, gpu_pod("single", 4))[0]
    assert not set(passed) & waiting
    assert set(passed) & set(in_clique) - planned
    # the members still to come go where the plan put them, and then nothing is held any more
    for m in members[before:]:
        (node,), _ = filtered(again, m)
        assert node in waiting
        again.apply_pod("MODIFIED", bound(m, node))
    assert not again.groups.plans and not [k for k in again.pods if reserved(k)]


def test_a_member_listed_after_the_plan_claims_its_slot() -> None:
    """The members bound before the restart are listed after the pod carrying the plan: each claims the slot on its
    node, and only the slots of the members still to come stay held."""
    cache = Cache(wall=lambda: 1000.0)
    cache.reset_pods([])
    cache.reset_nodes(copy.deepcopy(NODES))
    members = [member("train", i, SIZE) for i in range(SIZE)]
    seen, plan = first_members(cache, members[:2])
    again = Cache(wall=lambda: 1000.0)
    again.reset_nodes(copy.deepcopy(NODES))
    again.reset_pods(seen[:1])  # the carrier first, then the watch shows the others
    assert len([k for k in again.pods if reserved(k)]) == SIZE - 1
    for pod in seen[1:]:
        again.apply_pod("MODIFIED", pod)
    held = [r.node for k, r in again.pods.items() if reserved(k)]
    assert held == [plan.slots[2].node]


def test_a_finished_group_is_not_held_again() -> None:
    """The first member of a group that ran carries its plan still: a restart within the plan's deadline holds
    nothing for it."""
    cache = Cache(wall=lambda: 1000.0)
    cache.reset_pods([])
    cache.reset_nodes(copy.deepcopy(NODES))
    members = [member("train", i, 2) for i in range(2)]
    seen, _ = first_members(cache, members)
    for pod in seen:
        pod["status"] = {"phase": "Succeeded"}
    again = relisted(seen, nodes_first=True)
    assert not again.groups.plans and not [k for k in again.pods if reserved(k)]
