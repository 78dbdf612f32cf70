"""What must hold after every fault (issue 19), checked on what the API server stores, written once:

- every pod of the test ends bound, or Pending with a reason (a FailedScheduling event, or a
  PodScheduled=False condition with a message);
- no GPU is handed out twice: on each node the ``gpu-tailor.io/gpus`` annotations of its bound pods
  never hold a GPU beyond what its backing allows (a whole GPU is one pod's; a time-sliced or MPS GPU
  has ``nvidia.com/gpu.replicas`` replicas; a MIG GPU has its layout's instances of each profile and 7
  compute slices in all), and name no GPU the node does not have;
- no node is over its allocatable for any resource: the bound pods' effective requests (the larger of
  the containers' sum and the largest init container, plus overhead; one ``pods`` each) per node are
  at most the Node's ``status.allocatable``;
- both services answer ``/readyz`` with 200, and the extender has written the GPUs of every pod it
  scored on the pod (kube-scheduler binds; the extender records after the bind).

The model of the backings here is deliberately independent of ``gpu_tailor.gpumodel``: it is read from
the node's GPU Feature Discovery labels, as a person would check it.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from decimal import Decimal
from functools import partial
from typing import Any

from tests.e2e.kube import Kube, Obj, api_path, wait_for
from tests.e2e.services import Service, Stack, records_pending

ANN_GPUS = "gpu-tailor.io/gpus"
_SUFFIX = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
           "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9, "T": Decimal(10) ** 12,
           "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
           "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40,
           "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+)?(n|u|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_MIG_RESOURCE = re.compile(r"^nvidia\.com/mig-(\d+)g\.[0-9a-z.+]+$")
MIG_SLICES = 7  # compute slices of an A100 or H100, what every MIG profile's ``<n>g`` counts in


def quantity(text: Any) -> Decimal:
    """A Kubernetes quantity (``500m``, ``64Gi``, ``1e3``) as a number."""
    m = _QUANTITY.match(str(text).strip())
    if not m:
        raise ValueError(f"not a quantity: {text!r}")
    value = Decimal(m.group(1) + (m.group(2) or ""))
    return value * _SUFFIX[m.group(3) or ""]


def effective_requests(pod: Obj) -> dict[str, Decimal]:
    """What kube-scheduler counts a pod as taking on its node (requests default to limits in the API)."""
    spec = pod["spec"]

    def requests(c: Obj) -> dict[str, Decimal]:
        res = c.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        return {k: quantity(v) for k, v in merged.items()}

    total: dict[str, Decimal] = defaultdict(Decimal)
    for c in spec.get("containers") or []:
        for k, v in requests(c).items():
            total[k] += v
    for c in spec.get("initContainers") or []:
        for k, v in requests(c).items():
            total[k] = max(total[k], v)
    for k, v in (spec.get("overhead") or {}).items():
        total[k] += quantity(v)
    total["pods"] += 1
    return dict(total)


def bound(pod: Obj) -> str:
    return str(pod["spec"].get("nodeName") or "")


def pending_reason(kube: Kube, pod: Obj) -> str:
    """Why a Pending pod waits, as a person reads it: PodScheduled=False's message, else its last
    FailedScheduling event; "" when nothing says."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("message"):
            return str(cond["message"])
    meta = pod["metadata"]
    events = [e for e in kube.events(meta["namespace"], "Pod", meta["name"]) if e.get("reason") == "FailedScheduling"]
    return str(events[-1].get("message") or "FailedScheduling") if events else ""


def unsettled(kube: Kube, pods: list[Obj]) -> list[str]:
    """The pods that are neither bound nor Pending with a reason."""
    return [p["metadata"]["name"] for p in pods if not bound(p) and not pending_reason(kube, p)]


