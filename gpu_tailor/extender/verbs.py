"""The extender's decisions, on the ``k8s.io/kube-scheduler/extender/v1`` wire: pure functions of a snapshot.

Filter, prioritize, preempt and the choice bind makes read a ``Snapshot`` and the request (as
``extender.wire`` reads it), and return the answer; none changes the cache (the server assumes,
remembers and teaches the policy). Field names are the Go struct names (the types carry no JSON
tags): ExtenderFilterResult ``Nodes``, ``NodeNames``, ``FailedNodes``,
``FailedAndUnresolvableNodes``, ``Error``; HostPriority ``Host``, ``Score``.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Any, cast

import numpy as np

from gpu_tailor.extender import draholds
from gpu_tailor.extender.gangbook import Answer, as_the_plugin_sees
from gpu_tailor.extender.records import PodRecord
from gpu_tailor.extender.scores import MAX_SCORE, extender_scores, node_order, tie_order
from gpu_tailor.extender.snapshot import NodeInfo, Snapshot
from gpu_tailor.extender.wire import extender_args, pod_of, victims_of
from gpu_tailor.gpumodel.devices import dra as claims
from gpu_tailor.gpumodel.dra_usage import gpu_column
from gpu_tailor.gpumodel.fleet import PICK_FIRST, Shape
from gpu_tailor.gpumodel.occupancy import Placement, format_gpu_annotation
from gpu_tailor.gpumodel.schedule import Demand, demand_of, fit, pod_key, shape_of


class NotSynced(RuntimeError):
    """The cache has not listed nodes and pods yet: for verbs whose answer has no ``Error`` field, an
    HTTP error (kube-scheduler fails the call and tries the pod again later)."""


_OK = attrgetter("ok")


def _uid(pod: dict[str, Any]) -> str:
    return str(pod["metadata"].get("uid") or pod_key(pod))


def filter_nodes(snap: Snapshot, body: Any, member: Answer | None = None) -> dict[str, Any]:
    """``member``: for a pod of a group placed whole, the one node its group's plan gives it (or why none)."""
    args = extender_args(body)
    names, objs, demand = args.names, args.objs, args.demand
    if not snap.ready:
        return {"Nodes": None, "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
                "Error": "gpu-tailor extender is not synced with the API server yet"}
    passed: list[str] = []
    fit_failed = False  # a node passed for DRA's sake though fit() refused it
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    if member is not None:  # its GPUs there are held for it: no fit to check
        fit_failed = True
        passed = [member.node] if member.node in names else []
        why = member.reason or f"its group's plan puts it on {member.node}"
        failed = {n: why for n in names if n != member.node}
    elif not demand.gpu and not demand.error:
        # nothing of ours to check (kube-scheduler checks CPU, memory and claims), but GPUs plans hold on DRA nodes
        passed, failed = _off_held(snap, args.pod, names) if snap.held else (list(names), failed)
    else:
        served = dra_served(snap, demand)
        fits = snap.fits(names, demand)
        if all(map(_OK, fits)):  # every node fits, as most do: one C loop, not a Python one
            passed = list(names)
        else:
            for name, f in zip(names, fits, strict=True):
                if f.ok or name in served:  # served: DynamicResources allocated a claim for it there already
                    if not f.ok and not _held_room(snap, name, demand.units, ()):
                        failed[name] = HELD
                        continue
                    passed.append(name)
                    if not f.ok:
                        fit_failed = True
                elif f.unresolvable:
                    unresolvable[name] = f.reason
                else:
                    failed[name] = f.reason
    if demand.gpu and not fit_failed:  # every node passed fits: prioritize need not fit them again
        snap.verdicts.filtered(demand, snap.generation, passed)
    out: dict[str, Any] = {"FailedNodes": failed, "FailedAndUnresolvableNodes": unresolvable, "Error": ""}
    if objs is None:
        out["NodeNames"], out["Nodes"] = passed, None
    else:
        out["Nodes"], out["NodeNames"] = {"metadata": {}, "items": [objs[n] for n in passed]}, None
    return out


HELD = "the GPUs free here are held for the pods of a group still to come"


def _held_room(snap: Snapshot, node: str, whole: int, shares: tuple[int, ...] | list[int]) -> bool:
    """Whether a DRA node has room for ``whole`` GPUs and ``shares`` beside what group plans hold there for the
    members still to come (its fleet row counts those as taken: ``draholds``)."""
    if node not in snap.held:
        return True
    row = snap.fleet.index.get(node)
    return row is None or draholds.room(snap.fleet.gpu[row], whole, shares)


