"""``gpu-tailor explain``: what the webhook would do to a pod, and where the scheduler would put it, and why.

Nothing here decides anything of its own. The webhook's answer is ``webhook.mutate.decide`` on an
AdmissionReview built as the API server would send it, over a ``webhook.state.ClusterView`` of the
nodes and pods; its JSONPatch is applied to give the pod as stored. The extender's answers are
``extender.verbs.filter_nodes``, ``prioritize`` and ``plan_bind`` on a snapshot of an
``extender.cache.Cache`` filled with the same nodes and pods, asked about the nodes that pass
kube-scheduler's own filters (``intree``), as kube-scheduler asks only about those.
"""

from __future__ import annotations

import copy
import difflib
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import jsonpatch
import yaml

from gpu_tailor.extender import verbs, wire
from gpu_tailor.extender.cache import Cache
from gpu_tailor.extender.records import pod_record
from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.devices import dra as claims
from gpu_tailor.gpumodel.dra import DraPool
from gpu_tailor.gpumodel.occupancy import NodeGpus
from gpu_tailor.gpumodel.schedule import Demand, demand_of
from gpu_tailor.tools import intree
from gpu_tailor.tools.explain_groups import groups_said
from gpu_tailor.tools.source import Cluster
from gpu_tailor.webhook.config import AdmissionPolicy
from gpu_tailor.webhook.mutate import KUBE_DEFAULT_SCHEDULER, decide
from gpu_tailor.webhook.registration import EXEMPT_NAMESPACES
from gpu_tailor.webhook.state import ClusterView

Obj = dict[str, Any]


@dataclass
class Admission:
    called: bool  # whether the API server would call the webhook at all
    allowed: bool
    outcome: str  # not-called | allowed | mutated | denied
    message: str = ""  # the denial, or why the webhook is not called
    code: int = 200
    warnings: list[str] = field(default_factory=list)
    patch: list[Obj] = field(default_factory=list)
    diff: str = ""  # unified diff of the pod's YAML, as written -> as stored


@dataclass
class NodeVerdict:
    node: str
    fits: bool
    by: str = ""  # who turns it away: kube-scheduler | gpu-tailor extender ("" when it fits)
    reasons: list[str] = field(default_factory=list)
    unresolvable: bool = False  # the extender says no eviction would help
    score: int | None = None  # prioritize's 0..10, for the nodes that fit
    gpus: list[int] | None = None  # what bind would hand out there (None: no GPU ask, or counted only)
    maybe: list[int] | None = None  # the GPUs the device plugin may pick among, where it is not one
    whole: bool = False  # ``gpus`` are whole GPUs (else replicas, MIG instances or shares)
    nvlink: str = ""  # for several whole GPUs: whether those GPUs are all NVLink-connected
    detail: str = ""  # for people: how much is free of what is short, or that a degraded node is scored last


@dataclass
class Explanation:
    subject: str
    source: str
    namespace: str
    admission: Admission
    stored: Obj  # the pod as the API server would store it (without the API server's own defaults)
    scheduler: str
    extender_asked: bool
    ask: str  # the native GPU ask after admission, for people
    nodes: list[NodeVerdict]
    chosen: str | None = None
    gpus: list[int] | None = None
    maybe: list[int] | None = None  # as NodeVerdict.maybe, on the chosen node
    nvlink: str = ""
    pending: str = ""  # kube-scheduler's FailedScheduling message when no node fits
    notes: list[str] = field(default_factory=list)

    def wire(self) -> Obj:
        return asdict(self)


def admission_review(pod: Obj) -> Obj:
    """The AdmissionReview request the API server sends for a create of ``pod``."""
    meta = pod.get("metadata") or {}
    return {"uid": "gpu-tailor-explain", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": meta.get("name", ""), "namespace": meta.get("namespace", ""), "operation": "CREATE",
            "userInfo": {"username": "gpu-tailor-explain"}, "object": pod, "dryRun": True}


