"""Groups of pods placed whole ("gangs"), on a real kube-scheduler with the shipped profile: 50 GB200-like compute
trays (4 GPUs each, built from the h100-hgx-0 fixture as ``tests/extender/test_gangs.py`` builds them) in three NVLink
domains (``nvidia.com/gpu.clique``) of 18, 18 and 14 trays, created once for the module.

Each group is declared with gpu-tailor's own annotations (``gpu-tailor.io/group``, ``group-size``, ``nvlink-domain:
required``) on plain 4-GPU pods. What is checked: a group goes whole into the partly used clique that holds it, with
every member's GPUs recorded; a group as large as a clique fills an untouched clique; a group that fits no clique now
stays Pending, nothing of it bound, saying why, and one larger than every clique is refused at admission; the plan
written on the first member survives an extender restart; a single pod never takes a tray planned for a member still
to come; a group deleted and created again under its name is placed again.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import pytest

from gpu_tailor.gpumodel import labels
from tests.e2e.cluster import fixture_nodes, install_node
from tests.e2e.invariants import cluster_problems, pending_reason
from tests.e2e.kube import ApiError, Obj, api_path, wait_for
from tests.e2e.pods import Pods, gpu_pod, gpus_annotation, unique
from tests.e2e.services import Stack, failed_scheduling

pytestmark = pytest.mark.e2e

CLIQUES = {"a": 18, "b": 18, "c": 14}  # NVLink domain -> its trays: 50 nodes
TRAY_GPUS = 4
FOUR = {labels.GPU_RESOURCE: str(TRAY_GPUS)}
GANG = "e2e.gpu-tailor.io/gang"  # a label on every member, to list a group by
NO_DOMAIN = "fits in no NVLink domain as a whole"


def tray(clique: str, i: int) -> Obj:
    """An NVL72 compute tray as GFD labels one: four GB200 GPUs and its clique (``<cluster uuid>.<clique id>``)."""
    (hgx,) = [n for n in fixture_nodes() if n["metadata"]["name"] == "h100-hgx-0"]
    node = copy.deepcopy(hgx)
    name = f"gb200-{clique}-{i:02d}"
    node["metadata"]["name"] = name
    node["metadata"]["labels"].update({
        "kubernetes.io/hostname": name, labels.GPU_COUNT: str(TRAY_GPUS), labels.GPU_PRODUCT: "NVIDIA-GB200",
        labels.GPU_CLIQUE: f"7f3c2a9e-0d41-4b6e-9a55-{ord(clique):012x}.{ord(clique) - ord('a')}"})
    for part in ("capacity", "allocatable"):
        node["status"][part][labels.GPU_RESOURCE] = str(TRAY_GPUS)
    return node


@dataclass(frozen=True)
class Trays:
    """The module's trays by clique, and each tray's clique."""

    by_clique: dict[str, list[str]]

    def clique(self, node: str) -> str:
        return next(c for c, names in self.by_clique.items() if node in names)

    @property
    def all(self) -> list[str]:
        return [n for names in self.by_clique.values() for n in names]


@contextmanager
def installed(stack: Stack, cliques: dict[str, int], make: Callable[[str, int], Obj]) -> Iterator[Trays]:
    """The trays of ``cliques`` (``make(clique, i)`` each) on the control plane, deleted after."""
    made = Trays({c: [f"gb200-{c}-{i:02d}" for i in range(n)] for c, n in cliques.items()})
    try:
        for clique, names in made.by_clique.items():
            for i in range(len(names)):
                install_node(stack.kube, make(clique, i))
        yield made
    finally:
        for name in made.all:
            stack.kube.delete(api_path("nodes", name=name))
        wait_for(lambda: not [n for n in made.all if stack.kube.exists(api_path("nodes", name=n))], 60,
                 "the module's trays deleted")


@pytest.fixture(scope="module")
def trays(stack: Stack) -> Iterator[Trays]:
    with installed(stack, CLIQUES, tray) as made:
        yield made


def only_on(pod: Obj, nodes: Iterable[str]) -> Obj:
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": sorted(nodes)}]}]}}}
    return pod


def member(group: str, i: int, size: int, domain: str = "required") -> Obj:
    """Member ``i`` of ``group``: a 4-GPU pod with gpu-tailor's group annotations."""
    return gpu_pod(f"{group}-{i}", FOUR, labels={GANG: group}, annotations={
        labels.ANN_GROUP: group, labels.ANN_GROUP_SIZE: str(size), labels.ANN_GROUP_DOMAIN: domain})


