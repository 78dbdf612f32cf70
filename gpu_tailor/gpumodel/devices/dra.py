"""GPUs sold through Dynamic Resource Allocation: how a portable ask is written as a ResourceClaim for NVIDIA's DRA
driver (``gpu.nvidia.com``), and which device the scheduler's allocator would give it now.

This backing is not a ``Device`` of ``base``: a DRA pool sells nothing through ``status.allocatable`` and
kube-scheduler's DynamicResources plugin, not the device plugin, picks the device. What gpu-tailor decides is the
claim. A pod's portable ask becomes one ResourceClaimTemplate (the pod references it in ``spec.resourceClaims``, and
each GPU container names its request in ``resources.claims``); each container's request is a ``firstAvailable``
list of alternatives, *rungs*, smallest first, as choosing on device-plugin pools orders offerings: the least share
of a GPU taken, then the least memory left over. The allocator tries the rungs in order on each node, so on every
node the pod gets the smallest device there that holds it, and the scheduler's DynamicResources score (and
gpu-tailor's extender) prefer nodes where an earlier rung fits. What each rung selects, and its three kinds, is
``devices/dra_rungs.py``'s.

Sources: kubernetes-sigs/dra-driver-nvidia-gpu (DeviceClasses in its Helm chart, ``GpuConfig`` in
``api/nvidia.com/resource/v1beta1``), ``resource.k8s.io/v1`` types (``firstAvailable`` at most 8 alternatives,
``DeviceSubRequest.capacity``); ``../shared/docs/dra-facts.md`` in this project's workspace.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from gpu_tailor.gpumodel.ask import ContainerAsk, Isolation, PodAsk, Topology
from gpu_tailor.gpumodel.devices.dra_rungs import GPU_CLASS, MIG_CLASS, Rung, RungKind, no_rung, rungs
from gpu_tailor.gpumodel.dra import DRIVER, DraDevice, DraInventory
from gpu_tailor.gpumodel.dra_state import DraState
from gpu_tailor.gpumodel.dra_usage import Usage, carvable
from gpu_tailor.gpumodel.fleet import Shape

CLAIM = "gpu-tailor"  # the pod's ``spec.resourceClaims`` entry
TEMPLATE_PREFIX = "gpu-tailor-"
SHARING_API = "resource.nvidia.com/v1beta1"


@dataclass(frozen=True, slots=True)
class Pick:
    """The devices the allocator would give a container now: its rung (position in the list) and the devices, the
    first one first."""

    rung: Rung
    position: int
    device: DraDevice
    devices: tuple[DraDevice, ...]

    @property
    def node_pool(self) -> str:
        return self.device.pool


@dataclass(frozen=True, slots=True)
class DraChoice:
    """A portable ask written for DRA: the ResourceClaimTemplate, each container's request, and what it gets now."""

    template: dict[str, Any]  # a ResourceClaimTemplate without its namespace
    requests: dict[str, str]  # container key ("init:" + name for init containers) -> request name
    rungs: dict[str, tuple[Rung, ...]]
    picks: dict[str, Pick | None]
    consumed: Fraction
    spare: int

    @property
    def name(self) -> str:
        return str(self.template["metadata"]["name"])

    @property
    def free_now(self) -> bool:
        return all(p is not None for p in self.picks.values())

    @property
    def backing(self) -> str:
        """The ``gpu-tailor.io/backing`` value: ``dra`` and the first container's best rung now."""
        first = next(iter(self.picks.values()), None)
        rung = first.rung if first is not None else next(iter(self.rungs.values()))[0]
        return f"dra:{rung.name}"


@dataclass(frozen=True, slots=True)
class DraRefusal:
    message: str


def container_key(container: ContainerAsk) -> str:
    return ("init:" if container.init else "") + container.name


Ladders = dict[str, tuple[Rung, ...]]  # request-owning container key -> its rungs, smallest first