def api_defaults(pod: Obj) -> Obj:
    """``pod`` with what the API server fills in before it calls mutating webhooks and that decisions read:
    requests default to limits (per resource, per container) and an unset schedulerName is
    ``default-scheduler``. The DefaultTolerationSeconds tolerations and the rest are left out."""
    out = copy.deepcopy(pod)
    spec = out.setdefault("spec", {})
    for key in ("initContainers", "containers"):
        for c in spec.get(key) or []:
            res = c.get("resources") if isinstance(c, dict) else None
            if isinstance(res, dict) and isinstance(res.get("limits"), dict):
                requests = res.setdefault("requests", {})
                for name, value in res["limits"].items():
                    requests.setdefault(name, value)
    spec.setdefault("schedulerName", KUBE_DEFAULT_SCHEDULER)
    return out


def _as_yaml(obj: Obj) -> list[str]:
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False).splitlines(keepends=True)


def admit(pod: Obj, cluster: Cluster, policy: AdmissionPolicy) -> tuple[Admission, Obj, list[str]]:
    """The webhook's answer for ``pod`` and the pod as stored; notes on what was assumed."""
    notes: list[str] = []
    meta = pod.get("metadata") or {}
    ns = str(meta.get("namespace", ""))
    if ns in EXEMPT_NAMESPACES:
        return Admission(False, True, "not-called", f"namespace {ns} is never sent to the webhook"), pod, notes
    if (meta.get("labels") or {}).get(labels.POD_OPT_OUT_LABEL) == "true":
        return Admission(False, True, "not-called", f"the pod is labelled {labels.POD_OPT_OUT_LABEL}=true"), pod, notes
    if cluster.namespaces is None or ns not in cluster.namespaces:
        notes.append(f"namespace {ns}: its labels are unknown here ({cluster.source} does not include it); "
                     f"assumed opted in ({labels.NAMESPACE_OPT_IN_LABEL}=true)")
    elif cluster.namespaces[ns].get(labels.NAMESPACE_OPT_IN_LABEL) != "true":
        return Admission(False, True, "not-called", f"namespace {ns} is not labelled "
                         f"{labels.NAMESPACE_OPT_IN_LABEL}=true: the webhook is not called"), pod, notes
    view = ClusterView(policy)
    view.reset(cluster.nodes, cluster.pods)
    view.dra = cluster.dra
    decision = decide(admission_review(pod), view.candidates(), policy, view.dra, view.nodes_taking_pods())
    if not decision.allowed:
        return Admission(True, False, "denied", decision.message, decision.code, list(decision.warnings)), pod, notes
    stored: Obj = jsonpatch.apply_patch(pod, decision.patch) if decision.patch else pod
    diff = "".join(difflib.unified_diff(_as_yaml(pod), _as_yaml(stored), "as written", "as stored"))
    return Admission(True, True, decision.outcome, "", 200, list(decision.warnings), list(decision.patch),
                     diff), stored, notes


def describe_ask(demand: Demand) -> str:
    if demand.error:
        return demand.error
    if not demand.gpu:
        return "no GPU"
    extra = []
    if demand.products:
        extra.append(f"product {'|'.join(demand.products)}")
    if demand.nvlink:
        extra.append("NVLink")
    return f"{demand.units} x {demand.resource}" + (f" ({', '.join(extra)})" if extra else "")


def pending_message(verdicts: list[NodeVerdict]) -> str:
    """kube-scheduler's ``0/N nodes are available: ...``: each reason with how many nodes gave it."""
    counts: Counter[str] = Counter()
    for v in verdicts:
        counts.update(v.reasons)
    parts = ", ".join(f"{n} {reason}" for reason, n in sorted(counts.items()))
    return f"0/{len(verdicts)} nodes are available: {parts}."


def _nvlink(topology: Any, gpus: list[int], demand: Demand) -> str:
    if len(gpus) < 2:
        return ""
    linked = topology is not None and topology.all_nvlinked(gpus)
    said = "all NVLink-connected" if linked else f"not all NVLink-connected ({getattr(topology, 'kind', 'pcie')})"
    return said + (f"; {labels.ANN_TOPOLOGY} asks for NVLink" if demand.nvlink else "")