def _off_held(snap: Snapshot, pod: dict[str, Any], names: list[str]) -> tuple[list[str], dict[str, str]]:
    """A claim pod's nodes, less the DRA nodes where what the allocator would give it would take GPUs a group's
    plan holds there (and each of those with why)."""
    ladders = claim_ladders(snap, pod)
    if ladders is None:
        return list(names), {}
    inv, usage = snap.dra.inventory(), snap.dra.usage()
    passed, failed = [], {}
    for n in names:
        picks = claims.node_picks(ladders, inv, usage, n) if n in snap.held else None
        if picks is not None and not _held_room(snap, n, *draholds.claim_need(picks.values())):
            failed[n] = HELD
        else:
            passed.append(n)
    return passed, failed


def dra_served(snap: Snapshot, demand: Demand) -> frozenset[str]:
    """The nodes where DRA serves the pod's native resource (KEP-5004): a DeviceClass maps it
    (``extendedResourceName``), the node publishes DRA pools and sells none of it itself. kube-scheduler's
    DynamicResources plugin allocates those units as a claim and filters the node before the extender is asked, so
    the extender passes it: refusing it would disagree with the allocator. Kept while no node comes, goes or changes
    what it sells, and DRA's slices and classes stay: pods bound and claims allocated meanwhile change nothing of it."""
    dra = snap.dra
    if not demand.gpu or not dra.enabled or demand.resource not in dra.extended():
        return frozenset()
    key = (snap.node_layout, dra.layout, demand.resource)
    kept = snap.verdicts.served
    if kept is not None and kept[0] == key:
        return kept[1]
    out = set()
    for node in dra.inventory().nodes():
        info = snap.nodes.get(node)
        if info is None or info.state.inventory.offering(demand.resource) is None:
            out.add(node)
    served = frozenset(out)
    snap.verdicts.served = (key, served)
    return served


def claim_ladders(snap: Snapshot, pod: dict[str, Any]) -> claims.Ladders | None:
    """The rungs of a pod the webhook sent to DRA pools (backing ``dra:...``), from its ask annotation; None for
    any other pod."""
    return draholds.claim_ladders(snap.dra, pod)


def _dra_scores(snap: Snapshot, names: list[str], keys: dict[str, Any]) -> list[dict[str, Any]]:
    """Scores by rank of each node's key (lower first; 0 where there is none), ties by the fixed node order."""
    raw = np.zeros(len(names))
    ok = np.array([keys.get(n) is not None for n in names], bool)
    rank = {k: i for i, k in enumerate(sorted({k for k in keys.values() if k is not None}))}
    for i, n in enumerate(names):
        if ok[i]:
            raw[i] = -rank[keys[n]]
    order = np.array([node_order(n) for n in names], np.int64)
    final = extender_scores(raw, ok, order)
    return [{"Host": n, "Score": v} for n, v in zip(names, final.tolist(), strict=True)]


def _scored(snap: Snapshot, names: list[str]) -> tuple[list[str], list[int]]:
    """The candidates the fleet has a row for, and their rows (a node with a row is in ``snap.nodes``: the
    cache gives a node its row when it copies it there, and takes both away together)."""
    rows = list(map(snap.fleet.index.get, names))  # one C loop: every candidate has a row, nearly always
    if None not in rows:
        return names, cast(list[int], rows)
    known = [n for n, r in zip(names, rows, strict=True) if r is not None]
    return known, [r for r in rows if r is not None]


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
    claimed = _claim_shape(snap, args.pod, args.demand)  # a claim on DRA pools: its share of the GPUs
    return _uid(args.pod), claimed[0] if claimed is not None else _shape(snap, args.demand, args.names)


def prioritize(snap: Snapshot, body: Any, member: Answer | None = None) -> list[dict[str, Any]]:
    """``member``: as for ``filter_nodes``: its planned node first."""
    args = extender_args(body)
    names, demand = args.names, args.demand
    if not snap.ready or not names:
        return [{"Host": n, "Score": 0} for n in names]
    if member is not None:
        return [{"Host": n, "Score": MAX_SCORE if n == member.node else 0} for n in names]
    ladders = claim_ladders(snap, args.pod) if not demand.gpu else None
    if ladders is not None and (packed := _claim_scores(snap, names, ladders, demand)) is not None:
        return packed
    if ladders is not None:  # another claim on DRA pools: the nodes where its smallest rung fits, the fullest first
        dra = snap.dra
        inv, usage = dra.inventory(), dra.usage()
        pooled = inv.nodes()
        return _dra_scores(snap, names, {n: claims.claim_preference(ladders, inv, usage, n) for n in names
                                         if n in pooled})
    served = dra_served(snap, demand)
    if served:
        out = _prioritize_known(snap, names, demand)
        if not any(o["Score"] for o in out):  # no device-plugin node fits: the DRA nodes, best fit first
            return _dra_scores(snap, names, {n: claims.native_preference(snap.dra, n, demand.units)
                                             for n in names if n in served})
        return out  # device-plugin nodes stay the home of native asks, as before DRA
    return _prioritize_known(snap, names, demand)


