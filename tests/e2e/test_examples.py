"""Each manifest of ``examples/``, applied with ``kubectl apply -f`` into the opted-in namespace as a user would, on
every release: its pods (a Deployment's replicas, a Job's pods) are admitted, rewritten as the example's comment
says (``tests/examples.py`` reads it: the backing annotation, the GPU resources or DRA claims) and bound by
gpu-tailor-scheduler to a node the comment names.

The fixture nodes offer what the device-plugin examples need (MIG A100s, time-sliced T4s, MPS V100s, an HGX board of
H100s). An example that says what it becomes on DRA pools runs there instead, on 1.34 and later: the DRA nodes and
ResourceSlices of ``tests/e2e/test_dra.py``, the device-plugin nodes cordoned.

An example whose pods are one group has its plan checked too: the plan gpu-tailor writes on one of the pods
(``gpu-tailor.io/group-plan``) names the group and the size the comment says, and the nodes the pods were bound to.
A file may hold the object that sizes the group beside its workload: the whole file is applied, and that object
deleted after the pods. For scheduler-plugins' coscheduling PodGroup, a CRD these control planes do not have, the
module installs a stand-in written for these tests (``coscheduling-podgroup-crd.yaml``).

The JobSet example runs with JobSet's controller beside the control plane (``tests/e2e/jobset.py``), where its binary
is found. Not applied here, each skipped with the reason: the LeaderWorkerSet example (no such controller on these
control planes; ``tests/test_example_groups.py`` makes its pods as that controller would and reads its group),
1.36's PodGroup and 1.35's Workload (served only with alpha feature gates on; ``tests/e2e/test_podgroups.py`` and
``test_workloads.py`` apply those examples on such control planes).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path

import pytest

from tests.e2e.cluster import Release
from tests.e2e.jobset import API as JOBSET_API
from tests.e2e.jobset import NAME_LABEL, jobset_controller, jobset_home
from tests.e2e.kube import ApiError, Kube, Obj, api_path, wait_for
from tests.e2e.pods import Pods
from tests.e2e.services import Service, Stack, pod_events
from tests.e2e.test_dra import GROUP, dra_pools
from tests.e2e.test_gangs import bound_all, nodes_of, wait_plan
from tests.e2e.test_scheduling import assert_bound_where_it_fits
from tests.examples import EXAMPLES as EXAMPLE_FOLDER
from tests.examples import Becomes, Example, examples, load

pytestmark = pytest.mark.e2e

EXAMPLES = examples()
COSCHEDULING = "scheduling.x-k8s.io/v1alpha1"
CRD = Path(__file__).with_name("coscheduling-podgroup-crd.yaml")
CRD_NAME = "podgroups.scheduling.x-k8s.io"
NO_CONTROLLER = "no {} controller runs on the test control planes (tests/test_example_groups.py makes its pods)"
GATED = {"scheduling.k8s.io/v1alpha2": "Kubernetes 1.36's PodGroup is served only with alpha feature gates on "
                                       "(tests/e2e/test_podgroups.py applies this example on such a control plane)",
         "scheduling.k8s.io/v1alpha1": "Kubernetes 1.35's Workload is served only with alpha feature gates on "
                                       "(tests/e2e/test_workloads.py applies this example on such a control plane)"}


def not_applied(example: Example) -> str | None:
    """Why the example cannot be applied on the module's control plane, or None."""
    if example.kind == "LeaderWorkerSet":
        return f"{example.path.name}: {NO_CONTROLLER.format(example.kind)}"
    if example.kind == "JobSet" and jobset_home()[0] is None:
        return f"{example.path.name}: {jobset_home()[1]}"
    gated = [GATED[d["apiVersion"]] for d in example.extra if d.get("apiVersion") in GATED]
    return f"{example.path.name}: {gated[0]}" if gated else None