def _allocated(pick: claims.Pick) -> str:
    """What the allocator gives one request: ``1 x NVIDIA H100 80GB HBM3 (80Gi) -> device gpu-0``, or
    ``-> devices gpu-2, gpu-3`` for several."""
    names = [d.name for d in pick.devices]
    return f"{pick.rung.describe()} -> device{'s' if len(names) > 1 else ''} {', '.join(names)}"


def _uncertain(pools: list[DraPool]) -> str:
    """Why the allocator may take other devices than predicted on a node, where it may: a pool the driver is still
    publishing (devices not seen yet may come first), or several pools (searched in an order the prediction does not
    know)."""
    incomplete = [p.name for p in pools if not p.complete]
    if incomplete:
        return f" (may differ: pool {', '.join(incomplete)} is not wholly published yet)"
    if len(pools) > 1:
        return f" (may differ: {len(pools)} pools on the node, the allocator may search another first)"
    return ""


def dra_allocations(stored: Obj, cache: Cache) -> dict[str, str] | None:
    """For a pod whose GPUs are a DRA claim (gpu-tailor's template, or a native ask a DeviceClass serves): per node
    where kube-scheduler's DynamicResources plugin can allocate it now, what the allocator would pick there; None for
    a pod without such a claim. A node left out cannot allocate it."""
    snap = cache.snapshot()
    dra = snap.dra
    if not dra.enabled:
        return None
    inv, usage = dra.inventory(), dra.usage()
    ladders = verbs.claim_ladders(snap, {"metadata": stored.get("metadata") or {}})
    if ladders is not None:
        out = {}
        for node in inv.nodes():
            picks = claims.node_picks(ladders, inv, usage, node)
            if picks is not None:
                out[node] = "claim: " + ", ".join(_allocated(p) for p in picks.values() if p is not None) + \
                    _uncertain(inv.on_node(node))
        return out
    demand = demand_of(stored)
    served = verbs.dra_served(snap, demand)
    if not served:
        return None
    out = {}
    for node in served:
        left = claims.native_preference(snap.dra, node, demand.units)
        if left is not None:
            out[node] = f"claim of {demand.units} x {demand.resource} through DRA ({left} GPUs left free)"
    return out


