"""The extender's cache of the cluster, after kube-scheduler's (``pkg/scheduler/internal/cache``).

One writer keeps it: the node and pod watches (or a cluster file), plus bind's ``assume``,
``finish_binding`` and ``forget``. Requests read a ``Snapshot`` of it (``snapshot()``), never the
maps below.

Its books -- each node's state, the pods counted on it as ``PodRecord``s with the GPUs they hold there, and
the node agents' reports -- are kept by ``extender.ledger``; this module says what pod events, bind and
requests write in them, and keeps the read side.

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
relist (``extender.relist``) applies every listed object as the watch would, then deletes
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
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from gpu_tailor.extender.draholds import claim_ladders, claimed, held_free
from gpu_tailor.extender.gangbook import Answer, GroupBook, reserved
from gpu_tailor.extender.ledger import REPORT_STALE, Ledger
from gpu_tailor.extender.records import (
    KNOWN,
    Demands,
    PodRecord,
    confirmed,
    kept,
    live,
    pod_record,
    pod_uid,
    pod_version,
    waiting,
)
from gpu_tailor.extender.relist import NodeRelist, PodRelist, at_once
from gpu_tailor.extender.scores import node_order
from gpu_tailor.extender.snapshot import NodeInfo, Snapshot, Verdicts
from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.devices.dra import fleet_shape
from gpu_tailor.gpumodel.dra_state import DraState
from gpu_tailor.gpumodel.dra_usage import gpu_column
from gpu_tailor.gpumodel.fleet import PICK_FIRST, Fleet
from gpu_tailor.gpumodel.groups import GroupError, GroupObjects, GroupRef, group_of, resolved
from gpu_tailor.gpumodel.inventory import HealthState
from gpu_tailor.gpumodel.occupancy import Placement
from gpu_tailor.gpumodel.policies import TailorPolicy
from gpu_tailor.gpumodel.schedule import DOMAIN_LABELS, Demand, dra_row, fleet_row, pod_key
from gpu_tailor.kube.freshness import Freshness

log = logging.getLogger(__name__)

ASSUMED_TTL = 30.0  # seconds an accepted Binding may go unseen by the watch before its GPUs are freed
# seconds a pod counts where prioritize ranked it first, unseen bound: kube-scheduler binds within milliseconds,
# and a pod it did not bind there (another plugin outweighed the extender, a Reserve or PreBind failed) must not
# hold GPUs long
SCORED_TTL = 10.0
KEPT_PENDING = 512  # pods asked about and not yet seen by the watch (least recently asked dropped first)
KEPT_DELETED = 4096  # uids of deleted pods kept: a request about one after its deletion counts nothing


class Cache(Ledger):
    """Nodes, pods and assumptions, kept by the watches and bind; read through ``snapshot()``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, ttl: float = ASSUMED_TTL,
                 wall: Callable[[], float] = time.time, report_stale: float | None = REPORT_STALE,
                 scored_ttl: float = SCORED_TTL) -> None:
        """``wall``: the clock reports' ``observedAt`` is read against; ``report_stale``: seconds after which an
        unrenewed report is forgotten (None: never, for a cluster file read at another time)."""
        self.fleet = Fleet()
        super().__init__(TailorPolicy(self.fleet), clock, wall, report_stale)
        self.ttl, self.scored_ttl = ttl, scored_ttl
        self.asked: OrderedDict[str, PodRecord] = OrderedDict()  # see the module notes
        self.demands = Demands()
        self.verdicts = Verdicts()
        self.nodes_synced = False
        self.pods_synced = False
        self.freshness: dict[str, Freshness] = {}  # per watched resource, when watches keep the cache
        self.dra = DraState(enabled=False)  # DRA pools; on where the watches find resource.k8s.io/v1
        self._dra_written: tuple[DraState, int] | None = None  # the DRA state and version the DRA rows were written at
        self._dra_nodes: set[str] = set()  # the nodes with DRA pools then
        self._view: dict[str, NodeInfo] = {}
        self._degraded: set[str] = set()
        # pods kube-scheduler bound whose GPUs are not written yet: key -> (uid, clock() when bound)
        self.deleted: OrderedDict[str, None] = OrderedDict()  # uids of the pods last shown deleted (``_deleted``)
        self.ours: OrderedDict[str, None] = OrderedDict()  # uids of the GPU pods filter or prioritize was asked about
        self.unrecorded: dict[str, tuple[str, float]] = {}
        self.last_asked = -math.inf  # clock() of the last pod filter or prioritize was asked about
        self.on_unrecorded: Callable[[], None] | None = None  # called when one is added
        # reads a group's object from the API on the spot, where the watch has not delivered it (``LiveGroups``)
        self.fetch_group: Callable[[GroupRef], Awaitable[None]] | None = None
        self.groups = GroupBook(wall=wall)  # groups placed whole: their plans and the GPUs held for them
        self.group_objects = GroupObjects()  # PodGroups that say a group's size, where the API serves them
        self.domain_keys = DOMAIN_LABELS  # node labels that name an NVLink domain, first found wins

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
        if self.groups.plans:
            self.groups.expire(self)
        self._dra_changed()
        self.refresh()
        return Snapshot(self._view, self.fleet, self.policy, frozenset(self._degraded), self.verdicts, self.ready,
                        self.dra, self._last_generation, self.node_layout, self.groups.dra.by_node)

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
        row = fleet_row(copy, self.domain_keys)
        if name in self._dra_nodes:  # its GPUs may be DRA devices
            row = dra_row(row, gpu_column(self.dra.inventory().on_node(name), self.dra.usage()), inv)
            held = self.groups.dra.by_node.get(name)
            if held and row.pick == PICK_FIRST:  # the devices group plans hold for members still to come
                row = replace(row, gpu_free=held_free(row.gpu_free, held.values()))
        at = self.fleet.upsert(name, row.cpu_free, row.mem_free_mib, row.gpu_free, row.model, row.topology,
                               cpu_capacity=row.cpu_capacity, pick=row.pick, step=row.step, domain=row.domain)
        self.fleet.rank[at] = node_order(name)  # ties go by a fixed node order (extender/scores.py)
        if inv.unschedulable:
            self.fleet.remove(name)

    # ----- what requests teach it -----
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
        if rec is not None and rec.assumed and (not uid or rec.uid == uid) and not reserved(key):
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

    # ----- the watches (node and report events are ``Ledger``'s) -----
    def relist_nodes(self) -> NodeRelist:
        """A node relist, fed page by page (``kube.watch.Relist``)."""
        return NodeRelist(self)

    def relist_pods(self) -> PodRelist:
        """A pod relist, fed page by page (``kube.watch.Relist``)."""
        return PodRelist(self)

    def reset_nodes(self, items: list[dict[str, Any]]) -> None:
        """A whole node list at once (a cluster file, tests): see ``NodeRelist``."""
        at_once(self.relist_nodes(), items)

    def reset_pods(self, items: list[dict[str, Any]]) -> None:
        """A whole pod list at once (a cluster file, tests): see ``PodRelist``."""
        at_once(self.relist_pods(), items)

    def apply_pod(self, event: str, obj: dict[str, Any]) -> None:
        """A pod event (or a listed pod: "MODIFIED")."""
        key, uid = pod_key(obj), pod_uid(obj)
        if (asked := self.asked.get(key)) is not None and asked.uid == uid:
            del self.asked[key]  # the watch has it now
        old = self.pods.get(key)
        if event == "DELETED":
            self._deleted(uid)
            self.groups.gone(uid)
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
        if rec.node and uid in self.groups.members:  # a group's member: its slot's GPUs become its own first
            self.groups.bound(self, uid, rec.node)
        elif not rec.node and not waiting(obj) and uid in self.groups.settled_in:  # a member finished
            self.groups.gone(uid)
        elif (rec.demand.gpu or claimed(obj)) and (
                labels.ANN_GROUP_PLAN in ((obj.get("metadata") or {}).get("annotations") or {})
                or rec.node):
            # a plan written on this pod (bound or not), or a member bound before it; a group's pod bound is noted
            # while no plan is held too: read back later, a plan knows its members bound by their node where their
            # GPUs do not tell (on DRA nodes a pod's devices say nothing of its group)
            self._restore_plan(obj, rec)
        self._add(rec)
        if record:
            del self.ours[uid]
            self._unrecorded(key, uid)

    def group_ref(self, pod: dict[str, Any], demand: Demand) -> GroupRef | None:
        """The group a GPU pod names, as it names it (None for any other pod, or a group ask that cannot be read)."""
        if not demand.gpu and not claimed(pod):
            return None
        try:
            return group_of(pod)
        except GroupError:
            return None

    def group_answer(self, pod: dict[str, Any], demand: Demand, candidates: list[str] | None = None) -> Answer | None:
        """For a member of a group (``groups.group_of``) of a GPU pod: the one node it may go to, its group planned
        first where no plan is held (``GroupBook.answer``), or why none; None for any other pod. A GPU pod is one
        with a native ask, or with a claim on DRA pools of whole GPUs or of a share of one (a claim of MIG devices is
        left to kube-scheduler's allocator pod by pod)."""
        if not self.ready or (not demand.gpu and not claimed(pod)):
            return None
        try:
            ref = group_of(pod)
        except GroupError as exc:
            return Answer(None, str(exc))
        if ref is not None:  # a PodGroup's size where the pod states none, and its topology constraint
            ref = resolved(ref, self.group_objects.objects, self.domain_keys)
        if ref is None or ref.size < 2:
            return None
        claim = None
        if not demand.gpu:
            ladders = claim_ladders(self.dra, pod)
            fitted = fleet_shape(ladders, demand.cpu_milli, demand.memory_mib) if ladders is not None else None
            if fitted is None:
                return None
            claim = fitted[0]
        self.snapshot()  # the fleet's rows as they are now (plans past their deadline released): plans are made on them
        return self.groups.answer(self, pod, demand, ref, candidates, claim)

    def _restore_plan(self, obj: dict[str, Any], rec: PodRecord) -> None:
        try:
            ref = group_of(obj)
        except GroupError:
            return
        if ref is not None:
            ref = resolved(ref, self.group_objects.objects, self.domain_keys)
        if ref is not None and ref.size > 1:
            self.groups.restore(self, obj, ref, rec.demand)

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
