"""Scheduling through a real kube-scheduler running manifests/scheduler's configuration with the extender:
what the API shows after the webhook rewrote a pod and gpu-tailor-scheduler placed it, and what a person
reads on a pod nothing can hold."""

from __future__ import annotations

import pytest

from tests.e2e.kube import Obj, api_path, wait_for
from tests.e2e.pods import Pods, gpu_pod, gpus_annotation, limits_of, pod_from_review, requests_of, unique
from tests.e2e.services import SCHEDULER_NAME, Stack, event_sources, extender_metric, failed_scheduling, pod_events

pytestmark = pytest.mark.e2e

HGX, DEGRADED = "h100-hgx-0", "h100-degraded-0"


def nvidia_limits(pod: Obj) -> dict[str, int]:
    out: dict[str, int] = {}
    for key in ("initContainers", "containers"):
        for c in pod["spec"].get(key) or []:
            for name, value in ((c.get("resources") or {}).get("limits") or {}).items():
                if name.startswith("nvidia.com/"):
                    out[name] = max(out.get(name, 0), int(value))
    return out


def assert_bound_where_it_fits(cluster: Stack, pod: Obj, node_name: str) -> Obj:
    node = cluster.kube.get(api_path("nodes", name=node_name))
    for resource, units in nvidia_limits(pod).items():
        assert int(node["status"]["allocatable"].get(resource, "0")) >= units, \
            f"{pod['metadata']['name']} asks {units} {resource}; {node_name} allocates {node['status']['allocatable']}"
    assert pod["spec"]["schedulerName"] == SCHEDULER_NAME
    scheduled_by = wait_for(lambda: event_sources(cluster.kube, pod, "Scheduled"), 10, "the Scheduled event")
    assert scheduled_by == [SCHEDULER_NAME]
    return node


# Where each admitted fixture pod belongs on the fixture nodes, worked out by hand: whole GPUs on the
# healthy H100 (the degraded one is scored last), a quarter GPU on the time-sliced T4 (4 replicas),
# a 10 GiB ask on the A100 MIG 2g.10gb slices, native asks on the only node selling that resource.
PLACEMENTS = {
    "a": HGX,
    "k": HGX,
    "d": "t4-timeslice-0",
    "e": "a100-mig-mixed-0",
    "h": "a100-mig-mixed-0",
}
WHOLE_GPUS = {"a": 2, "k": 1}


@pytest.mark.parametrize("letter", sorted(PLACEMENTS))
def test_rewritten_pod_is_bound_by_gpu_tailor_scheduler(letter: str, cluster: Stack, pods: Pods) -> None:
    created = pods.create(cluster.opted_in, pod_from_review(letter))
    bound = pods.wait_bound(created)
    node_name = bound["spec"]["nodeName"]
    assert node_name == PLACEMENTS[letter], pod_events(cluster.kube, bound)
    node = assert_bound_where_it_fits(cluster, bound, node_name)
    if letter in WHOLE_GPUS:
        gpus = gpus_annotation(bound)
        assert len(set(gpus)) == len(gpus) == WHOLE_GPUS[letter], bound["metadata"].get("annotations")
        assert all(0 <= g < int(node["metadata"]["labels"]["nvidia.com/gpu.count"]) for g in gpus)


def test_a_pod_nothing_can_hold_says_why_in_gpu_terms(cluster: Stack, pods: Pods) -> None:
    # One GPU of the only healthy 8-GPU node is taken; the degraded H100 has 5 of its 8 GPUs.
    holder = pods.create(cluster.opted_in, gpu_pod(unique("hold-one"), {"nvidia.com/gpu": "1"}, node=HGX))
    assert pods.wait_bound(holder)["spec"]["nodeName"] == HGX
    big = pods.create(cluster.opted_in, gpu_pod(unique("eight-gpus"), {"nvidia.com/gpu": "8"}))
    events = wait_for(lambda: failed_scheduling(cluster.kube, big), 30, "a FailedScheduling event",
                      context=cluster.context)
    message = events[-1]
    assert "0/9 nodes are available" in message
    # kube-scheduler counts nvidia.com/gpu itself (ignoredByScheduler: false), so the nodes short of 8 --
    # the two H100s among them -- are turned away before the extender is asked ...
    assert "Insufficient nvidia.com/gpu" in message
    # ... and the extender says why the nodes that do sell 8 units of nvidia.com/gpu cannot give 8 GPUs.
    for sold_as in ("mig-1g.5gb", "shared:mps:10", "shared:time-slicing:4"):
        assert f"node sells nvidia.com/gpu as {sold_as}: 8 units would be 8 slices or replicas, not 8 GPUs" \
            in message
    assert not pods.get(big)["spec"].get("nodeName")