def schedule(stored: Obj, cluster: Cluster, group_notes: list[str] | None = None) -> tuple[list[NodeVerdict], Demand]:
    """Every node's verdict: kube-scheduler's own filters first, then the extender's filter, prioritize
    and bind's choice of GPUs on the nodes that pass them. ``group_notes``: what is said of the pod's group, if any
    (its plan, the NVLink domains), is added there."""
    group_notes = [] if group_notes is None else group_notes
    cache = Cache(report_stale=None)  # a dump is read later than it was taken: its reports are as they were
    cache.reset_reports(cluster.reports)  # the node agents' word first: the nodes are installed with it
    cache.group_objects = cluster.groups  # before the pods: a plan read back from one sizes its group by them
    cache.reset_pods(cluster.pods)  # as ``gpu-tailor extender --cluster-file`` loads it
    cache.reset_nodes(cluster.nodes)
    cache.dra = cluster.dra
    by_node = intree.pods_by_node(cluster.pods)
    verdicts: dict[str, NodeVerdict] = {}
    passing: list[str] = []
    allocations = dra_allocations(stored, cache)
    for node in sorted(cluster.nodes, key=lambda n: str((n.get("metadata") or {}).get("name", ""))):
        name = str((node.get("metadata") or {}).get("name", ""))
        here = by_node.get(name, [])
        why = intree.reasons(stored, node, here)
        if allocations is not None:  # DynamicResources: the claim must be allocatable on the node
            served = allocations.get(name)
            why = [r for r in why if not (served and r.startswith("Insufficient nvidia.com/"))]
            if served is None:
                why.append("cannot allocate all claims")
            else:
                verdicts[name] = NodeVerdict(name, not why, "kube-scheduler" if why else "", why, detail=served)
        if name not in verdicts:
            verdicts[name] = NodeVerdict(name, not why, "kube-scheduler" if why else "", why)
        if any(r.startswith("Insufficient ") for r in why):
            verdicts[name].detail = "; ".join(intree.shortfalls(stored, node, here))
        if not why:
            passing.append(name)
    demand = demand_of(stored)
    # a group's pod: its node in the group's plan (planned now, on the nodes kube-scheduler passes, if none is held)
    member = cache.group_answer(stored, demand, passing)
    group_notes.extend(groups_said(cache, stored, demand, member))
    if not passing:
        return list(verdicts.values()), demand
    snap = cache.snapshot()
    args = wire.extender_args({"Pod": stored, "NodeNames": passing})
    result = verbs.filter_nodes(snap, args, member)
    for failures, unresolvable in ((result["FailedNodes"], False), (result["FailedAndUnresolvableNodes"], True)):
        for name, reason in failures.items():
            verdicts[name] = NodeVerdict(name, False, "gpu-tailor extender", [reason], unresolvable)
    fitting = list(result["NodeNames"] or [])
    if fitting:
        asked = verbs.shape_asked(snap, args)
        if asked is not None:
            cache.observe(*asked)  # as the server does before it scores: the pod is part of the mix
        scored = verbs.prioritize(snap, wire.extender_args({"Pod": stored, "NodeNames": fitting}), member)
        rec = pod_record(stored, demand)
        for entry in scored:
            name = entry["Host"]
            v = verdicts[name]
            v.score = int(entry["Score"])
            if name in snap.degraded or snap.nodes[name].state.gpus.unhealthy:
                v.detail = _unsold(snap.nodes[name].state.gpus, name in snap.degraded)
            plan = verbs.plan_bind(snap, rec, name)
            if plan.error:
                v.fits, v.by, v.reasons = False, "gpu-tailor extender", [plan.error]
                continue
            if plan.placement is not None and plan.placement.counted:
                v.detail = "; ".join(d for d in (v.detail, "which GPUs is not known: counted only") if d)
            elif plan.placement is not None and plan.placement.gpus:
                v.gpus = list(plan.placement.gpus)
                v.maybe = list(plan.placement.maybe) or None
                v.whole = plan.placement.whole
                if plan.placement.whole:
                    v.nvlink = _nvlink(snap.nodes[name].state.gpus.topology, v.gpus, demand)
    return list(verdicts.values()), demand


def _unsold(gpus: NodeGpus, degraded: bool) -> str:
    """Which GPUs a node does not sell or lost, where a node agent said; else how many (a degraded node)."""
    if gpus.unhealthy:
        said = f"GPU {', '.join(map(str, sorted(gpus.unhealthy)))} not sold or lost (the node agent's report)"
        if gpus.sold_but_lost():
            said += "; the device plugin still sells it and may hand it out"
    else:
        said = f"{len(gpus.slots) - gpus.usable} of {len(gpus.slots)} GPUs not sold, which not known"
    return f"degraded: {said}; scored last" if degraded else said


def explain(pod: Obj, subject: str, cluster: Cluster, policy: AdmissionPolicy) -> Explanation:
    pod = api_defaults(pod)
    admission, stored, notes = admit(pod, cluster, policy)
    notes = [*cluster.notes, *notes]
    ns = str((pod.get("metadata") or {}).get("namespace", ""))
    scheduler = str((stored.get("spec") or {}).get("schedulerName") or KUBE_DEFAULT_SCHEDULER)
    asked = scheduler == (policy.schedulerName or labels.GPU_TAILOR_SCHEDULER)
    out = Explanation(subject, cluster.source, ns, admission, stored, scheduler, asked, "", [], notes=notes)
    if not admission.allowed:
        out.ask = describe_ask(demand_of(pod))
        return out
    if not asked:
        notes.append(f"schedulerName {scheduler}: gpu-tailor's extender is not asked about this pod; the GPU "
                     "verdicts below are what it would say")
    out.nodes, demand = schedule(stored, cluster, notes)
    out.ask = describe_ask(demand)
    fitting = [v for v in out.nodes if v.fits]
    if fitting:
        best = max(fitting, key=lambda v: v.score or 0)  # the first of the best, in name order
        out.chosen, out.gpus, out.maybe, out.nvlink = best.node, best.gpus, best.maybe, best.nvlink
        ties = [v.node for v in fitting if v.score == best.score and v is not best]
        if ties:
            notes.append(f"{', '.join(ties)} score{'s' if len(ties) == 1 else ''} the same as {best.node}: "
                         "kube-scheduler's own scores (the extender's weigh 5 x 0..10) pick among them")
    else:
        out.pending = pending_message(out.nodes)
        unsold = _unsold_mig(demand, cluster)
        if unsold:
            notes.append(unsold)
    return out


