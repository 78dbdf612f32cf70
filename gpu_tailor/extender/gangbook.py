"""Groups placed whole in a live cluster: each group's plan, the GPUs it holds for the members not bound yet, and
the filter's answer for a member.

kube-scheduler asks about one pod at a time. The first member of a group that reaches the filter has the whole group
planned (``gangs.plan`` on the cache's fleet with the policy: the domain, then every member's node and GPUs); where
no domain, or no set of nodes, holds the whole group, no member passes any node and each says why. A plan holds the
GPUs of every member not bound yet as a *reservation*: a record on the planned node, counted like an assumed pod
(``Ledger._add``), so single pods and other groups are steered off them, until its member is seen bound there.
Each member is filtered to its own slot's node. The plan is written on the pod it was made for
(``gpu-tailor.io/group-plan``): a restarted extender, or its standby, reads it back with the pods and holds the same
GPUs again. A plan whose members have not all been bound by its deadline is released (its reservations dropped, the
reason logged and sent as an event); the members still to come are planned again, in the domain of those bound.

On DRA nodes kube-scheduler's allocator picks each pod's devices: a plan there is made on the DRA nodes' fleet rows,
and its reservations hold their GPUs in ``draholds`` instead, which the rows and the filter count.

Reservations are keyed ``namespace/~group#slot``: no pod can have that name.
"""

from __future__ import annotations

import json
import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from gpu_tailor.extender.draholds import DraHolds
from gpu_tailor.extender.placements import Placements
from gpu_tailor.extender.records import PodRecord, pod_uid
from gpu_tailor.gpumodel import gangs, labels
from gpu_tailor.gpumodel.dra_state import DraState
from gpu_tailor.gpumodel.fleet import MILLI, PICK_FIRST, Fleet, Shape
from gpu_tailor.gpumodel.groups import GroupRef
from gpu_tailor.gpumodel.inventory import HealthState
from gpu_tailor.gpumodel.policies import Policy
from gpu_tailor.gpumodel.schedule import Demand, Fit, NodeState, inventory_verdict, shape_of

log = logging.getLogger(__name__)

GROUP_TIMEOUT = 300.0  # seconds a plan waits for all its members to be bound (--group-timeout)
RESERVED = "~"  # a reservation's name starts so (no pod name can)
KEPT_GROUPS = 4096  # groups whose bound members' nodes are kept (least recently bound dropped first)


class Books(Protocol):
    """What the book needs of the cache: its nodes, fleet and policy, its pod records, and how to count one."""

    nodes: dict[str, NodeState]
    pods: dict[str, PodRecord]
    on_node: dict[str, dict[str, PodRecord]]
    fleet: Fleet
    dra: DraState

    @property
    def policy(self) -> Policy: ...

    def _add(self, rec: PodRecord) -> None: ...

    def _drop(self, rec: PodRecord) -> None: ...


def reserved(key: str) -> bool:
    """Whether a record's key is a reservation's, not a pod's."""
    return key.partition("/")[2].startswith(RESERVED)


def as_the_plugin_sees(state: NodeState, records: Iterable[tuple[str, PodRecord]]) -> NodeState:
    """A node's ``state`` without the GPUs plans hold there for members still to come (``records``: the node's, by
    key): what the device plugin picks from, which hands a pod any GPU no pod holds. Reservations steer the filter
    and the scores; a pod's GPUs are predicted on this. A copy where something is held, else ``state``."""
    held = [(key, rec) for key, rec in records if reserved(key)]
    if not held:
        return state
    state = state.copy()
    for key, rec in held:
        if state.gpus.release(key) is not None:
            state.units_used[rec.demand.resource] = state.units_used.get(rec.demand.resource, 0) - rec.demand.units
        state.cpu_used -= rec.demand.cpu_milli
        state.mem_used_mib -= rec.demand.memory_mib
    return state


@dataclass
class Slot:
    node: str
    gpus: tuple[int, ...]
    member: str = ""  # the uid of the pod it is for, once one was filtered
    bound: bool = False