def test_deployment_replicas_are_rewritten_and_bound(cluster: Stack, pods: Pods) -> None:
    """Pods made by the ReplicaSet controller (no name, an owner, another user) go through the same path."""
    name = unique("milli-deploy")
    template = pod_from_review("i")
    template["metadata"] = {"labels": {"app": name}}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
                  "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name}}, "template": template}}
    apps = api_path("deployments", cluster.opted_in, group="apps/v1")
    cluster.kube.create(apps, deployment)
    try:
        def replicas_bound() -> list[Obj]:
            items = cluster.kube.list(api_path("pods", cluster.opted_in), label_selector=f"app={name}")
            return items if len(items) == 2 and all(p["spec"].get("nodeName") for p in items) else []

        wait_for(replicas_bound, 60, f"2 bound pods of Deployment {name}", context=cluster.context)
        cluster.wait_records()
        replicas = replicas_bound()
        held: dict[str, list[int]] = {}
        for pod in replicas:
            assert pod["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
            assert limits_of(pod, "main") == requests_of(pod, "main") == {"nvidia.com/gpu": "1"}
            assert pod["metadata"]["annotations"]["gpu-tailor.io/backing"] == "whole"
            node = assert_bound_where_it_fits(cluster, pod, pod["spec"]["nodeName"])
            assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
            gpus = gpus_annotation(pod)
            assert len(gpus) == 1
            assert not set(gpus) & set(held.get(pod["spec"]["nodeName"], [])), "one GPU handed out twice"
            held.setdefault(pod["spec"]["nodeName"], []).extend(gpus)
    finally:
        remove_deployment(cluster, name, pods)


def remove_deployment(cluster: Stack, name: str, pods: Pods) -> None:
    """Orphan the ReplicaSet and its pods so that nothing recreates them, then force-delete the pods."""
    ns = cluster.opted_in
    cluster.kube.delete(api_path("deployments", ns, name, group="apps/v1"), propagation="Orphan")
    for rs in cluster.kube.list(api_path("replicasets", ns, group="apps/v1"), label_selector=f"app={name}"):
        cluster.kube.delete(api_path("replicasets", ns, rs["metadata"]["name"], group="apps/v1"), propagation="Orphan")
    for pod in cluster.kube.list(api_path("pods", ns), label_selector=f"app={name}"):
        pods.created.append((ns, pod["metadata"]["name"]))


def test_admitted_two_replica_shared_ask_is_placed(cluster: Stack, pods: Pods) -> None:
    """Fixture g: two replicas of the renamed time-sliced T4 (nvidia.com/gpu.shared: 2). The webhook admits
    it, warning only that two replicas give no more GPU than one; the device plugin (without
    failRequestsGreaterThanOne) would run it; so it must be placed on the node that sells that resource."""
    created = pods.create(cluster.opted_in, pod_from_review("g"))
    assert any("not combined into more GPU" in w for w in cluster.kube.warnings)
    bound = pods.wait_bound(created)
    assert bound["spec"]["nodeName"] == "t4-timeslice-renamed-0"
    assert_bound_where_it_fits(cluster, bound, "t4-timeslice-renamed-0")


def _extender_filters(cluster: Stack) -> float:
    """How many filter calls the extender has answered, from its /metrics."""
    return extender_metric(cluster.extender, "gpu_tailor_extender_requests_total", verb="filter", outcome="ok") or 0.0


def test_a_cpu_only_pod_of_an_opted_in_namespace_is_placed_and_bound_through_the_extender(
        cluster: Stack, pods: Pods) -> None:
    # The webhook names gpu-tailor-scheduler (cpuOnlyPods), and with no managedResources kube-scheduler
    # asks the extender about it, as it does for GPU pods, and binds it.
    before = _extender_filters(cluster)
    created = pods.create(cluster.opted_in, pod_from_review("l", unique("cpu-only")))
    assert not nvidia_limits(created)
    bound = pods.wait_bound(created)
    assert_bound_where_it_fits(cluster, bound, bound["spec"]["nodeName"])
    assert _extender_filters(cluster) >= before + 1
    assert "gpu-tailor.io/gpus" not in (bound["metadata"].get("annotations") or {})
