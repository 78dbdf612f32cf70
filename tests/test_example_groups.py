"""Each example that declares a group: the pods its controllers make fall in the group its comment names, of the size
and with the NVLink-domain ask it says, as the extender reads them (``gpumodel.groups.group_of`` on each pod, sized by
the group objects it watches, read by its own readers: ``tools.source.group_objects``).

The pods are made here the way each controller makes them, with the labels and annotations it sets:

- the Job controller: ``parallelism`` pods at once, labelled ``batch.kubernetes.io/job-name``; an Indexed Job's also
  carry their ``batch.kubernetes.io/job-completion-index``;
- JobSet: a child Job per replica of each replicated Job, named ``<jobset>-<replicated job>-<index>``, whose pod
  template it labels ``jobset.sigs.k8s.io/jobset-name``, ``replicatedjob-name`` and ``job-index``; the Job controller
  then makes the pods;
- LeaderWorkerSet: per replica a leader ``<name>-<group>`` and workers ``<name>-<group>-<worker>``, labelled
  ``leaderworkerset.sigs.k8s.io/name``, ``group-index``, ``worker-index`` and ``group-key``, the group's size in the
  annotation ``leaderworkerset.sigs.k8s.io/size``.

The end-to-end suite has no JobSet or LeaderWorkerSet controller, so this is where their examples are held to their
comments; the others are applied there too (``tests/e2e/test_examples.py``, ``test_podgroups.py``,
``test_workloads.py``).
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from gpu_tailor.cli import main
from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.groups import group_of, resolved
from gpu_tailor.gpumodel.schedule import DOMAIN_LABELS
from gpu_tailor.tools.source import group_objects
from tests.examples import Example, examples

Obj = dict[str, Any]
NS = "team-a"
GROUPED = [e for e in examples() if e.group is not None]
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-key"


def _pod(name: str, template: Obj, more_labels: dict[str, str], more_annotations: dict[str, str]) -> Obj:
    meta = copy.deepcopy(template.get("metadata") or {})
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": {**(meta.get("labels") or {}), **more_labels},
                         "annotations": {**(meta.get("annotations") or {}), **more_annotations}},
            "spec": copy.deepcopy(template["spec"])}


def job_pods(job: Obj) -> list[Obj]:
    """The pods the Job controller runs at once: ``parallelism`` of them (1 unless set)."""
    name, spec = job["metadata"]["name"], job["spec"]
    indexed = spec.get("completionMode") == "Indexed"
    pods = []
    for i in range(spec.get("parallelism", 1)):
        index = {labels.JOB_COMPLETION_INDEX: str(i)} if indexed else {}
        pods.append(_pod(f"{name}-{i}" if indexed else f"{name}-{i:05x}", spec["template"],
                         {labels.JOB_NAME: name, "job-name": name, **index}, index))
    return pods


def jobset_jobs(jobset: Obj) -> list[Obj]:
    """The child Jobs JobSet makes: one per replica of each replicated Job, Indexed unless it says otherwise (JobSet's
    webhook defaults the completion mode), its pod template labelled with the JobSet, the replicated Job and the Job's
    index."""
    name, jobs = jobset["metadata"]["name"], []
    for replicated in jobset["spec"]["replicatedJobs"]:
        for i in range(replicated.get("replicas", 1)):
            spec: Obj = {"completionMode": "Indexed", **copy.deepcopy(replicated["template"]["spec"])}
            job: Obj = {"apiVersion": "batch/v1", "kind": "Job",
                        "metadata": {"name": f"{name}-{replicated['name']}-{i}", "namespace": NS}, "spec": spec}
            meta = job["spec"]["template"].setdefault("metadata", {})
            meta["labels"] = {**(meta.get("labels") or {}), labels.JOBSET_NAME: name,
                              labels.JOBSET_REPLICATED_JOB: replicated["name"], labels.JOBSET_JOB_INDEX: str(i)}
            jobs.append(job)
    return jobs


def lws_pods(lws: Obj) -> list[Obj]:
    """The pods LeaderWorkerSet makes: per replica (a group) a leader and ``size - 1`` workers, the leader from its own
    template where the set has one."""
    name, spec = lws["metadata"]["name"], lws["spec"]
    templates = spec["leaderWorkerTemplate"]
    size = templates.get("size", 1)
    pods = []
    for group in range(spec.get("replicas", 1)):
        key = hashlib.sha1(f"{NS}/{name}-{group}".encode()).hexdigest()  # a hash naming the group, as it labels it
        for worker in range(size):
            template = templates.get("leaderTemplate") if worker == 0 else None
            pods.append(_pod(f"{name}-{group}" if worker == 0 else f"{name}-{group}-{worker}",
                             template or templates["workerTemplate"],
                             {labels.LWS_NAME: name, labels.LWS_GROUP_INDEX: str(group),
                              LWS_WORKER_INDEX: str(worker), LWS_GROUP_KEY: key},
                             {labels.LWS_SIZE: str(size)}))
    return pods


def made(example: Example) -> tuple[list[Obj], list[Obj]]:
    """The pods the example's workload makes, and the API objects beside them that the extender may read a group's
    size from: the example's other documents, and the Jobs (a JobSet's child Jobs)."""
    workload = copy.deepcopy(example.manifest)
    workload["metadata"]["namespace"] = NS
    extra = [{**doc, "metadata": {**doc["metadata"], "namespace": NS}} for doc in example.extra]
    match example.kind:
        case "Pod":
            return [workload], extra
        case "Job":
            return job_pods(workload), [*extra, workload]
        case "JobSet":
            jobs = jobset_jobs(workload)
            return [p for job in jobs for p in job_pods(job)], [*extra, *jobs]
        case "LeaderWorkerSet":
            return lws_pods(workload), extra
    raise AssertionError(f"{example.path.name}: no pods made here for a {example.kind}")


@pytest.mark.parametrize("example", GROUPED, ids=[e.name for e in GROUPED])
def test_the_pods_an_example_makes_are_the_group_its_comment_names(example: Example) -> None:
    said = example.group
    assert said is not None
    pods, objects = made(example)
    store = group_objects(objects)  # as the extender's watches keep them
    refs = []
    for pod in pods:
        ref = group_of(pod)
        assert ref is not None, f"{example.path.name}: pod {pod['metadata']['name']} names no group"
        refs.append(resolved(ref, store.objects, DOMAIN_LABELS))
    assert {r.key for r in refs} == {said.key_in(NS)}, refs
    assert {r.size for r in refs} == {said.size}, refs
    assert {r.domain for r in refs} == {said.domain}, refs
    assert len(pods) == said.size, f"{example.path.name}: makes {len(pods)} pods, a group of {said.size}"


def test_the_examples_cover_every_way_to_declare_a_group() -> None:
    """An example for each convention of the user guide's table of groups, by its workload and the kind of group it
    makes."""
    ways = {(e.kind, e.group.key.split("/", 1)[0]) for e in GROUPED if e.group is not None}
    assert ways == {("Job", "group"), ("Job", "kueue"), ("LeaderWorkerSet", "leaderworkerset"), ("Job", "podgroup"),
                    ("Job", "workload"), ("Job", "coscheduling"), ("Job", "job"), ("JobSet", "job")}


@pytest.mark.parametrize("example", GROUPED, ids=[e.name for e in GROUPED])
def test_explain_names_the_group_an_example_makes(example: Example, capsys: pytest.CaptureFixture[str]) -> None:
    """``gpu-tailor explain -f`` on the example, before it is applied: the pod it explains carries what its
    controllers set, and the example's own PodGroup or Job sizes the group."""
    said = example.group
    assert said is not None
    dump = Path(__file__).parent / "fixtures" / "cluster" / "control-plane-dump.json"
    assert main(["explain", "-f", str(example.path), "-n", NS, "--cluster-file", str(dump), "-o", "json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    kind, name = said.key.split("/", 1)
    group = f"{kind} {NS}/{name}"  # planned ("<group>: 2 pods (...)") or refused ("<group> (2 pods of ...)")
    assert any(f"{group}: {said.size} pods (" in n or f"{group} ({said.size} pods of" in n for n in notes), notes