@dataclass
class Plan:
    """A group's plan: every member's node and GPUs in ``domain`` ("" where spread), until ``deadline`` (wall).
    ``claim``: on DRA nodes, each member's GPUs as the fleet sees them (whole GPUs, or a share of one)."""

    ref: GroupRef
    demand: Demand
    domain: str
    slots: list[Slot]
    deadline: float
    anchor: str  # namespace/name of the pod it was made for, which carries it
    written: bool = False
    anchor_uid: str = ""
    claim: Shape | None = None

    def wire(self) -> str:
        out: dict[str, Any] = {"group": self.ref.key, "size": self.ref.size, "domain": self.domain,
                               "deadline": round(self.deadline, 3),
                               "slots": [[s.node, list(s.gpus), s.member] for s in self.slots]}
        if self.claim is not None:
            out["claim"] = [self.claim.gpus, self.claim.milli]
        return json.dumps(out, separators=(",", ":"))

    def held(self, key: str) -> Demand:
        """What a reservation of it counts on its node: a member's demand, without the GPUs on a DRA node (``draholds``
        keeps those: the node sells no device-plugin resource)."""
        if self.claim is None:
            return replace(self.demand, key=key)
        return replace(self.demand, key=key, resource="", units=0, per_container=0)

    def reservation(self, i: int) -> str:
        # ":" joins the key's parts: no Kubernetes name holds one, so two groups never share a reservation
        ns, rest = self.ref.key.split("/", 1)
        return f"{ns}/{RESERVED}{rest.replace('/', ':')}#{i}"


def _alike(plan: Plan, demand: Demand, claim: Shape | None) -> bool:
    """Whether a member asks as its group's plan does (a native ask DRA serves is planned with a claim's shape)."""
    if (plan.demand.units, plan.demand.resource) != (demand.units, demand.resource):
        return False
    return claim is None or (plan.claim is not None
                             and (plan.claim.gpus, plan.claim.milli) == (claim.gpus, claim.milli))


def each(demand: Demand, claim: Shape | None) -> str:
    """A member's ask in words: its native resource, or what its claim takes on DRA nodes."""
    if claim is None:
        return f"{demand.units} x {demand.resource}"
    if claim.milli < MILLI:
        return f"{claim.milli / 10:g}% of a shared GPU (DRA)"
    return f"{claim.gpus} GPU{'s' if claim.gpus != 1 else ''} (DRA)"


@dataclass(frozen=True, slots=True)
class Answer:
    """The filter's answer for a member: only ``node`` passes, or none does (``reason``)."""

    node: str | None
    reason: str = ""


