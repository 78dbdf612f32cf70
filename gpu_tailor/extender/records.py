"""The extender's record of one pod: what decisions need of it, and how a pod event changes it.

A record is never the pod object: the cache keeps one per pod of the cluster (100,000 in a big one),
so it holds only what filter, prioritize, preempt and bind read (see ``PodRecord``).
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

import orjson

from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.occupancy import Placement, format_gpu_annotation, parse_gpu_annotation
from gpu_tailor.gpumodel.schedule import Demand, NodeState, demand_of, pod_key, recorded_placement


@dataclass(frozen=True, slots=True)
class PodRecord:
    """One pod as decisions need it -- never the pod object (about 450 bytes with its Demand, Placement
    and strings: some 45 MB for 100,000 pods).

    ``demand``: what it asks for (its ``key`` is the pod's namespace/name); ``uid``; ``node``: where it
    is bound or assumed, "" while pending and once finished (a Succeeded or Failed pod holds nothing);
    ``placement``: the GPUs it holds there (None for CPU-only pods, or while its node is unknown);
    ``recorded``: its ``gpu-tailor.io/gpus`` annotation as read (None: absent or unreadable), for a node
    that shows up after the pod; ``deadline``: None once the watch has shown the pod, else the clock
    time its assumption expires (infinite while its Binding is in flight).
    """

    uid: str
    node: str
    demand: Demand
    placement: Placement | None = None
    recorded: tuple[int, ...] | None = None
    deadline: float | None = None

    @property
    def key(self) -> str:
        return self.demand.key

    @property
    def assumed(self) -> bool:
        return self.deadline is not None


def pod_uid(pod: dict[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid", ""))


def _active(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def waiting(pod: dict[str, Any]) -> bool:
    """Not bound yet and not finished: a pod kube-scheduler may still be binding."""
    return not (pod.get("spec") or {}).get("nodeName") and _active(pod)


def pod_record(pod: dict[str, Any], demand: Demand | None = None) -> PodRecord:
    """A pod object as a record (not placed: the cache places it on its node); ``demand``: the pod's,
    when the caller has read it already."""
    node = sys.intern(str((pod.get("spec") or {}).get("nodeName") or "")) if _active(pod) else ""  # one per node
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(labels.ANN_GPUS)
    recorded = parse_gpu_annotation(str(raw)) if raw is not None else None
    return PodRecord(pod_uid(pod), node, demand or demand_of(pod), recorded=recorded)


def _mapping(value: Any) -> Any:
    """``value`` when it is an object (a dict, or simdjson's lazy one), else None."""
    return value if hasattr(value, "items") and hasattr(value, "get") else None


def _plain(value: Any) -> Any:
    """A lazily parsed value as plain Python objects (dicts stay as they are)."""
    return value.as_dict() if hasattr(value, "as_dict") else value


def slim_pod(obj: Any) -> dict[str, Any]:
    """The parts of a pod object that records read, as plain dicts: its name, namespace and uid, the
    project's annotations, its node, its containers' and init containers' resources (and restart
    policy: sidecars), its overhead and its phase. ``obj``: a pod as a dict or as simdjson parsed it
    lazily (a list page of 100,000 pods: the rest of each pod -- managedFields, volumes, env, status
    -- is never built). Anything that is not the expected shape is left out, as if absent."""
    out: dict[str, Any] = {}
    meta = _mapping(obj.get("metadata"))
    if meta is not None:
        m = {k: meta.get(k) for k in ("name", "namespace", "uid") if meta.get(k) is not None}
        annotations = _mapping(meta.get("annotations"))
        if annotations is not None:
            ours = {k: v for k, v in annotations.items() if k.startswith(labels.TAILOR_DOMAIN + "/")}
            if ours:
                m["annotations"] = ours
        out["metadata"] = m
    spec = _mapping(obj.get("spec"))
    if spec is not None:
        s: dict[str, Any] = {}
        if (node := spec.get("nodeName")) is not None:
            s["nodeName"] = node
        for key, fields in (("containers", ("name", "resources")),
                            ("initContainers", ("name", "resources", "restartPolicy"))):
            raw = spec.get(key)
            if raw is not None and not isinstance(raw, str) and not _mapping(raw):
                s[key] = [{f: _plain(c.get(f)) for f in fields if c.get(f) is not None}
                          for c in raw if _mapping(c) is not None]
        if (overhead := _mapping(spec.get("overhead"))) is not None:
            s["overhead"] = _plain(overhead)
        out["spec"] = s
    status = _mapping(obj.get("status"))
    if status is not None and (phase := status.get("phase")) is not None:
        out["status"] = {"phase": phase}
    return out


class Demands:
    """``demand_of`` per pod, worked out once per distinct ask: the replicas of a workload ask alike,
    and a relist of 100,000 pods is mostly the same few dozen asks (the demand is read from the
    project's annotations, the containers' and init containers' resources and restart policies, and
    the overhead; all of them are in the memo's key)."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self.memo: OrderedDict[bytes, Demand] = OrderedDict()

    def of(self, pod: dict[str, Any]) -> Demand:
        meta, spec = pod.get("metadata"), pod.get("spec")
        if not isinstance(meta, dict) or not isinstance(spec, dict):
            return demand_of(pod)
        annotations = meta.get("annotations")
        if isinstance(annotations, dict) and labels.ANN_GPUS in annotations:  # bind's record, not the ask
            annotations = {k: v for k, v in annotations.items() if k != labels.ANN_GPUS}
        try:
            ask = orjson.dumps((annotations, spec.get("containers"), spec.get("initContainers"),
                                spec.get("overhead")))
        except TypeError:  # not JSON (a pod built by hand): no memo
            return demand_of(pod)
        known = self.memo.get(ask)
        key = pod_key(pod)
        if known is None:
            known = self.memo[ask] = demand_of(pod)
            if len(self.memo) > self.size:
                self.memo.popitem(last=False)
            return known if known.key == key else replace(known, key=key)
        return replace(known, key=key)


def live(rec: PodRecord, now: float) -> bool:
    """An assumption still within its deadline."""
    return rec.deadline is not None and rec.deadline > now


def holds(placement: Placement | None) -> tuple[int, ...] | None:
    """The GPUs of a placement as its annotation writes them."""
    return tuple(sorted(placement.gpus)) if placement is not None else None


def where(ns: NodeState, demand: Demand, gpus: tuple[int, ...] | None) -> Placement | None:
    """The placement on ``ns`` for these GPUs (kept or annotated), or predicted when there are none."""
    annotations = {labels.ANN_GPUS: format_gpu_annotation(gpus)} if gpus else {}
    return recorded_placement({"metadata": {"annotations": annotations}}, ns, demand)


def confirmed(assumed: PodRecord, seen: PodRecord) -> PodRecord:
    """The watch shows an assumed pod bound where bind put it: it keeps the GPUs bind chose, unless
    its own annotation names others."""
    return kept(assumed, seen)  # ``seen`` has no deadline: the result is confirmed


def kept(old: PodRecord, seen: PodRecord) -> PodRecord:
    """The pod as the API shows it now, on the node it was on: its GPUs stay unless its annotation
    names others (or it asks for something else)."""
    if seen.demand != old.demand or (seen.recorded is not None and seen.recorded != holds(old.placement)):
        return seen
    return replace(seen, placement=old.placement)