def _claim_shape(snap: Snapshot, pod: dict[str, Any], demand: Demand) -> tuple[Shape, bool] | None:
    """The fleet's shape of a pod's claim on DRA pools (``claims.fleet_shape``), and whether it shares a device."""
    ladders = claim_ladders(snap, pod) if not demand.gpu else None
    return claims.fleet_shape(ladders, demand.cpu_milli, demand.memory_mib) if ladders is not None else None


def _claim_scores(snap: Snapshot, names: list[str], ladders: claims.Ladders,
                  demand: Demand) -> list[dict[str, Any]] | None:
    """A claim of whole GPUs or of a share of a shared GPU, ranked as a device-plugin ask is: the policy scores the
    placement kube-scheduler's allocator will make on each node (the devices it takes first, ``PICK_FIRST`` rows of
    the fleet) by the fragmentation it leaves. A node counts where the allocator can allocate the claim now
    (``claims.node_picks``), on the device the fleet predicts too. None for a claim the fleet cannot hold, and where
    a node the allocator can serve has no fleet row of the claim's kind (GPUs shared and whole on one node, or sold by
    the device plugin too): the fixed order then ranks them all on one scale."""
    fitted = claims.fleet_shape(ladders, demand.cpu_milli, demand.memory_mib)
    if fitted is None:
        return None
    shape, shared = fitted
    fleet, inv, usage = snap.fleet, snap.dra.inventory(), snap.dra.usage()
    pooled = inv.nodes()
    known: list[str] = []  # the candidates the allocator can serve now, and its pick there
    picked: list[claims.Pick] = []
    for n in names:
        picks = claims.node_picks(ladders, inv, usage, n) if n in pooled else None
        pick = next(iter(picks.values())) if picks else None
        if pick is None:
            continue
        if n not in fleet.index or fleet.pick[fleet.index[n]] != PICK_FIRST or pick.device.shared != shared:
            return None
        known.append(n)
        picked.append(pick)
    rows = np.array([fleet.index[n] for n in known], np.int64)
    scores, gpu = snap.policy.node_scores(shape, rows) if len(rows) else (np.zeros(0), np.zeros(0, np.int64))
    ok = ~np.isnan(scores)
    if shared:  # the share's device as the fleet rounds it is the allocator's: else its score is not the pick's
        for i in np.flatnonzero(ok):
            column = gpu_column(inv.on_node(known[i]), usage)
            ok[i] = column is not None and int(gpu[i]) == column.names.index(picked[i].device.name)
    policy = snap.policy
    whole = shape if policy.keep_whole_nodes else None
    final = extender_scores(scores, ok, tie_order(fleet, rows, True, whole, policy.tie_keys))
    by_name = dict(zip(known, final.tolist(), strict=True))
    return [{"Host": n, "Score": by_name.get(n, 0)} for n in names]


def _prioritize_known(snap: Snapshot, names: list[str], demand: Demand) -> list[dict[str, Any]]:
    known, at = _scored(snap, names)
    shape = _shape(snap, demand, known)
    rows = np.array(at, np.int64)
    scores, _ = snap.policy.node_scores(shape, rows) if len(rows) else (np.zeros(0), None)
    ok = ~np.isnan(scores)  # NaN: does not fit
    if demand.gpu and ok.any():  # the fleet model is coarse for MIG/replicas: a node must also pass fit()
        fitting = np.flatnonzero(ok)
        candidates = known if len(fitting) == len(known) else [known[i] for i in fitting]
        if not snap.verdicts.all_passed(demand, snap.generation, candidates):  # else filter just fitted them
            ok[fitting] = [f.ok for f in snap.fits(candidates, demand)]
    degraded = snap.degraded
    if degraded:
        ok &= np.array([n not in degraded for n in known], bool)  # degraded nodes last
    policy = snap.policy
    whole = shape if policy.keep_whole_nodes else None
    final = extender_scores(scores, ok, tie_order(snap.fleet, rows, demand.gpu, whole, policy.tie_keys))  # by rank
    if len(known) == len(names):  # every candidate known, in order
        return [{"Host": n, "Score": v} for n, v in zip(names, final.tolist(), strict=True)]
    by_name = dict(zip(known, final.tolist(), strict=True))
    return [{"Host": n, "Score": by_name.get(n, 0)} for n in names]


