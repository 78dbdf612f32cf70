"""The books of the extender's cache (``extender.cache``): each node's state, the pods counted on it, the GPUs
each pod holds there, and the node agents' reports that say which GPUs those are.

Pods are kept as ``PodRecord``s, never as pod objects, and indexed per node, so a node event touches
only that node's pods. A pod's GPUs are chosen once -- at bind, from its ``gpu-tailor.io/gpus``
annotation, or predicted the first time it is seen bound without one -- and then stay with its
record: a node event re-places the node's pods from their records, and a pod event moves a pod's GPUs
only when its node or its own annotation says otherwise.

Where a node agent runs (``gpu-tailor agent``), its ``NodeGPUReport`` says which GPUs each pod of the
node really holds, which GPUs the device plugin does not sell, and the NVLink peers NVML sees. The
cache prefers it to every prediction and annotation: a pod the report names holds the reported GPUs
(``_place``), and each pod whose reported GPUs the prediction (or bind's annotation) did not allow is
counted once in ``contradictions``. Without a report, or for pods it does not name yet (bound since
the agent last looked), the prediction stands.

``Cache`` builds on these books: it decides what pod events, bind and requests write in them, and copies the
nodes that changed into the read side its snapshots are taken from.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gpu_tailor.extender.gangbook import as_the_plugin_sees
from gpu_tailor.extender.records import PodRecord, holds, where
from gpu_tailor.gpumodel.fleet import Shape
from gpu_tailor.gpumodel.inventory import NodeInventory, from_node
from gpu_tailor.gpumodel.occupancy import Placement
from gpu_tailor.gpumodel.policies import TailorPolicy
from gpu_tailor.gpumodel.report import NodeReport, parse_time
from gpu_tailor.gpumodel.report import parse as parse_report
from gpu_tailor.gpumodel.schedule import NodeState, node_state, shape_of
from gpu_tailor.gpumodel.topology import from_peers

log = logging.getLogger(__name__)

REPORT_STALE = 900.0  # seconds a node agent's report may go unrenewed (the agent renews it every 300 s)
REPORT_CHECK = 30.0  # seconds between looks for stale reports


class Ledger:
    """Nodes, the pods counted on them and the node agents' reports, kept by ``Cache``, which builds on them."""

    def __init__(self, policy: TailorPolicy, clock: Callable[[], float], wall: Callable[[], float],
                 report_stale: float | None) -> None:
        """``policy``: the placement policy, which learns the mix of pod shapes (``observe``); ``clock``, ``wall``
        and ``report_stale``: as ``Cache`` takes them."""
        self.policy, self.clock, self.wall, self.report_stale = policy, clock, wall, report_stale
        self.nodes: dict[str, NodeState] = {}  # the writer's own copies, changed in place
        self.generation: dict[str, int] = {}
        self.kind_of: dict[str, int] = {}
        self.kinds: dict[tuple[Any, ...], int] = {}
        self.pods: dict[str, PodRecord] = {}  # by namespace/name
        self.on_node: dict[str, dict[str, PodRecord]] = {}  # node -> key -> record, nodes not known yet too
        self.assumed: set[str] = set()  # keys of assumed records
        self.seen: set[str] = set()  # uids of the pods whose shape the policy has learnt
        self._last_generation = 0
        self.node_layout = 0  # counts nodes added, removed, or changed in kind: where DRA may serve a native resource
        self._dirty: set[str] = set()  # nodes changed since the last snapshot
        self.reports: dict[str, NodeReport] = {}  # node agents' reports, by node
        self._held: dict[str, dict[str, tuple[int, ...]]] = {}  # node -> pod -> reported GPUs (``pod_gpus``)
        self.contradictions = 0  # pods whose reported GPUs the prediction did not allow
        self._contradicted: dict[str, tuple[str, tuple[int, ...]]] = {}  # pod -> (uid, GPUs) counted already
        self._reports_checked = -math.inf  # self.clock() when stale reports were last looked for

    def observe(self, uid: str, shape: Shape) -> None:
        """Teach the policy one pod's shape, once per pod."""
        if uid not in self.seen:
            self.seen.add(uid)
            self.policy.observe(shape)

    # ----- nodes and reports -----
    def apply_node(self, event: str, obj: dict[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        if event == "DELETED":
            if self.nodes.pop(name, None) is not None:
                self.generation.pop(name, None)
                self.kind_of.pop(name, None)
                self.node_layout += 1
                self._dirty.add(name)
            return  # its pods stay indexed under it, counted nowhere, until they go or it comes back
        inv = from_node(obj)
        old = self.nodes.get(name)
        if old is not None and old.inventory == inv:
            return  # a status update that changes nothing decisions read
        self._install(inv)

    def _install(self, inv: NodeInventory) -> None:
        """A fresh state for the node, its pods placed again from their records (kept GPUs first, so
        the ones still to predict see them)."""
        name = inv.name
        self.nodes[name] = state = node_state(inv)
        self._know(state)
        kind = self.kinds.setdefault((inv.health, inv.product, inv.offerings), len(self.kinds))
        if self.kind_of.get(name) != kind:
            self.kind_of[name] = kind
            self.node_layout += 1
        self._touch(name)
        on = self.on_node.get(name)
        if not on:
            return
        held = self._held.get(name, {})
        for rec in sorted(on.values(), key=lambda r: (r.key not in held, r.placement is None and r.recorded is None)):
            on[rec.key] = placed = self._place(rec, refit=True)
            if placed is not rec:
                self.pods[rec.key] = placed

    def apply_report(self, event: str, obj: dict[str, Any]) -> None:
        """A ``NodeGPUReport`` event: the node's pods are placed again, on the GPUs it names."""
        name = str((obj.get("metadata") or {}).get("name", ""))
        if event == "DELETED":
            self._held.pop(name, None)
            if self.reports.pop(name, None) is None:
                return
        else:
            report = parse_report(obj)
            if report.problems:
                log.warning("NodeGPUReport %s: %s", name, "; ".join(report.problems))
            same = self.reports.get(name) == report  # observedAt is not compared
            self.reports[name] = report  # renewed: its observedAt is the one ``expire_reports`` reads
            if same:
                return
            self._held[name] = report.pod_gpus()
        ns = self.nodes.get(name)
        if ns is not None:
            self._install(ns.inventory)

    def expire_reports(self) -> None:
        """Forget reports their agents have not renewed for ``REPORT_STALE`` seconds (an agent renews its report every
        few minutes even when nothing changed): their nodes go back to predictions. Looked at every
        ``REPORT_CHECK`` seconds at most."""
        now = self.clock()
        if self.report_stale is None or now - self._reports_checked < REPORT_CHECK or not self.reports:
            return
        self._reports_checked = now
        wall = self.wall()
        for name, report in list(self.reports.items()):
            when = parse_time(report.observed_at)
            observed = when.timestamp() if when is not None else wall  # no time: nothing to go stale by
            if wall - observed > self.report_stale:
                log.warning("the report of node %s is %.0f min old: its agent is gone or cannot write; its GPUs are "
                            "predicted again", name, (wall - observed) / 60)
                self.apply_report("DELETED", {"metadata": {"name": name}})

    def reset_reports(self, items: list[dict[str, Any]]) -> None:
        """A whole report list: what it lacks is gone."""
        listed = {str((o.get("metadata") or {}).get("name", "")) for o in items}
        for name in list(self.reports.keys() - listed):
            self.apply_report("DELETED", {"metadata": {"name": name}})
        for obj in items:
            self.apply_report("ADDED", obj)

    def _know(self, state: NodeState) -> None:
        """What the node's report says of its GPUs: which are not sold, and their NVLink peers."""
        report = self.reports.get(state.name)
        if report is None:
            return
        gpus = state.gpus
        unhealthy = report.unhealthy()
        if unhealthy is not None and len(gpus.slots) - len(unhealthy) > state.inventory.usable_gpus:
            # the node sells fewer GPUs than the report leaves (the report is behind): the count stands, and which
            # GPUs stays unknown until they agree. Where the report leaves fewer, it names GPUs the driver lost that
            # the device plugin still sells (it learns of a loss from an Xid event, or at its next start): they
            # are not counted, and a prediction names them among the GPUs the plugin may hand out (``sold_but_lost``)
            log.info("node %s: its report marks %d of %d GPUs unsold, its allocatable %d unsold", state.name,
                     len(unhealthy), len(gpus.slots), len(gpus.slots) - state.inventory.usable_gpus)
            unhealthy = None
        gpus.set_unhealthy(unhealthy)
        peers = report.peers(len(gpus.slots))
        if peers is not None and any(peers):
            gpus.topology = from_peers(peers)

    # ----- the books' internals -----
    def _touch(self, name: str) -> None:
        if name in self.nodes:
            self._last_generation += 1
            self.generation[name] = self._last_generation
            self._dirty.add(name)

    def _add(self, rec: PodRecord) -> None:
        rec = self._place(rec)
        self.pods[rec.key] = rec
        if rec.node:
            self.on_node.setdefault(rec.node, {})[rec.key] = rec
        if rec.assumed:
            self.assumed.add(rec.key)

    def _drop(self, rec: PodRecord) -> None:
        self._unplace(rec)
        self._contradicted.pop(rec.key, None)
        self.pods.pop(rec.key, None)
        on = self.on_node.get(rec.node)
        if on is not None:
            on.pop(rec.key, None)
            if not on:
                del self.on_node[rec.node]
        self.assumed.discard(rec.key)

    def _restamp(self, old: PodRecord, version: str) -> None:
        """The record at a newer resourceVersion, nothing else changed: no node is touched."""
        new = replace(old, version=version)
        self.pods[new.key] = new
        if new.node:
            self.on_node[new.node][new.key] = new

    def _swap(self, old: PodRecord, new: PodRecord) -> None:
        """Replace a record by one that holds the same node and GPUs."""
        self.pods[new.key] = new
        if new.node:
            self.on_node[new.node][new.key] = new
        if new.assumed:
            self.assumed.add(new.key)
        else:
            self.assumed.discard(new.key)
        self._touch(new.node)

    def _place(self, rec: PodRecord, refit: bool = False) -> PodRecord:
        """Count ``rec`` on its node (when known); the record with the GPUs it holds there: its own
        (``refit``: re-read for the node's inventory, same GPUs), else its annotation's, else predicted."""
        ns = self.nodes.get(rec.node) if rec.node else None
        if ns is None:
            return rec
        d = rec.demand
        placement = rec.placement
        if d.gpu:
            if rec.uid:
                self.observe(rec.uid, shape_of(d, ns.inventory.offering(d.resource)))
            reported = self._reported(rec)
            if placement is None or refit or (reported is not None and holds(placement) != reported):
                known = placement is not None and not placement.unplaced and not placement.counted
                if known:
                    placement = where(ns, d, holds(placement))
                else:  # recorded, or predicted as the device plugin picks, blind to the GPUs plans hold here
                    view = ns if rec.recorded else as_the_plugin_sees(ns, self.on_node.get(rec.node, {}).items())
                    placement = where(view, d, rec.recorded, rec.among)
                old = rec.placement
                if old is not None and placement is not None and holds(placement) == holds(old):
                    # the same GPUs again: still the prediction they were (the set they were picked among)
                    placement = replace(placement, maybe=old.maybe, read_back=old.read_back)
                if reported is not None and placement is not None and holds(placement) != reported:
                    # what was predicted: the record's own placement (with the set it was chosen from), else now
                    self._contradicted_by(rec, rec.placement or placement, reported)
                    placement = where(ns, d, reported)
            if placement is not None:
                ns.gpus.place(rec.key, placement)
                ns.units_used[d.resource] = ns.units_used.get(d.resource, 0) + d.units
        ns.cpu_used += d.cpu_milli
        ns.mem_used_mib += d.memory_mib
        self._touch(rec.node)
        return rec if placement == rec.placement else replace(rec, placement=placement)

    def _reported(self, rec: PodRecord) -> tuple[int, ...] | None:
        """The GPUs the node's report says ``rec`` holds, sorted; None when no report names the pod."""
        held = self._held.get(rec.node)
        return held.get(rec.key) if held is not None else None

    def _contradicted_by(self, rec: PodRecord, placement: Placement, reported: tuple[int, ...]) -> None:
        """Count a pod whose reported GPUs the prediction did not allow (once per pod)."""
        if placement.counted:
            return  # a guess on a degraded node promised nothing
        if placement.maybe and set(reported) <= set(placement.maybe) and len(reported) == len(placement.gpus):
            return  # the device plugin picked among GPUs the prediction named
        if placement.read_back:
            return  # replicas read back from bind's annotation: the set they were picked from is not known here
        report = self.reports.get(rec.node) if rec.node else None
        if report is not None and report.unmapped and len(reported) < len(placement.gpus):
            return  # the agent could not tell the GPU of some of the pod's devices: not the whole answer
        if self._contradicted.get(rec.key) == (rec.uid, reported):
            return
        self._contradicted[rec.key] = (rec.uid, reported)
        self.contradictions += 1
        log.info("pod %s on %s holds GPUs %s, not %s as predicted", rec.key, rec.node,
                 ",".join(map(str, reported)), ",".join(map(str, sorted(placement.gpus))))

    def _unplace(self, rec: PodRecord) -> None:
        ns = self.nodes.get(rec.node) if rec.node else None
        if ns is None:
            return
        if ns.gpus.release(rec.key) is not None:
            ns.units_used[rec.demand.resource] = ns.units_used.get(rec.demand.resource, 0) - rec.demand.units
        ns.cpu_used -= rec.demand.cpu_milli
        ns.mem_used_mib -= rec.demand.memory_mib
        self._touch(rec.node)
