"""Which pod a manifest makes: a Pod as written, a workload's pod template, in which namespace."""

from __future__ import annotations

import pytest
import yaml

from gpu_tailor.gpumodel.groups import group_of
from gpu_tailor.tools.manifest import ManifestError, group_sizers, pod_of
from gpu_tailor.tools.source import group_objects

TEMPLATE = {"metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "main", "image": "busybox",
                                     "resources": {"limits": {"gpu-tailor.io/gpu-milli": "250"}}}]}}


def workload(kind: str) -> dict[str, object]:
    if kind == "CronJob":
        spec: dict[str, object] = {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": TEMPLATE}}}
    else:
        spec = {"template": TEMPLATE}
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": "web", "namespace": "team-a"}, "spec": spec}


@pytest.mark.parametrize("kind", ["Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob"])
def test_a_workload_stands_for_its_pods(kind: str) -> None:
    pod, subject = pod_of(yaml.safe_dump(workload(kind)), "w.yaml", None, "default")
    assert subject == f"{kind} team-a/web"
    job = {"batch.kubernetes.io/job-name": "web", "job-name": "web"} if kind == "Job" else {}  # as its controller sets
    assert pod["kind"] == "Pod" and pod["metadata"] == {"labels": {"app": "web", **job}, "name": "web-explain",
                                                        "namespace": "team-a"}
    assert pod["spec"] == TEMPLATE["spec"]


@pytest.mark.parametrize(("flag", "written", "context", "expected"), [
    pytest.param("team-b", "team-a", "ctx-ns", "team-b", id="-n wins"),
    pytest.param(None, "team-a", "ctx-ns", "team-a", id="the manifest's next"),
    pytest.param(None, None, "ctx-ns", "ctx-ns", id="else the kubeconfig context's"),
])
def test_namespace_as_kubectl_apply_picks_it(flag: str | None, written: str | None, context: str,
                                             expected: str) -> None:
    meta = {"name": "p", **({"namespace": written} if written else {})}
    text = yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": TEMPLATE["spec"]})
    pod, subject = pod_of(text, "p.yaml", flag, context)
    assert pod["metadata"]["namespace"] == expected and subject == f"Pod {expected}/p"


def test_the_first_pod_of_a_multi_document_file_and_lists() -> None:
    text = "---\napiVersion: v1\nkind: Service\nmetadata: {name: s}\n---\n" + yaml.safe_dump(
        {"kind": "List", "items": [{"kind": "ConfigMap"}, workload("Job")]})
    assert pod_of(text, "f.yaml", None, "default")[1] == "Job team-a/web"


@pytest.mark.parametrize(("text", "message"), [
    pytest.param("kind: Service\nmetadata: {name: s}\n", "found Service", id="no pod in it"),
    pytest.param("kind: Deployment\nmetadata: {name: d}\nspec: {}\n", "has no spec.template", id="no template"),
    pytest.param("a: [", "not YAML or JSON", id="not YAML"),
])
def test_what_is_not_a_pod_is_said(text: str, message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        pod_of(text, "x.yaml", None, "default")


def test_a_workloads_pod_carries_the_labels_its_controllers_name_its_group_with() -> None:
    """As the Job controller, JobSet and LeaderWorkerSet label their pods: the group each names is the one the
    extender reads from them (``gpumodel.groups.group_of``)."""
    indexed = {"kind": "Job", "metadata": {"name": "train"},
               "spec": {"completionMode": "Indexed", "completions": 2, "parallelism": 2, "template": TEMPLATE}}
    jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "js"},
              "spec": {"replicatedJobs": [{"name": "workers", "template": {"spec": indexed["spec"]}}]}}
    lws = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": {"name": "vllm"},
           "spec": {"leaderWorkerTemplate": {"size": 4, "workerTemplate": TEMPLATE}}}
    plain = {"kind": "Job", "metadata": {"name": "once"}, "spec": {"template": TEMPLATE}}
    for doc, key, size in ((indexed, "team-a/job/train", 0), (jobset, "team-a/job/js-workers-0", 0),
                           (lws, "team-a/leaderworkerset/vllm-0", 4), (plain, None, None)):
        pod, _ = pod_of(yaml.safe_dump(doc), "w.yaml", "team-a", "default")
        ref = group_of(pod)
        assert (ref.key, ref.size) == (key, size) if ref is not None else key is None, (doc["kind"], ref)
        assert pod["metadata"]["labels"]["app"] == "web"  # the template's own labels kept


def test_the_objects_of_a_manifest_that_size_its_group() -> None:
    podgroup = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "pg"},
                "spec": {"minMember": 3}}
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"},
           "spec": {"completionMode": "Indexed", "parallelism": 3, "template": TEMPLATE}}
    jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "js"},
              "spec": {"replicatedJobs": [{"name": "workers", "template": {"spec": job["spec"]}}]}}
    text = "---\n".join(yaml.safe_dump(d) for d in (podgroup, job, jobset, workload("Deployment")))
    sizers = group_sizers(text, "f.yaml", "team-a")
    assert [(d["kind"], d["metadata"]["name"], d["metadata"]["namespace"]) for d in sizers] == [
        ("PodGroup", "pg", "team-a"), ("Job", "train", "team-a"), ("Job", "js-workers-0", "team-a")]
    sizes = {o.key: o.size for o in group_objects(sizers).objects.values()}
    assert sizes == {"team-a/coscheduling/pg": 3, "team-a/job/train": 3, "team-a/job/js-workers-0": 3}


def test_a_jobsets_child_job_is_indexed_unless_it_says_otherwise() -> None:
    """JobSet's webhook defaults a child Job's completion mode to Indexed: explain reads the group as the extender
    reads it from the Job JobSet makes."""
    child_spec = {"parallelism": 4, "template": TEMPLATE}  # no completionMode
    jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "js"},
              "spec": {"replicatedJobs": [{"name": "w", "template": {"spec": child_spec}}]}}
    text = yaml.safe_dump(jobset)
    pod, _ = pod_of(text, "js.yaml", "team-a", "default")
    ref = group_of(pod)
    assert ref is not None and ref.key == "team-a/job/js-w-0"
    (child,) = group_sizers(text, "js.yaml", "team-a")
    assert child["spec"]["completionMode"] == "Indexed"
    assert group_objects([child]).objects["team-a/job/js-w-0"].size == 4


def test_documents_that_size_no_group_are_passed_over_and_a_nameless_sizer_is_said() -> None:
    elsewhere = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
                 "metadata": {"name": "pg", "namespace": "ml"}, "spec": {"minMember": 2}}
    text = "kind: ConfigMap\nmetadata:\n---\nkind: Service\nmetadata: plain\n---\n" + yaml.safe_dump(elsewhere)
    assert [d["metadata"]["namespace"] for d in group_sizers(text, "f.yaml", "team-a")] == ["ml"]  # its own kept
    with pytest.raises(ManifestError, match=r"a PodGroup without metadata\.name"):
        group_sizers("kind: PodGroup\nmetadata:\n", "f.yaml", "team-a")