def create_members(pods: Pods, ns: str, group: str, size: int, members: Iterable[int]) -> list[Obj]:
    return [pods.create(ns, member(group, i, size)) for i in members]


def bound_all(cluster: Stack, pods: Pods, created: list[Obj], timeout: float = 60) -> list[Obj]:
    """Every pod of ``created`` bound, with the GPUs the extender recorded on it; the pods as stored then."""
    for pod in created:
        pods.wait_bound(pod, timeout)
    for pod in created:  # the extender may see a bind after the test does: its record is waited for on the pod
        wait_for(partial(recorded, pods, pod), 30, f"the GPUs recorded on {pod['metadata']['name']}",
                 context=cluster.context)
    return [pods.get(pod) for pod in created]


def recorded(pods: Pods, pod: Obj) -> list[int]:
    return gpus_annotation(pods.get(pod))


def nodes_of(placed: list[Obj]) -> list[str]:
    return [p["spec"]["nodeName"] for p in placed]


@dataclass(frozen=True)
class Plan:
    """The group plan the extender wrote on its first member (``gpu-tailor.io/group-plan``)."""

    anchor: str
    group: str
    size: int
    domain: str
    slots: list[tuple[str, tuple[int, ...]]]

    @property
    def nodes(self) -> list[str]:
        return [node for node, _ in self.slots]


def plan_on(pods: Pods, created: list[Obj]) -> Plan | None:
    """The plan written on one of ``created``, or None while none carries one; two carrying one fail."""
    carried = []
    for pod in created:
        raw = (pods.get(pod)["metadata"].get("annotations") or {}).get(labels.ANN_GROUP_PLAN)
        if raw is not None:
            wire = json.loads(raw)
            carried.append(Plan(pod["metadata"]["name"], wire["group"], wire["size"], wire["domain"],
                                [(str(n), tuple(g)) for n, g, _ in wire["slots"]]))
    assert len(carried) <= 1, f"more than one member carries a plan: {carried}"
    return carried[0] if carried else None


def wait_plan(cluster: Stack, pods: Pods, created: list[Obj]) -> Plan:
    plan = wait_for(partial(plan_on, pods, created), 30, "the group's plan written on its first member",
                    context=cluster.context)
    assert plan is not None
    return plan


def assert_whole(trays: Trays, placed: list[Obj]) -> str:
    """Every member on a tray of its own in one clique, holding all four GPUs of it; that clique."""
    nodes = nodes_of(placed)
    assert len(set(nodes)) == len(nodes), f"two members on one tray: {sorted(nodes)}"
    cliques = {trays.clique(n) for n in nodes}
    assert len(cliques) == 1, f"the group spans cliques {sorted(cliques)}: {sorted(nodes)}"
    for pod in placed:
        assert sorted(gpus_annotation(pod)) == list(range(TRAY_GPUS)), pod["metadata"].get("annotations")
    return cliques.pop()


def assert_landed(cluster: Stack, pods: Pods, trays: Trays, created: list[Obj], clique: str, held: list[str],
                  group: str) -> None:
    """``created`` bound whole in ``clique``, on none of its trays ``held`` (single pods hold them), and the plan
    written for ``group`` (its key) in that clique's domain, naming the trays they run on."""
    placed = bound_all(cluster, pods, created)
    assert assert_whole(trays, placed) == clique
    assert not set(nodes_of(placed)) & set(held)
    plan = wait_plan(cluster, pods, created)
    assert plan.group == group and plan.domain.endswith(f".{ord(clique) - ord('a')}")
    assert sorted(plan.nodes) == sorted(nodes_of(placed))


def assert_sound(cluster: Stack) -> None:
    problems = cluster_problems(cluster.kube)
    assert not problems, "\n".join(problems)