def _fits_without(info: NodeInfo, demand: Demand, victims: list[str]) -> bool:
    """Whether the pod passes the extender's checks on the node once every victim counted there is gone:
    ``fit`` (health, product, counts, per-GPU room, MIG layout, NVLink) and, as kube-scheduler's
    NodeResourcesFit does, CPU and memory requests against allocatable (a zero request always fits)."""
    node = info.state.copy()  # a private copy: the snapshot is never changed
    by_uid = {r.uid: r for r in info.pods.values()}
    for uid in victims:
        rec = by_uid.get(uid)  # a victim not counted here frees nothing the extender can see
        if rec is None:
            continue
        d = rec.demand
        if node.gpus.release(rec.key) is not None:
            node.units_used[d.resource] = node.units_used.get(d.resource, 0) - d.units
        node.cpu_used -= d.cpu_milli
        node.mem_used_mib -= d.memory_mib
    inv = node.inventory
    if demand.cpu_milli and demand.cpu_milli > inv.cpu_milli - node.cpu_used:
        return False
    if demand.memory_mib and demand.memory_mib > inv.memory_bytes // 2**20 - node.mem_used_mib:
        return False
    return fit(node, demand, place=False).ok


def preempt(snap: Snapshot, body: Any) -> dict[str, Any]:
    """The candidates of kube-scheduler's preemption the extender agrees with, each with all its victims.

    kube-scheduler (DefaultPreemption's ``SelectVictimsOnNode``) evicts every lower-priority pod of a
    node on paper, then gives back one by one each pod the preemptor still fits without, by its in-tree
    filters: CPU, memory and the GPU counts (NodeResourcesFit), ports, affinity, nominated pods... So
    every victim it proposes is one some in-tree filter needs gone, and none can be dropped here without
    the pod failing that filter after the evictions. The extender therefore never thins a victim list
    (dropping the GPU victims whose CPUs were needed is what made the evictions useless); it only
    removes the nodes where, with every proposed victim gone, the pod would still fail its own checks
    (a GPU free by count but not where the pod needs it, NVLink, MIG layout, health, or CPU/memory).

    What kube-scheduler's ``callExtenders`` does with the answer (v1.28): a node left out stops being a
    candidate; a node mapped to an empty victim list fails the whole preemption ("expected at least one
    victim pod on node") for an extender that is not ignorable, as this one is not. So a node is either
    answered with a non-empty list or left out, never answered empty.
    """
    pod = pod_of(body)
    victims = victims_of(body)
    if not snap.ready:
        raise NotSynced("gpu-tailor extender is not synced with the API server yet")
    demand = demand_of(pod)
    out: dict[str, Any] = {}
    if demand.error:
        return {"NodeNameToMetaVictims": out}  # filter fails every node as unresolvable
    served = dra_served(snap, demand)
    for node, (uids, pdb) in victims.items():
        if not uids:
            continue
        info = snap.nodes.get(node)
        if info is None:
            if demand.gpu:
                continue  # filter fails a node it does not know yet: evicting there would be for nothing
        elif not _fits_without(info, demand, uids) and node not in served:
            continue
        out[node] = {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": pdb}
    return {"NodeNameToMetaVictims": out}


@dataclass(frozen=True, slots=True)
class BindPlan:
    """What bind does: the GPUs to assume and annotate (None: no GPUs, or a node gpu-tailor does not
    know), or why it must not bind (``error``, for kube-scheduler's ``Error``)."""

    placement: Placement | None = None
    error: str = ""

    @property
    def gpus(self) -> str | None:
        """The ``gpu-tailor.io/gpus`` annotation to write; None when no GPU of it is known (a MIG layout
        that cannot be told: the units are counted, not placed; a degraded node whose unsold GPUs are
        not known: the GPUs are bookkeeping, not a promise)."""
        p = self.placement
        known = p.gpus if p is not None and not p.counted else ()
        return format_gpu_annotation(known) if known else None

    @property
    def among(self) -> str | None:
        """The ``gpu-tailor.io/gpus-among`` annotation to write beside ``gpus``: every GPU the device plugin may
        pick among, where it may pick other GPUs than ``gpus`` names; else None."""
        p = self.placement
        return format_gpu_annotation(p.maybe) if p is not None and p.maybe and self.gpus is not None else None


def plan_bind(snap: Snapshot, rec: PodRecord, node: str) -> BindPlan:
    """The GPUs the pod gets on ``node``: what the device plugin would hand it, on the node as it is now. The plugin
    does not see the GPUs a group's plan holds for its members still to come: none counts here, the one held for the
    pod itself neither (``gangbook.as_the_plugin_sees``)."""
    info = snap.nodes.get(node)
    if not rec.demand.gpu or info is None or node in dra_served(snap, rec.demand):
        return BindPlan()  # no GPU of ours, or a claim's allocation is the record
    state = as_the_plugin_sees(info.state, info.pods.items())
    f = fit(state, rec.demand)
    if not f.ok:
        return BindPlan(error=f"pod {rec.key} no longer fits {node}: {f.reason}")
    return BindPlan(f.placement)
