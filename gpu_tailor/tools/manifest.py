"""The pod a manifest makes: a Pod as written, or the pod template of a workload, named and placed in a
namespace the way its controller would (the controller adds a suffix; the name only has to be one), with the labels
its controller sets that name a group of pods (a Job's, a JobSet's child Job's, a LeaderWorkerSet's); and the objects
of the manifest that size such a group (``group_sizers``: its PodGroups or Workloads, its Job, a JobSet's first
child Job)."""

from __future__ import annotations

import copy
from typing import Any

import yaml

from gpu_tailor.gpumodel import labels

Obj = dict[str, Any]

# kind -> path to the pod template (a JobSet's: its first replicated Job's; a LeaderWorkerSet's: its workers')
TEMPLATES: dict[str, tuple[str | int, ...]] = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "ReplicationController": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
    "JobSet": ("spec", "replicatedJobs", 0, "template", "spec", "template"),
    "LeaderWorkerSet": ("spec", "leaderWorkerTemplate", "workerTemplate"),
}


class ManifestError(ValueError):
    """Not a Pod or a workload with a pod template; the message says what was found."""


def documents(text: str, source: str) -> list[Obj]:
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ManifestError(f"{source}: not YAML or JSON: {exc}") from exc
    out: list[Obj] = []
    for d in docs:
        if isinstance(d, dict) and d.get("kind") == "List":
            out.extend(i for i in d.get("items") or [] if isinstance(i, dict))
        elif isinstance(d, dict):
            out.append(d)
    return out


def pod_of(text: str, source: str, namespace: str | None, default_namespace: str) -> tuple[Obj, str]:
    """The first Pod or workload of the manifest as the pod its controller would create, and what it came
    from (``Pod team-a/x`` or ``Deployment team-a/web``). The namespace: ``namespace`` (``-n``), else the
    manifest's, else ``default_namespace`` (the kubeconfig context's), as ``kubectl apply`` would."""
    kinds = []
    for doc in documents(text, source):
        kind = str(doc.get("kind", ""))
        kinds.append(kind or "(no kind)")
        meta = doc.get("metadata") or {}
        ns = namespace or meta.get("namespace") or default_namespace
        if kind == "Pod":
            pod = copy.deepcopy(doc)
            pod.setdefault("apiVersion", "v1")
            pod.setdefault("metadata", {})["namespace"] = ns
            if not pod["metadata"].get("name"):
                pod["metadata"]["name"] = f"{pod['metadata'].get('generateName') or 'pod-'}explain"
            return pod, f"Pod {ns}/{pod['metadata']['name']}"
        if kind in TEMPLATES:
            template = _at(doc, TEMPLATES[kind])
            if not isinstance(template, dict):
                path = ".".join(map(str, TEMPLATES[kind]))
                raise ManifestError(f"{source}: {kind} {meta.get('name', '')} has no {path}")
            name = str(meta.get("name") or "workload")
            pod_meta = copy.deepcopy(template.get("metadata") or {})
            pod_meta.update(name=f"{name}-explain", namespace=ns)
            for key, value in _controller_labels(kind, doc, name).items():
                pod_meta.setdefault("labels", {})[key] = value
            for key, value in _controller_annotations(kind, doc).items():
                pod_meta.setdefault("annotations", {})[key] = value
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta,
                   "spec": copy.deepcopy(template.get("spec") or {})}
            return pod, f"{kind} {ns}/{name}"
    found = ", ".join(kinds) or "nothing"
    raise ManifestError(f"{source}: expected a Pod or a workload with a pod template "
                        f"({', '.join(['Pod', *TEMPLATES])}); found {found}")


def _at(doc: Any, path: tuple[str | int, ...]) -> Any:
    for key in path:
        if isinstance(key, int):
            doc = doc[key] if isinstance(doc, list) and len(doc) > key else None
        else:
            doc = doc.get(key) if isinstance(doc, dict) else None
    return doc


def _child_job(doc: Obj, name: str) -> tuple[str, Obj]:
    """A JobSet's first child Job, as JobSet names it (``<jobset>-<replicated job>-0``), and its spec, Indexed unless
    it says otherwise (JobSet's webhook defaults a child Job's completion mode to Indexed)."""
    replicated = _at(doc, ("spec", "replicatedJobs", 0))
    replicated = replicated if isinstance(replicated, dict) else {}
    spec = _at(replicated, ("template", "spec"))
    spec = {"completionMode": "Indexed", **spec} if isinstance(spec, dict) else {"completionMode": "Indexed"}
    return f"{name}-{replicated.get('name', '')}-0", spec


def _controller_labels(kind: str, doc: Obj, name: str) -> dict[str, str]:
    """The labels a workload's controllers set on its pods that name their group (the first pod's)."""
    if kind == "Job":
        return {labels.JOB_NAME: name, "job-name": name}
    if kind == "JobSet":
        child, _ = _child_job(doc, name)
        replicated = str(_at(doc, ("spec", "replicatedJobs", 0, "name")) or "")
        return {labels.JOBSET_NAME: name, labels.JOBSET_REPLICATED_JOB: replicated, labels.JOBSET_JOB_INDEX: "0",
                labels.JOB_NAME: child, "job-name": child}
    if kind == "LeaderWorkerSet":
        return {labels.LWS_NAME: name, labels.LWS_GROUP_INDEX: "0"}
    return {}


def _controller_annotations(kind: str, doc: Obj) -> dict[str, str]:
    spec = _at(doc, ("spec",)) if kind == "Job" else _child_job(doc, "")[1] if kind == "JobSet" else None
    if isinstance(spec, dict) and spec.get("completionMode") == "Indexed":
        return {labels.JOB_COMPLETION_INDEX: "0"}
    if kind == "LeaderWorkerSet":
        size = _at(doc, ("spec", "leaderWorkerTemplate", "size"))
        return {labels.LWS_SIZE: str(size if isinstance(size, int) else 1)}
    return {}


# the kinds of document that may size a group of pods (``kube.groupobjects.SOURCES``'s, a JobSet for its child Job)
SIZERS = ("PodGroup", "Workload", "Job", "JobSet")


def group_sizers(text: str, source: str, namespace: str) -> list[Obj]:
    """The objects of the manifest the extender may read a group's size from once applied: its PodGroups, Workloads
    and Jobs, and a JobSet's first child Job; in the namespace each names, else ``namespace`` (the pod's)."""
    out = []
    for doc in documents(text, source):
        kind, meta = str(doc.get("kind", "")), doc.get("metadata")
        if kind not in SIZERS:
            continue
        if not isinstance(meta, dict) or not meta.get("name"):
            raise ManifestError(f"{source}: a {kind} without metadata.name")
        if kind == "JobSet":
            child, spec = _child_job(doc, str(meta["name"]))
            doc = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": child, **(
                {"namespace": meta["namespace"]} if meta.get("namespace") else {})}, "spec": spec}
        doc = copy.deepcopy(doc)
        doc["metadata"]["namespace"] = doc["metadata"].get("namespace") or namespace
        out.append(doc)
    return out
