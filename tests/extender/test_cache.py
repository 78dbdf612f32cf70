"""The extender's cache: assume, confirm, forget, expiry, relists, and node events that keep every pod's GPUs.

Clusters are the fixture nodes and the real ExtenderArgs pods; time is a fake clock, so nothing sleeps.
"""

from __future__ import annotations

import copy
import math
import sys
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import pytest

from gpu_tailor.extender import verbs
from gpu_tailor.extender.cache import ASSUMED_TTL, Cache
from gpu_tailor.extender.records import PodRecord
from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.occupancy import Placement
from tests.conftest import node_fixture
from tests.extender.builders import NODE_NAMES, RecordingBinder, args, cluster, gpu_pod, pod_of

HGX = "h100-hgx-0"
KEY = "gpu-jobs/train-gpu4"  # the pod of the bind-pod-gpu4 fixture (4 whole GPUs)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def bound(pod: dict[str, Any], node: str, gpus: str | None = None) -> dict[str, Any]:
    """``pod`` as the watch shows it once bound to ``node`` (with the annotation bind wrote, if any)."""
    out = copy.deepcopy(pod)
    out["spec"]["nodeName"], out["status"] = node, {"phase": "Running"}
    out["metadata"]["resourceVersion"] = str(int(out["metadata"].get("resourceVersion") or 0) + 1)  # a new write
    if gpus is not None:
        out["metadata"]["annotations"] = {**(out["metadata"].get("annotations") or {}), labels.ANN_GPUS: gpus}
    return out


def relabelled(name: str) -> dict[str, Any]:
    """The node with one more label: a node update that changes its inventory (so the node is rebuilt)."""
    node = node_fixture(name)
    node["metadata"]["labels"]["example.com/rack"] = "r7"
    return node


def holds(cache: Cache, key: str) -> tuple[int, ...] | None:
    rec = cache.pods[key]
    return rec.placement.gpus if rec.placement is not None else None


def bind(cache: Cache, key: str, node: str = HGX) -> tuple[int, ...]:
    """Bind as the server does: plan on a snapshot, assume, the API takes the Binding."""
    rec = cache.pending(key, "")
    assert rec is not None
    plan = verbs.plan_bind(cache.snapshot(), rec, node)
    assert not plan.error and plan.placement is not None, plan
    cache.assume(rec, node, plan.placement)
    cache.finish_binding(rec.key, rec.uid)
    return plan.placement.gpus


def second() -> dict[str, Any]:
    """Another replica with the same 4-GPU ask."""
    pod = pod_of("filter-nodecache-true-pod-gpu4")
    pod["metadata"].update(name="train-gpu4-b", uid="uid-b")
    return pod


def confirmed_then_node_modified(cache: Cache) -> None:
    cache.apply_pod("MODIFIED", bound(pod_of("filter-nodecache-true-pod-gpu4"), HGX, "0,1,2,3"))
    cache.apply_node("MODIFIED", relabelled(HGX))


def relisted_bound_then_node_modified(cache: Cache) -> None:
    cache.reset_pods([bound(pod_of("filter-nodecache-true-pod-gpu4"), HGX), second()])
    cache.apply_node("MODIFIED", relabelled(HGX))


# what may happen between a bind and the next one; the bound pod must keep its GPUs through all of it
EVENTS: list[tuple[str, Callable[[Cache], None]]] = [
    ("node-modified-unchanged", lambda c: c.apply_node("MODIFIED", node_fixture(HGX))),
    ("node-modified-relabelled", lambda c: c.apply_node("MODIFIED", relabelled(HGX))),
    ("node-relist", lambda c: c.reset_nodes([node_fixture(n) for n in NODE_NAMES])),
    ("pod-relist-still-pending", lambda c: c.reset_pods([pod_of("filter-nodecache-true-pod-gpu4"), second()])),
    ("watch-confirms-unannotated", lambda c: c.apply_pod("MODIFIED", bound(pod_of("filter-nodecache-true-pod-gpu4"),
                                                                           HGX))),
    ("watch-confirms-then-node-modified", confirmed_then_node_modified),
    ("pod-relist-bound-then-node-modified", relisted_bound_then_node_modified),
]