def ladders_for(ask: PodAsk, isolation: Isolation, inv: DraInventory,
                classes: tuple[str, ...] = (GPU_CLASS, MIG_CLASS)) -> tuple[dict[str, str], Ladders] | DraRefusal:
    """Each portable container's request name, and the rungs of each request, or why no DRA device can serve.

    One request per app container and sidecar; a plain init container (it runs before the app containers, never
    beside them) uses the request of an app container whose ask holds its own, else one of its own."""
    containers = [c for c in ask.gpu_containers if c.virtual]
    if not inv.pools:
        return DraRefusal("no node that takes pods publishes GPUs through DRA (no ResourceSlices of gpu.nvidia.com)")
    if any(c.native for c in ask.gpu_containers) or any(ask.effective_native.values()):
        return DraRefusal("the pod also asks for device-plugin resources (nvidia.com/*), which DRA pools do not sell")
    owners = [c for c in containers if not c.init or c.sidecar]
    requests: dict[str, str] = {}
    ladders: Ladders = {}
    for c in [*owners, *(c for c in containers if c not in owners)]:
        host = next((o for o in owners if not o.init and o.milli >= c.milli and o.memory_bytes >= c.memory_bytes
                     and o.whole_gpus >= c.whole_gpus), None) if c.init and not c.sidecar else None
        if host is not None:
            requests[container_key(c)] = requests[container_key(host)]
            continue
        if c.whole_gpus > 1 and ask.topology is Topology.NVLINK:
            return DraRefusal(f"container {c.name}: {c.whole_gpus} GPUs joined by NVLink, but NVIDIA's DRA driver "
                              "publishes no NVLink topology to select them by")
        found = rungs(c, isolation, ask.products, inv, classes)
        if not found:
            return DraRefusal(f"container {c.name}: {no_rung(c, isolation, ask.products, inv, classes)}")
        key = container_key(c)
        requests[key] = f"gpu-{len(ladders)}"
        ladders[key] = tuple(found)
    return requests, ladders


def choose(ask: PodAsk, isolation: Isolation, inv: DraInventory, usage: Usage,
           classes: Iterable[str] = (GPU_CLASS, MIG_CLASS),
           nodes: AbstractSet[str] | None = None) -> DraChoice | DraRefusal:
    """The claim that meets every portable container of ``ask`` on the cluster's DRA pools, or why none can.

    What the claim gets now is what the allocator would give on the best node (``claim_preference``): one claim's
    devices are all on the pod's node. ``nodes``: the nodes that take pods (not cordoned), when known; other nodes'
    pools are left out."""
    if nodes is not None:
        inv = DraInventory({n: p for n, p in inv.pools.items() if p.node in nodes}, inv.problems)
    planned = ladders_for(ask, isolation, inv, tuple(classes))
    if isinstance(planned, DraRefusal):
        return planned
    requests, ladders = planned
    best: tuple[tuple[int, Fraction, int, int], str, dict[str, Pick | None]] | None = None
    for node in sorted(inv.nodes()):
        picks = node_picks(ladders, inv, usage, node)
        if picks is not None:
            pref = _preference(picks, on_node(inv, node), usage)
            if best is None or (pref, node) < best[:2]:
                best = (pref, node, picks)
    picks = best[2] if best is not None else dict.fromkeys(ladders)
    template = claim_template({k: requests[k] for k in ladders}, ladders, isolation)
    chosen = [p.rung if p is not None else ladders[k][0] for k, p in picks.items()]
    return DraChoice(template, requests, ladders, picks, sum((r.consumed for r in chosen), Fraction(0)),
                     sum(r.spare for r in chosen))


def _picks(ladders: dict[str, tuple[Rung, ...]], inv: DraInventory, usage: Usage) -> dict[str, Pick | None]:
    """For each container, the earliest rung with a device free now in some pool, and the device the allocator
    would take there (the first free one the pool publishes), in the pool with the fewest such devices free (the
    fullest: what the extender prefers). Containers are served in turn from what the earlier ones left."""
    left = usage.scratch()
    out: dict[str, Pick | None] = {}
    for key, ladder in ladders.items():
        out[key] = None
        for position, rung in enumerate(ladder):
            best: tuple[int, str, list[DraDevice]] | None = None
            for pool in inv.pools.values():
                free = [d for d in pool.devices.values() if rung.matches(d) and (
                    left.memory_left(d) >= rung.request_bytes if rung.kind is RungKind.SHARED else left.free(d))]
                if len(free) >= rung.count and (best is None or (len(free), pool.name) < best[:2]):
                    best = (len(free), pool.name, free)
            if best is not None:
                taken: list[DraDevice] = []
                for d in best[2]:  # one by one, as the allocator does: partitions of one GPU share its counters
                    if len(taken) == rung.count:
                        break
                    if rung.kind is RungKind.SHARED or left.free(d):
                        _allocate(left, rung, d)
                        taken.append(d)
                if len(taken) < rung.count:
                    continue
                out[key] = Pick(rung, position, taken[0], tuple(taken))
                break
    return out


def _allocate(usage: Usage, rung: Rung, device: DraDevice) -> None:
    """Count ``device`` allocated to a request of ``rung``: its memory share where the rung shares, else all of it."""
    if rung.kind is RungKind.SHARED:
        usage.share(device, rung.request_bytes)
    else:
        usage.take(device)


def allocate(usage: Usage, pick: Pick) -> None:
    """Count what ``pick`` would be allocated in ``usage``, as the allocator's allocation of it will."""
    for device in pick.devices:
        _allocate(usage, pick.rung, device)


