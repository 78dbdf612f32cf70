"""The extender's record of one pod: what decisions need of it, and how a pod event changes it.

A record is never the pod object: the cache keeps one per pod of the cluster (100,000 in a big one),
so it holds only what filter, prioritize, preempt and bind read (see ``PodRecord``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import Any

from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.occupancy import Placement, format_gpu_annotation, parse_gpu_annotation
from gpu_tailor.gpumodel.schedule import Demand, NodeState, demand_of, recorded_placement


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
