"""The extender's decisions, on the ``k8s.io/kube-scheduler/extender/v1`` wire: pure functions of a snapshot.

Filter, prioritize, preempt and the choice bind makes read a ``Snapshot`` and the request, and return
the answer; none changes the cache (the server assumes, remembers and teaches the policy). Field
names are the Go struct names (the types carry no JSON tags): ExtenderArgs ``Pod``, ``Nodes``,
``NodeNames``; ExtenderFilterResult ``Nodes``, ``NodeNames``, ``FailedNodes``,
``FailedAndUnresolvableNodes``, ``Error``; HostPriority ``Host``, ``Score``; ExtenderBindingArgs
``PodName``, ``PodNamespace``, ``PodUID``, ``Node``; ExtenderPreemptionArgs ``Pod``,
``NodeNameToVictims``, ``NodeNameToMetaVictims``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_tailor.extender.records import PodRecord
from gpu_tailor.extender.snapshot import Snapshot
from gpu_tailor.gpumodel.fleet import Shape
from gpu_tailor.gpumodel.occupancy import Placement, format_gpu_annotation
from gpu_tailor.gpumodel.schedule import Demand, NodeState, demand_of, fit, pod_key, shape_of

MAX_SCORE = 10


class WireError(ValueError):
    """The body is not what kube-scheduler sends: HTTP 400."""


def pod_of(body: Any) -> dict[str, Any]:
    """The ``Pod`` of ExtenderArgs or ExtenderPreemptionArgs."""
    if not isinstance(body, dict):
        raise WireError("expected a JSON object")
    pod = body.get("Pod")
    if not isinstance(pod, dict) or not isinstance(pod.get("metadata"), dict):
        raise WireError("'Pod' must be a Pod object with metadata")
    return pod


def _uid(pod: dict[str, Any]) -> str:
    return str(pod["metadata"].get("uid") or pod_key(pod))


def _node_names(body: dict[str, Any]) -> tuple[list[str], dict[str, dict[str, Any]] | None]:
    """Candidate names, and the node objects when the scheduler sent a full NodeList."""
    names = body.get("NodeNames")
    if isinstance(names, list):
        if not set(map(type, names)) <= {str}:  # a few hundred names: no Python loop over them
            raise WireError("'NodeNames' must be a list of strings")
        return list(names), None
    nodes = body.get("Nodes")
    if isinstance(nodes, dict) and isinstance(nodes.get("items"), list):
        objs = {str((n.get("metadata") or {}).get("name", "")): n for n in nodes["items"] if isinstance(n, dict)}
        return list(objs), objs
    raise WireError("expected 'NodeNames' (nodeCacheCapable) or 'Nodes' with 'items'")


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """ExtenderArgs read once per request: the Pod, the candidates (and their objects when the
    scheduler sent a NodeList) and the pod's demand, which filter, prioritize and the cache share."""

    pod: dict[str, Any]
    names: list[str]
    objs: dict[str, dict[str, Any]] | None
    demand: Demand


def extender_args(body: Any) -> ExtenderArgs:
    if isinstance(body, ExtenderArgs):
        return body
    pod = pod_of(body)
    names, objs = _node_names(body)
    return ExtenderArgs(pod, names, objs, demand_of(pod))


def filter_nodes(snap: Snapshot, body: Any) -> dict[str, Any]:
    args = extender_args(body)
    names, objs, demand = args.names, args.objs, args.demand
    if not snap.ready:
        return {"Nodes": None, "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
                "Error": "gpu-tailor extender is not synced with the API server yet"}
    passed: list[str] = []
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    if not demand.gpu and not demand.error:
        passed = list(names)  # nothing of ours to check: kube-scheduler checks CPU and memory
    else:
        for name, f in zip(names, snap.fits(names, demand), strict=True):
            if f.ok:
                passed.append(name)
            elif f.unresolvable:
                unresolvable[name] = f.reason
            else:
                failed[name] = f.reason
    out: dict[str, Any] = {"FailedNodes": failed, "FailedAndUnresolvableNodes": unresolvable, "Error": ""}
    if objs is None:
        out["NodeNames"], out["Nodes"] = passed, None
    else:
        out["Nodes"], out["NodeNames"] = {"metadata": {}, "items": [objs[n] for n in passed]}, None
    return out