def refusals(cluster: Stack, created: list[Obj]) -> list[str]:
    """The last FailedScheduling reason of every pod of ``created``, once each has one."""

    def all_refused() -> list[str]:
        reasons = [failed_scheduling(cluster.kube, p) for p in created]
        return [r[-1] for r in reasons] if all(reasons) else []

    got: list[str] = wait_for(all_refused, 60, "a FailedScheduling event on every member", context=cluster.context)
    return got


def holders(pods: Pods, ns: str, where: dict[str, str]) -> list[Obj]:
    """Single pods bound first, to make cliques partly used: node -> how many GPUs."""
    made = [pods.create(ns, gpu_pod(unique("holder"), {labels.GPU_RESOURCE: gpus}, node=node))
            for node, gpus in where.items()]
    placed = [pods.wait_bound(p) for p in made]
    assert nodes_of(placed) == list(where)
    return placed


def test_a_group_lands_whole_in_the_partly_used_clique_that_holds_it(cluster: Stack, pods: Pods,
                                                                     trays: Trays) -> None:
    ns = cluster.opted_in
    used = trays.by_clique["a"]
    holders(pods, ns, {used[0]: "4", used[1]: "4", used[2]: "2"})  # clique a: 15 trays whole, one half used
    group = unique("train")
    created = create_members(pods, ns, group, 6, range(6))
    assert_landed(cluster, pods, trays, created, "a", used[:3], f"{ns}/group/{group}")  # in use before untouched
    assert_sound(cluster)


def test_a_group_as_large_as_a_clique_fills_an_untouched_clique(cluster: Stack, pods: Pods, trays: Trays) -> None:
    ns = cluster.opted_in
    holders(pods, ns, {trays.by_clique["a"][0]: "2"})  # clique a holds 17 whole trays now, b 18, c 14
    size = CLIQUES["b"]
    placed = bound_all(cluster, pods, create_members(pods, ns, unique("full"), size, range(size)), timeout=90)
    assert assert_whole(trays, placed) == "b"
    assert sorted(nodes_of(placed)) == trays.by_clique["b"]
    assert_sound(cluster)


def test_a_group_no_clique_holds_now_stays_pending_with_nothing_bound(cluster: Stack, pods: Pods,
                                                                     trays: Trays) -> None:
    ns = cluster.opted_in
    holders(pods, ns, {trays.by_clique["a"][0]: "1", trays.by_clique["b"][0]: "1"})  # a and b hold 17 now
    size = CLIQUES["a"]
    created = create_members(pods, ns, unique("wide"), size, range(size))
    for reason in refusals(cluster, created):
        assert NO_DOMAIN in reason and "the most any domain holds now is 17" in reason, reason
        assert "no pod of it is bound until all fit" in reason
    now = [pods.get(p) for p in created]
    assert not [p["metadata"]["name"] for p in now if p["spec"].get("nodeName")], "a member was bound"
    assert all(NO_DOMAIN in pending_reason(cluster.kube, p) for p in now)
    assert plan_on(pods, created) is None  # no plan, nothing held


def test_a_group_larger_than_every_clique_is_refused_at_admission(cluster: Stack, pods: Pods, trays: Trays) -> None:
    ns = cluster.opted_in
    size = CLIQUES["a"] + 1
    with pytest.raises(ApiError) as refused:
        pods.create(ns, member(unique("huge"), 0, size))
    assert refused.value.status == 403
    assert f"need {size * TRAY_GPUS} GPUs in one NVLink domain" in refused.value.message
    assert f"the largest domain here has {CLIQUES['a'] * TRAY_GPUS}" in refused.value.message


