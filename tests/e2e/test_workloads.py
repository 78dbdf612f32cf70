"""Kubernetes 1.35's own gang scheduling beside gpu-tailor: a ``scheduling.k8s.io/v1alpha1`` Workload whose pod group
has a gang policy (``minCount``), and pods that name it in ``spec.workloadRef`` (the Workload, the pod group, and a
replica key: each replica is a gang of its own), on a control plane of its own with the alpha gates
``GenericWorkload`` and ``GangScheduling`` on and that version served. gpu-tailor is installed as everywhere else; the
trays are ``test_gangs.py``'s: 50 GB200-like trays in three cliques of 18, 18 and 14.

1.35's Workload has no topology constraint: the pods ask for one NVLink domain with ``gpu-tailor.io/nvlink-domain:
required``. gpu-tailor sizes each replica's group from the Workload (the pods do not say it), lists and watches the
Workloads where the API server serves them, and places the group whole in the partly used clique that holds it; two
replicas of one pod group are planned apart. ``examples/workload-1-35.yaml`` applied as a user would, with ``kubectl
apply -f``, binds whole in one clique. 1.36 replaced this API with PodGroup (``test_podgroups.py``); on other
releases these tests skip.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpu_tailor.gpumodel import labels
from tests.e2e.cluster import Release
from tests.e2e.kube import Obj, api_path
from tests.e2e.pods import Pods, gpu_pod, unique
from tests.e2e.services import Stack, control_plane_with_gpu_tailor
from tests.e2e.test_examples import group_example_bound
from tests.e2e.test_gangs import (
    CLIQUES,
    FOUR,
    GANG,
    NO_DOMAIN,
    Trays,
    assert_sound,
    assert_whole,
    bound_all,
    holders,
    installed,
    nodes_of,
    plan_on,
    refusals,
    tray,
    wait_plan,
)

pytestmark = pytest.mark.e2e

GATES = "GenericWorkload=true,GangScheduling=true"
VERSION = "scheduling.k8s.io/v1alpha1"


@pytest.fixture(scope="module")
def gated(release: Release, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Trays]]:
    if release.minor != 35:
        pytest.skip(f"kube-scheduler's Workload ({VERSION}, spec.workloadRef) is 1.35's; {release.version} has "
                    "none" + (" (1.36 replaced it with PodGroup: test_podgroups.py)" if release.minor > 35 else ""))
    workdir = tmp_path_factory.mktemp(f"e2e-workloads-{release.version}")
    env = {"K8S_FEATURE_GATES": GATES, "K8S_RUNTIME_CONFIG": f"{VERSION}=true"}
    with (control_plane_with_gpu_tailor(release, workdir, env=env,
                                        scheduler_flags=[f"--feature-gates={GATES}"]) as stack,
          installed(stack, CLIQUES, tray) as made):
        yield stack, made


@pytest.fixture
def workloads(gated: tuple[Stack, Trays]) -> Iterator[list[str]]:
    """The names of the Workloads a test made, deleted after its pods (``pods`` depends on this fixture)."""
    stack, _ = gated
    made: list[str] = []
    yield made
    for name in made:
        stack.kube.delete(api_path("workloads", stack.opted_in, name, group=VERSION))


@pytest.fixture
def pods(gated: tuple[Stack, Trays], workloads: list[str]) -> Iterator[Pods]:
    stack, _ = gated
    tracker = Pods(stack.kube, stack.extender)
    yield tracker
    tracker.cleanup()


def create_workload(stack: Stack, made: list[str], name: str, size: int) -> None:
    """A Workload with one pod group, ``workers``, a gang of ``size``."""
    stack.kube.create(api_path("workloads", stack.opted_in, group=VERSION), {
        "apiVersion": VERSION, "kind": "Workload", "metadata": {"name": name},
        "spec": {"podGroups": [{"name": "workers", "policy": {"gang": {"minCount": size}}}]}})
    made.append(name)


def create_members(stack: Stack, pods: Pods, workload: str, replica: str, size: int) -> list[Obj]:
    """``size`` 4-GPU pods of the Workload's ``workers`` group, replica ``replica``, asking for one NVLink domain;
    the group's size is not on them."""
    created = []
    for i in range(size):
        pod = gpu_pod(f"{workload}-{replica}-{i}", FOUR, labels={GANG: f"{workload}-{replica}"},
                      annotations={labels.ANN_GROUP_DOMAIN: "required"})
        pod["spec"]["workloadRef"] = {"name": workload, "podGroup": "workers", "podGroupReplicaKey": replica}
        created.append(pods.create(stack.opted_in, pod))
    return created


def test_each_replica_of_a_workloads_gang_lands_whole_in_a_clique_sized_by_the_workload(
        gated: tuple[Stack, Trays], pods: Pods, workloads: list[str]) -> None:
    stack, trays = gated
    used = trays.by_clique["b"]
    holders(pods, stack.opted_in, {used[0]: "4", used[1]: "2"})  # b: partly used, 16 trays whole
    name = unique("wl")
    create_workload(stack, workloads, name, 4)
    first = create_members(stack, pods, name, "r0", 4)
    placed = bound_all(stack, pods, first)
    assert stack.kube.get(api_path("pods", stack.opted_in, first[0]["metadata"]["name"]))["spec"]["workloadRef"][
        "podGroupReplicaKey"] == "r0", "the API server dropped spec.workloadRef: is GenericWorkload on?"
    assert assert_whole(trays, placed) == "b"  # the clique in use that holds it
    plan = wait_plan(stack, pods, first)
    assert (plan.group, plan.size) == (f"{stack.opted_in}/workload/{name}/workers/r0", 4)  # sized by the Workload
    second = create_members(stack, pods, name, "r1", 4)
    again = bound_all(stack, pods, second)
    assert assert_whole(trays, again) == "b"
    assert not set(nodes_of(again)) & set(nodes_of(placed))
    assert wait_plan(stack, pods, second).group.endswith("/workers/r1")  # a gang of its own
    assert_sound(stack)


def test_a_workloads_gang_no_clique_holds_stays_pending_with_nothing_bound(
        gated: tuple[Stack, Trays], pods: Pods, workloads: list[str]) -> None:
    stack, trays = gated
    holders(pods, stack.opted_in, {trays.by_clique["a"][0]: "1", trays.by_clique["b"][0]: "1"})  # a, b hold 17
    name, size = unique("wl-wide"), CLIQUES["a"]  # the size is in the Workload: admission cannot refuse it
    create_workload(stack, workloads, name, size)
    created = create_members(stack, pods, name, "r0", size)
    for reason in refusals(stack, created):
        assert NO_DOMAIN in reason and "the most any domain holds now is 17" in reason, reason
    now = [pods.get(p) for p in created]
    assert not [p["metadata"]["name"] for p in now if p["spec"].get("nodeName")], "a member was bound"
    assert plan_on(pods, created) is None  # no plan, nothing held


def test_the_workload_example_binds_whole_where_it_says(gated: tuple[Stack, Trays], pods: Pods,
                                                       workloads: list[str]) -> None:
    """The example's Workload and Job, applied in one go: its pods are left as its comment says and bound whole where
    it says, both on the HGX board, a domain of its own (1.35's Workload has no topology constraint to keep them to
    the cliques' trays, and the board holds the group in one domain)."""
    stack, _ = gated
    with group_example_bound(stack, pods, "workload-1-35.yaml", "Workload", workloads) as (example, placed):
        assert set(nodes_of(placed)) <= set(example.becomes["fixture nodes"].nodes), nodes_of(placed)
        assert_sound(stack)
