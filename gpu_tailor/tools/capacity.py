"""``gpu-tailor capacity``: per node pool and GPU product, what is used, what is free, and what more fits.

The numbers come from the extender's own state: a ``Cache`` filled with the nodes and pods (the GPUs
each pod holds, as the extender books them), ``schedule.fit`` for "how many more pods of this shape
fit" (fitted and booked one by one on a copy of each node), and the FGD fragmentation measure
(``policies.fgd``) weighed by the pod mix the extender learnt from the pods present.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gpu_tailor.extender.cache import Cache
from gpu_tailor.extender.snapshot import NodeInfo
from gpu_tailor.gpumodel.devices.base import BackingKind, HealthState, Offering
from gpu_tailor.gpumodel.domains import DomainRow, domain_rows, member_shapes
from gpu_tailor.gpumodel.dra import DeviceType
from gpu_tailor.gpumodel.dra_state import DraState
from gpu_tailor.gpumodel.dra_usage import can_carve, counted_memory
from gpu_tailor.gpumodel.fleet import MILLI, Fleet
from gpu_tailor.gpumodel.policies.fgd import FgdPolicy, Mix
from gpu_tailor.gpumodel.quantity import GIB
from gpu_tailor.gpumodel.schedule import Demand, NodeState, fit, fleet_row, shape_of
from gpu_tailor.tools.migadvice import Advice, UnsoldPod, advise
from gpu_tailor.tools.source import Cluster

# node labels that name a node pool, by cloud; the first one a node carries names its pool
POOL_LABELS = ("cloud.google.com/gke-nodepool", "kubernetes.azure.com/agentpool", "eks.amazonaws.com/nodegroup",
               "karpenter.sh/nodepool")
MAX_PODS_PER_NODE = 1024  # a bound on the fitting loop (a 64-GPU node of 16-replica shares)
SHORT = {2: "half", 4: "quarter"}


@dataclass(frozen=True)
class CommonShape:
    """One pod shape to count: a name for people and the native ask a pod of it has after admission."""

    name: str
    demand: Demand
    offering: Offering


@dataclass
class Pool:
    pool: str
    product: str
    nodes: int = 0
    gpus: int = 0  # physical, as labelled
    in_use: int = 0  # GPUs with anything placed on them
    free: int = 0  # idle GPUs the node sells now
    unavailable: int = 0  # labelled but not allocatable (degraded)
    units: dict[str, str] = field(default_factory=dict)  # resource -> "used/allocatable"
    fragmentation_gpus: float = 0.0  # FGD: expected GPU share the mix cannot use
    fragmentation_pct: float = 0.0  # of the pool's free GPU share
    stranded_gpus: float = 0.0  # free GPU share on nodes whose CPU or memory cannot feed one more pod
    stranded_nodes: list[str] = field(default_factory=list)
    fits: dict[str, int] = field(default_factory=dict)  # shape -> how many more


@dataclass
class DraPoolRow:
    """One DRA pool (a node's devices as NVIDIA's driver publishes them): devices by kind, and what is free."""

    node: str
    pool: str
    devices: dict[str, str] = field(default_factory=dict)  # "H100 80GB HBM3" / "MIG 1g.10gb" -> "free/all"
    free_devices: int = 0
    devices_total: int = 0
    free_memory_gib: float = 0.0  # memory of devices no claim holds, and what shared claims left
    memory_gib: float = 0.0
    complete: bool = True
    carvable: dict[str, int] = field(default_factory=dict)  # partitionable GPUs: how many more of each partition fit


def dra_pools(state: DraState) -> list[DraPoolRow]:
    inv, usage = state.inventory(), state.usage()
    rows = []
    for pool in sorted(inv.pools.values(), key=lambda p: (p.node, p.name)):
        row = DraPoolRow(pool.node, pool.name, complete=pool.complete)
        counts: dict[str, list[int]] = {}
        for d in pool.devices.values():
            if d.consumes:  # partitionable (DynamicMIG): counted by what the counters can still carve, below
                continue
            kind = f"MIG {d.profile}" if d.type is DeviceType.MIG else d.product.removeprefix("NVIDIA ") + (
                " (shared)" if d.shared else "")
            c = counts.setdefault(kind, [0, 0])
            left = usage.memory_left(d)
            free = usage.free(d)
            c[0] += free
            c[1] += 1
            row.free_devices += free
            row.devices_total += 1
            row.free_memory_gib += left / GIB
            row.memory_gib += d.memory_bytes / GIB
        if pool.counter_sets:
            total, left = counted_memory(pool, usage)
            row.memory_gib += total / GIB
            row.free_memory_gib += left / GIB
            row.carvable = can_carve(pool, usage)
            gpus = len(pool.counter_sets)
            idle = row.carvable.get("whole GPU", 0)
            counts["GPU (partitionable)"] = [idle, gpus]
            row.free_devices += idle
            row.devices_total += gpus
        row.devices = {k: f"{a}/{b}" for k, (a, b) in sorted(counts.items())}
        row.free_memory_gib = round(row.free_memory_gib, 1)
        row.memory_gib = round(row.memory_gib, 1)
        rows.append(row)
    return rows


@dataclass
class Report:
    source: str
    pools: list[Pool]
    fits: dict[str, int]
    mix: str  # where the fragmentation's pod mix came from
    problems: list[dict[str, str]]  # degraded, initializing, invalid-MIG and cordoned nodes
    pod_cpu_milli: int
    pod_memory_mib: int
    dra: list[DraPoolRow] = field(default_factory=list)  # the DRA pools, where DRA is on
    dra_on: bool = False
    unsold: list[UnsoldPod] = field(default_factory=list)  # Pending MIG pods no node can take now
    mig_advice: list[Advice] = field(default_factory=list)  # a layout per MIG product that would place them
    domains: list[DomainRow] = field(default_factory=list)  # NVLink domains several nodes share

    def wire(self) -> dict[str, Any]:
        return asdict(self)


def pool_of(labels: dict[str, str], label: str | None = None) -> str:
    """The node's pool: the value of ``label`` when given, else of the first cloud pool label it carries."""
    if label:
        return labels.get(label, "-")
    return next((labels[k] for k in POOL_LABELS if k in labels), "-")