def _unsold_mig(demand: Demand, cluster: Cluster) -> str:
    """For a pod asking for a MIG instance that no node sells any more (its pool re-cut, or being re-cut), say so
    and where to look; "" otherwise."""
    if not demand.resource.startswith(labels.MIG_RESOURCE_PREFIX):
        return ""
    from gpu_tailor.gpumodel.inventory import from_node

    sold = any(o.allocatable > 0 for n in cluster.nodes for o in from_node(n).offerings
               if str(o.resource) == demand.resource)
    if sold:
        return ""
    return (f"no node sells {demand.resource} now (no MIG pool is cut that way, or its nodes are being re-cut): "
            "`gpu-tailor capacity` suggests a nvidia.com/mig.config layout that would place it")


# ----- for people -----
def _either(gpus: list[int]) -> str:
    """``[2, 3]`` -> ``2 or 3``, ``[1, 2, 3]`` -> ``1, 2 or 3``."""
    *head, last = map(str, gpus)
    return f"{', '.join(head)} or {last}" if head else last


def _gpus(v: NodeVerdict) -> str:
    if v.gpus is None:
        return "-"
    if v.maybe:  # the device plugin picks among GPUs that rank alike: say the set, not one
        if len(v.gpus) == 1:
            said = "GPU " + _either(v.maybe)
        elif v.whole:
            said = f"{len(v.gpus)} of GPUs {','.join(map(str, v.maybe))}"
        else:
            said = f"{len(v.gpus)} replicas on GPUs {','.join(map(str, v.maybe))}"
        return said + " (the device plugin picks)" + (f" ({v.nvlink})" if v.nvlink else "")
    return "GPU " + ",".join(map(str, v.gpus)) + (f" ({v.nvlink})" if v.nvlink else "")


def table(e: Explanation) -> str:
    a = e.admission
    lines = [f"{e.subject}, read from {e.source}", ""]
    if not a.called:
        lines.append(f"Admission: the gpu-tailor webhook is not called ({a.message}); the pod is stored as written")
    elif not a.allowed:
        lines.append(f"Admission: DENIED by the gpu-tailor webhook (HTTP {a.code}): {a.message}")
    else:
        lines.append("Admission: allowed by the gpu-tailor webhook" + (", rewritten" if a.outcome == "mutated" else
                                                                      ", unchanged"))
    lines += [f"  warning: {w}" for w in a.warnings]
    if a.diff:
        lines += ["", a.diff.rstrip("\n")]
    if not a.allowed:
        lines += [f"note: {n}" for n in e.notes]
        return "\n".join(lines) + "\n"
    lines += ["", f"Scheduling by {e.scheduler}: ask {e.ask}"]
    if e.chosen:
        lines.append(f"  would bind to {e.chosen}" + (f", {_gpus(next(v for v in e.nodes if v.node == e.chosen))}"
                                                      if e.gpus is not None else ""))
    else:
        lines.append(f"  stays Pending: {e.pending}")
    rows = [("NODE", "FITS", "SCORE", "GPUS / WHY NOT")]
    for v in e.nodes:
        detail = f" ({v.detail})" if v.detail else ""
        if v.fits:
            rows.append((v.node, "yes", str(v.score) if v.score is not None else "-", _gpus(v) + detail))
        else:
            who = "kube-scheduler" if v.by == "kube-scheduler" else "extender"
            rows.append((v.node, "no", "-", f"{who}: {'; '.join(v.reasons)}{detail}"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines.append("")
    lines += ["  ".join(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)) + "  " + r[3] for r in rows]
    if e.notes:
        lines.append("")
        lines += [f"note: {n}" for n in e.notes]
    return "\n".join(lines) + "\n"
