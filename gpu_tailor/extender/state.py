"""The extender's picture of the cluster, kept by one writer (the watches or a cluster file).

Per node: inventory, per-GPU occupancy and requested CPU/memory, and a row in the packing fleet
that is updated incrementally on every change, so a request never recomputes or copies the cluster.
Bind adds an *assumption* (the pod on its node and GPUs) that the next filter sees at once; it is
dropped when the binding fails, the pod is deleted, or the watch shows the pod bound elsewhere. It
lives in memory only: after a restart everything comes back from the API (annotations included).

Bind needs the pod's demand, and kube-scheduler's informer can see a pod before the extender's
watch does (a busy API server, 2 cores). Filter and prioritize carry the whole Pod, so the pods they
were asked about are kept (the most recent few, by namespace/name and uid) until the watch delivers
them or they are bound; bind falls back to them, then to reading the pod from the API.

The placement policy learns the mix of pod shapes from the pods it sees: the pods it is asked to
score, and the GPU pods the API shows bound to nodes, each pod once (by uid). So a restarted
extender scores with the cluster's mix from its first request instead of starting from nothing.
CPU-only pods bound elsewhere are not counted: most belong to other schedulers (DaemonSets on every
node would swamp the mix).

Fit verdicts are kept per ask (a pod's demand without its name) and node, stamped with the node's
fleet row and generation: every change to a node (its object, a pod placed or removed) bumps the
generation, so a kept verdict is reused only while the node is exactly as it was. kube-scheduler asks
prioritize right after filter about the same pod, and the replicas of a Job or Deployment arrive one
after another with the same ask; between two of them only the nodes that changed are checked again.
The part of a verdict that depends on the inventory alone is kept per ask and node *kind* (same
health, product and offerings, as the nodes of one pool are): a first ask works it out once per
pool, not once per node.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any

from gpu_tailor.gpumodel.fleet import Fleet, Shape
from gpu_tailor.gpumodel.inventory import Health, HealthState, NodeInventory, Offering, from_node
from gpu_tailor.gpumodel.occupancy import Placement
from gpu_tailor.gpumodel.policies import TailorPolicy
from gpu_tailor.gpumodel.products import Product
from gpu_tailor.gpumodel.schedule import (
    Demand,
    Fit,
    NodeState,
    demand_of,
    fit,
    inventory_verdict,
    node_state,
    pod_key,
    recorded_placement,
    shape_of,
)

KEPT_ASKS = 64  # distinct asks whose per-node verdicts are kept (least recently asked dropped first)
KEPT_PENDING = 512  # pods asked about and not yet seen by the watch (least recently asked dropped first)


@dataclass
class Kept:
    """What is kept for one ask: verdicts per node (row, generation, verdict), inventory verdicts per kind."""

    by_node: dict[str, tuple[int, int, Fit]] = field(default_factory=dict)
    by_kind: dict[int, Fit | Offering] = field(default_factory=dict)


@dataclass
class PodRecord:
    key: str
    uid: str
    node: str  # "" while pending
    demand: Demand
    pod: dict[str, Any]
    placement: Placement | None = None
    assumed: bool = False


def _active(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def _uid(pod: dict[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid", ""))


def record(pod: dict[str, Any]) -> PodRecord:
    """A pending pod as a record (not counted anywhere until assumed)."""
    return PodRecord(pod_key(pod), _uid(pod), "", demand_of(pod), pod)


class ClusterState:
    def __init__(self) -> None:
        self.nodes: dict[str, NodeState] = {}
        self.pods: dict[str, PodRecord] = {}
        self.by_uid: dict[str, str] = {}
        self.fleet = Fleet()
        self.policy = TailorPolicy(self.fleet)
        self.seen: set[str] = set()  # uids of the pods whose shape the policy has learnt
        self.degraded: set[str] = set()  # nodes selling fewer GPUs than they have
        self.verdicts: OrderedDict[Demand, Kept] = OrderedDict()  # per ask: see the module notes
        self.kinds: dict[tuple[Health, Product | None, tuple[Offering, ...]], int] = {}
        self.kind_of: dict[str, int] = {}  # node -> its kind
        self.asked: OrderedDict[str, tuple[str, dict[str, Any]]] = OrderedDict()  # key -> (uid, pod): see the notes
        self.nodes_synced = False
        self.pods_synced = False

    @property
    def ready(self) -> bool:
        return self.nodes_synced and self.pods_synced

    def observe(self, uid: str, shape: Shape) -> None:
        """Teach the policy one pod's shape, once per pod."""
        if uid not in self.seen:
            self.seen.add(uid)
            self.policy.observe(shape)

    def remember(self, pod: dict[str, Any]) -> None:
        """Keep a pod filter or prioritize was asked about, for a bind that comes before the watch's news."""
        key = pod_key(pod)
        uid = _uid(pod)
        known = self.pods.get(key)
        if known is not None and known.uid == uid:
            return  # the watch has it
        self.asked[key] = (uid, pod)
        self.asked.move_to_end(key)
        if len(self.asked) > KEPT_PENDING:
            self.asked.popitem(last=False)

    def pending(self, key: str, uid: str) -> PodRecord | None:
        """The pod to bind: as the watch shows it, else as last asked about; None when neither has it
        (or has another pod of that name). ``uid`` "" matches any."""
        rec = self.pods.get(key)
        if rec is not None and (not uid or rec.uid == uid):
            return rec
        asked = self.asked.get(key)
        if asked is not None and (not uid or asked[0] == uid):
            return record(asked[1])
        return None

    def fits(self, names: list[str], demand: Demand) -> list[Fit]:
        """``fit(node, demand, place=False)`` per node name, kept while a node is unchanged (see the notes)."""
        ask = replace(demand, key="")
        kept = self.verdicts.get(ask)
        if kept is None:
            kept = self.verdicts[ask] = Kept()
            if len(self.verdicts) > KEPT_ASKS:
                self.verdicts.popitem(last=False)
        else:
            self.verdicts.move_to_end(ask)
        index, gens = self.fleet.index, self.fleet.gen.tolist()
        out = []
        for name in names:
            ns = self.nodes.get(name)
            if ns is None:
                out.append(Fit(False, "node not known to gpu-tailor yet (watch catching up)"))
                continue
            kind = self.kind_of[name]
            settled = kept.by_kind.get(kind)
            if settled is None:
                settled = kept.by_kind[kind] = inventory_verdict(ns.inventory, demand)
            if isinstance(settled, Fit):  # the inventory settles it, whatever runs there
                out.append(settled)
                continue
            row = index.get(name)
            if row is None:  # unschedulable, so not in the fleet: no generation to trust
                out.append(fit(ns, demand, place=False, settled=settled))
                continue
            hit = kept.by_node.get(name)
            if hit is not None and hit[0] == row and hit[1] == gens[row]:
                out.append(hit[2])
                continue
            verdict = fit(ns, demand, place=False, settled=settled)
            kept.by_node[name] = (row, gens[row], verdict)
            out.append(verdict)
        return out

    def _set_node(self, inv: NodeInventory) -> None:
        self.nodes[inv.name] = node_state(inv)
        self.kind_of[inv.name] = self.kinds.setdefault((inv.health, inv.product, inv.offerings), len(self.kinds))

    # ----- the writer's side -----
    def reset_nodes(self, items: list[dict[str, Any]]) -> None:
        for name in list(self.nodes):
            self.fleet.remove(name)
        self.nodes, self.degraded = {}, set()
        self.verdicts.clear()  # every node is new: nothing kept would be trusted anyway
        self.kind_of = {}
        for obj in items:
            self._set_node(from_node(obj))
        for rec in self.pods.values():
            rec.placement = None
        for rec in self.pods.values():
            self._place(rec)
        for name in self.nodes:
            self._sync(name)
        self.nodes_synced = True

    def apply_node(self, event: str, obj: dict[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        if event == "DELETED":
            self.nodes.pop(name, None)
            self.degraded.discard(name)
            self.fleet.remove(name)
            self.kind_of.pop(name, None)
            for kept in self.verdicts.values():
                kept.by_node.pop(name, None)
            return
        self._set_node(from_node(obj))
        for rec in self.pods.values():
            if rec.node == name:
                rec.placement = None
                self._place(rec)
        self._sync(name)

    def reset_pods(self, items: list[dict[str, Any]]) -> None:
        assumed = {k: r for k, r in self.pods.items() if r.assumed}
        touched = set(self.nodes)
        self.pods, self.by_uid = {}, {}
        for node in self.nodes.values():
            node.gpus.clear()
            node.cpu_used, node.mem_used_mib, node.units_used = 0, 0, {}
        for obj in items:
            self._upsert_pod(obj, sync=False)
        for key, rec in assumed.items():  # still pending in the list: our bind is in flight
            now = self.pods.get(key)
            if now is not None and not now.node and now.uid == rec.uid:
                self.pods[key] = rec
                self._place(rec)
        for name in touched:
            self._sync(name)
        self.seen &= set(self.by_uid)  # pods deleted while the watch was down
        self.pods_synced = True

    def apply_pod(self, event: str, obj: dict[str, Any]) -> None:
        if event == "DELETED":
            key, uid = pod_key(obj), _uid(obj)
            if self.asked.get(key, ("",))[0] == uid:
                del self.asked[key]
            rec = self.pods.get(key)
            if rec is not None and (rec.uid == uid or not uid):  # not a newer pod of the same name
                del self.pods[key]
                self.by_uid.pop(rec.uid, None)
                self.seen.discard(rec.uid)
                self._unplace(rec)
            return
        self._upsert_pod(obj, sync=True)

    def _upsert_pod(self, obj: dict[str, Any], sync: bool) -> None:
        key = pod_key(obj)
        if self.asked.get(key, ("",))[0] == _uid(obj):
            del self.asked[key]  # the watch has it now
        old = self.pods.get(key)
        node = str((obj.get("spec") or {}).get("nodeName") or "")
        if not _active(obj):
            node = ""
        uid = _uid(obj)
        if old is not None:
            if old.assumed and not node and old.uid == uid:
                old.pod = obj  # still pending: keep our assumption
                return
            self._unplace(old, sync)
            if old.uid != uid:
                self.by_uid.pop(old.uid, None)
        rec = PodRecord(key, uid, node, demand_of(obj), obj)
        self.pods[key] = rec
        self.by_uid[uid] = key
        self._place(rec, sync)

    def assume(self, key: str, node: str, placement: Placement | None, rec: PodRecord | None = None) -> None:
        """Count the pod on ``node`` until the watch confirms it (or ``forget``). ``rec``: a pod the watch
        has not delivered yet (``pending``); it replaces whatever was kept under its name."""
        if rec is not None and self.pods.get(key) is not rec:
            old = self.pods.pop(key, None)
            if old is not None:
                self._unplace(old)
                self.by_uid.pop(old.uid, None)
            self.pods[key] = rec
            self.by_uid[rec.uid] = key
        self.asked.pop(key, None)
        rec = self.pods[key]
        self._unplace(rec)
        rec.node, rec.assumed = node, True
        self._place(rec, placement=placement)

    def forget(self, key: str) -> None:
        rec = self.pods.get(key)
        if rec is not None and rec.assumed:
            self._unplace(rec)
            rec.node, rec.assumed = "", False

    def _place(self, rec: PodRecord, sync: bool = True, placement: Placement | None = None) -> None:
        ns = self.nodes.get(rec.node)
        if ns is None or not rec.node:
            return
        d = rec.demand
        if d.gpu and rec.uid:
            self.observe(rec.uid, shape_of(d, ns.inventory.offering(d.resource)))
        rec.placement = placement or recorded_placement(rec.pod, ns, d)
        if rec.placement is not None:
            ns.gpus.place(rec.key, rec.placement)
            ns.units_used[d.resource] = ns.units_used.get(d.resource, 0) + d.units
        ns.cpu_used += d.cpu_milli
        ns.mem_used_mib += d.memory_mib
        if sync:
            self._sync(rec.node)

    def _unplace(self, rec: PodRecord, sync: bool = True) -> None:
        ns = self.nodes.get(rec.node)
        if ns is None or not rec.node:
            return
        if ns.gpus.release(rec.key) is not None:
            ns.units_used[rec.demand.resource] = ns.units_used.get(rec.demand.resource, 0) - rec.demand.units
        ns.cpu_used -= rec.demand.cpu_milli
        ns.mem_used_mib -= rec.demand.memory_mib
        rec.placement = None
        if sync:
            self._sync(rec.node)

    def _sync(self, name: str) -> None:
        """Refresh the node's fleet row (free CPU, memory and per-GPU share)."""
        ns = self.nodes.get(name)
        if ns is None:
            return
        inv = ns.inventory
        if inv.health.state is HealthState.DEGRADED:
            self.degraded.add(name)
        else:
            self.degraded.discard(name)
        usable = ns.gpus.usable
        free = [s.free_milli if i < usable else 0 for i, s in enumerate(ns.gpus.slots)]
        alloc_cpu = inv.cpu_milli
        self.fleet.upsert(name, alloc_cpu - ns.cpu_used, inv.memory_bytes // 2**20 - ns.mem_used_mib, free,
                          inv.model, ns.gpus.topology, cpu_capacity=alloc_cpu)
        if inv.unschedulable:
            self.fleet.remove(name)

