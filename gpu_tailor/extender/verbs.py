"""The four extender verbs over the cluster state, on the ``k8s.io/kube-scheduler/extender/v1`` wire.

Field names are the Go struct names (the types carry no JSON tags): ExtenderArgs ``Pod``, ``Nodes``,
``NodeNames``; ExtenderFilterResult ``Nodes``, ``NodeNames``, ``FailedNodes``,
``FailedAndUnresolvableNodes``, ``Error``; HostPriority ``Host``, ``Score``; ExtenderBindingArgs
``PodName``, ``PodNamespace``, ``PodUID``, ``Node``; ExtenderPreemptionArgs ``Pod``,
``NodeNameToVictims``, ``NodeNameToMetaVictims``.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from gpu_tailor.extender.state import ClusterState, PodRecord
from gpu_tailor.gpumodel.occupancy import Placement
from gpu_tailor.gpumodel.schedule import Demand, NodeState, demand_of, fit, pod_key, shape_of

MAX_SCORE = 10


class WireError(ValueError):
    """The body is not what kube-scheduler sends: HTTP 400."""


def _pod(body: Any) -> dict[str, Any]:
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
        if not all(isinstance(n, str) for n in names):
            raise WireError("'NodeNames' must be a list of strings")
        return list(names), None
    nodes = body.get("Nodes")
    if isinstance(nodes, dict) and isinstance(nodes.get("items"), list):
        objs = {str((n.get("metadata") or {}).get("name", "")): n for n in nodes["items"] if isinstance(n, dict)}
        return list(objs), objs
    raise WireError("expected 'NodeNames' (nodeCacheCapable) or 'Nodes' with 'items'")


def filter_nodes(state: ClusterState, body: Any) -> dict[str, Any]:
    pod = _pod(body)
    names, objs = _node_names(body)
    if not state.ready:
        return {"Nodes": None, "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
                "Error": "gpu-tailor extender is not synced with the API server yet"}
    demand = demand_of(pod)
    passed: list[str] = []
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    if not demand.gpu and not demand.error:
        passed = list(names)  # nothing of ours to check: kube-scheduler checks CPU and memory
    else:
        for name, f in zip(names, state.fits(names, demand), strict=True):
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


def prioritize(state: ClusterState, body: Any) -> list[dict[str, Any]]:
    pod = _pod(body)
    names, _ = _node_names(body)
    if not state.ready or not names:
        return [{"Host": n, "Score": 0} for n in names]
    demand = demand_of(pod)
    known = [n for n in names if n in state.nodes and n in state.fleet.index]
    offering = None
    for n in known:
        offering = state.nodes[n].inventory.offering(demand.resource) if demand.gpu else None
        if offering is not None:
            break
    shape = shape_of(demand, offering)
    policy = state.policy
    uid = _uid(pod)
    state.observe(uid, shape)
    rows = np.array([state.fleet.index[n] for n in known], np.int64)
    scores, _ = policy.node_scores(shape, rows) if len(rows) else (np.zeros(0), None)
    by_name = {n: s for n, s in zip(known, scores.tolist(), strict=True) if s == s}  # NaN: does not fit
    if demand.gpu:  # the fleet model is coarse for MIG/replicas: a node must also pass fit()
        ok = state.fits(list(by_name), demand)
        by_name = {n: s for (n, s), f in zip(by_name.items(), ok, strict=True) if f.ok}
    degraded = state.degraded
    healthy = [s for n, s in by_name.items() if n not in degraded]
    lo, hi = (min(healthy), max(healthy)) if healthy else (0.0, 0.0)
    out = []
    for n in names:
        s = by_name.get(n)
        if s is None or n in degraded:
            score = 0  # degraded nodes last
        elif hi > lo:
            score = 1 + round((s - lo) * (MAX_SCORE - 1) / (hi - lo))
        else:
            score = MAX_SCORE
        out.append({"Host": n, "Score": int(score)})
    return out


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


def preempt(state: ClusterState, body: Any) -> dict[str, Any]:
    pod = _pod(body)
    meta_victims = body.get("NodeNameToMetaVictims")
    full_victims = body.get("NodeNameToVictims")
    source = meta_victims if isinstance(meta_victims, dict) else full_victims if isinstance(full_victims, dict) else {}
    demand = demand_of(pod)
    out: dict[str, Any] = {}
    for node, entry in source.items():
        uids = _victim_uids(entry)
        pdb = int((entry or {}).get("NumPDBViolations") or 0)
        ns = state.nodes.get(node)
        if not demand.gpu or ns is None:
            out[node] = {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": pdb}
            continue
        victims = [state.pods.get(state.by_uid.get(uid, "")) for uid in uids]
        trial = _Trial(ns)
        for rec in victims:
            if rec is not None and rec.node == node and rec.demand.gpu:
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
