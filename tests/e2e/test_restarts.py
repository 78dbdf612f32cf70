"""Each gpu-tailor service killed (SIGKILL, as a crash or an OOM kill) and started again while the cluster
keeps working: what the API shows before, during and after."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.kube import ApiError, api_path, wait_for
from tests.e2e.pods import Pods, gpu_pod, gpus_annotation, limits_of, unique
from tests.e2e.services import Stack, failed_scheduling

pytestmark = pytest.mark.e2e

HGX = "h100-hgx-0"


def test_restarted_extender_never_hands_out_a_gpu_twice(cluster: Stack, pods: Pods) -> None:
    ns = cluster.opted_in
    first = pods.wait_bound(pods.create(ns, gpu_pod(unique("before-crash"), {"nvidia.com/gpu": "3"}, node=HGX)))
    cluster.extender.kill()
    # While it is down, kube-scheduler cannot ask it (ignorable: false): a GPU pod waits instead of being
    # bound with no GPUs recorded. (kube-scheduler v1.28 retries such a pod only about a minute later,
    # so this one is deleted rather than waited for.)
    waiting = pods.create(ns, gpu_pod(unique("during-crash"), {"nvidia.com/gpu": "1"}, node=HGX))
    events = wait_for(lambda: failed_scheduling(cluster.kube, waiting), 30,
                      "kube-scheduler to report the unreachable extender", context=cluster.context)
    assert "connection refused" in events[0], events
    assert not pods.get(waiting)["spec"].get("nodeName")
    pods.delete(ns, waiting["metadata"]["name"])

    cluster.extender.start()
    # The restarted extender learns the GPUs of the first pod from its annotation.
    second = pods.wait_bound(pods.create(ns, gpu_pod(unique("after-crash"), {"nvidia.com/gpu": "3"}, node=HGX)))
    third = pods.wait_bound(pods.create(ns, gpu_pod(unique("after-crash"), {"nvidia.com/gpu": "2"}, node=HGX)))
    held = [recorded(pods, p, cluster) for p in (first, second, third)]
    assert [len(g) for g in held] == [3, 3, 2], held
    assert sorted(g for gpus in held for g in gpus) == list(range(8)), f"a GPU handed out twice: {held}"
    assert {p["spec"]["nodeName"] for p in (first, second, third)} == {HGX}


def recorded(pods: Pods, pod: dict[str, Any], cluster: Stack) -> list[int]:
    """The GPUs the extender recorded on ``pod``, waited for on the pod itself: the extender may see the bind after
    the test does, and then has no record pending yet when ``wait_bound`` asks."""
    return wait_for(lambda: gpus_annotation(pods.get(pod)), 30, f"the GPUs recorded on {pod['metadata']['name']}",
                    context=cluster.context)


def certificate_state(cluster: Stack) -> tuple[object, list[str]]:
    """The Secret the webhook keeps its CA and certificate in, and the caBundle it wrote."""
    secret = cluster.kube.get(api_path("secrets", "gpu-tailor", "gpu-tailor-webhook-tls"))
    config = cluster.kube.get(api_path("mutatingwebhookconfigurations", name="gpu-tailor",
                                       group="admissionregistration.k8s.io/v1"))
    return secret["data"], [w["clientConfig"].get("caBundle", "") for w in config["webhooks"]]


def test_webhook_down_refuses_gpu_asks_lets_cpu_pods_through_and_recovers(cluster: Stack, pods: Pods) -> None:
    ns = cluster.opted_in
    before = certificate_state(cluster)
    assert all(before[1]), "the webhook wrote no caBundle"
    cluster.webhook.kill()
    init_only = gpu_pod(unique("init-gpu"), {"cpu": "100m"})
    init_only["spec"]["initContainers"] = [{"name": "warm", "image": "busybox", "command": ["true"],
                                            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    # failurePolicy: Fail for whatever may ask for a GPU -- refused, not let through with an ask nothing can
    # schedule, a native ask unchecked, or a forged GPU annotation
    for pod in (gpu_pod(unique("portable"), {"gpu-tailor.io/gpu-milli": "250"}),
                gpu_pod(unique("native"), {"nvidia.com/gpu": "1"}),
                init_only,
                gpu_pod(unique("forged"), {"cpu": "100m"}, annotations={"gpu-tailor.io/gpus": "0,1"})):
        name = pod["metadata"]["name"]
        with pytest.raises(ApiError) as refused:
            pods.create(ns, pod)
        assert refused.value.status == 500, name
        assert 'failed calling webhook "pods.gpu-tailor.io"' in refused.value.message, name
        assert "connection refused" in refused.value.message
        assert not cluster.kube.exists(api_path("pods", ns, name))
    # failurePolicy: Ignore for the rest: a CPU-only pod is created as it is, for the default scheduler
    cpu_only = pods.create(ns, gpu_pod(unique("cpu-only"), {"cpu": "100m", "memory": "64Mi"},
                                       annotations={"team": "a"}))
    assert pods.get(cpu_only)["spec"]["schedulerName"] == "default-scheduler"
    # namespaces that did not opt in do not depend on the webhook
    pods.create(cluster.plain, gpu_pod(unique("not-opted-in"), {"cpu": "100m"}))

    cluster.webhook.start()
    # The restarted webhook serves the certificate kept in its Secret, which the caBundle already trusts.
    created = pods.create(ns, gpu_pod(unique("after-webhook-restart"), {"gpu-tailor.io/gpu-milli": "250"}))
    assert limits_of(pods.get(created), "main") == {"nvidia.com/gpu": "1"}
    assert certificate_state(cluster) == before, "a restart made a new certificate or rewrote the caBundle"