def wait_settled(stack: Stack, namespace: str, selector: str, expected: int, timeout: float = 120) -> list[Obj]:
    """Until all ``expected`` pods of ``selector`` are bound or Pending with a reason; the pods."""
    def settled() -> list[Obj]:
        pods = stack.kube.list(api_path("pods", namespace), label_selector=selector)
        if len(pods) != expected:
            return []
        waiting = [p for p in pods if not bound(p)]
        return pods if not unsettled(stack.kube, waiting) else []

    out: list[Obj] = wait_for(settled, timeout, f"{expected} pods of {selector} bound or Pending with a reason",
                              interval=0.5, context=stack.context)
    return out


def wait_bound(stack: Stack, namespace: str, selector: str, expected: int, timeout: float = 120,
               records: bool = True) -> list[Obj]:
    """Until ``expected`` pods of ``selector`` are bound, and (``records``) the stack's extender has written their GPUs
    on them; the pods."""
    def all_bound() -> list[Obj]:
        pods = stack.kube.list(api_path("pods", namespace), label_selector=selector)
        return pods if sum(1 for p in pods if bound(p)) >= expected else []

    def progress() -> str:
        pods = stack.kube.list(api_path("pods", namespace), label_selector=selector)
        waiting = [p for p in pods if not bound(p)][:3]
        reasons = [f"{p['metadata']['name']}: {pending_reason(stack.kube, p) or '(no reason)'}" for p in waiting]
        return (f"{sum(1 for p in pods if bound(p))} of {len(pods)} bound; waiting: {reasons}\n"
                f"{stack.context()}")

    out: list[Obj] = wait_for(all_bound, timeout, f"{expected} pods of {selector} bound", interval=0.5,
                              context=progress)
    if records and stack.wait_records():
        out = stack.kube.list(api_path("pods", namespace), label_selector=selector)
    return out


def _gpu_rule(node: Obj, resource: str) -> tuple[str, int]:
    """How a node's GPU may be shared by the pods of ``resource``: ("whole", 1), ("replicas", R) or
    ("mig", per-GPU instances of the profile; 0 when the layout cannot be told from the labels)."""
    labels = node["metadata"].get("labels") or {}
    if m := _MIG_RESOURCE.match(resource):
        profile = resource.removeprefix("nvidia.com/mig-")
        count, gpus = int(labels.get(f"nvidia.com/mig-{profile}.count", 0)), int(labels.get("nvidia.com/gpu.count", 0))
        del m
        return "mig", count // gpus if gpus and count % gpus == 0 else 0
    replicas = int(labels.get("nvidia.com/gpu.replicas", "1") or 1)
    if labels.get("nvidia.com/gpu.sharing-strategy") in ("time-slicing", "mps") and replicas > 1:
        return "replicas", replicas
    return "whole", 1


def gpu_problems(node: Obj, pods: list[Obj]) -> list[str]:
    """Where the bound pods' ``gpu-tailor.io/gpus`` hold a GPU of ``node`` beyond what its backing allows."""
    labels = node["metadata"].get("labels") or {}
    count = int(labels.get("nvidia.com/gpu.count", 0) or 0)
    name = node["metadata"]["name"]
    whole: dict[int, list[str]] = defaultdict(list)
    shared: dict[int, Counter[str]] = defaultdict(Counter)  # GPU -> resource -> units
    sharers: dict[int, list[str]] = defaultdict(list)
    slices: dict[int, int] = defaultdict(int)
    problems: list[str] = []
    for pod in pods:
        raw = (pod["metadata"].get("annotations") or {}).get(ANN_GPUS)
        if raw is None:
            continue
        pname = pod["metadata"]["name"]
        gpus = [int(g) for g in str(raw).split(",") if g.strip()]
        nvidia = [r for r in effective_requests(pod) if r.startswith("nvidia.com/")]
        if len(nvidia) != 1:
            problems.append(f"{name}: {pname} has {ANN_GPUS}={raw} but asks {nvidia}")
            continue
        resource = nvidia[0]
        kind, _ = _gpu_rule(node, resource)
        for g in gpus:
            if not 0 <= g < count:
                problems.append(f"{name}: {pname} holds GPU {g}; the node has {count} (nvidia.com/gpu.count)")
        if kind == "whole":
            if len(set(gpus)) != len(gpus):
                problems.append(f"{name}: {pname} holds one whole GPU twice: {raw}")
            for g in set(gpus):
                whole[g].append(pname)
        else:
            for g in gpus:
                shared[g][resource] += 1
                sharers[g].append(pname)
                if kind == "mig":
                    slices[g] += int(_MIG_RESOURCE.match(resource).group(1))  # type: ignore[union-attr]
    for g, holders in sorted(whole.items()):
        if len(holders) > 1:
            problems.append(f"{name}: whole GPU {g} handed to {len(holders)} pods: {sorted(holders)}")
        if g in shared:
            problems.append(f"{name}: GPU {g} is held whole by {holders} and shared by {dict(shared[g])}")
    for g, units in sorted(shared.items()):
        for resource, n in units.items():
            kind, room = _gpu_rule(node, resource)
            if kind == "replicas" and n > room:
                problems.append(f"{name}: GPU {g} has {room} replicas of {resource}; {n} handed out: "
                                f"{sorted(sharers[g])}")
            if kind == "mig" and room and n > room:
                problems.append(f"{name}: GPU {g} has {room} {resource} instances; {n} handed out: "
                                f"{sorted(sharers[g])}")
        if slices.get(g, 0) > MIG_SLICES:
            problems.append(f"{name}: GPU {g} has {MIG_SLICES} MIG compute slices; {slices[g]} handed out")
    return problems


