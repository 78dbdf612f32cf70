"""Kubernetes 1.36's own gang scheduling beside gpu-tailor: a ``scheduling.k8s.io/v1alpha2`` PodGroup (gang
``minCount``, a topology constraint on ``nvidia.com/gpu.clique``) and pods that name it in
``spec.schedulingGroup.podGroupName``, on a control plane of its own with the alpha gates ``GenericWorkload``,
``GangScheduling`` and ``TopologyAwareWorkloadScheduling`` on (API server, kube-controller-manager, the cluster's
kube-scheduler and gpu-tailor-scheduler) and that version served. gpu-tailor is installed as everywhere else
(``manifests/``, the webhook, the extender, gpu-tailor-scheduler); the trays are ``test_gangs.py``'s: 50 GB200-like
trays in three cliques of 18, 18 and 14.

kube-scheduler runs a PodGroup cycle once ``minCount`` pods exist: it tries every clique in turn as a "placement"
(in no fixed order), asks the extender about each member with that clique's nodes only, keeps a placement where every
member passed, binds them all, and sets the PodGroup's ``PodGroupScheduled`` condition (``Scheduled``, or
``Unschedulable``: "0/3 placements are available"). gpu-tailor sizes the group from ``minCount``, requires one clique
(the topology constraint), chooses the clique and the GPUs, and passes each member on its planned tray only.

Checked: a PodGroup lands whole in the partly used clique that holds it, whichever clique kube-scheduler tries first,
each member's GPUs recorded, the plan written on one member; a PodGroup no clique holds now (as large as a clique:
admission cannot refuse it, the size is not on the pod) stays Pending with nothing bound and the reason, on its pods
and on the PodGroup; ``examples/podgroup-1-36.yaml`` applied as a user would, with ``kubectl apply -f``, binds
whole in one clique, each pod rewritten as the example's comment says. On releases before 1.36 there is no such
PodGroup: the tests skip.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from gpu_tailor.gpumodel import labels
from tests.e2e.cluster import Release, install_node
from tests.e2e.invariants import pending_reason
from tests.e2e.kube import Obj, api_path, wait_for
from tests.e2e.pods import Pods, gpu_pod, unique
from tests.e2e.services import Stack, control_plane_with_gpu_tailor
from tests.e2e.test_examples import group_example_bound
from tests.e2e.test_gangs import (
    CLIQUES,
    FOUR,
    GANG,
    NO_DOMAIN,
    Trays,
    assert_landed,
    assert_sound,
    assert_whole,
    holders,
    plan_on,
    refusals,
    tray,
)

pytestmark = pytest.mark.e2e

GATES = ",".join(f"{g}=true" for g in ("GenericWorkload", "GangScheduling", "TopologyAwareWorkloadScheduling"))
VERSION = "scheduling.k8s.io/v1alpha2"


@dataclass(frozen=True)
class Gated:
    """The module's control plane with kube-scheduler's gang scheduling on, gpu-tailor running, and the trays."""

    stack: Stack
    trays: Trays


@pytest.fixture(scope="module")
def gated(release: Release, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gated]:
    if release.minor < 36:
        pytest.skip(f"kube-scheduler's PodGroup ({VERSION}, gang and topology constraints) is 1.36's; "
                    f"{release.version} has none")
    workdir = tmp_path_factory.mktemp(f"e2e-podgroups-{release.version}")
    env = {"K8S_FEATURE_GATES": GATES, "K8S_RUNTIME_CONFIG": f"{VERSION}=true"}
    with control_plane_with_gpu_tailor(release, workdir, env=env,
                                       scheduler_flags=[f"--feature-gates={GATES}"]) as stack:
        made = Trays({c: [f"gb200-{c}-{i:02d}" for i in range(n)] for c, n in CLIQUES.items()})
        for clique, names in made.by_clique.items():
            for i in range(len(names)):
                install_node(stack.kube, tray(clique, i))
        yield Gated(stack, made)


@pytest.fixture
def podgroups(gated: Gated) -> Iterator[list[str]]:
    """The names of the PodGroups a test made, deleted after its pods (``pods`` depends on this fixture)."""
    made: list[str] = []
    yield made
    for name in made:
        gated.stack.kube.delete(api_path("podgroups", gated.stack.opted_in, name, group=VERSION))


@pytest.fixture
def pods(gated: Gated, podgroups: list[str]) -> Iterator[Pods]:
    tracker = Pods(gated.stack.kube, gated.stack.extender)
    yield tracker
    tracker.cleanup()


def create_podgroup(stack: Stack, made: list[str], name: str, size: int) -> None:
    """A gang of ``size`` that kube-scheduler places in one clique (its topology constraint)."""
    stack.kube.create(api_path("podgroups", stack.opted_in, group=VERSION), {
        "apiVersion": VERSION, "kind": "PodGroup", "metadata": {"name": name},
        "spec": {"schedulingPolicy": {"gang": {"minCount": size}},
                 "schedulingConstraints": {"topology": [{"key": labels.GPU_CLIQUE}]}}})
    made.append(name)


def create_members(stack: Stack, pods: Pods, group: str, size: int) -> list[Obj]:
    """``size`` plain 4-GPU pods naming PodGroup ``group``: nothing of gpu-tailor's on them."""
    created = []
    for i in range(size):
        pod = gpu_pod(f"{group}-{i}", FOUR, labels={GANG: group})
        pod["spec"]["schedulingGroup"] = {"podGroupName": group}
        created.append(pods.create(stack.opted_in, pod))
    return created


