"""Which group a pod belongs to: each convention as its project writes it, and bad asks refused with the reason."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.gangs import ANYWHERE, PREFERRED, REQUIRED
from gpu_tailor.gpumodel.groups import (
    GroupError,
    GroupObject,
    GroupObjects,
    GroupRef,
    coscheduling_object,
    group_of,
    job_object,
    podgroup_object,
    resolved,
    workload_objects,
)


def pod(ns: str = "team-a", pod_labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
        spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": ns, "labels": pod_labels or {}, "annotations": annotations or {}},
            "spec": spec or {"containers": [{"name": "c"}]}}


@pytest.mark.parametrize(("p", "want"), [
    pytest.param(pod(annotations={labels.ANN_GROUP: "train", labels.ANN_GROUP_SIZE: "8"}),
                 GroupRef("team-a/group/train", "group team-a/train", 8, PREFERRED), id="gpu-tailor"),
    pytest.param(pod(annotations={labels.ANN_GROUP: "train", labels.ANN_GROUP_SIZE: " 4 ",
                                  labels.ANN_GROUP_DOMAIN: "Required"}),
                 GroupRef("team-a/group/train", "group team-a/train", 4, REQUIRED), id="gpu-tailor-required"),
    pytest.param(pod(pod_labels={labels.KUEUE_GROUP: "g1"}, annotations={labels.KUEUE_GROUP_COUNT: "3"}),
                 GroupRef("team-a/kueue/g1", "kueue team-a/g1", 3, PREFERRED), id="kueue"),
    pytest.param(pod(pod_labels={labels.LWS_NAME: "vllm", labels.LWS_GROUP_INDEX: "2"},
                     annotations={labels.LWS_SIZE: "4", labels.ANN_GROUP_DOMAIN: "anywhere"}),
                 GroupRef("team-a/leaderworkerset/vllm-2", "leaderworkerset team-a/vllm-2", 4, ANYWHERE), id="lws"),
    pytest.param(pod(spec={"schedulingGroup": {"podGroupName": "pg"}}, annotations={labels.ANN_GROUP_SIZE: "12"}),
                 GroupRef("team-a/podgroup/pg", "podgroup team-a/pg", 12, PREFERRED), id="podgroup-sized"),
    pytest.param(pod(spec={"schedulingGroup": {"podGroupName": "pg"}}),
                 GroupRef("team-a/podgroup/pg", "podgroup team-a/pg", 0, PREFERRED), id="podgroup-unsized"),
    pytest.param(pod(spec={"workloadRef": {"name": "train", "podGroup": "workers", "podGroupReplicaKey": "r1"}}),
                 GroupRef("team-a/workload/train/workers/r1", "workload team-a/train/workers/r1", 0, PREFERRED,
                          source="team-a/workload/train/workers"), id="workload-replica"),
    pytest.param(pod(spec={"workloadRef": {"name": "train", "podGroup": "workers"}}),
                 GroupRef("team-a/workload/train/workers", "workload team-a/train/workers", 0, PREFERRED,
                          source="team-a/workload/train/workers"), id="workload"),
    pytest.param(pod(pod_labels={labels.COSCHEDULING_GROUP: "cg"}),
                 GroupRef("team-a/coscheduling/cg", "coscheduling team-a/cg", 0, PREFERRED), id="coscheduling"),
    pytest.param(pod(pod_labels={labels.JOBSET_NAME: "js", labels.JOBSET_REPLICATED_JOB: "workers",
                                 labels.JOBSET_JOB_INDEX: "1"}, annotations={labels.ANN_GROUP_SIZE: "2"}),
                 GroupRef("team-a/jobset/js-workers-1", "jobset team-a/js-workers-1", 2, PREFERRED), id="jobset"),
    pytest.param(pod(pod_labels={labels.JOB_NAME: "j"}, annotations={labels.JOB_COMPLETION_INDEX: "0"}),
                 GroupRef("team-a/job/j", "job team-a/j", 0, PREFERRED), id="indexed-job"),
    pytest.param(pod(pod_labels={labels.JOB_NAME: "j"}), None, id="non-indexed-job"),
    pytest.param(pod(pod_labels={labels.LWS_NAME: "vllm"}), None, id="lws-without-size"),
    pytest.param(pod(), None, id="none"),
    pytest.param({"metadata": "junk"}, None, id="junk-metadata"),
])
def test_group_of_reads_each_convention(p: dict[str, Any], want: GroupRef | None) -> None:
    assert group_of(p) == want


@pytest.mark.parametrize(("p", "error"), [
    pytest.param(pod(annotations={labels.ANN_GROUP: "t"}), "without gpu-tailor.io/group-size", id="no-size"),
    pytest.param(pod(annotations={labels.ANN_GROUP: " ", labels.ANN_GROUP_SIZE: "2"}), "is empty", id="no-name"),
    pytest.param(pod(annotations={labels.ANN_GROUP: "t", labels.ANN_GROUP_SIZE: "two"}), "whole number",
                 id="size-not-a-number"),
    pytest.param(pod(annotations={labels.ANN_GROUP: "t", labels.ANN_GROUP_SIZE: "0"}), "1 to 10000", id="size-0"),
    pytest.param(pod(annotations={labels.ANN_GROUP: "t", labels.ANN_GROUP_SIZE: "2",
                                  labels.ANN_GROUP_DOMAIN: "rack"}), "expected one of required", id="domain"),
    pytest.param(pod(pod_labels={labels.KUEUE_GROUP: "g"}), "without kueue.x-k8s.io/pod-group-total-count",
                 id="kueue-no-count"),
])
def test_bad_group_asks_say_why(p: dict[str, Any], error: str) -> None:
    with pytest.raises(GroupError, match=error):
        group_of(p)


def podgroup(name: str, count: int | None, keys: tuple[str, ...] = (), ns: str = "team-a") -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": count}} if count is not None else {"basic": {}}}
    if keys:
        spec["schedulingConstraints"] = {"topology": [{"key": k} for k in keys]}
    return {"apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": ns}, "spec": spec}


@pytest.mark.parametrize(("obj", "want"), [
    pytest.param(podgroup("pg", 12, (labels.GPU_CLIQUE,)),
                 GroupObject("team-a/podgroup/pg", 12, (labels.GPU_CLIQUE,)), id="gang-with-topology"),
    pytest.param(podgroup("pg", 4), GroupObject("team-a/podgroup/pg", 4), id="gang"),
    pytest.param(podgroup("pg", None), GroupObject("team-a/podgroup/pg", 0), id="basic-is-no-gang"),
    pytest.param(podgroup("pg", 0), GroupObject("team-a/podgroup/pg", 0), id="zero"),
    pytest.param({"metadata": {}}, None, id="nameless"),
])
def test_kube_scheduler_podgroups_are_read(obj: dict[str, Any], want: GroupObject | None) -> None:
    assert podgroup_object(obj) == want


def test_coscheduling_podgroups_are_read() -> None:
    obj = {"metadata": {"name": "cg", "namespace": "ml"}, "spec": {"minMember": 3, "scheduleTimeoutSeconds": 10}}
    assert coscheduling_object(obj) == GroupObject("ml/coscheduling/cg", 3)


def test_a_group_object_sizes_the_pods_that_name_it_and_its_clique_constraint_requires_one_domain() -> None:
    store = GroupObjects()
    store.reset("podgroup", podgroup_object, [podgroup("pg", 8, (labels.GPU_CLIQUE,)), podgroup("other", 2)])
    ref = group_of(pod(spec={"schedulingGroup": {"podGroupName": "pg"}}))
    assert ref is not None and ref.size == 0
    assert resolved(ref, store.objects, (labels.GPU_CLIQUE,)) == GroupRef(ref.key, ref.name, 8, REQUIRED, True)
    assert resolved(ref, store.objects, ("rack",)).domain == PREFERRED  # another key: kube-scheduler's own
    other = group_of(pod(spec={"schedulingGroup": {"podGroupName": "other"}}))
    assert other is not None and resolved(other, store.objects, (labels.GPU_CLIQUE,)).size == 2
    store.apply("podgroup", podgroup_object, "DELETED", podgroup("pg", 8))
    assert resolved(ref, store.objects, (labels.GPU_CLIQUE,)).size == 0
    store.reset("podgroup", podgroup_object, [])  # a relist without it drops what the last one had
    assert not store.objects


def test_a_pod_that_states_its_size_still_takes_its_podgroups_topology_constraint() -> None:
    store = GroupObjects()
    store.reset("podgroup", podgroup_object, [podgroup("pg", 8, (labels.GPU_CLIQUE,))])
    ref = group_of(pod(spec={"schedulingGroup": {"podGroupName": "pg"}}, annotations={labels.ANN_GROUP_SIZE: "4"}))
    assert ref is not None
    got = resolved(ref, store.objects, (labels.GPU_CLIQUE,))
    assert (got.size, got.domain, got.by_domain) == (4, REQUIRED, True)


def workload(name: str, groups: list[Any], ns: str = "team-a") -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1alpha1", "kind": "Workload",
            "metadata": {"name": name, "namespace": ns}, "spec": {"podGroups": groups}}


def test_a_1_35_workload_gives_each_of_its_pod_groups_a_size() -> None:
    obj = workload("train", [{"name": "workers", "policy": {"gang": {"minCount": 8}}},
                             {"name": "driver", "policy": {"basic": {}}}, "junk", {"policy": {}}])
    assert workload_objects(obj) == [GroupObject("team-a/workload/train/workers", 8),
                                     GroupObject("team-a/workload/train/driver", 0)]
    assert workload_objects({"metadata": {"name": "w"}, "spec": {"podGroups": "no"}}) == []
    assert workload_objects({"metadata": {}, "spec": {"podGroups": []}}) == []


def test_each_replica_of_a_workloads_pod_group_is_a_group_of_that_size() -> None:
    store = GroupObjects()
    store.reset("workload", workload_objects, [workload("train", [{"name": "workers",
                                                                  "policy": {"gang": {"minCount": 4}}}])])
    refs = [group_of(pod(spec={"workloadRef": {"name": "train", "podGroup": "workers", "podGroupReplicaKey": r}}))
            for r in ("a", "b")]
    assert refs[0] is not None and refs[1] is not None
    got = [resolved(r, store.objects, (labels.GPU_CLIQUE,)) for r in refs if r is not None]
    assert [(g.size, g.domain) for g in got] == [(4, PREFERRED), (4, PREFERRED)]
    assert got[0].key != got[1].key  # one gang each, planned apart
    # a Workload changed to drop the pod group leaves its pods unsized; deleted, the same
    store.apply("workload", workload_objects, "MODIFIED", workload("train", [{"name": "other"}]))
    assert resolved(refs[0], store.objects, ()).size == 0 and set(store.objects) == {"team-a/workload/train/other"}
    store.apply("workload", workload_objects, "DELETED", workload("train", [{"name": "other"}]))
    assert not store.objects


@pytest.mark.parametrize(("spec", "size"), [
    pytest.param({"completionMode": "Indexed", "parallelism": 4, "completions": 8}, 4, id="parallelism"),
    pytest.param({"completionMode": "Indexed", "completions": 3}, 3, id="completions"),
    pytest.param({"completionMode": "Indexed", "parallelism": 0}, 0, id="suspended-none"),
])
def test_an_indexed_job_sizes_its_pods_group(spec: dict[str, Any], size: int) -> None:
    job = {"metadata": {"name": "train", "namespace": "team-a"}, "spec": spec}
    assert job_object(job) == GroupObject("team-a/job/train", size)
    store = GroupObjects()
    store.reset("job", job_object, [job])
    member = group_of(pod(pod_labels={labels.JOB_NAME: "train"}, annotations={labels.JOB_COMPLETION_INDEX: "1"}))
    assert member is not None and resolved(member, store.objects, ()).size == size


def test_a_non_indexed_job_is_no_group_and_a_jobset_pod_is_its_child_jobs() -> None:
    assert job_object({"metadata": {"name": "j"}, "spec": {"parallelism": 4}}) is None
    child = group_of(pod(pod_labels={labels.JOBSET_NAME: "js", labels.JOBSET_REPLICATED_JOB: "workers",
                                     labels.JOBSET_JOB_INDEX: "0", labels.JOB_NAME: "js-workers-0"}))
    assert child == GroupRef("team-a/job/js-workers-0", "job team-a/js-workers-0", 0, PREFERRED)
