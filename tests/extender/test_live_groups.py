"""A group's object read on the spot: a pod that reaches the filter before the watch has delivered the PodGroup,
Workload or Job that sizes its group is placed with its group, not as a single pod."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from gpu_tailor.extender.cache import Cache
from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.groups import GroupObjects, group_of, podgroup_object, resolved, sizing_object
from gpu_tailor.kube.groupobjects import ABSENT_FOR, LiveGroups
from tests.extender.builders import args, gpu_pod
from tests.extender.test_gangs import NAMES, NODES

PODGROUP = {"apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup",
            "metadata": {"name": "workers", "namespace": "gpu-jobs"},
            "spec": {"schedulingPolicy": {"gang": {"minCount": 3}},
                     "schedulingConstraints": {"topology": [{"key": labels.GPU_CLIQUE}]}}}


def podgroup_member(i: int) -> dict[str, Any]:
    pod = gpu_pod(f"workers-{i}", 4)
    pod["spec"]["schedulingGroup"] = {"podGroupName": "workers"}
    return pod


class Getter:
    """A namespaced GET of one object kind: answers ``found`` (or raises ``error``), counting the calls."""

    def __init__(self, found: dict[str, Any] | None = None, error: Exception | None = None) -> None:
        self.found, self.error, self.calls = found, error, 0

    async def __call__(self, *, namespace: str, name: str, **_: Any) -> dict[str, Any]:
        self.calls += 1
        if self.error is not None:
            raise self.error
        assert self.found is not None and (namespace, name) == ("gpu-jobs", self.found["metadata"]["name"])
        return copy.deepcopy(self.found)


def test_the_object_that_sizes_a_group_is_named_by_its_kind() -> None:
    def ref(pod: dict[str, Any]) -> Any:
        got = group_of(pod)
        assert got is not None
        return got

    assert sizing_object(ref(podgroup_member(0))) == ("podgroup", "gpu-jobs", "workers")
    workload = gpu_pod("w-0", 4)
    workload["spec"]["workloadRef"] = {"name": "train", "podGroup": "workers", "podGroupReplicaKey": "1"}
    assert sizing_object(ref(workload)) == ("workload", "gpu-jobs", "train")
    job = gpu_pod("j-0", 4)
    job["metadata"]["labels"] = {labels.JOB_NAME: "indexed"}
    job["metadata"]["annotations"] = {labels.JOB_COMPLETION_INDEX: "0"}
    assert sizing_object(ref(job)) == ("job", "gpu-jobs", "indexed")
    own = gpu_pod("o-0", 4, annotations={labels.ANN_GROUP: "own", labels.ANN_GROUP_SIZE: "2"})
    assert sizing_object(ref(own)) is None  # the pod says its size: no object to read


async def test_a_podgroup_the_watch_has_not_delivered_is_read_and_sizes_the_group() -> None:
    store = GroupObjects()
    live = LiveGroups(store)
    get = Getter(PODGROUP)
    live.getters["podgroup"] = (get, podgroup_object)
    ref = group_of(podgroup_member(0))
    assert ref is not None and resolved(ref, store.objects, (labels.GPU_CLIQUE,)).size == 0
    await live.fetch(ref)
    sized = resolved(ref, store.objects, (labels.GPU_CLIQUE,))
    assert (sized.size, sized.domain, sized.by_domain) == (3, "required", True)
    await live.fetch(ref)
    assert get.calls == 1  # known now: not read again
    store.apply("podgroup", podgroup_object, "DELETED", PODGROUP)  # the watch's own events replace what was read
    assert resolved(ref, store.objects, (labels.GPU_CLIQUE,)).size == 0


@pytest.mark.parametrize("error", [ApiException(status=404), ApiException(status=500), TimeoutError()],
                         ids=["absent", "server-error", "timeout"])
async def test_an_object_that_cannot_be_read_is_not_asked_for_again_at_once(error: Exception) -> None:
    now = [100.0]
    store = GroupObjects()
    live = LiveGroups(store, clock=lambda: now[0])
    get = Getter(error=error)
    live.getters["podgroup"] = (get, podgroup_object)
    ref = group_of(podgroup_member(0))
    assert ref is not None
    await live.fetch(ref)
    await live.fetch(ref)
    assert get.calls == 1 and not store.objects
    now[0] += ABSENT_FOR
    await live.fetch(ref)
    assert get.calls == 2


async def test_a_kind_not_served_is_not_asked_for() -> None:
    live = LiveGroups(GroupObjects())
    ref = group_of(podgroup_member(0))
    assert ref is not None
    await live.fetch(ref)  # no getter: the API server serves no PodGroups (yet)
    assert not live.asked


async def test_the_filter_reads_a_missing_podgroup_before_it_answers(client_for: Any) -> None:
    """Through the extender's HTTP filter: a member of a PodGroup the watch has not delivered is planned with its
    group (one tray of the clique kube-scheduler's gates ask for), not passed everywhere as a single pod."""
    cache = Cache()
    cache.reset_pods([])
    cache.reset_nodes(copy.deepcopy(NODES))
    live = LiveGroups(cache.group_objects)
    live.getters["podgroup"] = (Getter(PODGROUP), podgroup_object)
    cache.fetch_group = live.fetch
    client = await client_for(cache)
    body = args("filter-nodecache-true-pod-gpu4", list(NAMES))
    body["Pod"] = podgroup_member(0)
    resp = await client.post("/filter", json=body)
    assert resp.status == 200
    out = await resp.json()
    assert len(out["NodeNames"]) == 1, out  # planned: this member's tray only
    (plan,) = cache.groups.plans.values()
    assert plan.ref.size == 3 and plan.domain.startswith(f"{labels.GPU_CLIQUE}=")
