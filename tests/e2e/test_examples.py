"""Each manifest of ``examples/``, applied with ``kubectl apply -f`` into the opted-in namespace as a user would, on
every release: its pods (a Deployment's replicas, a Job's pods) are admitted, rewritten as the example's comment
says (``tests/examples.py`` reads it: the backing annotation, the GPU resources or DRA claims) and bound by
gpu-tailor-scheduler to a node the comment names.

The fixture nodes offer what the device-plugin examples need (MIG A100s, time-sliced T4s, MPS V100s, an HGX board of
H100s). An example that says what it becomes on DRA pools runs there instead, on 1.34 and later: the DRA nodes and
ResourceSlices of ``tests/e2e/test_dra.py``, the device-plugin nodes cordoned.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext
from functools import partial

import pytest

from tests.e2e.cluster import Release
from tests.e2e.kube import Obj, api_path, wait_for
from tests.e2e.pods import Pods
from tests.e2e.services import Stack, pod_events
from tests.e2e.test_dra import GROUP, dra_pools
from tests.e2e.test_scheduling import assert_bound_where_it_fits
from tests.examples import Becomes, Example, examples

pytestmark = pytest.mark.e2e

EXAMPLES = examples()


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
    return cluster.kube.list(api_path("pods", ns), label_selector=selector(example))


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
    wait_for(lambda: not any(p["metadata"].get("ownerReferences") for p in owned_pods(cluster, example)), 30,
             f"the pods of {example.kind} {name} orphaned")
    for pod in owned_pods(cluster, example):
        if pod["metadata"].get("finalizers"):
            kube.patch(api_path("pods", ns, pod["metadata"]["name"]), {"metadata": {"finalizers": None}})
        pods.created.append((ns, pod["metadata"]["name"]))


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_example_is_admitted_rewritten_and_bound_as_its_comment_says(example: Example, becomes: Becomes,
                                                                      cluster: Stack, pods: Pods) -> None:
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
        if example.kind != "Pod":  # the controller's own object keeps the portable ask: each new pod is rewritten
            stored = cluster.kube.get(api_path(f"{example.kind.lower()}s", cluster.opted_in,
                                               example.manifest["metadata"]["name"],
                                               group="apps/v1" if example.kind == "Deployment" else "batch/v1"))
            limits = stored["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
            assert any(k.startswith("gpu-tailor.io/") for k in limits), limits
    finally:
        remove(cluster, example, pods)