@dataclass
class GroupBook:
    timeout: float = GROUP_TIMEOUT
    wall: Callable[[], float] = field(default=lambda: 0.0)
    plans: dict[str, Plan] = field(default_factory=dict)  # by group key
    members: dict[str, tuple[str, int]] = field(default_factory=dict)  # member uid -> (group key, slot)
    released: list[tuple[Plan, str]] = field(default_factory=list)  # for the server to report, then cleared
    unwritten: list[Plan] = field(default_factory=list)  # plans for the server to write on their anchor pod
    # each group's members seen bound and where (uid -> node), kept past its plan while they run: the rest of the
    # group is planned beside them; a member deleted or finished leaves it
    settled: OrderedDict[str, dict[str, str]] = field(default_factory=OrderedDict)
    settled_in: dict[str, str] = field(default_factory=dict)  # member uid -> its group key in ``settled``
    # groups kube-scheduler places one domain at a time, not planned yet (``Placements``), least recently asked first
    placements: OrderedDict[str, Placements] = field(default_factory=OrderedDict)
    mix: gangs.GangMix = field(default_factory=gangs.GangMix)  # the groups planned so far, by size and ask
    # pods of a group seen bound while no plan of it was held (uid -> node): a plan read back later counts them bound
    early: OrderedDict[str, dict[str, str]] = field(default_factory=OrderedDict)
    early_in: dict[str, str] = field(default_factory=dict)  # uid -> its group key in ``early``
    dra: DraHolds = field(default_factory=DraHolds)  # what reservations on DRA nodes hold there

    # ----- the filter -----
    def answer(self, books: Books, pod: dict[str, Any], demand: Demand, ref: GroupRef,
               candidates: list[str] | None = None, claim: Shape | None = None) -> Answer:
        """The node a member may go to, planning its group first where nothing holds a plan for it, on
        ``candidates`` where given: the nodes kube-scheduler's own filters passed for this pod (its node selector,
        affinity and tolerations, which its group's pods share, and DynamicResources' check that its claims can be
        allocated there; gpu-tailor-scheduler scores every feasible node). ``claim``: a member whose GPUs come from a
        ResourceClaim on DRA pools, as the fleet sees them."""
        uid = pod_uid(pod)
        if uid in self.members:
            key, i = self.members[uid]
            plan = self.plans.get(key)
            if plan is not None:
                return Answer(plan.slots[i].node)
        plan = self.plans.get(ref.key)
        if plan is not None and not _alike(plan, demand, claim):
            return Answer(None, f"{ref.name}: its pods ask for different GPUs ({each(plan.demand, plan.claim)} and "
                                f"{each(demand, claim)}): a group's pods must ask alike")
        if plan is None:
            made = self._plan(books, demand, ref, pod, candidates, claim)
            if isinstance(made, str):
                return Answer(None, made)
            plan = made
        free = [i for i, s in enumerate(plan.slots) if not s.member]
        if not free:
            return Answer(None, f"{ref.name} has its {ref.size} pods placed: this one is one too many")
        i = free[0]
        plan.slots[i].member = uid
        self.members[uid] = (ref.key, i)
        return Answer(plan.slots[i].node)

    def _plan(self, books: Books, demand: Demand, ref: GroupRef, pod: dict[str, Any],
              candidates: list[str] | None, claim: Shape | None) -> Plan | str:
        fleet, policy = books.fleet, books.policy
        # Only the nodes whose inventory can serve a member (what fit() checks before placing: health, product, the
        # resource sold as whole GPUs and not as MIG slices or replicas): the fleet's rows say GPUs, not how they
        # are sold, and a member's filter passes its planned node without fitting it again.
        rows = fleet.rows() if candidates is None else fleet.rows(candidates)
        here = self._placement(fleet, ref, pod, rows) if ref.by_domain and candidates is not None else None
        if here is not None:
            rows = self.placements[ref.key].rows(fleet)
        offers = [] if claim is not None else [
            (r, v) for r in rows if (ns := books.nodes.get(fleet.names[r])) is not None
            and not isinstance(v := inventory_verdict(ns.inventory, demand), Fit)]
        # A native ask no device-plugin node serves, and DRA does (a DeviceClass's extendedResourceName): each pod's
        # GPUs are whole devices the allocator picks on a DRA node. Where device-plugin nodes serve it, the group is
        # planned there, or refused, as without DRA.
        if not offers and claim is None and books.dra.enabled and demand.resource in books.dra.extended():
            claim = Shape(demand.cpu_milli, demand.memory_mib, demand.units, MILLI)
        if claim is not None:  # the DRA nodes among the candidates: their rows are the allocator's devices
            rows = rows[fleet.pick[rows] == PICK_FIRST]
            if not len(rows):
                return f"{ref.name}: no node's DRA pool serves {each(demand, claim)} to each of its pods"
            shape = claim
        elif not offers:
            return f"{ref.name}: no node serves {each(demand, claim)} to each of its pods"
        else:
            rows = np.array([r for r, _ in offers], np.int64)
            shape = shape_of(demand, offers[0][1])
        settled = [n for n in self.settled.get(ref.key, {}).values() if n in fleet.index]
        if len(settled) >= ref.size:
            return f"{ref.name} has its {ref.size} pods bound: this one is one too many"
        if settled and ref.domain != gangs.ANYWHERE:  # the rest goes beside the members bound
            rows = rows[fleet.domain[rows] == fleet.domain[fleet.index[settled[0]]]]
        gang = gangs.Gang(ref.size - len(settled), shape, ref.domain)
        # degraded nodes last, as for single pods: the group goes there only where nothing else holds it
        healthy = np.array([books.nodes[fleet.names[r]].inventory.health.state is not HealthState.DEGRADED
                            for r in rows], bool)
        self.mix.observe(gang)  # the gang sizes seen: a domain is chosen to keep room for them
        chosen = gangs.plan(policy, gang, self.mix, rows[healthy]) if healthy.any() else None
        if chosen is None and not healthy.all():
            chosen = gangs.plan(policy, gang, self.mix, rows)
        if chosen is None:
            return self._why_not(fleet, gang, ref, each(demand, claim), rows)
        domain = fleet.domain_names[chosen.domain] if chosen.domain >= 0 else ""
        if here is not None:
            if chosen.domain != here:
                return f"{ref.name} goes whole into NVLink domain {domain}, not into this one"
            self.placements.pop(ref.key, None)
        plan = Plan(ref, demand, domain if chosen.domain >= 0 and fleet.labelled[chosen.domain] else "",
                    [Slot(fleet.names[m.node], m.gpus) for m in chosen.members], self.wall() + self.timeout,
                    f"{(pod.get('metadata') or {}).get('namespace', '')}/{(pod.get('metadata') or {}).get('name', '')}",
                    anchor_uid=pod_uid(pod), claim=claim)
        self.install(books, plan)
        self.unwritten.append(plan)
        where = f"in NVLink domain {plan.domain}" if plan.domain else "over several domains" \
            if chosen.domain < 0 else f"on node {plan.slots[0].node}"
        log.info("%s: %d pods planned %s", ref.name, ref.size, where)
        return plan

    def _placement(self, fleet: Fleet, ref: GroupRef, pod: dict[str, Any], rows: np.ndarray) -> int | None:
        """The domain kube-scheduler asks about (``Placements``), noted with the nodes it passed there; None where
        ``rows`` are not the nodes of one labelled domain (kube-scheduler is not placing the group domain by domain)."""
        domains = np.unique(fleet.domain[rows])
        if len(domains) != 1 or not fleet.labelled[int(domains[0])]:
            return None
        domain = int(domains[0])
        seen = self.placements.pop(ref.key, None) or Placements()
        self.placements[ref.key] = seen
        if len(self.placements) > KEPT_GROUPS:
            self.placements.popitem(last=False)
        seen.seen(pod_uid(pod), domain, rows)
        return domain

    @staticmethod
    def _why_not(fleet: Fleet, gang: gangs.Gang, ref: GroupRef, member: str, rows: np.ndarray) -> str:
        hold = gangs.domain_slots(fleet, gang.member, rows)
        ask = f"{ref.size} pods of {member}"
        if gang.domain == gangs.REQUIRED:
            return (f"{ref.name} ({ask}) fits in no NVLink domain as a whole: the most any domain holds now is "
                    f"{int(hold.max()) if len(hold) else 0}; no pod of it is bound until all fit")
        return (f"{ref.name} ({ask}) does not fit as a whole: the cluster holds {int(hold.sum())} of its pods now; "
                "no pod of it is bound until all fit")

    # ----- holding GPUs -----
    def install(self, books: Books, plan: Plan) -> None:
        """Take ``plan`` in (replacing one of its group's) and hold the GPUs of its slots not bound yet."""
        old = self.plans.get(plan.ref.key)
        if old is not None:
            self._unhold(books, old)
        self.plans[plan.ref.key] = plan
        for i, s in enumerate(plan.slots):
            if s.member:
                self.members[s.member] = (plan.ref.key, i)
            if not s.bound:  # a node not known yet counts it once it comes
                key = plan.reservation(i)
                if plan.claim is not None:
                    self.dra.hold(s.node, key, s.gpus, plan.claim.milli)
                books._add(PodRecord("", s.node, plan.held(key), recorded=s.gpus, deadline=math.inf))

    def _unhold(self, books: Books, plan: Plan) -> None:
        for i in range(len(plan.slots)):
            self._drop(books, plan, i)

    def _drop(self, books: Books, plan: Plan, i: int) -> None:
        key = plan.reservation(i)
        self.dra.drop(plan.slots[i].node, key)
        rec = books.pods.get(key)
        if rec is not None:
            books._drop(rec)

    def bound(self, books: Books, uid: str, node: str) -> None:
        """A member was seen bound (on its slot's node or not): its slot's GPUs are its own now."""
        where = self.members.get(uid)
        plan = self.plans.get(where[0]) if where is not None else None
        if plan is None or where is None:
            return
        slot = plan.slots[where[1]]
        if slot.bound:
            return
        slot.bound = True
        self.settled.setdefault(plan.ref.key, {})[uid] = node
        self.settled_in[uid] = plan.ref.key
        self.settled.move_to_end(plan.ref.key)
        if len(self.settled) > KEPT_GROUPS:
            _, dropped = self.settled.popitem(last=False)
            for gone in dropped:
                self.settled_in.pop(gone, None)
        self._drop(books, plan, where[1])
        if node != slot.node:
            log.warning("%s: a pod planned on %s was bound on %s", plan.ref.name, slot.node, node)
        if all(s.bound for s in plan.slots):
            self._forget(plan)

    def gone(self, uid: str) -> None:
        """A member was deleted or finished: bound, it no longer counts in its group; not bound yet, its slot waits
        for another pod of the group."""
        key = self.settled_in.pop(uid, None)
        if key is not None and key in self.settled:
            self.settled[key].pop(uid, None)
            if not self.settled[key]:
                del self.settled[key]
        self.early.get(self.early_in.pop(uid, ""), {}).pop(uid, None)  # noted bound while no plan was held
        where = self.members.pop(uid, None)
        plan = self.plans.get(where[0]) if where is not None else None
        if plan is not None and where is not None and not plan.slots[where[1]].bound:
            plan.slots[where[1]].member = ""

    def _forget(self, plan: Plan) -> None:
        self.plans.pop(plan.ref.key, None)
        for s in plan.slots:
            self.members.pop(s.member, None)

    def expire(self, books: Books) -> None:
        """Release the plans past their deadline: their reservations go, and the reason is kept for the server."""
        now = self.wall()
        for plan in [p for p in self.plans.values() if p.deadline <= now]:
            waiting = sum(1 for s in plan.slots if not s.bound)
            why = (f"{plan.ref.name}: {waiting} of {len(plan.slots)} pods not bound within {self.timeout:.0f}s; "
                   "the GPUs held for them are free again")
            log.warning("%s", why)
            self._unhold(books, plan)
            self._forget(plan)
            self.released.append((plan, why))

    # ----- read back -----
    def restore(self, books: Books, pod: dict[str, Any], ref: GroupRef, demand: Demand) -> None:
        """A pod carrying a plan (``gpu-tailor.io/group-plan``) was listed or watched: hold it again where this
        replica holds none for the group (a restart, a standby taking over). Or a pod of a group whose plan is held
        was seen bound: a member bound before the plan was read back, whose slot is its own now.

        The plan is written once, at the first member's filter, bound or not by now; it names that member only, so
        a member bound before the plan was read back is known by the slot's GPUs it holds (``_taken``) or by its
        node (``_claim``)."""
        uid, node = pod_uid(pod), str((pod.get("spec") or {}).get("nodeName") or "")
        held = self.plans.get(ref.key)
        if held is not None:
            if node and uid not in self.members:
                self._claim(books, held, uid, node)
            return
        raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(labels.ANN_GROUP_PLAN)
        if raw is None and node:
            self._early(ref.key, uid, node)
        if raw is None or ref.key in self.settled or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return  # members seen bound by this replica (the plan was held here: done or released), or the group ran
        try:
            wire = json.loads(str(raw))
            slots = [Slot(str(n), tuple(int(g) for g in gpus), str(m)) for n, gpus, m in wire["slots"]]
            deadline = float(wire["deadline"])
            claim = None if wire.get("claim") is None else \
                Shape(demand.cpu_milli, demand.memory_mib, int(wire["claim"][0]), int(wire["claim"][1]))
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("%s: its plan annotation cannot be read (%s): planned again", ref.name, exc)
            return
        if deadline <= self.wall() or len(slots) != ref.size:
            return
        meta = pod.get("metadata") or {}
        plan = Plan(ref, demand, str(wire.get("domain", "")), slots, deadline,
                    f"{meta.get('namespace', '')}/{meta.get('name', '')}", written=True, anchor_uid=pod_uid(pod),
                    claim=claim)
        for s in slots:  # members bound already hold their own GPUs: this pod where it is bound, and the others
            s.bound = bool(node) and s.member == uid
        self._taken(books, [s for s in slots if s.member != uid])
        for seen, where in self.early.pop(ref.key, {}).items():  # bound before the plan was read back, still there
            self.early_in.pop(seen, None)
            if not any(r.uid == seen for r in (books.on_node.get(where) or {}).values()):
                continue
            hit = next((s for s in slots if s.node == where and not s.bound and s.member in ("", seen)), None)
            if hit is not None:
                hit.bound, hit.member = True, seen
        if all(s.bound for s in slots):
            return
        self.install(books, plan)

    def _early(self, key: str, uid: str, node: str) -> None:
        self.early.setdefault(key, {})[uid] = node
        self.early_in[uid] = key
        self.early.move_to_end(key)
        if len(self.early) > KEPT_GROUPS:
            for gone in self.early.popitem(last=False)[1]:
                self.early_in.pop(gone, None)

    @staticmethod
    def _taken(books: Books, slots: list[Slot]) -> None:
        """Mark bound the slots whose GPUs a pod counted on their node holds: the members they were held for, bound
        before the plan was read back (nothing else could take them while the plan held them). A pod whose GPUs are
        not known yet (its node not listed yet, no record on it) takes one slot of its node."""
        for node in {s.node for s in slots}:
            open_slots = [s for s in slots if s.node == node]
            for key, rec in (books.on_node.get(node) or {}).items():
                if reserved(key) or not rec.demand.gpu:
                    continue
                gpus = rec.placement.gpus if rec.placement is not None else rec.recorded
                hit = next((s for s in open_slots if gpus is None or set(gpus) & set(s.gpus)), None)
                if hit is not None:
                    hit.bound, hit.member = True, rec.uid  # its slot: not handed to another member
                    open_slots.remove(hit)

    def _claim(self, books: Books, plan: Plan, uid: str, node: str) -> None:
        """A pod of the group seen bound on ``node`` without a slot here: the slot held there is its own."""
        free = [i for i, s in enumerate(plan.slots) if s.node == node and not s.bound and s.member in ("", uid)]
        if free:
            plan.slots[free[0]].member = uid
            self.members[uid] = (plan.ref.key, free[0])
            self.bound(books, uid, node)
