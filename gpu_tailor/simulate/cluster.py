"""A cluster dump (``kubectl get nodes,pods,namespaces -A -o json``, as ``explain`` reads one) as the simulator's
nodes and workload, for ``gpu-tailor simulate --cluster-file DUMP --scheduler ...``.

Nodes: each schedulable node the device plugin serves whole GPUs or time-sliced/MPS replicas on, at its allocatable
CPU and memory, empty; nodes without GPUs too (CPU-only pods land there). Left out, each with the reason: cordoned
nodes, GPU nodes that are not healthy (degraded, initializing), MIG pools and GPU nodes that sell nothing through
the device plugin (DRA pools): ``simulate.kube`` models whole GPUs and replicas only.

Workload: the dump's pods (not finished ones) as templates, each with its CPU and memory requests and its GPU ask:
the portable ask gpu-tailor recorded at admission (``gpu-tailor.io/ask``) or still carries, else its native ask
(whole GPUs; replicas as the share of a GPU they are on the pool the pod is bound to). Pods asking for MIG slices,
for GPU memory alone, or for replicas of no known pool are left out, counted by reason.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.ask import PodAsk, from_canonical, from_pod
from gpu_tailor.gpumodel.devices.base import BackingKind, HealthState
from gpu_tailor.gpumodel.fleet import MILLI, Shape
from gpu_tailor.gpumodel.inventory import NodeInventory, from_node
from gpu_tailor.gpumodel.resources import ResourceKind, parse_resource
from gpu_tailor.gpumodel.schedule import demand_of
from gpu_tailor.kube.clusterfile import ClusterFileError, parse_cluster
from gpu_tailor.simulate.kube import SimNode
from gpu_tailor.simulate.trace import TraceError, TraceNode, TracePod


@dataclass
class Dumped:
    nodes: list[SimNode]
    pods: list[TracePod]  # the workload's templates, named namespace/name
    left_out_nodes: dict[str, str] = field(default_factory=dict)  # node -> why
    left_out_pods: Counter[str] = field(default_factory=Counter)  # why -> how many

    def notes(self, pods: bool = True) -> list[str]:
        """What was left out, for people; ``pods``: the workload is drawn from the dump's pods."""
        out = [f"node {n} left out: {why}" for n, why in sorted(self.left_out_nodes.items())]
        if pods:
            out += [f"{k} pod(s) left out of the workload: {why}" for why, k in sorted(self.left_out_pods.items())]
        return out


def sim_node(inv: NodeInventory) -> SimNode | str:
    """The node as the simulator takes it, or why it is left out."""
    if inv.unschedulable:
        return "cordoned"
    base = TraceNode(inv.name, inv.cpu_milli, inv.memory_bytes // 2**20, 0, inv.model)
    if not inv.has_gpus:
        return SimNode(base)
    if inv.health.state is not HealthState.HEALTHY:
        return f"{inv.health.state.value}" + (f" ({inv.health.reason})" if inv.health.reason else "")
    backings = {o.backing for o in inv.offerings if o.allocatable > 0}
    if BackingKind.MIG in backings:
        return "a MIG pool (simulate --scheduler models whole GPUs and time-sliced or MPS replicas only)"
    if not backings:
        return "sells no GPU through the device plugin (a DRA pool, or not ready)"
    gpus = TraceNode(inv.name, inv.cpu_milli, inv.memory_bytes // 2**20, inv.usable_gpus, inv.model)
    if BackingKind.SHARED in backings:
        return SimNode(gpus, max(o.replicas for o in inv.offerings if o.backing is BackingKind.SHARED),
                       inv.replica_policy)
    return SimNode(gpus)


def _portable(pod: dict[str, Any]) -> PodAsk | None:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    recorded = annotations.get(labels.ANN_ASK)
    ask = from_canonical(str(recorded)) if recorded is not None else None
    if ask is None:
        ask = from_pod(pod)
    return ask if ask.virtual and not ask.errors else None


def pod_shape(pod: dict[str, Any], nodes: dict[str, SimNode]) -> Shape | str:
    """The pod's ask as the simulator's shape, or why it cannot be replayed."""
    demand = demand_of(pod)
    if demand.error:
        return demand.error
    cpu, mem = demand.cpu_milli, demand.memory_mib
    ask = _portable(pod)
    if ask is not None:
        milli = ask.effective_milli
        if not milli:
            return "asks for GPU memory alone (the simulator's workload is in shares of a GPU's compute)"
        return Shape(cpu, mem, 1, milli) if milli < MILLI else Shape(cpu, mem, -(-milli // MILLI), MILLI)
    if not demand.gpu:
        return Shape(cpu, mem)
    resource = parse_resource(demand.resource)
    if resource is None or resource.kind is ResourceKind.MIG:
        return "asks for MIG slices"
    on = nodes.get(str((pod.get("spec") or {}).get("nodeName") or ""))
    if resource.kind is ResourceKind.GPU_SHARED or (on is not None and on.shared):
        if on is None or not on.shared:
            return "asks for replicas and is not bound to a time-sliced or MPS node the simulation holds"
        milli = min(demand.units * MILLI // on.replicas, MILLI)
        return Shape(cpu, mem, 1, milli)
    return Shape(cpu, mem, demand.units, MILLI)


def from_dump(path: str) -> Dumped:
    try:
        raw_nodes, raw_pods = parse_cluster(Path(path).read_text(), path)
    except OSError as exc:
        raise TraceError(f"--cluster-file {path}: {exc.strerror or exc}") from exc
    except ClusterFileError as exc:
        raise TraceError(f"--cluster-file {exc}") from exc
    out = Dumped([], [])
    for obj in raw_nodes:
        node = sim_node(from_node(obj))
        name = str((obj.get("metadata") or {}).get("name", ""))
        if isinstance(node, str):
            out.left_out_nodes[name] = node
        else:
            out.nodes.append(node)
    if not any(n.node.gpus for n in out.nodes):
        raise TraceError(f"--cluster-file {path}: no node to simulate on that sells whole GPUs or replicas"
                         + "".join(f"; {note}" for note in out.notes()))
    by_name = {n.name: n for n in out.nodes}
    for pod in raw_pods:
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        meta = pod.get("metadata") or {}
        shape = pod_shape(pod, by_name)
        if isinstance(shape, str):
            out.left_out_pods[shape] += 1
        else:
            out.pods.append(TracePod(f"{meta.get('namespace', '')}/{meta.get('name', '')}", shape))
    return out