def _model(info: NodeInfo) -> str:
    inv = info.state.inventory
    return inv.model or (inv.product.raw if inv.product else "unknown")


def common_shapes(nodes: list[NodeInfo], cpu_milli: int, memory_mib: int) -> list[CommonShape]:
    """The shapes the cluster sells: one whole GPU and a full node's worth (on NVLink where the board
    has it) per model, one instance of each MIG profile, one replica of each shared GPU."""
    found: dict[str, CommonShape] = {}

    def add(name: str, offering: Offering, units: int, model: str, nvlink: bool = False) -> None:
        same = found.get(name)
        if same is not None and same.demand.resource != str(offering.resource):
            name = f"{name} as {offering.resource}"  # the same slice sold under another name elsewhere
        if name not in found:
            demand = Demand(f"gpu-tailor-capacity/{name}", str(offering.resource), units, units, cpu_milli,
                            memory_mib, (model,), nvlink)
            found[name] = CommonShape(name, demand, offering)

    for info in nodes:
        inv = info.state.inventory
        if inv.health.state not in (HealthState.HEALTHY, HealthState.DEGRADED):
            continue
        model = _model(info)
        for o in inv.offerings:
            if o.backing is BackingKind.WHOLE:
                add(f"1x {model}", o, 1, model)
                if inv.gpu_count > 1:
                    linked = info.state.gpus.topology.all_nvlinked(range(inv.gpu_count))
                    add(f"{inv.gpu_count}x {model}" + (" on NVLink" if linked else ""), o, inv.gpu_count, model,
                        linked)
            elif o.mig_profile is not None:
                add(f"mig-{o.mig_profile.name} ({model})", o, 1, model)
            else:
                share = SHORT.get(o.replicas, f"1/{o.replicas}")
                add(f"{share} {model} ({o.sharing.value})", o, 1, model)
    return sorted(found.values(), key=lambda s: s.name)


def how_many(state: NodeState, demand: Demand) -> int:
    """Pods of ``demand`` that still fit the node, each fitted with ``schedule.fit`` and booked on a copy
    as the extender books a bound pod (GPUs, units, CPU and memory)."""
    node = state.copy()
    inv = node.inventory
    n = 0
    while n < MAX_PODS_PER_NODE:
        if demand.cpu_milli > inv.cpu_milli - node.cpu_used or \
                demand.memory_mib > inv.memory_bytes // 2**20 - node.mem_used_mib:
            break
        f = fit(node, demand)
        if not f.ok:
            break
        if f.placement is not None:
            node.gpus.place(f"{demand.key}-{n}", f.placement)
        node.units_used[demand.resource] = node.units_used.get(demand.resource, 0) + demand.units
        node.cpu_used += demand.cpu_milli
        node.mem_used_mib += demand.memory_mib
        n += 1
    return n


def _fragmentation(infos: list[NodeInfo], mix: Mix) -> float:
    fleet = Fleet()
    for info in infos:
        row = fleet_row(info.state)
        fleet.upsert(info.state.name, row.cpu_free, row.mem_free_mib, row.gpu_free, row.model, row.topology,
                     cpu_capacity=row.cpu_capacity, pick=row.pick, step=row.step)
    return FgdPolicy(fleet, mix=mix).fragmentation() / MILLI