def _scored(snap: Snapshot, names: list[str]) -> tuple[list[str], list[int]]:
    """The candidates the fleet has a row for, and their rows."""
    nodes, index = snap.nodes, snap.fleet.index
    known, rows = [], []
    for n in names:
        row = index.get(n)
        if row is not None and n in nodes:
            known.append(n)
            rows.append(row)
    return known, rows


def _shape(snap: Snapshot, demand: Demand, names: list[str]) -> Shape:
    """The pod's shape, with the offering of the first candidate the fleet has a row for that offers
    its resource (the first one, nearly always: no pass over all the candidates)."""
    if demand.gpu:
        for n in names:
            info = snap.nodes.get(n)
            if info is not None and n in snap.fleet.index:
                offering = info.state.inventory.offering(demand.resource)
                if offering is not None:
                    return shape_of(demand, offering)
    return shape_of(demand, None)


def shape_asked(snap: Snapshot, body: Any) -> tuple[str, Shape] | None:
    """The uid and shape of the pod prioritize is asked to score (what the policy learns its mix from);
    None when prioritize would not score it."""
    args = extender_args(body)
    if not snap.ready or not args.names:
        return None
    return _uid(args.pod), _shape(snap, args.demand, args.names)


def prioritize(snap: Snapshot, body: Any) -> list[dict[str, Any]]:
    args = extender_args(body)
    names, demand = args.names, args.demand
    if not snap.ready or not names:
        return [{"Host": n, "Score": 0} for n in names]
    known, at = _scored(snap, names)
    shape = _shape(snap, demand, known)
    rows = np.array(at, np.int64)
    scores, _ = snap.policy.node_scores(shape, rows) if len(rows) else (np.zeros(0), None)
    ok = ~np.isnan(scores)  # NaN: does not fit
    if demand.gpu and ok.any():  # the fleet model is coarse for MIG/replicas: a node must also pass fit()
        fitting = np.flatnonzero(ok)
        ok[fitting] = [f.ok for f in snap.fits([known[i] for i in fitting], demand)]
    degraded = snap.degraded
    if degraded:
        ok &= np.array([n not in degraded for n in known], bool)  # degraded nodes last
    # whole arrays, not a loop over a few hundred candidates: 1..MAX_SCORE over the nodes that fit
    final = np.zeros(len(known), np.int64)
    if ok.any():
        s = scores[ok]
        lo, hi = s.min(), s.max()
        final[ok] = 1 + np.round((s - lo) * (MAX_SCORE - 1) / (hi - lo)) if hi > lo else MAX_SCORE
    if len(known) == len(names):  # every candidate known, in order
        return [{"Host": n, "Score": v} for n, v in zip(names, final.tolist(), strict=True)]
    by_name = dict(zip(known, final.tolist(), strict=True))
    return [{"Host": n, "Score": by_name.get(n, 0)} for n in names]


def _victim_uids(entry: Any) -> list[str]:
    pods = (entry or {}).get("Pods") or []
    uids = []
    for p in pods:
        if isinstance(p, dict):
            uid = p.get("UID") or ((p.get("metadata") or {}).get("uid"))
            if uid:
                uids.append(str(uid))
    return uids


