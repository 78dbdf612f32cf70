"""The extender's record of one pod: what decisions need of it, and how a pod event changes it.

A record is never the pod object: the cache keeps one per pod of the cluster (100,000 in a big one),
so it holds only what filter, prioritize, preempt and bind read (see ``PodRecord``).
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import orjson
import simdjson

from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.occupancy import Placement, format_gpu_annotation, parse_gpu_annotation
from gpu_tailor.gpumodel.schedule import Demand, NodeState, demand_of, pod_key, recorded_placement
from gpu_tailor.kube.podfields import CONTAINER_FIELDS, containers, meta_fields, pick, raw_json, slim_pod


@dataclass(frozen=True, slots=True)
class PodRecord:
    """One pod as decisions need it -- never the pod object (0.6 KiB with its Demand, Placement, strings
    and the cache's indexes: some 60 MB for 100,000 pods, ``benchmarks/extender_state.py``).

    ``demand``: what it asks for (its ``key`` is the pod's namespace/name); ``uid``; ``node``: where it
    is bound or assumed, "" while pending and once finished (a Succeeded or Failed pod holds nothing);
    ``placement``: the GPUs it holds there (None for CPU-only pods, or while its node is unknown);
    ``recorded``: its ``gpu-tailor.io/gpus`` annotation as read (None: absent or unreadable), for a node
    that shows up after the pod; ``deadline``: None once the watch has shown the pod, else the clock
    time its assumption expires (infinite while its Binding is in flight); ``version``: the
    resourceVersion it was read at ("" when unknown); ``scored``: the assumption is the node this
    extender ranked first, where kube-scheduler is expected to bind it, not a Binding of its own.
    """

    uid: str
    node: str
    demand: Demand
    placement: Placement | None = None
    recorded: tuple[int, ...] | None = None
    deadline: float | None = None
    version: str = ""  # the pod's resourceVersion as read: the same again is the same pod, nothing to redo
    among: tuple[int, ...] | None = None  # its ``gpu-tailor.io/gpus-among`` annotation, with ``recorded``
    scored: bool = False  # assumed where prioritize ranked it first, no Binding of ours sent (``Cache.assume``)

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
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    raw = annotations.get(labels.ANN_GPUS)
    recorded = parse_gpu_annotation(str(raw)) if raw is not None else None
    among = annotations.get(labels.ANN_GPUS_AMONG) if recorded is not None else None
    return PodRecord(str(meta.get("uid", "")), node, demand or demand_of(pod), recorded=recorded,
                     version=str(meta.get("resourceVersion") or ""),
                     among=parse_gpu_annotation(str(among)) if among is not None else None)


def pod_version(pod: dict[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("resourceVersion") or "")


BIND_RECORD = frozenset({labels.ANN_GPUS, labels.ANN_GPUS_AMONG})  # what bind writes: not part of the ask
ASK = "@ask"  # in a projected pod: the bytes that identify what it asks for (see ``PodProjector``)
KNOWN = "@known"  # in a projected pod: only its metadata, as the cache held it at that version


class PodProjector:
    """``slim_pod`` for the watch: a pod parsed lazily by simdjson (a list page of 100,000 pods, every
    event) becomes the few fields records read, and the rest of it -- managedFields, volumes, env,
    status -- is never built.

    ``known(namespace/name, resourceVersion)``: whether the cache holds that pod at that version
    already; such a pod (most of a relist after a dropped watch, and a deletion) is read no further
    than its metadata.

    Replicas ask alike, so the containers' part is built once per distinct ask and shared: the ask is
    identified by the raw JSON of each container's name, resources and restart policy, the overhead,
    and the project's annotations but bind's (``ASK``, which ``Demands`` keys on), and on a hit only the
    name, uid, node and phase are read. Plain dicts are projected by ``slim_pod``."""

    def __init__(self, known: Callable[[str, str], bool] | None = None, size: int = 4096) -> None:
        self.known = known
        self.size = size
        self.parts: OrderedDict[bytes, dict[str, Any]] = OrderedDict()

    def __call__(self, obj: Any) -> dict[str, Any]:
        if not isinstance(obj, simdjson.Object):
            return slim_pod(obj)
        top = pick(obj, ("metadata", "spec", "status"))
        picked = pick(top.get("metadata"), ("name", "namespace", "uid", "resourceVersion", "annotations"))
        version = picked.get("resourceVersion")
        if self.known is not None and isinstance(version, str) and version and \
                self.known(f"{picked.get('namespace', '')}/{picked.get('name', '')}", version):
            # the cache holds the pod at this version: its name, uid and version are all it needs
            picked.pop("annotations", None)
            return {"metadata": picked, KNOWN: True}
        meta = meta_fields(picked)
        out: dict[str, Any] = {"metadata": meta}
        raw_spec = top.get("spec")
        if isinstance(raw_spec, simdjson.Object):
            spec = pick(raw_spec, ("nodeName", "containers", "initContainers", "overhead"))
            ask = self._ask(spec, meta.get("annotations"))
            parts = self.parts.get(ask)
            if parts is None:
                parts = self.parts[ask] = containers(raw_spec)
                if len(self.parts) > self.size:
                    self.parts.popitem(last=False)
            s = dict(parts)  # the lists inside are shared between the pods that ask alike: read only
            if (node := spec.get("nodeName")) is not None:
                s["nodeName"] = node
            out["spec"] = s
            out[ASK] = ask
        status = top.get("status")
        if isinstance(status, simdjson.Object) and (phase := pick(status, ("phase",)).get("phase")) is not None:
            out["status"] = {"phase": phase}
        return out

    @staticmethod
    def _ask(spec: dict[str, Any], annotations: dict[str, Any] | None) -> bytes:
        chunks: list[bytes] = []
        for key, names in CONTAINER_FIELDS:
            chunks.append(key.encode())
            raw = spec.get(key)
            if isinstance(raw, simdjson.Array):  # as it should be
                for c in raw:
                    if isinstance(c, simdjson.Object):
                        fields = pick(c, names)
                        chunks.extend(raw_json(fields.get(f)) for f in names)
                    else:
                        chunks.append(raw_json(c))
            else:
                chunks.append(raw_json(raw))
        chunks.append(raw_json(spec.get("overhead")))
        if annotations:
            chunks.append(orjson.dumps({k: v for k, v in annotations.items() if k not in BIND_RECORD}))
        return b"\0".join(chunks)


class Demands:
    """``demand_of`` per pod, worked out once per distinct ask: the replicas of a workload ask alike,
    and a relist of 100,000 pods is mostly the same few dozen asks. The ask is a projected pod's
    ``ASK``, else the JSON of what the demand is read from (the project's annotations but bind's,
    the containers and init containers, the overhead)."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self.memo: OrderedDict[bytes, tuple[Demand, tuple[Any, ...]]] = OrderedDict()

    def of(self, pod: dict[str, Any], key: str | None = None) -> Demand:
        """``demand_of(pod)``; ``key``: the pod's namespace/name, when the caller has it."""
        ask = pod.get(ASK)
        if not isinstance(ask, bytes):
            meta, spec = pod.get("metadata"), pod.get("spec")
            if not isinstance(meta, dict) or not isinstance(spec, dict):
                return demand_of(pod)
            annotations = meta.get("annotations")
            if isinstance(annotations, dict) and labels.ANN_GPUS in annotations:  # bind's record, not the ask
                annotations = {k: v for k, v in annotations.items() if k not in BIND_RECORD}
            try:
                ask = orjson.dumps((annotations, spec.get("containers"), spec.get("initContainers"),
                                    spec.get("overhead")))
            except TypeError:  # not JSON (a pod built by hand): no memo
                return demand_of(pod)
        key = key if key is not None else pod_key(pod)
        known = self.memo.get(ask)
        if known is None:
            demand = demand_of(pod)
            self.memo[ask] = (demand, astuple_rest(demand))
            if len(self.memo) > self.size:
                self.memo.popitem(last=False)
            return demand if demand.key == key else replace(demand, key=key)
        return Demand(key, *known[1])


def astuple_rest(demand: Demand) -> tuple[Any, ...]:
    """Every field of ``demand`` but its key, in order (to build the demands of other pods that ask alike)."""
    return tuple(getattr(demand, f.name) for f in fields(demand)[1:])


def live(rec: PodRecord, now: float) -> bool:
    """An assumption still within its deadline."""
    return rec.deadline is not None and rec.deadline > now


def holds(placement: Placement | None) -> tuple[int, ...] | None:
    """The GPUs of a placement as its annotation writes them."""
    return tuple(sorted(placement.gpus)) if placement is not None else None


def where(ns: NodeState, demand: Demand, gpus: tuple[int, ...] | None,
          among: tuple[int, ...] | None = None) -> Placement | None:
    """The placement on ``ns`` for these GPUs (kept or annotated, with the GPUs they were picked among), or
    predicted when there are none."""
    annotations = {labels.ANN_GPUS: format_gpu_annotation(gpus)} if gpus else {}
    if gpus and among:
        annotations[labels.ANN_GPUS_AMONG] = format_gpu_annotation(among)
    return recorded_placement({"metadata": {"annotations": annotations}}, ns, demand)


def confirmed(assumed: PodRecord, seen: PodRecord) -> PodRecord:
    """The watch shows an assumed pod bound where bind put it: it keeps the GPUs bind chose, unless
    its own annotation names others."""
    return kept(assumed, seen)  # ``seen`` has no deadline: the result is confirmed


def kept(old: PodRecord, seen: PodRecord) -> PodRecord:
    """The pod as the API shows it now, on the node it was on: its GPUs stay unless its annotation
    changed to name others (or it asks for something else). An annotation read before names what bind picked, which a
    node agent's report may since have replaced: the same annotation again is no news."""
    renamed = (seen.recorded is not None and seen.recorded != holds(old.placement)
               and (seen.recorded, seen.among) != (old.recorded, old.among))
    if seen.demand != old.demand or renamed:
        return seen
    return replace(seen, placement=old.placement)