def capacity(cluster: Cluster, cpu_milli: int = 1000, memory_mib: int = 4096, pool_label: str | None = None,
             recent_hours: float = 24.0) -> Report:
    cache = Cache(report_stale=None)  # a dump is read later than it was taken: its reports are as they were
    cache.reset_reports(cluster.reports)  # the node agents' word first: the nodes are installed with it
    cache.group_objects = cluster.groups  # before the pods: a plan read back from one sizes its group by them
    cache.reset_pods(cluster.pods)
    cache.reset_nodes(cluster.nodes)
    snap = cache.snapshot()
    infos = [snap.nodes[n] for n in sorted(snap.nodes)]
    shapes = common_shapes(infos, cpu_milli, memory_mib)
    mix = cache.policy.mix
    said = f"learnt from {mix.total} GPU pod(s) bound now"
    if not mix.total:
        mix = Mix()
        for s in shapes:
            mix.observe(shape_of(s.demand, s.offering))
        said = "no GPU pods bound: the common shapes below, equally weighted"
    problems: list[dict[str, str]] = []
    groups: dict[tuple[str, str], list[NodeInfo]] = {}
    for info in infos:
        inv = info.state.inventory
        if inv.health.state not in (HealthState.HEALTHY, HealthState.NO_GPU):
            problems.append({"node": inv.name, "state": inv.health.state.value, "reason": inv.health.reason})
        if inv.unschedulable:
            problems.append({"node": inv.name, "state": "cordoned", "reason": "spec.unschedulable: true"})
        if inv.has_gpus:
            groups.setdefault((pool_of(inv.labels, pool_label), _model(info)), []).append(info)
    pools: list[Pool] = []
    totals: dict[str, int] = {s.name: 0 for s in shapes}
    for (pool_name, product), members in sorted(groups.items()):
        p = Pool(pool_name, product, nodes=len(members))
        used: dict[str, list[int]] = {}
        free_milli = 0
        for info in members:
            state, inv = info.state, info.state.inventory
            p.gpus += inv.gpu_count
            p.unavailable += inv.gpu_count - state.gpus.usable
            for slot in state.gpus.usable_slots():
                if slot.idle:
                    p.free += 1
                else:
                    p.in_use += 1
            for o in inv.offerings:
                u = used.setdefault(str(o.resource), [0, 0])
                u[0] += state.units_used.get(str(o.resource), 0)
                u[1] += o.allocatable
            row = fleet_row(state)
            node_free = sum(m for m in row.gpu_free if m > 0)
            free_milli += node_free
            schedulable = not inv.unschedulable and inv.health.state in (HealthState.HEALTHY, HealthState.DEGRADED)
            if node_free and schedulable and (row.cpu_free < cpu_milli or row.mem_free_mib < memory_mib):
                p.stranded_gpus += node_free / MILLI
                p.stranded_nodes.append(inv.name)
            if schedulable:
                for s in shapes:
                    n = how_many(state, s.demand)
                    if n:
                        p.fits[s.name] = p.fits.get(s.name, 0) + n
                        totals[s.name] += n
        p.units = {r: f"{a}/{b}" for r, (a, b) in sorted(used.items())}
        p.fragmentation_gpus = round(_fragmentation(members, mix), 2)
        p.fragmentation_pct = round(100 * p.fragmentation_gpus * MILLI / free_milli, 1) if free_milli else 0.0
        p.stranded_gpus = round(p.stranded_gpus, 2)
        pools.append(p)
    unsold, advice = advise(infos, cluster.pods, recent_hours)
    domains = domain_rows(cache.fleet, member_shapes(cache.fleet, cpu_milli, memory_mib))
    return Report(cluster.source, pools, totals, said, problems, cpu_milli, memory_mib, dra_pools(cluster.dra),
                  cluster.dra.enabled, unsold, advice, domains)


