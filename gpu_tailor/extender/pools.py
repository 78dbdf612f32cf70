"""What each GPU pool holds, as Prometheus gauges computed at scrape time from the extender's own cache.

A pool is the nodes of one GPU model sold one way (``backing``: whole GPUs, MIG, time-slicing or MPS replicas).
Per pool:

- ``gpu_tailor_pool_gpus``: the GPUs the nodes sell now (a degraded node's missing GPUs left out);
- ``gpu_tailor_pool_gpus_used``: the GPUs held, shares added up (a quarter GPU is 0.25);
- ``gpu_tailor_pool_gpus_idle``: GPUs nobody holds any part of;
- ``gpu_tailor_pool_gpus_stranded``: idle GPUs on nodes left with less than ``FEED_CPU_MILLI`` of CPU or
  ``FEED_MEMORY_MIB`` of memory, which no pod can use until something there ends;
- ``gpu_tailor_pool_fragmentation_gpus``: the free GPU capacity the pod mix the extender has learnt could not use
  where it is (FGD's measure, the one the policy lowers), in GPUs.

Per NVLink domain several nodes share (an NVL72 rack's ``nvidia.com/gpu.clique``), labelled with the domain and its
pool's ``model``: ``gpu_tailor_domain_gpus``, ``gpu_tailor_domain_gpus_idle``, ``gpu_tailor_domain_whole_nodes`` and
``gpu_tailor_domain_largest_group`` (by GPUs per pod: the largest group of such pods that still fits there).

Cordoned nodes, and nodes that sell no GPU yet (initializing), count in no pool. The values are the extender's
view: which GPU a pod holds is a prediction on device-plugin pools (docs/concepts.md,
"Predicted and reported GPUs").
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from gpu_tailor.extender.cache import Cache
from gpu_tailor.gpumodel.devices.base import BackingKind
from gpu_tailor.gpumodel.domains import domain_rows, member_shapes
from gpu_tailor.gpumodel.fleet import MILLI, Fleet
from gpu_tailor.gpumodel.inventory import NodeInventory
from gpu_tailor.gpumodel.report import parse_time

FEED_CPU_MILLI = 1000
FEED_MEMORY_MIB = 1024
LABELS = ["model", "backing"]


def backing(inv: NodeInventory) -> str:
    kinds = {o.backing for o in inv.offerings if o.allocatable > 0}
    if BackingKind.MIG in kinds:
        return "mig"
    if BackingKind.SHARED in kinds:
        return next(o.sharing.value for o in inv.offerings if o.backing is BackingKind.SHARED)
    return "whole" if kinds else "none"


class PoolGauges:
    """A Prometheus collector over ``cache`` (registered on the extender's registry)."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache

    def collect(self) -> Iterator[GaugeMetricFamily]:
        # The cache's own node states, as they are now: no snapshot, whose refresh of every node changed since the
        # last request (thousands after a relist, which the relist copies in chunks) would block the verbs.
        cache = self.cache
        fleet = cache.fleet
        frag = cache.policy.node_fragmentation()  # as of the fleet rows the last request saw
        pools: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0] * 5)
        for name, state in list(cache.nodes.items()):
            inv = state.inventory
            row = fleet.index.get(name)
            sold = backing(inv)
            if inv.unschedulable or not inv.has_gpus or sold == "none":
                continue  # cordoned, no GPUs, or none sold yet (initializing)
            free = [s.free_milli for s in state.gpus.usable_slots()]
            idle = sum(f == MILLI for f in free)
            starved = (inv.cpu_milli - state.cpu_used < FEED_CPU_MILLI
                       or inv.memory_bytes // 2**20 - state.mem_used_mib < FEED_MEMORY_MIB)
            pool = pools[(inv.model or "unknown", sold)]
            node_frag = float(frag[row]) / MILLI if row is not None and row < len(frag) else 0.0
            for i, value in enumerate((len(free), sum(MILLI - f for f in free) / MILLI, idle, idle if starved else 0,
                                       node_frag)):
                pool[i] += value
        families = [GaugeMetricFamily(f"gpu_tailor_pool_{key}", text, labels=LABELS) for key, text in (
            ("gpus", "GPUs the pool's nodes sell now"),
            ("gpus_used", "GPUs held by pods, shares added up"),
            ("gpus_idle", "GPUs nobody holds any part of"),
            ("gpus_stranded", "Idle GPUs on nodes without the CPU or memory left to feed a pod"),
            ("fragmentation_gpus", "Free GPU capacity the learnt pod mix could not use where it is (FGD), in GPUs"))]
        for key, values in sorted(pools.items()):
            for family, value in zip(families, values, strict=True):
                family.add_metric(list(key), value)
        yield from families
        yield from domain_gauges(fleet)


def domain_gauges(fleet: Fleet) -> Iterator[GaugeMetricFamily]:
    """Per NVLink domain shared by nodes (``gpumodel.domains``): its GPUs, the idle ones, its whole free nodes, and
    the largest group of pods of one GPU, or of a whole node, that still fits there (pods asking no CPU or memory),
    as of the fleet rows the last request saw."""
    rows = domain_rows(fleet, member_shapes(fleet, 0, 0))
    if not rows:
        return
    by = ["domain", "model"]  # the model joins a domain to its pool's gauges
    gpus = GaugeMetricFamily("gpu_tailor_domain_gpus", "GPUs of the NVLink domain's nodes", labels=by)
    idle = GaugeMetricFamily("gpu_tailor_domain_gpus_idle", "GPUs of the NVLink domain nobody holds any part of",
                             labels=by)
    whole = GaugeMetricFamily("gpu_tailor_domain_whole_nodes", "Nodes of the NVLink domain with every GPU idle",
                              labels=by)
    largest = GaugeMetricFamily("gpu_tailor_domain_largest_group", "The most pods of gpus_per_pod GPUs each that "
                                "still fit in the NVLink domain at once", labels=[*by, "gpus_per_pod"])
    for d in rows:
        key = [d.name, d.model or "unknown"]
        gpus.add_metric(key, d.gpus)
        idle.add_metric(key, d.idle)
        whole.add_metric(key, d.whole_nodes)
        for g, n in sorted(d.largest.items()):
            largest.add_metric([*key, str(g)], n)
    yield from (gpus, idle, whole, largest)


class AgentMetrics:
    """What the node agents told the extender: nodes reporting, and predictions their reports contradicted."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        nodes = GaugeMetricFamily("gpu_tailor_agent_reports", "Nodes whose agent's NodeGPUReport the extender holds")
        nodes.add_metric([], len(self.cache.reports))
        yield nodes
        seen = GaugeMetricFamily("gpu_tailor_agent_report_observed_timestamp_seconds",
                                 "When the node agent observed what the NodeGPUReport the extender holds says, per "
                                 "node (Unix time)", labels=["node"])
        for name, report in sorted(self.cache.reports.items()):
            at = parse_time(report.observed_at)
            if at is not None:
                seen.add_metric([name], at.timestamp())
        yield seen
        wrong = CounterMetricFamily("gpu_tailor_agent_contradictions",
                                    "Pods whose GPUs, as a node agent reported them, the extender's prediction "
                                    "(or bind's annotation) did not allow")
        wrong.add_metric([], self.cache.contradictions)
        yield wrong

