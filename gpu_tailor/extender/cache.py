"""The extender's cache of the cluster, after kube-scheduler's (``pkg/scheduler/internal/cache``).

One writer keeps it: the node and pod watches (or a cluster file), plus bind's ``assume``,
``finish_binding`` and ``forget``. Requests read a ``Snapshot`` of it (``snapshot()``), never the
maps below.

Pods are kept as ``PodRecord``s, never as pod objects, and indexed per node, so a node event touches
only that node's pods. A pod's GPUs are chosen once -- at bind, from its ``gpu-tailor.io/gpus``
annotation, or predicted the first time it is seen bound without one -- and then stay with its
record: a node event re-places the node's pods from their records, and a pod event moves a pod's GPUs
only when its node or its own annotation says otherwise.

Where kube-scheduler binds (no ``bindVerb``, as shipped), prioritize *assumes* each GPU pod on the node it
ranked first (``scored``), where the extender's weight makes kube-scheduler bind it, until the watch
shows where it went or ``scored_ttl`` seconds pass. A GPU pod filter or prioritize was asked about (``ours``:
kube-scheduler asks only its own extender, so the standby replica's is never asked) is, once the watch
shows it bound without a record, queued for its GPUs to be written on it (``unrecorded``, drained by
``extender.recorder``). With ``bindVerb``, bind *assumes* a pod: it counts
on its node at once, so the next filter sees its GPUs taken. The
watch *confirms* it when it shows the pod bound to that node (keeping the GPUs bind chose unless the
pod's annotation names others); a refused Binding *forgets* it; an assumption the watch never
confirms *expires* ``ttl`` seconds after its Binding was accepted (checked at every snapshot). A
relist (``NodeRelist``, ``PodRelist``) applies every listed object as the watch would, then deletes
what the list lacks, except assumed pods still within their deadline, which the list may simply
predate (kube-scheduler's informer can be ahead of our watch). A Binding that fails is read back
before anything is freed (``server._after_failed_binding``).

Bind needs the pod's demand, and kube-scheduler's informer can see a pod before the extender's
watch does (a busy API server, 2 cores). Filter and prioritize carry the whole Pod, so the pods they
were asked about are kept as records (the most recent few, by namespace/name and uid) until the watch
delivers them or they are bound; bind falls back to them, then to reading the pod from the API.

The placement policy learns the mix of pod shapes from the pods it sees: the pods it is asked to
score, and the GPU pods the API shows bound to nodes, each pod once (by uid). So a restarted
extender scores with the cluster's mix from its first request. CPU-only pods bound elsewhere are not
counted: most belong to other schedulers (DaemonSets on every node would swamp the mix). So the
CPU-only pods gpu-tailor itself placed (the webhook's ``cpuOnlyPods``) are in the mix of the extender
that scored them, but not in that of a restarted one, or of the standby replica after a failover,
until new ones arrive: the records keep no scheduler name to tell ours from the rest.

Where a node agent runs (``gpu-tailor agent``), its ``NodeGPUReport`` says which GPUs each pod of the
node really holds, which GPUs the device plugin does not sell, and the NVLink peers NVML sees. The
cache prefers it to every prediction and annotation: a pod the report names holds the reported GPUs
(``_place``), and each pod whose reported GPUs the prediction (or bind's annotation) did not allow is
counted once in ``contradictions``. Without a report, or for pods it does not name yet (bound since
the agent last looked), the prediction stands.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from gpu_tailor.extender.records import (
    KNOWN,
    Demands,
    PodRecord,
    confirmed,
    holds,
    kept,
    live,
    pod_record,
    pod_uid,
    pod_version,
    waiting,
    where,
)
from gpu_tailor.extender.scores import node_order
from gpu_tailor.extender.snapshot import NodeInfo, Snapshot, Verdicts
from gpu_tailor.gpumodel.devices.dra import DraState
from gpu_tailor.gpumodel.dra import gpu_column
from gpu_tailor.gpumodel.fleet import Fleet, Shape
from gpu_tailor.gpumodel.inventory import HealthState, NodeInventory, from_node
from gpu_tailor.gpumodel.occupancy import Placement
from gpu_tailor.gpumodel.policies import TailorPolicy
from gpu_tailor.gpumodel.report import NodeReport, parse_time
from gpu_tailor.gpumodel.report import parse as parse_report
from gpu_tailor.gpumodel.schedule import Demand, NodeState, dra_row, fleet_row, node_state, pod_key, shape_of
from gpu_tailor.gpumodel.topology import from_peers
from gpu_tailor.kube.freshness import Freshness

log = logging.getLogger(__name__)

ASSUMED_TTL = 30.0  # seconds an accepted Binding may go unseen by the watch before its GPUs are freed
# seconds a pod counts where prioritize ranked it first, unseen bound: kube-scheduler binds within milliseconds,
# and a pod it did not bind there (another plugin outweighed the extender, a Reserve or PreBind failed) must not
# hold GPUs long
SCORED_TTL = 10.0
REPORT_STALE = 900.0  # seconds a node agent's report may go unrenewed (the agent renews it every 300 s)
REPORT_CHECK = 30.0  # seconds between looks for stale reports
KEPT_PENDING = 512  # pods asked about and not yet seen by the watch (least recently asked dropped first)
KEPT_DELETED = 4096  # uids of deleted pods kept: a request about one after its deletion counts nothing
POD_CHUNK = 100  # pods a relist handles between two turns of the event loop (a few ms)
NODE_CHUNK = 25  # nodes, likewise
REFRESH_CHUNK = 100  # changed nodes copied into the read side per turn at the end of a relist


class Cache:
    """Nodes, pods and assumptions, kept by the watches and bind; read through ``snapshot()``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, ttl: float = ASSUMED_TTL,
                 wall: Callable[[], float] = time.time, report_stale: float | None = REPORT_STALE,
                 scored_ttl: float = SCORED_TTL) -> None:
        """``wall``: the clock reports' ``observedAt`` is read against; ``report_stale``: seconds after which an
        unrenewed report is forgotten (None: never, for a cluster file read at another time)."""
        self.clock, self.ttl, self.wall, self.report_stale = clock, ttl, wall, report_stale
        self.scored_ttl = scored_ttl
        self.nodes: dict[str, NodeState] = {}  # the writer's own copies, changed in place
        self.generation: dict[str, int] = {}
        self.kind_of: dict[str, int] = {}
        self.kinds: dict[tuple[Any, ...], int] = {}
        self.pods: dict[str, PodRecord] = {}  # by namespace/name
        self.on_node: dict[str, dict[str, PodRecord]] = {}  # node -> key -> record, nodes not known yet too
        self.assumed: set[str] = set()  # keys of assumed records
        self.asked: OrderedDict[str, PodRecord] = OrderedDict()  # see the module notes
        self.seen: set[str] = set()  # uids of the pods whose shape the policy has learnt
        self.demands = Demands()
        self.fleet = Fleet()
        self.policy = TailorPolicy(self.fleet)
        self.verdicts = Verdicts()
        self.nodes_synced = False
        self.pods_synced = False
        self.freshness: dict[str, Freshness] = {}  # per watched resource, when watches keep the cache
        self.dra = DraState(enabled=False)  # DRA pools; on where the watches find resource.k8s.io/v1
        self._last_generation = 0
        self.node_layout = 0  # counts nodes added, removed, or changed in kind: where DRA may serve a native resource
        self._dra_written: tuple[DraState, int] | None = None  # the DRA state and version the DRA rows were written at
        self._dra_nodes: set[str] = set()  # the nodes with DRA pools then
        self._dirty: set[str] = set()  # nodes changed since the last snapshot
        self._view: dict[str, NodeInfo] = {}
        self._degraded: set[str] = set()
        self.reports: dict[str, NodeReport] = {}  # node agents' reports, by node
        self._held: dict[str, dict[str, tuple[int, ...]]] = {}  # node -> pod -> reported GPUs (``pod_gpus``)
        self.contradictions = 0  # pods whose reported GPUs the prediction did not allow
        self._contradicted: dict[str, tuple[str, tuple[int, ...]]] = {}  # pod -> (uid, GPUs) counted already
        self._reports_checked = -math.inf  # self.clock() when stale reports were last looked for
        # pods kube-scheduler bound whose GPUs are not written yet: key -> (uid, clock() when bound)
        self.deleted: OrderedDict[str, None] = OrderedDict()  # uids of the pods last shown deleted (``_deleted``)
        self.ours: OrderedDict[str, None] = OrderedDict()  # uids of the GPU pods filter or prioritize was asked about
        self.unrecorded: dict[str, tuple[str, float]] = {}
        self.last_asked = -math.inf  # clock() of the last pod filter or prioritize was asked about
        self.on_unrecorded: Callable[[], None] | None = None  # called when one is added

    @property
    def ready(self) -> bool:
        """Listed once, and no watch gone quiet for longer than the API server would keep it open."""
        return self.nodes_synced and self.pods_synced and self.dra.ready and all(
            f.fresh() for f in self.freshness.values())

    # ----- the read side -----
    def snapshot(self) -> Snapshot:
        """The cluster for one request: nodes that changed since the last call are copied, and their
        fleet rows written; assumptions past their deadline are dropped first."""
        self.expire()
        self.expire_reports()
        self._dra_changed()
        self.refresh()
        return Snapshot(self._view, self.fleet, self.policy, frozenset(self._degraded), self.verdicts, self.ready,
                        self.dra, self._last_generation, self.node_layout)

    def _dra_changed(self) -> None:
        """After DRA slices or claims change, the fleet rows of the nodes they changed are written again: their GPUs
        are the DRA devices (``_refresh``). A claim allocated or released changes its devices' nodes alone; slices or
        classes changing, or a new DraState, any node with DRA pools (before or now)."""
        dra = self.dra
        if not dra.enabled or (self._dra_written is not None and self._dra_written[0] is dra
                               and self._dra_written[1] == dra.version):
            return
        changed = dra.changed_since(self._dra_written[1]) \
            if self._dra_written is not None and self._dra_written[0] is dra else None
        self._dra_written = (dra, dra.version)
        if changed is None:
            now = dra.inventory().nodes()
            changed = now | self._dra_nodes
            self._dra_nodes = now
        self._dirty.update(n for n in changed if n in self.nodes)

    def refresh(self, limit: int | None = None) -> int:
        """Copy up to ``limit`` changed nodes (all of them by default) into the read side, as the next
        snapshot would; the number still to copy. A relist does it in chunks, so that the first request
        after it does not copy thousands of nodes at once."""
        # in name order: a node new to the fleet takes the next row, and the rows' order must not hang on the
        # hash order of a set (sums over rows would round differently from one process to the next)
        if limit is None:
            for name in sorted(self._dirty):
                self._refresh(name)
            self._dirty.clear()
            return 0
        for name in sorted(self._dirty)[:limit]:
            self._dirty.discard(name)
            self._refresh(name)
        return len(self._dirty)

    def _refresh(self, name: str) -> None:
        ns = self.nodes.get(name)
        if ns is None:
            self._view.pop(name, None)
            self.fleet.remove(name)
            self._degraded.discard(name)
            self.verdicts.drop(name)
            return
        copy = ns.copy()
        pods = dict(self.on_node.get(name, {}))
        self._view[name] = NodeInfo(copy, self.generation[name], self.kind_of[name], pods)
        inv = ns.inventory
        if inv.health.state is HealthState.DEGRADED:
            self._degraded.add(name)
        else:
            self._degraded.discard(name)
        row = fleet_row(copy)
        if name in self._dra_nodes:  # its GPUs may be DRA devices
            row = dra_row(row, gpu_column(self.dra.inventory().on_node(name), self.dra.usage()), inv)
        at = self.fleet.upsert(name, row.cpu_free, row.mem_free_mib, row.gpu_free, row.model, row.topology,
                               cpu_capacity=row.cpu_capacity, pick=row.pick, step=row.step)
        self.fleet.rank[at] = node_order(name)  # ties go by a fixed node order (extender/scores.py)
        if inv.unschedulable:
            self.fleet.remove(name)

    # ----- what requests teach it -----
    def observe(self, uid: str, shape: Shape) -> None:
        """Teach the policy one pod's shape, once per pod."""
        if uid not in self.seen:
            self.seen.add(uid)
            self.policy.observe(shape)

    def remember(self, pod: dict[str, Any], demand: Demand | None = None) -> None:
        """Keep a pod filter or prioritize was asked about, for a bind that comes before the watch's news
        (``demand``: the pod's, when the request has read it already)."""
        key, uid = pod_key(pod), pod_uid(pod)
        self.last_asked = self.clock()
        if uid in self.deleted:
            return  # asked about after the watch showed it deleted: nothing to bind, nothing to count
        if uid and (demand.gpu if demand is not None else True):
            # kube-scheduler asks only its own extender: bound, the pod's GPUs are this replica's to write
            self.ours[uid] = None
            self.ours.move_to_end(uid)
            if len(self.ours) > KEPT_DELETED:
                self.ours.popitem(last=False)
        known = self.pods.get(key)
        if known is not None and known.uid == uid:
            return  # the watch has it
        self.asked[key] = pod_record(pod, demand)
        self.asked.move_to_end(key)
        if len(self.asked) > KEPT_PENDING:
            self.asked.popitem(last=False)

    def pending(self, key: str, uid: str) -> PodRecord | None:
        """The pod to bind: as the watch shows it, else as last asked about; None when neither has it
        (or has another pod of that name). ``uid`` "" matches any."""
        for rec in (self.pods.get(key), self.asked.get(key)):
            if rec is not None and (not uid or rec.uid == uid):
                return rec
        return None

    def holds_version(self, key: str, version: str) -> bool:
        """Whether the pod ``key`` is kept as the watch showed it at ``version`` (not an assumption)."""
        rec = self.pods.get(key)
        return rec is not None and rec.version == version and not rec.assumed

    # ----- bind -----
    def assume(self, rec: PodRecord, node: str, placement: Placement | None, *, scored: bool = False) -> None:
        """Count the pod on ``node`` with ``placement`` until the watch confirms it (or ``forget``, or
        expiry); it replaces whatever was kept under its name. ``scored``: not a Binding of ours but the
        node prioritize ranked first, where kube-scheduler binds the pod itself: it expires ``scored_ttl``
        seconds from now, and once the watch shows the pod bound its GPUs are to be recorded
        (``unrecorded``)."""
        old = self.pods.get(rec.key)
        if old is not None:
            self._drop(old)
        self.asked.pop(rec.key, None)
        deadline = self.clock() + self.scored_ttl if scored else math.inf
        self._add(replace(rec, node=node, placement=placement, deadline=deadline, scored=scored))

    def expected_binds(self) -> int:
        """GPU pods counted where prioritize ranked them first, not seen bound yet."""
        return sum(1 for key in self.assumed if self.pods[key].scored)

    def unscore(self, key: str, uid: str) -> None:
        """The pod is being filtered or scored again: the node it was ranked first on last time did not
        take it (yet), and its own GPUs there must not count against it."""
        rec = self.pods.get(key)
        if rec is not None and rec.scored and rec.uid == uid:
            self.forget(key, uid)

    def finish_binding(self, key: str, uid: str) -> None:
        """The API server took the Binding: the assumption now expires unless the watch shows the pod."""
        rec = self.pods.get(key)
        if rec is not None and rec.uid == uid and rec.deadline == math.inf:
            self._swap(rec, replace(rec, deadline=self.clock() + self.ttl))

    def forget(self, key: str, uid: str) -> None:
        """The Binding was refused: the pod is pending again and holds nothing."""
        rec = self.pods.get(key)
        if rec is not None and rec.assumed and (not uid or rec.uid == uid):
            self._drop(rec)
            self._add(replace(rec, node="", placement=None, deadline=None, scored=False))

    def expire(self) -> None:
        """Forget assumptions whose deadline has passed (the watch never showed those pods bound)."""
        if not self.assumed:
            return
        now = self.clock()
        for key in [k for k in self.assumed if not live(self.pods[k], now)]:
            rec = self.pods[key]
            if rec.scored:
                log.info("pod %s ranked first on %s was not seen bound in %.0fs: its GPUs are free again", key,
                         rec.node, self.scored_ttl)
            else:
                log.warning("pod %s assumed on %s was never seen bound there: its GPUs are free again", key,
                            rec.node)
            self.forget(key, rec.uid)

    # ----- the watches -----
    def relist_nodes(self) -> NodeRelist:
        """A node relist, fed page by page (``kube.watch.Relist``)."""
        return NodeRelist(self)

    def relist_pods(self) -> PodRelist:
        """A pod relist, fed page by page (``kube.watch.Relist``)."""
        return PodRelist(self)

    def reset_nodes(self, items: list[dict[str, Any]]) -> None:
        """A whole node list at once (a cluster file, tests): see ``NodeRelist``."""
        _whole(self.relist_nodes(), items)

    def reset_pods(self, items: list[dict[str, Any]]) -> None:
        """A whole pod list at once (a cluster file, tests): see ``PodRelist``."""
        _whole(self.relist_pods(), items)

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

    def apply_pod(self, event: str, obj: dict[str, Any]) -> None:
        """A pod event (or a listed pod: "MODIFIED")."""
        key, uid = pod_key(obj), pod_uid(obj)
        if (asked := self.asked.get(key)) is not None and asked.uid == uid:
            del self.asked[key]  # the watch has it now
        old = self.pods.get(key)
        if event == "DELETED":
            self._deleted(uid)
            if old is not None and (old.uid == uid or not uid):  # not a newer pod of the same name
                self._drop(old)
                self.seen.discard(old.uid)
            return
        version = pod_version(obj)
        if obj.get(KNOWN) and not (old is not None and old.uid == uid and old.version == version):
            return  # projected as "held at this version", but the cache has moved on since: stale
        if old is not None and old.uid == uid and not old.assumed and old.version and old.version == version:
            return  # exactly what we hold (bind read it back before the watch delivered it)
        rec = pod_record(obj, self.demands.of(obj, key))
        # bound by kube-scheduler after this replica was asked about it, and not written yet: its GPUs are to be written
        record = bool(rec.node) and rec.recorded is None and uid in self.ours and rec.demand.gpu
        if old is not None and old.uid == uid:
            if old.assumed:
                if waiting(obj):
                    return  # still pending: our Binding is in flight or the watch lags, the assumption stands
                if rec.node == old.node:
                    rec = confirmed(old, rec)
            elif old.node == rec.node:
                rec = kept(old, rec)
                if replace(rec, version=old.version) == old:  # a status update: nothing decisions read changed
                    self._restamp(old, rec.version)
                    return
        if old is not None:
            self._drop(old)
            if old.uid != uid:
                self.seen.discard(old.uid)
        self._add(rec)
        if record:
            del self.ours[uid]
            self._unrecorded(key, uid)

    def _deleted(self, uid: str) -> None:
        """Remember a pod the API showed deleted: kube-scheduler, whose queue lags the watch, may still ask about it."""
        if uid:
            self.deleted[uid] = None
            if len(self.deleted) > KEPT_DELETED:
                self.deleted.popitem(last=False)

    def _unrecorded(self, key: str, uid: str) -> None:
        """kube-scheduler bound a pod this extender scored: its GPUs are to be written on it
        (``extender.recorder``), where a Binding of ours would have carried them."""
        placed = self.pods[key].placement
        if placed is not None and placed.gpus and not placed.counted:
            self.unrecorded[key] = (uid, self.clock())
            if self.on_unrecorded is not None:
                self.on_unrecorded()

    # ----- the writer's internals -----
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
                placement = where(ns, d, holds(placement)) if known else where(ns, d, rec.recorded, rec.among)
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


