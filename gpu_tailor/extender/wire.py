"""kube-scheduler's extender requests (``k8s.io/kube-scheduler/extender/v1``), read and checked before any verb
decides: a body kube-scheduler could not have sent is a ``WireError`` (HTTP 400).

Field names are the Go struct names (the types carry no JSON tags): ExtenderArgs ``Pod``, ``Nodes``,
``NodeNames``; ExtenderBindingArgs ``PodName``, ``PodNamespace``, ``PodUID``, ``Node``; ExtenderPreemptionArgs
``Pod``, ``NodeNameToVictims``, ``NodeNameToMetaVictims``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gpu_tailor.gpumodel.schedule import Demand, demand_of


class WireError(ValueError):
    """The body is not what kube-scheduler sends: HTTP 400."""


def pod_of(body: Any) -> dict[str, Any]:
    """The ``Pod`` of ExtenderArgs or ExtenderPreemptionArgs, its fields the extender reads checked for
    their JSON types (kube-scheduler sends pods the API server decoded: a wrong type is a 400)."""
    if not isinstance(body, dict):
        raise WireError("expected a JSON object")
    pod = body.get("Pod")
    if not isinstance(pod, dict) or not isinstance(pod.get("metadata"), dict):
        raise WireError("'Pod' must be a Pod object with metadata")
    why = _pod_problem(pod)
    if why:
        raise WireError(f"Pod.{why}")
    return pod


_QUANTITY = (str, int, float)


def _pod_problem(pod: dict[str, Any]) -> str | None:
    """What in the pod has the wrong JSON type, of the fields demand_of and the cache read (``null``
    counts as absent, as Kubernetes' decoder has it); None when they all have the right one."""
    meta = pod["metadata"]
    for key in ("name", "namespace", "uid"):
        if not isinstance(meta.get(key) or "", str):
            return f"metadata.{key}: expected a string"
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, dict) or not all(isinstance(v, str) for v in annotations.values()):
        return "metadata.annotations: expected an object of strings"
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    if not isinstance(spec, dict) or not isinstance(status, dict):
        return "spec and status: expected objects"
    if not isinstance(spec.get("nodeName") or "", str) or not isinstance(status.get("phase") or "", str):
        return "spec.nodeName and status.phase: expected strings"
    if not _quantities(spec.get("overhead")):
        return "spec.overhead: expected an object of quantities"
    for key in ("containers", "initContainers"):
        containers = spec.get(key) or []
        if not isinstance(containers, list):
            return f"spec.{key}: expected a list"
        for i, c in enumerate(containers):
            res = c.get("resources") or {} if isinstance(c, dict) else None
            if not isinstance(res, dict) or not isinstance(c.get("name") or "", str) \
                    or not isinstance(c.get("restartPolicy") or "", str):
                return f"spec.{key}[{i}]: expected a container with a name and resources"
            if not (_quantities(res.get("requests")) and _quantities(res.get("limits"))):
                return f"spec.{key}[{i}].resources: expected requests and limits of quantities"
    return None


def _quantities(value: Any) -> bool:
    return value is None or (isinstance(value, dict) and all(
        isinstance(v, _QUANTITY) and not isinstance(v, bool) for v in value.values()))


def _node_names(body: dict[str, Any]) -> tuple[list[str], dict[str, dict[str, Any]] | None]:
    """Candidate names, and the node objects when the scheduler sent a full NodeList."""
    names = body.get("NodeNames")
    if isinstance(names, list):
        if not set(map(type, names)) <= {str}:  # a few hundred names: no Python loop over them
            raise WireError("'NodeNames' must be a list of strings")
        return list(names), None
    nodes = body.get("Nodes")
    if isinstance(nodes, dict) and isinstance(nodes.get("items"), list):
        objs = {}
        for n in nodes["items"]:
            meta = n.get("metadata") if isinstance(n, dict) else None
            name = meta.get("name") if isinstance(meta, dict) else None
            if not isinstance(name, str) or not name:
                raise WireError("every node of 'Nodes.items' must be a Node with a name")
            try:  # filter sends the objects back: one nested past what orjson writes (255) cannot be
                orjson.dumps(n)
            except orjson.JSONEncodeError as exc:
                raise WireError(f"node {name!r} cannot be sent back: {exc}") from exc
            objs[name] = n
        return list(objs), objs
    raise WireError("expected 'NodeNames' (nodeCacheCapable) or 'Nodes' with 'items'")


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """ExtenderArgs read once per request: the Pod, the candidates (and their objects when the
    scheduler sent a NodeList) and the pod's demand, which filter, prioritize and the cache share."""

    pod: dict[str, Any]
    names: list[str]
    objs: dict[str, dict[str, Any]] | None
    demand: Demand