@pytest.mark.parametrize("before", [1, 2], ids=["first-member-bound", "two-members-bound"])
def test_a_restarted_extender_keeps_the_plan(cluster: Stack, pods: Pods, trays: Trays, before: int) -> None:
    """The plan is written on the first member at its filter, and that member is bound at once: the restarted
    extender reads it back from a bound pod, and knows the members bound before it (the plan names only the first)."""
    ns = cluster.opted_in
    group, size = unique("resumed"), 4
    first = bound_all(cluster, pods, create_members(pods, ns, group, size, range(before)))
    plan = wait_plan(cluster, pods, first)
    assert plan.anchor == first[0]["metadata"]["name"] and first[0]["spec"]["nodeName"] == plan.nodes[0]
    cluster.extender.restart()
    # A single pod that may go anywhere in the planned clique keeps off the trays still held for the group.
    clique = trays.clique(plan.nodes[0])
    single = pods.wait_bound(pods.create(ns, only_on(gpu_pod(unique("single"), FOUR), trays.by_clique[clique])))
    assert single["spec"]["nodeName"] not in plan.nodes, f"a planned tray taken: {plan}"
    placed = [*first, *bound_all(cluster, pods, create_members(pods, ns, group, size, range(before, size)))]
    assert assert_whole(trays, placed) == clique
    assert sorted(nodes_of(placed)) == sorted(plan.nodes)
    held = dict(plan.slots)
    for pod in placed:
        assert tuple(gpus_annotation(pod)) == held[pod["spec"]["nodeName"]]
    assert_sound(cluster)


def test_a_single_pod_never_takes_a_tray_planned_for_a_member_to_come(cluster: Stack, pods: Pods,
                                                                      trays: Trays) -> None:
    ns = cluster.opted_in
    group, size = unique("held"), 5
    first = create_members(pods, ns, group, size, [0])
    plan = wait_plan(cluster, pods, first)
    clique = trays.clique(plan.nodes[0])
    assert {trays.clique(n) for n in plan.nodes} == {clique}
    for _ in range(2):
        single = pods.wait_bound(pods.create(ns, only_on(gpu_pod(unique("single"), FOUR), trays.by_clique[clique])))
        assert single["spec"]["nodeName"] not in plan.nodes, f"a planned tray taken: {plan}"
    placed = bound_all(cluster, pods, [*first, *create_members(pods, ns, group, size, range(1, size))])
    assert sorted(nodes_of(placed)) == sorted(plan.nodes)
    assert_sound(cluster)


def test_a_group_deleted_and_created_again_under_its_name_is_placed_again(cluster: Stack, pods: Pods,
                                                                          trays: Trays) -> None:
    """A LeaderWorkerSet group restarted, or a Job's pods replaced, come back under the group's name."""
    ns = cluster.opted_in
    group, size = unique("again"), 3
    for _ in range(2):
        placed = bound_all(cluster, pods, create_members(pods, ns, group, size, range(size)))
        assert_whole(trays, placed)
        pods.cleanup()


def test_an_indexed_jobs_pods_are_one_group_sized_by_its_parallelism(cluster: Stack, pods: Pods, trays: Trays) -> None:
    """No group annotation but the domain ask: the extender sizes the group from the Job (its watch of Jobs)."""
    ns, kube = cluster.opted_in, cluster.kube
    holders(pods, ns, {trays.by_clique["b"][0]: "2"})  # clique b is in use, and holds the group
    name = unique("indexed")
    template = gpu_pod("x", FOUR, annotations={labels.ANN_GROUP_DOMAIN: "required"})
    template["metadata"].pop("name")
    template["spec"]["restartPolicy"] = "Never"
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
           "spec": {"completionMode": "Indexed", "completions": 3, "parallelism": 3, "backoffLimit": 0,
                    "template": template}}
    kube.create(api_path("jobs", ns, group="batch/v1"), job)

    def made() -> list[Obj]:
        found = kube.list(api_path("pods", ns), label_selector=f"{labels.JOB_NAME}={name}")
        return found if len(found) == 3 and all(p["spec"].get("nodeName") for p in found) else []

    try:
        placed = bound_all(cluster, pods, wait_for(made, 60, f"the 3 pods of Job {name} bound",
                                                   context=cluster.context))
        assert assert_whole(trays, placed) == "b"
        plan = wait_plan(cluster, pods, placed)
        assert plan.group == f"{ns}/job/{name}" and sorted(plan.nodes) == sorted(nodes_of(placed))
    finally:
        kube.delete(api_path("jobs", ns, name, group="batch/v1"), propagation="Orphan")
        for pod in kube.list(api_path("pods", ns), label_selector=f"{labels.JOB_NAME}={name}"):
            if pod["metadata"].get("finalizers"):  # the Job controller's tracking finalizer, as it would take it off
                kube.patch(api_path("pods", ns, pod["metadata"]["name"]), {"metadata": {"finalizers": None}})
            pods.created.append((ns, pod["metadata"]["name"]))