def served(kube: Kube, group_version: str, plural: str) -> bool:
    """Whether discovery lists ``plural`` in ``group_version``."""
    try:
        found = kube.get(f"/apis/{group_version}")
    except ApiError as exc:
        if exc.status == 404:
            return False
        raise
    return any(r.get("name") == plural for r in found.get("resources") or [])


def established(kube: Kube, name: str) -> bool:
    crd = kube.get(api_path("customresourcedefinitions", name=name, group="apiextensions.k8s.io/v1"))
    return any(c.get("type") == "Established" and c.get("status") == "True"
               for c in (crd.get("status") or {}).get("conditions") or [])


def since_start(service: Service) -> str:
    """The service's log since it last started (its log file is kept across restarts)."""
    return service.log.read_text(errors="replace").rsplit("\n===== start #", 1)[-1]


@pytest.fixture(scope="module")
def coscheduling(stack: Stack) -> Iterator[None]:
    """scheduler-plugins' coscheduling PodGroup served (the CRD, our stand-in), and an extender that watches it.
    The extender asks discovery about a group API it found not served only every minute (``RECHECK`` in
    ``kube/groupobjects.py``), so it is started again once discovery serves the CRD, and its log says when it watches;
    after the module the CRD is deleted and the extender started again, leaving no watch of a gone API behind."""
    kube = stack.kube
    stack.cp.kubectl("apply", "-f", str(CRD))
    try:
        wait_for(partial(established, kube, CRD_NAME), 30, f"CRD {CRD_NAME} Established")
        wait_for(partial(served, kube, COSCHEDULING, "podgroups"), 30, f"discovery serving podgroups in {COSCHEDULING}")
        stack.extender.restart()
        # what kube/groupobjects.py logs when it starts listing and watching them
        wait_for(lambda: f"watching podgroups ({COSCHEDULING})" in since_start(stack.extender), 30,
                 "the extender to watch coscheduling PodGroups", context=stack.extender.tail)
        yield
    finally:
        kube.delete(api_path("customresourcedefinitions", name=CRD_NAME, group="apiextensions.k8s.io/v1"))
        wait_for(lambda: not served(kube, COSCHEDULING, "podgroups"), 60, f"{COSCHEDULING} no longer served")
        stack.extender.restart()


@pytest.fixture
def applicable(example: Example, request: pytest.FixtureRequest) -> None:
    """The example can be applied here: skipped, saying why, where it cannot; the API it needs installed."""
    why = not_applied(example)
    if why is not None:
        pytest.skip(why)
    if any(d.get("apiVersion") == COSCHEDULING for d in example.extra):
        request.getfixturevalue("coscheduling")
    if example.kind == "JobSet":
        request.getfixturevalue("jobsets")