@pytest.mark.parametrize("event", [e[1] for e in EVENTS], ids=[e[0] for e in EVENTS])
def test_a_bound_pod_keeps_its_gpus_and_the_next_bind_gets_the_others(event: Callable[[Cache], None]) -> None:
    """The reported bug: bind chose GPUs 0-3, a node MODIFIED event re-predicted the pod onto 2-5."""
    cache = cluster([second()])
    assert bind(cache, KEY) == (0, 1, 2, 3)
    event(cache)
    assert holds(cache, KEY) == (0, 1, 2, 3)
    assert cache.nodes[HGX].gpus.free_whole() == [4, 5, 6, 7]
    out = verbs.filter_nodes(cache.snapshot(), args("filter-nodecache-true-pod-high-gpu8-after-preemption", [HGX]))
    assert out["FailedNodes"] == {HGX: "8 whole GPUs asked, 4 of 8 free"}
    assert bind(cache, "gpu-jobs/train-gpu4-b") == (4, 5, 6, 7)


def test_a_node_update_does_not_move_pods_placed_in_another_order() -> None:
    """How the bug came about: the node's pods were placed again in the order they were first listed, so a
    pod placed *after* the bind (bound without an annotation, its GPUs predicted) took GPUs first."""
    other = gpu_pod("other", 2)  # listed before the bound pod, bound to the node after it
    cache = cluster([other])
    assert bind(cache, KEY) == (0, 1, 2, 3)
    cache.apply_pod("MODIFIED", bound(other, HGX))  # bound by someone else: no annotation, GPUs predicted
    predicted = holds(cache, "gpu-jobs/other")
    assert predicted is not None and not set(predicted) & {0, 1, 2, 3}
    cache.apply_node("MODIFIED", relabelled(HGX))
    assert holds(cache, KEY) == (0, 1, 2, 3) and holds(cache, "gpu-jobs/other") == predicted
    cache.apply_pod("MODIFIED", bound(other, HGX))  # a status update of the other pod: it stays put too
    assert holds(cache, "gpu-jobs/other") == predicted


CONFIRMS = [  # (annotation the watch shows, GPUs the pod holds afterwards)
    pytest.param(None, (0, 1, 2, 3), id="no-annotation-yet"),
    pytest.param("0,1,2,3", (0, 1, 2, 3), id="the-annotation-bind-wrote"),
    pytest.param("4,5,6,7", (4, 5, 6, 7), id="its-annotation-says-otherwise"),
    pytest.param("oops", (0, 1, 2, 3), id="unreadable-annotation"),
]


@pytest.mark.parametrize(("annotation", "gpus"), CONFIRMS)
def test_confirm_keeps_the_gpus_chosen_at_bind_unless_the_pod_says_otherwise(annotation: str | None,
                                                                              gpus: tuple[int, ...]) -> None:
    cache = cluster()
    bind(cache, KEY)
    cache.apply_pod("MODIFIED", bound(pod_of("filter-nodecache-true-pod-gpu4"), HGX, annotation))
    rec = cache.pods[KEY]
    assert not rec.assumed and rec.node == HGX and holds(cache, KEY) == gpus
    assert cache.assumed == set()
    assert cache.nodes[HGX].gpus.free_whole() == sorted(set(range(8)) - set(gpus))


def test_the_watch_showing_the_pod_still_pending_leaves_the_assumption() -> None:
    cache = cluster()
    bind(cache, KEY)
    cache.apply_pod("MODIFIED", pod_of("filter-nodecache-true-pod-gpu4"))
    assert cache.pods[KEY].assumed and holds(cache, KEY) == (0, 1, 2, 3)