def scheduled_condition(stack: Stack, name: str) -> Obj | None:
    """The PodGroup's ``PodGroupScheduled`` condition, which kube-scheduler sets; None until it does."""
    group = stack.kube.get(api_path("podgroups", stack.opted_in, name, group=VERSION))
    for cond in (group.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodGroupScheduled":
            found: Obj = cond
            return found
    return None


def wait_condition(stack: Stack, name: str, status: str) -> Obj:
    def reached() -> Obj:
        cond = scheduled_condition(stack, name)
        return cond if cond is not None and cond.get("status") == status else {}

    cond: Obj = wait_for(reached, 30, f"PodGroup {name} PodGroupScheduled={status}", context=stack.context)
    return cond


def test_a_podgroup_lands_whole_in_the_partly_used_clique_that_holds_it(gated: Gated, pods: Pods,
                                                                      podgroups: list[str]) -> None:
    stack, trays = gated.stack, gated.trays
    used = trays.by_clique["b"]  # not the first clique by name: kube-scheduler tries them in no fixed order
    holders(pods, stack.opted_in, {used[0]: "4", used[1]: "4", used[2]: "2"})  # b: 15 trays whole, one half used
    group = unique("pg")
    create_podgroup(stack, podgroups, group, 6)
    created = create_members(stack, pods, group, 6)
    assert_landed(stack, pods, trays, created, "b", used[:3], f"{stack.opted_in}/podgroup/{group}")  # in use first
    cond = wait_condition(stack, group, "True")
    assert cond.get("reason") == "Scheduled", cond
    assert_sound(stack)


def test_a_podgroup_no_clique_holds_now_stays_pending_with_nothing_bound(gated: Gated, pods: Pods,
                                                                        podgroups: list[str]) -> None:
    stack, trays = gated.stack, gated.trays
    holders(pods, stack.opted_in, {trays.by_clique["a"][0]: "1", trays.by_clique["b"][0]: "1"})  # a, b hold 17
    group, size = unique("pg-wide"), CLIQUES["a"]  # as many GPUs as a clique has: admission lets it in
    create_podgroup(stack, podgroups, group, size)
    created = create_members(stack, pods, group, size)
    for reason in refusals(stack, created):  # gpu-tailor's, in kube-scheduler's event, whichever clique it tried last
        assert NO_DOMAIN in reason and "the most any domain holds now is 17" in reason, reason
        assert "no pod of it is bound until all fit" in reason
    cond = wait_condition(stack, group, "False")
    assert cond.get("reason") == "Unschedulable" and "0/3 placements are available" in cond.get("message", ""), cond
    now = [pods.get(p) for p in created]
    assert not [p["metadata"]["name"] for p in now if p["spec"].get("nodeName")], "a member was bound"
    assert all(NO_DOMAIN in pending_reason(stack.kube, p) for p in now)
    assert plan_on(pods, created) is None  # no plan, nothing held


def test_the_podgroup_example_binds_whole_in_one_clique(gated: Gated, pods: Pods, podgroups: list[str]) -> None:
    """The example's PodGroup and Job, applied in one go: its pods are rewritten as its comment says and bound whole,
    a tray each in one clique (the fixture nodes, where the comment places a pod alone, carry no clique)."""
    stack, trays = gated.stack, gated.trays
    with group_example_bound(stack, pods, "podgroup-1-36.yaml", "PodGroup", podgroups) as (example, placed):
        assert_whole(trays, placed)
        group = example.extra[0]["metadata"]["name"]
        assert wait_condition(stack, group, "True").get("reason") == "Scheduled"
        assert_sound(stack)
