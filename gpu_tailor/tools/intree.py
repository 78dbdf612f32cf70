"""What kube-scheduler checks itself before it asks the extender (v1.28 in-tree filters), so that
``explain`` can say why a node never reached the extender: the node is cordoned, a taint the pod does
not tolerate, a nodeSelector or required node affinity it fails, or too little of a resource
(NodeResourcesFit counts cpu, memory, pods and the NVIDIA resources: ``ignoredByScheduler: false``).

The reasons read as kube-scheduler writes them in a FailedScheduling event. Only these plugins are
modelled; pod (anti-)affinity, topology spread, ports and volumes are not.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from gpu_tailor.gpumodel.ask import from_pod
from gpu_tailor.gpumodel.quantity import parse_quantity
from gpu_tailor.gpumodel.schedule import demand_of

Obj = dict[str, Any]

# what the node lifecycle controller taints a node with and the API server's default tolerations cover
# (DefaultTolerationSeconds adds them to every pod), so they are tolerated here as they would be
DEFAULT_TOLERATED = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def _tolerates(tolerations: list[Obj], taint: Obj) -> bool:
    for t in tolerations:
        effect = t.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        key, op = t.get("key") or "", t.get("operator") or "Equal"
        if key and key != taint.get("key"):
            continue
        if not key and op != "Exists":
            continue
        if op == "Exists" or (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _expression(labels: dict[str, str], expr: Obj) -> bool:
    key, op, values = expr.get("key", ""), expr.get("operator", ""), list(expr.get("values") or [])
    have = labels.get(key)
    if op == "In":
        return have is not None and have in values
    if op == "NotIn":
        return have is None or have not in values
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in ("Gt", "Lt") and have is not None and values:
        try:
            a, b = int(have), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def _affinity_ok(pod: Obj, node: Obj) -> bool:
    spec = pod.get("spec") or {}
    labels = dict((node.get("metadata") or {}).get("labels") or {})
    for k, v in (spec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms")
    if not terms:
        return True
    name = (node.get("metadata") or {}).get("name", "")
    for term in terms:  # terms are ORed, the expressions of one term ANDed
        exprs = term.get("matchExpressions") or []
        fields = term.get("matchFields") or []
        if not exprs and not fields:
            continue
        if all(_expression(labels, e) for e in exprs) and all(
                _expression({"metadata.name": name}, f) for f in fields):
            return True
    return False


def _quantity(raw: Any) -> Fraction:
    try:
        return parse_quantity(str(raw))
    except ValueError:
        return Fraction(0)


def requests(pod: Obj) -> dict[str, Fraction]:
    """What NodeResourcesFit counts for a pod: cpu (cores), memory (bytes), the NVIDIA resources."""
    demand = demand_of(pod)
    out = {"cpu": Fraction(demand.cpu_milli, 1000), "memory": Fraction(demand.memory_mib * 2**20)}
    out.update({r: Fraction(n) for r, n in from_pod(pod).effective_native.items() if n > 0})
    return out


def _active(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def reasons(pod: Obj, node: Obj, on_node: list[Obj]) -> list[str]:
    """Why kube-scheduler's own filters turn the node away (empty: it passes them), as the event says.
    kube-scheduler stops at the first plugin that fails a node (NodeUnschedulable, TaintToleration,
    NodeAffinity, NodeResourcesFit, in that order); NodeResourcesFit names every resource short."""
    spec = node.get("spec") or {}
    out: list[str] = []
    if spec.get("unschedulable"):
        tolerations = (pod.get("spec") or {}).get("tolerations") or []
        if not _tolerates(tolerations, {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}):
            return ["node(s) were unschedulable"]
    tolerations = list((pod.get("spec") or {}).get("tolerations") or [])
    for taint in spec.get("taints") or []:
        if taint.get("effect") not in ("NoSchedule", "NoExecute") or taint.get("key") in DEFAULT_TOLERATED:
            continue
        if not _tolerates(tolerations, taint):
            value = f": {taint['value']}" if taint.get("value") else ""
            return [f"node(s) had untolerated taint {{{taint.get('key')}{value}}}"]
    if not _affinity_ok(pod, node):
        return ["node(s) didn't match Pod's node affinity/selector"]
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    wanted = requests(pod)
    used: dict[str, Fraction] = {}
    for p in on_node:
        for k, v in requests(p).items():
            used[k] = used.get(k, Fraction(0)) + v
    if len(on_node) + 1 > _quantity(allocatable.get("pods", "110")):
        out.append("Too many pods")
    for resource, amount in wanted.items():
        if amount and amount > _quantity(allocatable.get(resource, "0")) - used.get(resource, Fraction(0)):
            out.append(f"Insufficient {resource}")
    return out


def _amount(resource: str, value: Fraction) -> str:
    if resource == "memory":
        return f"{float(value) / 2**30:.3g}Gi"
    return f"{float(value):g}"


def shortfalls(pod: Obj, node: Obj, on_node: list[Obj]) -> list[str]:
    """For people, beside ``Insufficient X``: how much was asked and how much is free, of each resource short."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    used: dict[str, Fraction] = {}
    for p in on_node:
        for k, v in requests(p).items():
            used[k] = used.get(k, Fraction(0)) + v
    out = []
    for resource, amount in requests(pod).items():
        total = _quantity(allocatable.get(resource, "0"))
        free = total - used.get(resource, Fraction(0))
        if amount and amount > free:
            out.append(f"{resource}: {_amount(resource, amount)} asked, {_amount(resource, max(free, Fraction(0)))} "
                       f"of {_amount(resource, total)} free")
    return out


def pods_by_node(pods: list[Obj]) -> dict[str, list[Obj]]:
    """The pods that count on each node: bound and not finished."""
    out: dict[str, list[Obj]] = {}
    for p in pods:
        node = (p.get("spec") or {}).get("nodeName")
        if node and _active(p):
            out.setdefault(str(node), []).append(p)
    return out