class NodeRelist:
    """A node relist: each listed node is applied as the watch would apply it (a node whose inventory
    is unchanged is left as it is, with its pods and their GPUs); nodes the list lacks are deleted once
    it is complete. Pages are handled ``NODE_CHUNK`` nodes at a time, with the event loop free in
    between; requests answered meanwhile see each node either as it was or as listed."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache
        self.listed: set[str] = set()

    def page(self, items: list[dict[str, Any]]) -> Iterator[None]:
        for i, obj in enumerate(items, 1):
            self.cache.apply_node("ADDED", obj)
            self.listed.add(str((obj.get("metadata") or {}).get("name", "")))
            if i % NODE_CHUNK == 0:
                yield

    def done(self) -> Iterator[None]:
        cache = self.cache
        for i, name in enumerate(cache.nodes.keys() - self.listed, 1):
            cache.apply_node("DELETED", {"metadata": {"name": name}})
            if i % NODE_CHUNK == 0:
                yield
        while cache.refresh(REFRESH_CHUNK):
            yield
        cache.nodes_synced = True


class PodRelist:
    """A pod relist: every listed pod is applied as a watch event would be -- a pod unchanged since
    we last saw it costs a record and a comparison, one that changed is moved, and its GPUs stay
    unless its node or its annotation says otherwise. Pods the list lacks are deleted once it is
    complete, except assumptions still within their deadline (the list may predate a Binding). So a
    relist after a dropped watch touches only the nodes whose pods really changed.

    Pages are handled ``POD_CHUNK`` pods at a time with the event loop free in between: a request
    answered meanwhile sees each pod either as it was or as listed, as it would with a watch that
    has delivered some events and not yet others."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache
        self.listed: set[str] = set()
        self.uids: set[str] = set()

    def page(self, items: list[dict[str, Any]]) -> Iterator[None]:
        pods = self.cache.pods
        for i, obj in enumerate(items, 1):
            key, uid = pod_key(obj), pod_uid(obj)
            old = pods.get(key)
            # The API server gives every write a new resourceVersion: a listed pod at the version we
            # hold is exactly what we have (a relist after a dropped watch lists mostly these).
            if old is None or old.assumed or old.uid != uid or not old.version or old.version != pod_version(obj):
                self.cache.apply_pod("MODIFIED", obj)
            self.listed.add(key)
            self.uids.add(uid)
            if i % POD_CHUNK == 0:
                yield

    def done(self) -> Iterator[None]:
        cache = self.cache
        keys = list(cache.pods)
        for start in range(0, len(keys), 10 * POD_CHUNK):
            for key in keys[start:start + 10 * POD_CHUNK]:
                if key in self.listed or (rec := cache.pods.get(key)) is None:
                    continue
                if not live(rec, cache.clock()):  # deleted while the watch was down
                    cache._drop(rec)
                    cache._deleted(rec.uid)
                    cache.seen.discard(rec.uid)
                else:
                    self.uids.add(rec.uid)  # an assumption the list may predate
            yield
        cache.seen &= self.uids  # and forget the pods scored but never bound
        while cache.refresh(REFRESH_CHUNK):
            yield
        cache.pods_synced = True


def _whole(relist: NodeRelist | PodRelist, items: list[dict[str, Any]]) -> None:
    """Run a relist over one page holding every item, with no pause between its chunks."""
    for _ in relist.page(items):
        pass
    for _ in relist.done():
        pass