def fleet_shape(ladders: Ladders, cpu_milli: int, memory_mib: int) -> tuple[Shape, bool] | None:
    """A claim as a placement fleet's shape, where one holds it whatever node it lands on, and whether it is a share of
    a shared device: one request whose every rung takes the same number of whole GPUs, or the same share of a shared
    GPU (its memory in thousandths of the device's, rounded down as ``dra_usage.gpu_column`` rounds what is left, so
    that a device the claim fills exactly is seen to hold it); None for anything else (MIG rungs, several requests,
    rungs of several kinds), which is ranked by ``claim_preference`` instead."""
    if len(ladders) != 1:
        return None
    ladder = next(iter(ladders.values()))
    kinds = {r.kind for r in ladder}
    if kinds == {RungKind.GPU} and len({r.count for r in ladder}) == 1:
        return Shape(cpu_milli, memory_mib, ladder[0].count, 1000), False
    if kinds == {RungKind.SHARED} and len({r.consumed for r in ladder}) == 1:
        consumed = ladder[0].consumed
        return Shape(cpu_milli, memory_mib, 1, max(1, consumed.numerator * 1000 // consumed.denominator)), True
    return None


def claim_template(requests: dict[str, str], ladders: dict[str, tuple[Rung, ...]],
                   isolation: Isolation) -> dict[str, Any]:
    """The ResourceClaimTemplate (without namespace) for these requests; its name is a digest of its spec, so the
    same ask on the same pools names the same template."""
    strategy = "MPS" if isolation is Isolation.MPS else "TimeSlicing"
    devices: dict[str, Any] = {"requests": [{"name": requests[key], "firstAvailable": [r.subrequest() for r in ladder]}
                                            for key, ladder in ladders.items()]}
    shared = [f"{requests[key]}/{r.name}" for key, ladder in ladders.items() for r in ladder
              if r.kind is RungKind.SHARED]
    if shared:
        devices["config"] = [{"requests": shared, "opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": SHARING_API, "kind": "GpuConfig", "sharing": {"strategy": strategy}}}}]
    spec = {"spec": {"devices": devices}}
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": TEMPLATE_PREFIX + digest,
                         "labels": {"app.kubernetes.io/managed-by": "gpu-tailor"}},
            "spec": spec}



def on_node(inv: DraInventory, node: str) -> DraInventory:
    """The pools of one node."""
    return DraInventory({p.name: p for p in inv.on_node(node)})


def node_picks(ladders: dict[str, tuple[Rung, ...]], inv: DraInventory, usage: Usage,
               node: str) -> dict[str, Pick | None] | None:
    """What the allocator would give each container on ``node`` now; None where it cannot allocate the claim."""
    picks = _picks(ladders, on_node(inv, node), usage)
    return picks if picks and all(p is not None for p in picks.values()) else None


def claim_preference(ladders: dict[str, tuple[Rung, ...]], inv: DraInventory, usage: Usage,
                     node: str) -> tuple[int, Fraction, int, int] | None:
    """How much a claim pod of these ladders should like ``node`` (lower is better), as choosing orders offerings:
    the earliest rungs the allocator would take there (the smallest devices), then the share of a GPU taken, then, on
    partitionable GPUs (DynamicMIG), how much the carve takes of the larger partitions still possible there (a 1g
    partition where a 3g or 4g can still be carved after it beats one where none can), then the devices the node's
    pools keep free after it (fewer first: fill a node before opening another, so whole GPUs and whole nodes stay
    whole). None where the claim cannot be allocated there now."""
    picks = node_picks(ladders, inv, usage, node)
    return _preference(picks, on_node(inv, node), usage) if picks is not None else None


def _preference(picks: dict[str, Pick | None], pools: DraInventory, usage: Usage) -> tuple[int, Fraction, int, int]:
    """``claim_preference`` of picks that all found a device on the node of ``pools``: the rungs' positions, the share
    of a GPU taken, what the carve takes of the larger partitions still possible (``carvable``; 0 where no device is
    partitionable), and the devices left free."""
    chosen = [p for p in picks.values() if p is not None]
    after = usage.scratch()
    for pick in chosen:
        allocate(after, pick)
    loss = sum(carvable(p, usage) - carvable(p, after) for p in pools.pools.values())
    free = sum(1 for p in pools.pools.values() for d in p.devices.values() if after.free(d))
    return (sum(p.position for p in chosen), sum((p.rung.consumed for p in chosen), Fraction(0)), loss, free)


def native_preference(dra: DraState, node: str, units: int) -> int | None:
    """For ``units`` whole GPUs of an extended resource a DeviceClass serves (KEP-5004) on ``node``: the GPUs its
    pools keep free after them (fewer first: best fit), or None when fewer than ``units`` are free."""
    free = dra.free_gpus(node)
    return free - units if free >= units else None