def allocatable_problems(node: Obj, pods: list[Obj]) -> list[str]:
    """Resources of which the node's bound pods ask more than its ``status.allocatable``."""
    allocatable = {k: quantity(v) for k, v in (node["status"].get("allocatable") or {}).items()}
    used: dict[str, Decimal] = defaultdict(Decimal)
    for pod in pods:
        for k, v in effective_requests(pod).items():
            used[k] += v
    name = node["metadata"]["name"]
    return [f"{name}: {k} {v} requested by {len(pods)} pods > allocatable {allocatable.get(k, Decimal(0))}"
            for k, v in sorted(used.items()) if v > allocatable.get(k, Decimal(0))]


def cluster_problems(kube: Kube) -> list[str]:
    """The GPU and allocatable invariants over every node and every active pod bound to it."""
    nodes = {n["metadata"]["name"]: n for n in kube.list(api_path("nodes"))}
    per_node: dict[str, list[Obj]] = defaultdict(list)
    for pod in kube.list(api_path("pods")):
        if bound(pod) and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            per_node[bound(pod)].append(pod)
    problems: list[str] = []
    for node_name, pods in sorted(per_node.items()):
        node = nodes.get(node_name)
        if node is None:
            problems.append(f"{len(pods)} pods bound to {node_name}, which does not exist")
            continue
        problems += gpu_problems(node, pods)
        problems += allocatable_problems(node, pods)
    return problems


def records_written(extender: Service) -> bool:
    return records_pending(extender) == 0


def wait_ready(service: Service, timeout: float = 60) -> None:
    wait_for(service.ready, timeout, f"{service.name} running and /readyz 200", interval=0.2, context=service.tail)


def assert_sound(stack: Stack, namespace: str, selector: str, expected: int, timeout: float = 120,
                 services: list[Service] | None = None) -> list[Obj]:
    """Every invariant of issue 19 after a fault: the pods settled, no GPU twice, no node over its
    allocatable, the services (the stack's webhook and extender unless told) ready. Returns the pods."""
    pods = wait_settled(stack, namespace, selector, expected, timeout)
    extenders = [s for s in services or [stack.extender] if "extender" in s.name]
    for extender in extenders:
        wait_ready(extender)
        # kube-scheduler bound them: their records are written once it goes quiet, and checked here
        wait_for(partial(records_written, extender), 60, f"{extender.name} to write every record", interval=0.2,
                 context=extender.tail)
    pods = wait_settled(stack, namespace, selector, expected, timeout)
    problems = cluster_problems(stack.kube)
    assert not problems, "\n".join(problems)
    for service in services or [stack.webhook, stack.extender]:
        wait_ready(service)
    return pods