def test_an_assumption_the_watch_never_confirms_expires() -> None:
    clock = Clock()
    cache = cluster(clock=clock)
    rec = cache.pods[KEY]
    cache.assume(rec, HGX, verbs.plan_bind(cache.snapshot(), rec, HGX).placement)
    clock.now += 10 * ASSUMED_TTL
    cache.snapshot()
    assert cache.pods[KEY].deadline == math.inf  # the Binding is in flight: never expires
    cache.finish_binding(KEY, rec.uid)
    clock.now += ASSUMED_TTL - 1
    cache.snapshot()
    assert cache.pods[KEY].assumed and cache.nodes[HGX].gpus.free_whole() == [4, 5, 6, 7]
    clock.now += 1
    snap = cache.snapshot()  # expiry is checked whenever a request takes a snapshot
    assert not cache.pods[KEY].assumed and cache.pods[KEY].node == ""
    assert snap.nodes[HGX].state.gpus.free_whole() == list(range(8)) and KEY not in snap.nodes[HGX].pods


def test_forget_frees_the_gpus_of_that_pod_only() -> None:
    cache = cluster()
    bind(cache, KEY)
    cache.forget(KEY, "uid-someone-else")  # a newer pod of that name: not the one assumed
    assert cache.pods[KEY].assumed
    cache.forget(KEY, cache.pods[KEY].uid)
    assert not cache.pods[KEY].assumed and cache.pods[KEY].node == "" and holds(cache, KEY) is None
    assert cache.nodes[HGX].gpus.free_whole() == list(range(8))


async def test_a_refused_binding_forgets_the_assumption(client_for: Any) -> None:
    cache = cluster()
    client = await client_for(cache, RecordingBinder(fail=True))
    out = await (await client.post("/bind", json=args("bind-pod-gpu4"))).json()
    assert "409" in out["Error"] and cache.assumed == set()
    assert cache.snapshot().nodes[HGX].state.gpus.free_whole() == list(range(8))


def the_pod() -> dict[str, Any]:
    return pod_of("filter-nodecache-true-pod-gpu4")


def replaced() -> dict[str, Any]:
    pod = the_pod()
    pod["metadata"]["uid"] = "uid-new"
    return pod


RELISTS = [  # (seconds after the Binding was taken, pods listed, what the pod is afterwards)
    pytest.param(1, [], "assumed", id="unexpired-not-listed-kept"),
    pytest.param(1, [the_pod()], "assumed", id="listed-still-pending-kept"),
    pytest.param(1, [bound(the_pod(), HGX)], "confirmed", id="listed-bound-there-confirmed-same-gpus"),
    pytest.param(1, [bound(the_pod(), "h100-degraded-0")], "elsewhere", id="listed-bound-elsewhere"),
    pytest.param(1, [replaced()], "replaced", id="listed-under-another-uid"),
    pytest.param(ASSUMED_TTL + 1, [], "gone", id="expired-not-listed-dropped"),
]


@pytest.mark.parametrize(("after", "listed", "expected"), RELISTS)
def test_a_pod_relist_keeps_unexpired_assumptions_and_drops_what_the_list_lacks(
        after: float, listed: list[dict[str, Any]], expected: str) -> None:
    clock = Clock()
    held = gpu_pod("held", 2, node=HGX, annotations={labels.ANN_GPUS: "6,7"})
    cache = cluster([held], clock=clock)
    bind(cache, KEY)
    clock.now += after
    cache.reset_pods(listed)  # a relist after a watch outage: the held pod was deleted meanwhile
    assert "gpu-jobs/held" not in cache.pods  # confirmed pods come from the list only
    rec = cache.pods.get(KEY)
    free = cache.nodes[HGX].gpus.free_whole()
    if expected == "assumed":
        assert rec is not None and rec.assumed and holds(cache, KEY) == (0, 1, 2, 3) and free == [4, 5, 6, 7]
    elif expected == "confirmed":
        assert rec is not None and not rec.assumed and holds(cache, KEY) == (0, 1, 2, 3) and free == [4, 5, 6, 7]
    elif expected == "elsewhere":
        assert rec is not None and not rec.assumed and rec.node == "h100-degraded-0" and free == list(range(8))
    elif expected == "replaced":
        assert rec is not None and rec.uid == "uid-new" and rec.node == "" and free == list(range(8))
    else:
        assert rec is None and free == list(range(8))


