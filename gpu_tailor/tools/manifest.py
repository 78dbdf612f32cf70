"""The pod a manifest makes: a Pod as written, or the pod template of a workload, named and placed in a
namespace the way its controller would (the controller adds a suffix; the name only has to be one)."""

from __future__ import annotations

import copy
from typing import Any

import yaml

Obj = dict[str, Any]

# kind -> path to the pod template
TEMPLATES = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "ReplicationController": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
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
            template: Any = doc
            for key in TEMPLATES[kind]:
                template = template.get(key) if isinstance(template, dict) else None
            if not isinstance(template, dict):
                raise ManifestError(f"{source}: {kind} {meta.get('name', '')} has no {'.'.join(TEMPLATES[kind])}")
            name = str(meta.get("name") or "workload")
            pod_meta = copy.deepcopy(template.get("metadata") or {})
            pod_meta.update(name=f"{name}-explain", namespace=ns)
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta,
                   "spec": copy.deepcopy(template.get("spec") or {})}
            return pod, f"{kind} {ns}/{name}"
    found = ", ".join(kinds) or "nothing"
    raise ManifestError(f"{source}: expected a Pod or a workload with a pod template "
                        f"({', '.join(['Pod', *TEMPLATES])}); found {found}")
