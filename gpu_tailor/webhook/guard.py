"""Annotations only gpu-tailor writes, kept out of users' hands.

``gpu-tailor.io/ask`` and ``gpu-tailor.io/backing`` are the webhook's record of a rewrite, and
``gpu-tailor.io/gpus`` is written by the extender's Binding (the API server merges a Binding's
annotations into the pod through the ``pods/binding`` subresource, which is no UPDATE of ``pods``).
The other ``gpu-tailor.io/*`` annotations (isolation, topology, gpu-product) are the user's input.

On CREATE the decision comes from the pod's real ask, never from these annotations: ``gpus`` is
always dropped (no pod has been bound at creation), and ``ask``/``backing`` are kept only on a pod
that still looks exactly like the webhook's own rewrite -- the case of kube-apiserver's reinvocation
(``reinvocationPolicy: IfNeeded``: a later webhook changed the pod, so ours sees it again, already
rewritten). A user who writes a consistent pair on a pod with native resources gets nothing a native
ask would not give. On UPDATE no ``gpu-tailor.io/*`` annotation may change, except by the extender's
ServiceAccount.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.ask import PodAsk, from_canonical
from gpu_tailor.gpumodel.devices.dra import TEMPLATE_PREFIX

OUTPUT_ANNOTATIONS = (labels.ANN_ASK, labels.ANN_BACKING, labels.ANN_GPUS, labels.ANN_GPUS_AMONG)
BIND_ANNOTATIONS = (labels.ANN_GPUS, labels.ANN_GPUS_AMONG)  # bind's record: never the pod's own
# the extender's ServiceAccount (manifests/scheduler/rbac.yaml), the one writer besides the webhook
ANNOTATION_WRITERS = frozenset({"system:serviceaccount:gpu-tailor:gpu-tailor-scheduler"})
_PREFIX = labels.TAILOR_DOMAIN + "/"


@dataclass(frozen=True, slots=True)
class Owned:
    drop: tuple[str, ...] = ()  # output annotations the pod must not keep
    reinvocation: bool = False  # the pod is the webhook's own rewrite, seen again


def on_create(annotations: dict[str, Any], ask: PodAsk, pod: dict[str, Any] | None = None) -> Owned:
    present = [k for k in OUTPUT_ANNOTATIONS if k in annotations]
    if not present:
        return Owned()
    drop = [k for k in BIND_ANNOTATIONS if k in annotations]
    if ask.virtual:  # rewritten now, and the webhook writes ask and backing afresh
        return Owned(tuple(drop))
    if _rewritten_by_us(annotations, ask) or _claimed_by_us(annotations, ask, pod or {}):
        return Owned(tuple(drop), reinvocation=True)
    return Owned(tuple(k for k in OUTPUT_ANNOTATIONS if k in annotations))


def _rewritten_by_us(annotations: dict[str, Any], ask: PodAsk) -> bool:
    """Both records present, and every container the ask record names as portable now holds one NVIDIA
    resource, the same one (what ``mutate._rewrite`` leaves), and every native one what it held; or, for a native
    ask (backing ``native``), no portable container and every one holding what it held."""
    if not annotations.get(labels.ANN_BACKING) or labels.ANN_ASK not in annotations:
        return False
    try:
        recorded = json.loads(str(annotations[labels.ANN_ASK]))
    except (ValueError, RecursionError):
        return False
    containers = recorded.get("containers") if isinstance(recorded, dict) else None
    if not isinstance(containers, dict) or not containers:
        return False
    now = {("init:" if c.init else "") + c.name: c for c in ask.containers}
    resources: set[str] = set()
    for key, was in containers.items():
        c = now.get(key)
        if c is None or not isinstance(was, dict):
            return False
        if "gpuMilli" in was or "gpuMemory" in was:
            if len(c.native) != 1:
                return False
            resources |= set(c.native)
        elif was.get("native") != dict(sorted(c.native.items())):
            return False
    return len(resources) == 1 or (not resources and ask.has_gpu and annotations[labels.ANN_BACKING] == "native")


def _claimed_by_us(annotations: dict[str, Any], ask: PodAsk, pod: dict[str, Any]) -> bool:
    """What ``mutate._rewrite_dra`` leaves: backing ``dra:...``, a claim from a ``gpu-tailor-`` template, and every
    container the ask record names as portable holding no NVIDIA resource and naming a request of that claim."""
    if not str(annotations.get(labels.ANN_BACKING, "")).startswith("dra:") \
            or from_canonical(str(annotations.get(labels.ANN_ASK, ""))) is None:
        return False  # a record the webhook could not have written
    recorded = json.loads(str(annotations[labels.ANN_ASK]))
    containers = recorded.get("containers") if isinstance(recorded, dict) else None
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return False
    claims = {c.get("name") for c in spec.get("resourceClaims") or [] if isinstance(c, dict)
              and str(c.get("resourceClaimTemplateName", "")).startswith(TEMPLATE_PREFIX)}
    if not isinstance(containers, dict) or not containers or not claims:
        return False
    raw = {("init:" if init else "") + str(c.get("name")): c for init, key in ((True, "initContainers"),
                                                                               (False, "containers"))
           for c in spec.get(key) or [] if isinstance(c, dict)}
    now = {("init:" if c.init else "") + c.name: c for c in ask.containers}
    for key, was in containers.items():
        if not isinstance(was, dict) or key not in now or now[key].native:
            return False
        if "gpuMilli" in was or "gpuMemory" in was:
            named = ((raw[key].get("resources") or {}).get("claims") or []) if key in raw else []
            if not any(isinstance(n, dict) and n.get("name") in claims for n in named):
                return False
    return True


def changed(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The ``gpu-tailor.io/*`` annotations an UPDATE adds, removes or changes."""
    keys = {k for k in (*old, *new) if isinstance(k, str) and k.startswith(_PREFIX)}
    return sorted(k for k in keys if old.get(k) != new.get(k))


def why_removed(key: str) -> str:
    writer = "gpu-tailor's scheduler when it binds the pod" if key in BIND_ANNOTATIONS else "the gpu-tailor webhook"
    return f"annotation {key} removed: only {writer} writes it"