@pytest.mark.parametrize("elsewhere", [0, 300], ids=["no-other-pods", "300-pods-on-other-nodes"])
def test_a_node_event_visits_only_that_nodes_pods(monkeypatch: pytest.MonkeyPatch, elsewhere: int) -> None:
    """The per-node index: the work of a node event does not grow with the pods on other nodes."""
    others = [n for n in NODE_NAMES if n != HGX]
    pods = [gpu_pod(f"here-{i}", 1, node=HGX, annotations={labels.ANN_GPUS: str(i)}) for i in range(3)]
    for i in range(elsewhere):
        pod = gpu_pod(f"far-{i}", 1, node=others[i % len(others)])
        pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "10m"}}
        pods.append(pod)
    cache = cluster(pods)
    cache.snapshot()
    visited: list[str] = []
    place = cache._place

    def counted(rec: PodRecord, refit: bool = False) -> PodRecord:
        visited.append(rec.key)
        return place(rec, refit)

    monkeypatch.setattr(cache, "_place", counted)
    cache.apply_node("MODIFIED", relabelled(HGX))
    assert sorted(visited) == ["gpu-jobs/here-0", "gpu-jobs/here-1", "gpu-jobs/here-2"]
    assert [s.whole_by for s in cache.nodes[HGX].gpus.slots[:3]] == [f"gpu-jobs/here-{i}" for i in range(3)]
    assert set(cache._dirty) == {HGX}  # the next snapshot copies that node only
    visited.clear()
    cache.apply_node("MODIFIED", relabelled(HGX))  # the same object again (a status heartbeat): nothing to do
    assert visited == []


def test_a_snapshot_copies_only_the_nodes_that_changed_and_is_never_written_to() -> None:
    cache = cluster()
    first = cache.snapshot()
    before = dict(first.nodes)
    bind(cache, KEY)
    snap = cache.snapshot()
    changed = {n for n in NODE_NAMES if snap.nodes[n] is not before[n]}
    assert changed == {HGX} and snap.nodes[HGX].generation > before[HGX].generation
    assert before[HGX].state.gpus.free_whole() == list(range(8))  # the entry a request read stays as it was
    assert snap.nodes[HGX].state.gpus.free_whole() == [4, 5, 6, 7]
    assert snap.nodes[HGX].state is not cache.nodes[HGX]  # decisions never read the writer's own state
    assert set(snap.nodes[HGX].pods) == {KEY}
    row = snap.fleet.index[HGX]
    assert snap.fleet.gpu[row].tolist() == [0, 0, 0, 0, 1000, 1000, 1000, 1000]  # rows follow the snapshot


def test_records_are_small_and_hold_no_pod_object() -> None:
    cache = cluster([gpu_pod("held", 2, node=HGX, annotations={labels.ANN_GPUS: "6,7"})])
    cache.remember(second())
    records = [*cache.pods.values(), *cache.asked.values()]
    assert [f.name for f in fields(PodRecord)] == ["uid", "node", "demand", "placement", "recorded", "deadline",
                                                 "version", "among", "scored"]
    for rec in records:
        assert not hasattr(rec, "__dict__")  # slots only
        assert not any(isinstance(getattr(rec, f.name), dict) for f in fields(PodRecord))
        size = sys.getsizeof(rec) + sys.getsizeof(rec.demand) + sys.getsizeof(rec.placement)
        assert size < 400, size


@pytest.mark.parametrize(("placement", "annotation"), [
    pytest.param(None, None, id="no-gpus"),
    pytest.param(Placement((0, 1, 2, 3)), "0,1,2,3", id="whole-gpus"),
    pytest.param(Placement((1, 0, 0), whole=False, replicas=1), "0,0,1", id="replicas"),
    pytest.param(Placement((), whole=False, mig_profile="1g.5gb", unplaced=2), None, id="mig-units-not-placed"),
])
def test_bind_annotates_the_gpus_it_knows(placement: Placement | None, annotation: str | None) -> None:
    assert verbs.BindPlan(placement).gpus == annotation