def extender_args(body: Any, last: ExtenderArgs | None = None) -> ExtenderArgs:
    """The request read; ``last``: the previous request's, whose demand is reused when the pod is the same in all the
    demand is read from (kube-scheduler asks prioritize right after filter about the pod as its cache holds it: the
    same object, compared in a few microseconds where reading its demand again takes tens)."""
    if isinstance(body, ExtenderArgs):
        return body
    pod = pod_of(body)
    names, objs = _node_names(body)
    if last is not None and _same_demand(pod, last.pod):
        return ExtenderArgs(pod, names, objs, last.demand)
    return ExtenderArgs(pod, names, objs, demand_of(pod))


def _same_demand(pod: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether two pods agree in everything ``demand_of`` reads: namespace, name, annotations and spec."""
    a, b = pod["metadata"], other["metadata"]
    return (a.get("uid") == b.get("uid") and a.get("name") == b.get("name") and a.get("namespace") == b.get("namespace")
            and a.get("annotations") == b.get("annotations") and pod.get("spec") == other.get("spec"))


def victims_of(body: dict[str, Any]) -> dict[str, tuple[list[str], int]]:
    """Victim UIDs and PDB violations per node, from ``NodeNameToMetaVictims`` (nodeCacheCapable: MetaPods
    ``{"UID": ...}``) or else ``NodeNameToVictims`` (whole Pods, the UID in their metadata)."""
    meta, full = body.get("NodeNameToMetaVictims"), body.get("NodeNameToVictims")
    source = meta if meta is not None else full
    if source is None:
        return {}
    if not isinstance(source, dict):
        raise WireError("'NodeNameToMetaVictims' must map node names to victims")
    out: dict[str, tuple[list[str], int]] = {}
    for node, entry in source.items():
        if entry is None:
            out[node] = ([], 0)
            continue
        if not isinstance(entry, dict):
            raise WireError(f"victims of node {node!r} must be an object with 'Pods'")
        pods, pdb = entry.get("Pods") or [], entry.get("NumPDBViolations") or 0
        if not isinstance(pods, list) or isinstance(pdb, bool) or not isinstance(pdb, int):
            raise WireError(f"victims of node {node!r}: 'Pods' must be a list, 'NumPDBViolations' a number")
        uids = []
        for p in pods:
            if meta is None:  # a whole Pod
                pod_meta = p.get("metadata") if isinstance(p, dict) else None
                uid = pod_meta.get("uid") if isinstance(pod_meta, dict) else None
            else:  # a MetaPod
                uid = p.get("UID") if isinstance(p, dict) else None
            if not isinstance(uid, str) or not uid:
                raise WireError(f"a victim on node {node!r} has no UID")
            uids.append(uid)
        out[node] = (uids, pdb)
    return out


@dataclass(frozen=True, slots=True)
class BindArgs:
    """ExtenderBindingArgs."""

    namespace: str
    name: str
    uid: str
    node: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def bind_args(body: Any) -> BindArgs:
    """ExtenderBindingArgs; kube-scheduler always names the pod, its namespace and the node (an empty
    one would be bound to no node at all), and sends the pod's UID as a string."""
    if not isinstance(body, dict) or not all(isinstance(body.get(k), str) and body[k]
                                             for k in ("PodName", "PodNamespace", "Node")) \
            or not isinstance(body.get("PodUID") or "", str):
        raise WireError("expected ExtenderBindingArgs with PodName, PodNamespace, PodUID, Node")
    return BindArgs(body["PodNamespace"], body["PodName"], body.get("PodUID") or "", body["Node"])