class _Trial:
    """A private copy of one node to evict victims on, and to put them back (preempt's what-ifs)."""

    def __init__(self, ns: NodeState) -> None:
        self.node = copy.copy(ns)
        self.node.gpus = ns.gpus.copy()
        self.node.units_used = dict(ns.units_used)
        self.evicted: dict[str, Placement] = {}

    def _count(self, rec: PodRecord, sign: int) -> None:
        used = self.node.units_used
        used[rec.demand.resource] = used.get(rec.demand.resource, 0) + sign * rec.demand.units

    def evict(self, rec: PodRecord) -> None:
        placement = self.node.gpus.release(rec.key)
        if placement is not None:
            self.evicted[rec.key] = placement
            self._count(rec, -1)

    def restore(self, rec: PodRecord) -> None:
        placement = self.evicted.pop(rec.key, None)
        if placement is not None:
            self.node.gpus.place(rec.key, placement)
            self._count(rec, +1)

    def fits(self, demand: Demand) -> bool:
        return fit(self.node, demand, place=False).ok


def preempt(snap: Snapshot, body: Any) -> dict[str, Any]:
    pod = pod_of(body)
    meta_victims = body.get("NodeNameToMetaVictims")
    full_victims = body.get("NodeNameToVictims")
    source = meta_victims if isinstance(meta_victims, dict) else full_victims if isinstance(full_victims, dict) else {}
    demand = demand_of(pod)
    out: dict[str, Any] = {}
    for node, entry in source.items():
        uids = _victim_uids(entry)
        pdb = int((entry or {}).get("NumPDBViolations") or 0)
        info = snap.nodes.get(node)
        if not demand.gpu or info is None:
            out[node] = {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": pdb}
            continue
        counted = {r.uid: r for r in info.pods.values()}
        victims = [counted.get(uid) for uid in uids]  # only pods counted on that node
        trial = _Trial(info.state)
        for rec in victims:
            if rec is not None and rec.demand.gpu:
                trial.evict(rec)
        if not trial.fits(demand):
            continue  # evicting them all still would not free the GPUs it needs
        keep = list(uids)
        # drop victims whose GPUs it does not need (CPU-only victims stay): put each back in turn and
        # keep it there while the pod still fits
        for uid, rec in zip(uids, victims, strict=True):
            if rec is None or not rec.demand.gpu:
                continue
            trial.restore(rec)
            if trial.fits(demand):
                keep = [u for u in keep if u != uid]
            else:
                trial.evict(rec)
        out[node] = {"Pods": [{"UID": u} for u in keep], "NumPDBViolations": pdb}
    return {"NodeNameToMetaVictims": out}


@dataclass(frozen=True, slots=True)
class BindArgs:
    """ExtenderBindingArgs."""

    namespace: str
    name: str
    uid: str
    node: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def bind_args(body: Any) -> BindArgs:
    if not isinstance(body, dict) or not all(isinstance(body.get(k), str) for k in ("PodName", "PodNamespace",
                                                                                    "Node")):
        raise WireError("expected ExtenderBindingArgs with PodName, PodNamespace, PodUID, Node")
    return BindArgs(body["PodNamespace"], body["PodName"], str(body.get("PodUID") or ""), body["Node"])


@dataclass(frozen=True, slots=True)
class BindPlan:
    """What bind does: the GPUs to assume and annotate (None: no GPUs, or a node gpu-tailor does not
    know), or why it must not bind (``error``, for kube-scheduler's ``Error``)."""

    placement: Placement | None = None
    error: str = ""

    @property
    def gpus(self) -> str | None:
        """The ``gpu-tailor.io/gpus`` annotation to write; None when no GPU of it is known (a MIG layout
        that cannot be told: the units are counted, not placed)."""
        known = self.placement.gpus if self.placement is not None else ()
        return format_gpu_annotation(known) if known else None


def plan_bind(snap: Snapshot, rec: PodRecord, node: str) -> BindPlan:
    """The GPUs the pod gets on ``node``: what the device plugin would hand it, on the node as it is now."""
    info = snap.nodes.get(node)
    if not rec.demand.gpu or info is None:
        return BindPlan()
    f = fit(info.state, rec.demand)
    if not f.ok:
        return BindPlan(error=f"pod {rec.key} no longer fits {node}: {f.reason}")
    return BindPlan(f.placement)