def test_a_pick_among_equals_is_recorded_as_the_set_and_read_back() -> None:
    """The 4-GPU pod on the idle NVSwitch board: any four GPUs may be handed out. Bind writes one pick and the set;
    after a restart the set is read back with the pick, and the node agent's report of four others is no
    contradiction. A pod bound after it is as unsure until the report says where the first went."""
    cache = cluster()
    rec = cache.pending(KEY, "")
    assert rec is not None
    plan = verbs.plan_bind(cache.snapshot(), rec, HGX)
    assert (plan.gpus, plan.among) == ("0,1,2,3", "0,1,2,3,4,5,6,7")
    seen = bound(pod_of("filter-nodecache-true-pod-gpu4"), HGX, plan.gpus)
    seen["metadata"]["annotations"][labels.ANN_GPUS_AMONG] = plan.among

    restarted = Cache()
    restarted.reset_pods([seen, second()])
    restarted.reset_nodes([node_fixture(n) for n in NODE_NAMES])
    placed = restarted.pods[KEY].placement
    assert placed is not None and (placed.gpus, placed.maybe) == ((0, 1, 2, 3), tuple(range(8)))
    following = verbs.plan_bind(restarted.snapshot(), restarted.pods["gpu-jobs/train-gpu4-b"], HGX)
    assert (following.gpus, following.among) == ("4,5,6,7", "0,1,2,3,4,5,6,7")
    assert restarted.snapshot().nodes[HGX].state.gpus.surely_free() == []

    restarted.apply_report("ADDED", {"metadata": {"name": HGX}, "spec": {
        "node": HGX, "observedAt": "2026-11-26T12:00:00Z", "gpus": [{"index": i, "healthy": True} for i in range(8)],
        "pods": [{"namespace": "gpu-jobs", "name": "train-gpu4", "container": "main", "resource": "nvidia.com/gpu",
                  "gpus": [2, 3, 6, 7]}]}})
    assert restarted.contradictions == 0
    assert holds(restarted, KEY) == (2, 3, 6, 7)
    state = restarted.snapshot().nodes[HGX].state.gpus
    assert state.surely_free() == [0, 1, 4, 5]
    after = verbs.plan_bind(restarted.snapshot(), restarted.pods["gpu-jobs/train-gpu4-b"], HGX)
    assert (after.gpus, after.among) == ("0,1,4,5", None)  # known now: the one set left


def test_a_pod_settled_by_a_report_is_not_placed_again_on_each_event() -> None:
    """A report puts the pod on other GPUs than bind's annotation names (a pick within the set): the pod's later
    events, with the same annotation, change nothing on its node."""
    cache = cluster()
    rec = cache.pending(KEY, "")
    assert rec is not None
    plan = verbs.plan_bind(cache.snapshot(), rec, HGX)
    seen = bound(pod_of("filter-nodecache-true-pod-gpu4"), HGX, plan.gpus)
    seen["metadata"]["annotations"][labels.ANN_GPUS_AMONG] = plan.among
    cache.apply_pod("MODIFIED", seen)
    cache.apply_report("ADDED", {"metadata": {"name": HGX}, "spec": {
        "node": HGX, "observedAt": "2026-11-26T12:00:00Z", "gpus": [{"index": i, "healthy": True} for i in range(8)],
        "pods": [{"namespace": "gpu-jobs", "name": "train-gpu4", "container": "main", "resource": "nvidia.com/gpu",
                  "gpus": [2, 3, 6, 7]}]}})
    generation = cache.generation[HGX]
    for _ in range(3):  # status updates, as a kubelet writes them
        seen = copy.deepcopy(seen)
        seen["metadata"]["resourceVersion"] = str(int(seen["metadata"]["resourceVersion"]) + 1)
        cache.apply_pod("MODIFIED", seen)
    assert cache.generation[HGX] == generation and holds(cache, KEY) == (2, 3, 6, 7)
