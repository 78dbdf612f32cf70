"""MIG pools on DRA (``gpu-tailor simulate --mig``): the same nodes and arrivals carved on demand (NVIDIA's DynamicMIG,
partitionable devices) or cut in advance into a static layout, placed by gpu-tailor or by kube-scheduler alone.

The nodes are published as NVIDIA's DRA driver publishes them (``pool_slices``: ResourceSlices in its shape, read by
``gpumodel.dra.read_slices`` as the services read the real ones). Every decision is the product's:

- the claim of each portable ask is the webhook's (``devices.dra.ladders_for``: the MIG profiles that hold the
  ask, smallest first, then the whole GPU where the driver publishes it, as under DynamicMIG);
- where kube-scheduler's allocator can allocate it, and which device it takes there (``devices.dra.node_picks``:
  the first device the pool lists whose counters are free; it scores no device);
- with gpu-tailor, the node the extender ranks first (``devices.dra.claim_preference``: the smallest profile
  first, then what the carve takes of the larger partitions still possible, then fullness);
- alone, the node kube-scheduler's default profile takes among those the allocator can serve: with every pod
  asking alike for CPU and memory, LeastAllocated spreads them, the node with the fewest pods first (ties at
  random).

Workload: the single-GPU pods of the trace or the generated workload, a pod of ``gpu_milli`` asking for that share
of a GPU's compute (``gpu-tailor.io/gpu-milli``: the MIG profiles of at least that many sevenths, or a whole GPU),
arriving as ``simulate.trace`` replays them, up to ``inflate`` x the GPUs. alloc% is the GPU share the
placed pods asked for, against the GPUs' (a partition larger than the ask is not counted beyond it), at each
arrived%.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gpu_tailor.extender.scores import node_order
from gpu_tailor.gpumodel.ask import Isolation, from_pod
from gpu_tailor.gpumodel.devices.dra import DraRefusal, allocate, claim_preference, ladders_for, node_picks, on_node
from gpu_tailor.gpumodel.devices.dra_rungs import GPU_CLASS, MIG_CLASS
from gpu_tailor.gpumodel.dra import DRIVER, DraInventory, read_slices
from gpu_tailor.gpumodel.dra_usage import Usage
from gpu_tailor.gpumodel.fleet import MILLI
from gpu_tailor.gpumodel.mig import H100_80GB, MigSku, layouts, placed_together
from gpu_tailor.simulate.trace import TracePod, _curve, arrivals

LAYOUTS = ("dynamic", "all-1g.10gb", "all-balanced")
SCHEDULERS = ("gpu-tailor", "kube-default")
PRODUCT = "NVIDIA H100 80GB HBM3"
GIB = 2**30


def static_layout(sku: MigSku, name: str) -> list[tuple[str, int]]:
    """A static layout of mig-parted's standard names on one GPU, as (profile, start): ``all-<profile>`` as many of
    the profile as fit, ``all-balanced`` 2 x 1g, 1 x 2g, 1 x 3g (``mig.layouts``)."""
    counts = layouts(sku).get(name)
    if counts is None:
        raise ValueError(f"unknown MIG layout {name!r}: expected one of {', '.join(LAYOUTS)}")
    instances = [p for name, n in counts.items() if (p := sku.profile(name)) is not None for _ in range(n)]
    placed = placed_together(sku, instances)
    if placed is None:
        raise ValueError(f"MIG layout {name} does not fit one {sku.key}")
    return [(p.name, start) for p, start in placed]


def _device(name: str, kind: str, memory_mib: int, profile: str = "", parent: str = "") -> dict[str, Any]:
    attributes: dict[str, Any] = {"type": {"string": kind}, "productName": {"string": PRODUCT}}
    if profile:
        attributes |= {"profile": {"string": profile}, "parentUUID": {"string": parent}}
    return {"name": name, "attributes": attributes, "capacity": {"memory": {"value": f"{memory_mib}Mi"}}}


def pool_slices(node: str, gpus: int, layout: str, sku: MigSku = H100_80GB) -> list[dict[str, Any]]:
    """A node's ResourceSlices as NVIDIA's DRA driver publishes them: under DynamicMIG (``dynamic``) a counter set
    per GPU and the whole GPU plus every profile at every placement consuming from it; under a static layout the MIG
    devices cut in advance (a GPU in MIG mode is not published whole)."""
    devices: list[dict[str, Any]] = []
    sets: list[dict[str, Any]] = []
    for g in range(gpus):
        parent = f"GPU-{node}-{g}"
        if layout != "dynamic":
            for profile, start in static_layout(sku, layout):
                p = sku.profile(profile)
                assert p is not None
                devices.append(_device(f"gpu-{g}-mig-{profile.replace('.', '')}-{start}", "mig", p.memory_mib,
                                       profile, parent))
            continue
        counters = f"gpu-{g}-counter-set"
        every = {f"memory-slice-{i}": {"value": "1"} for i in range(sku.memory_slices)}
        sets.append({"name": counters, "counters": {"memory": {"value": f"{sku.memory_mib}Mi"}, **every}})
        whole = _device(f"gpu-{g}", "gpu", sku.memory_mib)
        whole["consumesCounters"] = [{"counterSet": counters, "counters": {
            "memory": {"value": f"{sku.memory_mib}Mi"}, **every}}]
        devices.append(whole)
        for p in sku.profiles:
            for start in p.placements:
                device = _device(f"gpu-{g}-mig-{p.name.replace('.', '')}-{start}", "mig", p.memory_mib, p.name,
                                 parent)
                device["consumesCounters"] = [{"counterSet": counters, "counters": {
                    "memory": {"value": f"{p.memory_mib}Mi"},
                    **{f"memory-slice-{start + i}": {"value": "1"} for i in range(p.span)}}}]
                devices.append(device)
    spec: dict[str, Any] = {"driver": DRIVER, "nodeName": node, "devices": devices,
                            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}}
    if sets:
        spec["sharedCounters"] = sets
    return [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
             "metadata": {"name": f"{node}-{DRIVER}"}, "spec": spec}]


WORKLOADS = ("single-GPU", "shares")  # every pod of one GPU or less; only those of less than one


def share_ask(pod: TracePod, workload: str = WORKLOADS[0]) -> int | None:
    """The share of one GPU's compute a trace pod asks for (``gpu-tailor.io/gpu-milli``), where ``workload`` takes it;
    None for pods of no or several GPUs (and, for ``shares``, of a whole one)."""
    s = pod.shape
    if s.gpus != 1 or s.milli <= 0 or (workload == "shares" and s.milli >= MILLI):
        return None
    return s.milli


@dataclass
class MigRun:
    layout: str
    scheduler: str
    workload: str
    seed: int
    sums: dict[int, float] = field(default_factory=dict)
    counts: dict[int, int] = field(default_factory=dict)
    failed: Counter[str] = field(default_factory=Counter)  # by the ask's GPU share (milli)
    carved: Counter[str] = field(default_factory=Counter)  # devices taken, by profile

    def curve(self, top: int) -> dict[str, float]:
        return _curve(self.sums, self.counts, top)


def run(layout: str, scheduler: str, pods: list[TracePod], seed: int, nodes: int = 16, gpus: int = 8,
        inflate: float = 1.3, workload: str = WORKLOADS[0]) -> MigRun:
    """One replay: ``pods`` (those ``workload`` takes; the others are left out) arriving on ``nodes`` nodes of
    ``gpus`` H100s each, cut or carved as ``layout`` says, placed by ``scheduler``."""
    if layout not in LAYOUTS or scheduler not in SCHEDULERS or workload not in WORKLOADS:
        raise ValueError(f"layout {layout!r}, scheduler {scheduler!r}, workload {workload!r}: expected one of "
                         f"{LAYOUTS}, {SCHEDULERS} and {WORKLOADS}")
    names = [f"h100-{i:03d}" for i in range(nodes)]
    inv = read_slices([s for n in names for s in pool_slices(n, gpus, layout)])
    assert not inv.problems, inv.problems
    per_node: dict[str, DraInventory] = {n: on_node(inv, n) for n in names}
    usage = Usage.of([], inv)
    capacity = nodes * gpus * MILLI
    single = [p for p in pods if share_ask(p, workload) is not None]
    rng = random.Random(seed)
    placed_on: Counter[str] = Counter()
    out = MigRun(layout, scheduler, workload, seed)
    arrived = used = 0
    ladders_of: dict[int, Any] = {}
    for pod in arrivals(single, seed, capacity, inflate):
        milli = share_ask(pod, workload)
        assert milli is not None
        if milli not in ladders_of:
            res = {"gpu-tailor.io/gpu-milli": str(milli)}
            ask = from_pod({"spec": {"containers": [{"name": "main", "resources": {"limits": res}}]}})
            planned = ladders_for(ask, Isolation.ANY, inv, (GPU_CLASS, MIG_CLASS))
            ladders_of[milli] = None if isinstance(planned, DraRefusal) else planned[1]
        ladders = ladders_of[milli]
        chosen: str | None = None
        if ladders is not None:
            if scheduler == "gpu-tailor":
                best: tuple[Any, int, str] | None = None
                for n in names:
                    pref = claim_preference(ladders, per_node[n], usage, n)
                    if pref is not None and (best is None or (pref, node_order(n)) < best[:2]):
                        best = (pref, node_order(n), n)
                chosen = best[2] if best is not None else None
            else:
                feasible = [n for n in names if node_picks(ladders, per_node[n], usage, n) is not None]
                if feasible:
                    fewest = min(placed_on[n] for n in feasible)
                    chosen = rng.choice([n for n in feasible if placed_on[n] == fewest])
        arrived += pod.shape.gpu_milli
        if chosen is None:
            out.failed[f"{milli}m"] += 1
        else:
            picks = node_picks(ladders, per_node[chosen], usage, chosen)
            assert picks is not None
            for pick in picks.values():
                assert pick is not None
                allocate(usage, pick)
                out.carved.update(d.profile or "whole GPU" for d in pick.devices)
            placed_on[chosen] += 1
            used += pod.shape.gpu_milli
        pct = math.floor(arrived * 100 / capacity + 0.5)
        out.sums[pct] = out.sums.get(pct, 0.0) + used * 100 / capacity
        out.counts[pct] = out.counts.get(pct, 0) + 1
    return out