# ----- for people -----
def table(r: Report) -> str:
    rows = [("POOL", "PRODUCT", "NODES", "GPUS", "IN USE", "FREE", "UNAVAIL", "FRAG (FGD)", "STRANDED", "UNITS USED")]
    for p in r.pools:
        rows.append((p.pool, p.product, str(p.nodes), str(p.gpus), str(p.in_use), str(p.free), str(p.unavailable),
                     f"{p.fragmentation_gpus:g} GPU ({p.fragmentation_pct:g}%)", f"{p.stranded_gpus:g} GPU",
                     ", ".join(f"{k.removeprefix('nvidia.com/')} {v}" for k, v in p.units.items())))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = [f"GPU capacity, read from {r.source}", ""]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1] for row in rows]
    lines += ["", f"fragmentation: FGD's expected GPU share that the pod mix cannot use ({r.mix})"]
    stranded = [n for p in r.pools for n in p.stranded_nodes]
    if stranded:
        lines.append(f"stranded: free GPUs beside less than {r.pod_cpu_milli / 1000:g} CPU or "
                     f"{r.pod_memory_mib / 1024:g} GiB free, on {', '.join(stranded)}")
    lines += ["", f"How many more pods fit right now (each also asking {r.pod_cpu_milli / 1000:g} CPU and "
                  f"{r.pod_memory_mib / 1024:g} GiB memory):"]
    width = max((len(k) for k in r.fits), default=0)
    lines += [f"  {k.ljust(width)}  {v}" for k, v in r.fits.items()]
    if r.domains:
        sizes = sorted({g for d in r.domains for g in d.largest})
        lines += ["", "NVLink domains (nodes sharing one; the largest group of pods of 1 GPU, or of a whole node, that "
                      "still fits in each, each pod also asking the CPU and memory above per GPU):"]
        rows3 = [("DOMAIN", "NODES", "GPUS", "FREE", "IDLE", "WHOLE NODES",
                  *(f"GROUP OF {g}-GPU PODS" for g in sizes))]
        rows3 += [(d.name, str(d.nodes), str(d.gpus), f"{d.free:g}", str(d.idle), str(d.whole_nodes),
                   *(str(d.largest.get(g, 0)) for g in sizes)) for d in r.domains]
        w3 = [max(len(row[i]) for row in rows3) for i in range(len(rows3[0]))]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(row, w3, strict=True)).rstrip() for row in rows3]
    if r.dra:
        lines += ["", "DRA pools (gpu.nvidia.com ResourceSlices; free = held by no claim):"]
        rows2 = [("NODE", "FREE DEVICES", "FREE MEMORY", "DEVICES (free/all)")]
        for d in r.dra:
            rows2.append((d.node + ("" if d.complete else " (incomplete)"), f"{d.free_devices}/{d.devices_total}",
                          f"{d.free_memory_gib:g}/{d.memory_gib:g} GiB", ", ".join(f"{k} {v}"
                                                                                  for k, v in d.devices.items())))
        w2 = [max(len(row[i]) for row in rows2) for i in range(3)]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(row[:3], w2, strict=True)) + "  " + row[3]
                  for row in rows2]
        carve = [d for d in r.dra if d.carvable]
        if carve:
            lines += ["", "Partitionable GPUs (DynamicMIG): how many more of each partition the free counters can "
                          "carve, each on its own:"]
            lines += [f"  {d.node}: " + ", ".join(f"{k} {v}" for k, v in sorted(
                d.carvable.items(), key=lambda kv: (kv[0] == "whole GPU", kv[0]))) for d in carve]
    elif not r.dra_on:
        lines += ["", "DRA: off (the source has no resource.k8s.io/v1 objects, or the API server does not serve it)"]
    if r.unsold:
        lines += ["", "Pending pods whose MIG instance no node has free (none sells it, or all are taken):"]
        lines += [f"  {u.pod}: {u.resource}" for u in r.unsold]
    if r.mig_advice:
        lines += ["", "MIG layouts that would place them (advice only: gpu-tailor relabels nothing; mig-manager "
                      "re-cuts a node when its label changes):"]
        lines += [f"  {a.line()}" for a in r.mig_advice]
    if r.problems:
        lines += ["", "Nodes that cannot take GPU pods as labelled:"]
        lines += [f"  {p['node']}: {p['state']}" + (f" ({p['reason']})" if p["reason"] else "") for p in r.problems]
    return "\n".join(lines) + "\n"


def plot(r: Report, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [f"{p.pool} / {p.product}" if p.pool != "-" else p.product for p in r.pools]
    parts: list[tuple[str, list[float], str]] = [("in use", [float(p.in_use) for p in r.pools], "tab:blue"),
             ("free", [max(0.0, p.free - p.stranded_gpus) for p in r.pools], "tab:green"),
             ("free but stranded", [min(float(p.free), p.stranded_gpus) for p in r.pools], "tab:orange"),
             ("unavailable", [float(p.unavailable) for p in r.pools], "tab:red")]
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(names) + 1.5))
    left = [0.0] * len(names)
    for label, values, colour in parts:
        ax.barh(names, values, left=left, label=label, color=colour)
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.set_xlabel("GPUs")
    ax.set_title("GPUs per pool and product")
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
