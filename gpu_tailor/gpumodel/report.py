"""A node agent's report: what the node really did with its GPUs (``NodeGPUReport``, ``gpu-tailor.io/v1alpha1``).

Which physical GPU a pod got is the device plugin's call, at container start; the extender can only
predict it (``occupancy``). The agent on each GPU node (``gpu-tailor agent``) reads the answer from the
kubelet's PodResources API and the driver (NVML) and publishes it as one cluster-scoped object per node,
named after the node:

    spec:
      node: gpu-node-7
      observedAt: "2026-11-26T12:00:00Z"
      driver: "550.54.15"              # "" without NVML
      gpus:                            # NVML's view; empty without NVML (and no index device ids)
      - {index: 0, uuid: GPU-..., healthy: true, peers: [1, 2, 3]}
      pods:                            # per container, the GPU of each device it holds (a GPU repeats
      - {namespace: team-a, name: p, container: main, resource: nvidia.com/gpu, gpus: [2, 2]}  # for replicas)
      unmapped: ["..."]                # device ids no GPU could be found for

This module is the format both sides share: the agent builds it, the extender reads it; reading never
raises on a malformed object (a hand-edited one, or another version's): it says what is wrong.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

GROUP, VERSION, KIND, PLURAL = "gpu-tailor.io", "v1alpha1", "NodeGPUReport", "nodegpureports"
API_VERSION = f"{GROUP}/{VERSION}"


@dataclass(frozen=True, slots=True)
class ReportedGpu:
    index: int
    uuid: str = ""
    healthy: bool = True
    peers: tuple[int, ...] = ()  # NVLink peers (through NVSwitch too)


@dataclass(frozen=True, slots=True)
class ContainerGpus:
    namespace: str
    name: str  # the pod's
    container: str
    resource: str
    gpus: tuple[int, ...]  # one per device held

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class NodeReport:
    node: str
    observed_at: str = field(default="", compare=False)  # when the agent last looked (not compared)
    driver: str = ""
    gpus: tuple[ReportedGpu, ...] = ()
    containers: tuple[ContainerGpus, ...] = ()
    unmapped: tuple[str, ...] = ()
    problems: tuple[str, ...] = field(default=(), compare=False)  # what could not be read

    def pod_gpus(self) -> dict[str, tuple[int, ...]]:
        """Per pod (namespace/name), the GPU of every device its containers hold, sorted."""
        out: dict[str, list[int]] = {}
        for c in self.containers:
            out.setdefault(c.key, []).extend(c.gpus)
        return {k: tuple(sorted(v)) for k, v in out.items()}

    def unhealthy(self) -> frozenset[int] | None:
        """The GPUs not sold; None when the report lists no GPUs (it cannot tell)."""
        return frozenset(g.index for g in self.gpus if not g.healthy) if self.gpus else None

    def peers(self, count: int) -> tuple[tuple[int, ...], ...] | None:
        """NVLink peers of GPUs 0..count-1; None unless the report has exactly those GPUs."""
        by_index = {g.index: g for g in self.gpus}
        if sorted(by_index) != list(range(count)):
            return None
        return tuple(by_index[i].peers for i in range(count))

    def spec(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "observedAt": self.observed_at,
            "driver": self.driver,
            "gpus": [{"index": g.index, "uuid": g.uuid, "healthy": g.healthy, "peers": list(g.peers)}
                     for g in self.gpus],
            "pods": [{"namespace": c.namespace, "name": c.name, "container": c.container, "resource": c.resource,
                      "gpus": list(c.gpus)} for c in self.containers],
            "unmapped": list(self.unmapped),
        }

    def object(self) -> dict[str, Any]:
        return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": self.node}, "spec": self.spec()}


def parse_time(raw: object) -> dt.datetime | None:
    """A time as the API writes one (RFC 3339, ``2026-11-26T12:00:00Z``: ``observedAt``, ``creationTimestamp``),
    in UTC where it names no zone; None when absent or unreadable."""
    try:
        when = dt.datetime.fromisoformat(str(raw).replace("Z", "+00:00")) if raw else None
    except ValueError:
        return None
    return when.replace(tzinfo=dt.UTC) if when is not None and when.tzinfo is None else when


def _ints(raw: Any, where: str, problems: list[str]) -> tuple[int, ...]:
    if not isinstance(raw, list) or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in raw):
        problems.append(f"{where}: expected a list of GPU indices, got {raw!r}")
        return ()
    return tuple(raw)


def parse(obj: Mapping[str, Any]) -> NodeReport:
    """A ``NodeGPUReport`` object as read from the API. Parts that cannot be read are left out and said in
    ``problems``; a report whose ``spec.node`` is not its own name names nothing (the agent's webhook
    check keeps them equal, ``webhook.reports``)."""
    problems: list[str] = []
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    name = str((meta or {}).get("name", ""))
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return NodeReport(name, problems=("spec: missing",))
    if spec.get("node") != name:
        return NodeReport(name, problems=(f"spec.node {spec.get('node')!r} is not the report's name {name!r}",))
    def items(key: str) -> list[Any]:
        raw = spec.get(key) or []
        if isinstance(raw, list):
            return raw
        problems.append(f"spec.{key}: expected a list, got {type(raw).__name__}")
        return []

    gpus: list[ReportedGpu] = []
    for i, g in enumerate(items("gpus")):
        index = g.get("index") if isinstance(g, Mapping) else None
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            problems.append(f"gpus[{i}]: no index")
            continue
        peers = _ints(g.get("peers", []), f"gpus[{i}].peers", problems)
        gpus.append(ReportedGpu(index, str(g.get("uuid", "")), g.get("healthy") is not False, peers))
    containers: list[ContainerGpus] = []
    for i, c in enumerate(items("pods")):
        if not isinstance(c, Mapping) or not c.get("namespace") or not c.get("name"):
            problems.append(f"pods[{i}]: needs namespace and name")
            continue
        held = _ints(c.get("gpus"), f"pods[{i}].gpus", problems)
        if held:
            containers.append(ContainerGpus(str(c["namespace"]), str(c["name"]), str(c.get("container", "")),
                                            str(c.get("resource", "")), held))
    unmapped = tuple(str(u) for u in items("unmapped"))
    return NodeReport(name, str(spec.get("observedAt", "")), str(spec.get("driver", "")), tuple(gpus),
                      tuple(containers), unmapped, tuple(problems))