@pytest.fixture(scope="module")
def jobsets(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """JobSet's controller running beside the control plane, for the module's JobSet examples."""
    home, _ = jobset_home()
    assert home is not None
    with jobset_controller(stack, home, tmp_path_factory.mktemp("jobset")):
        yield


@pytest.fixture
def extras(cluster: Stack) -> Iterator[list[str]]:
    """The API paths of the objects an example makes beside its workload (its group's PodGroup), deleted after its
    pods (``pods`` depends on this fixture)."""
    made: list[str] = []
    yield made
    for path in made:
        cluster.kube.delete(path)


@pytest.fixture
def pods(cluster: Stack, extras: list[str]) -> Iterator[Pods]:
    tracker = Pods(cluster.kube, cluster.extender)
    yield tracker
    tracker.cleanup()


def extra_path(ns: str, doc: Obj) -> str:
    """Where the API serves one of an example's other documents (the kinds there make their plural with an "s")."""
    return api_path(f"{doc['kind'].lower()}s", ns, doc["metadata"]["name"], group=doc["apiVersion"])


@pytest.fixture
def becomes(example: Example, release: Release, cluster: Stack) -> Iterator[Becomes]:
    """What the example's pods must become on this release's cluster: on DRA pools where the example says, set up
    for the test and removed after it (its pods, deleted by ``pods``, go first)."""
    dra = example.becomes.get("DRA pools")
    if dra is not None and release.minor < 34:
        pytest.skip(f"{example.path.name} is a DRA ask; {release.version} serves no {GROUP} (DRA is GA from 1.34)")
    with dra_pools(cluster) if dra is not None else nullcontext(cluster):
        yield dra or example.becomes["fixture nodes"]


def owned_pods(cluster: Stack, example: Example) -> list[Obj]:
    """The pods the example made: itself, or those whose owner (a Job, a Deployment's ReplicaSet) it made."""
    ns, name = cluster.opted_in, example.manifest["metadata"]["name"]
    if example.kind == "Pod":
        return [cluster.kube.get(api_path("pods", ns, name))]
    if example.kind == "Job":
        return cluster.kube.list(api_path("pods", ns), label_selector=f"job-name={name}")
    if example.kind == "JobSet":
        return cluster.kube.list(api_path("pods", ns), label_selector=f"{NAME_LABEL}={name}")
    return cluster.kube.list(api_path("pods", ns), label_selector=selector(example))


def child_jobs(cluster: Stack, jobset: str) -> list[Obj]:
    return cluster.kube.list(api_path("jobs", cluster.opted_in, group="batch/v1"),
                             label_selector=f"{NAME_LABEL}={jobset}")


def stored_limits(cluster: Stack, example: Example) -> dict[str, str]:
    """The first container's limits in the pod template of the example's workload, as the API stores it."""
    kind, name = example.kind, example.manifest["metadata"]["name"]
    group = {"Deployment": "apps/v1", "JobSet": JOBSET_API}.get(kind, "batch/v1")
    spec = cluster.kube.get(api_path(f"{kind.lower()}s", cluster.opted_in, name, group=group))["spec"]
    if kind == "JobSet":
        spec = spec["replicatedJobs"][0]["template"]["spec"]
    limits: dict[str, str] = spec["template"]["spec"]["containers"][0]["resources"]["limits"]
    return limits


def selector(example: Example) -> str:
    return ",".join(f"{k}={v}" for k, v in example.manifest["spec"]["selector"]["matchLabels"].items())


def all_bound(cluster: Stack, example: Example) -> list[Obj]:
    made = owned_pods(cluster, example)
    return made if len(made) == example.replicas and all(p["spec"].get("nodeName") for p in made) else []


def remove(cluster: Stack, example: Example, pods: Pods) -> None:
    """Delete what ``kubectl apply`` made. A Job or Deployment is deleted orphaning its pods (and a Deployment's
    ReplicaSet too), so nothing makes new ones; then ``pods`` force-deletes the pods (no kubelet would finish a
    graceful deletion). A Job's pods carry the Job controller's tracking finalizer, taken off here, as the controller
    would once it counted them."""
    ns, name = cluster.opted_in, example.manifest["metadata"]["name"]
    kube = cluster.kube
    if example.kind == "Pod":
        pods.created.append((ns, name))
        return
    if example.kind == "Deployment":
        kube.delete(api_path("deployments", ns, name, group="apps/v1"), propagation="Orphan")
        # the ReplicaSet by its labels (the template's): its owner reference may be gone already
        for rs in kube.list(api_path("replicasets", ns, group="apps/v1"), label_selector=selector(example)):
            kube.delete(api_path("replicasets", ns, rs["metadata"]["name"], group="apps/v1"), propagation="Orphan")
    elif example.kind == "Job":
        kube.delete(api_path("jobs", ns, name, group="batch/v1"), propagation="Orphan")
    elif example.kind == "JobSet":  # its child Jobs orphaned, then each of them orphaning its pods
        kube.delete(api_path("jobsets", ns, name, group=JOBSET_API), propagation="Orphan")
        wait_for(lambda: not any(j["metadata"].get("ownerReferences") for j in child_jobs(cluster, name)), 30,
                 f"the Jobs of JobSet {name} orphaned")
        for job in child_jobs(cluster, name):
            kube.delete(api_path("jobs", ns, job["metadata"]["name"], group="batch/v1"), propagation="Orphan")
    wait_for(lambda: not any(p["metadata"].get("ownerReferences") for p in owned_pods(cluster, example)), 30,
             f"the pods of {example.kind} {name} orphaned")
    for pod in owned_pods(cluster, example):
        if pod["metadata"].get("finalizers"):
            kube.patch(api_path("pods", ns, pod["metadata"]["name"]), {"metadata": {"finalizers": None}})
        pods.created.append((ns, pod["metadata"]["name"]))


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_example_is_admitted_rewritten_and_bound_as_its_comment_says(example: Example, applicable: None,
                                                                      becomes: Becomes, cluster: Stack,
                                                                      extras: list[str], pods: Pods) -> None:
    extras.extend(extra_path(cluster.opted_in, doc) for doc in example.extra)
    applied = cluster.cp.kubectl("apply", "-n", cluster.opted_in, "-f", str(example.path))
    assert "created" in applied, applied
    try:
        made = wait_for(partial(all_bound, cluster, example), 60,
                        f"{example.replicas} pod(s) of {example.path.name} bound", context=cluster.context)
        for pod in made:
            where = f"{example.path.name}: pod {pod['metadata']['name']}"
            assert "gpu-tailor.io/ask" in pod["metadata"]["annotations"], where  # admitted through the webhook
            becomes.check(pod, where)
            node = pod["spec"]["nodeName"]
            assert node in becomes.nodes, f"{where}: on {node}, not {becomes.nodes}: {pod_events(cluster.kube, pod)}"
            assert_bound_where_it_fits(cluster, pod, node)  # by gpu-tailor-scheduler, on a node that sells it
        if example.group is not None:  # placed as one group: the plan names it, sized as the comment says
            plan = wait_plan(cluster, pods, made)
            assert plan.group == example.group.key_in(cluster.opted_in) and plan.size == example.group.size, plan
            assert sorted(plan.nodes) == sorted(p["spec"]["nodeName"] for p in made), plan
        if example.kind != "Pod":  # the controller's own object keeps the portable ask: each new pod is rewritten
            limits = stored_limits(cluster, example)
            assert any(k.startswith("gpu-tailor.io/") for k in limits), limits
    finally:
        remove(cluster, example, pods)


@contextmanager
def group_example_bound(stack: Stack, pods: Pods, name: str, kind: str,
                        made: list[str]) -> Iterator[tuple[Example, list[Obj]]]:
    """``examples/<name>``, a group object of ``kind`` (kube-scheduler's own, named in ``made`` to be deleted after
    the pods) and its workload, applied in one go with ``kubectl apply -f`` on a control plane that serves that kind:
    the example, and its pods once all are bound, each rewritten as the comment says, the group's plan naming the
    group and the size it says; what it made removed after."""
    example = load(EXAMPLE_FOLDER / name)
    said = example.group
    assert said is not None and [d["kind"] for d in example.extra] == [kind]
    group = example.extra[0]["metadata"]["name"]
    made.append(group)
    applied = stack.cp.kubectl("apply", "-n", stack.opted_in, "-f", str(example.path))
    assert f"{kind.lower()}.scheduling.k8s.io/{group} created" in applied, applied
    try:
        ready = wait_for(partial(all_bound, stack, example), 60, f"the {example.replicas} pods of {name} bound",
                         context=stack.context)
        placed = bound_all(stack, pods, ready)
        for pod in placed:
            example.becomes["fixture nodes"].check(pod, f"{name}: pod {pod['metadata']['name']}")
        plan = wait_plan(stack, pods, placed)
        assert plan.group == said.key_in(stack.opted_in) and plan.size == said.size, plan
        assert sorted(plan.nodes) == sorted(nodes_of(placed))
        yield example, placed
    finally:
        remove(stack, example, pods)
