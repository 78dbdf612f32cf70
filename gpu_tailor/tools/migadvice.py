"""MIG layouts advised, never applied (issue 32): Pending pods whose MIG resource no node sells now, and per MIG pool
the ``nvidia.com/mig.config`` of mig-parted's standard names that idle nodes could be re-cut to so that those pods
find a place, with how many it would place and how many GPUs it would re-cut.

The standard names are mig-parted's own (NVIDIA/mig-parted, the GPU operator's default ``config-default.yaml``):
``all-<profile>`` cuts every GPU of a node into as many instances of one profile as fit, and ``all-balanced`` cuts
each GPU of the A100/H100/H200 family into 2 x the smallest 1g profile, 1 x 2g and 1 x 3g (A30: 2 x 1g, 1 x 2g).
Only nodes none of whose GPUs hold anything are proposed (mig-manager re-cuts a whole node, and evicts nothing it
need not), the fewest that place the most pods. Among layouts that place as many, the one whose instances hold the
most of the recent demand wins: the MIG asks of the pods created in the ``recent`` hours before the newest pod
of the source (bound or not; the newest pod's time, not the clock's, so a dump of last week reads as it did then).
Nothing is relabelled: people decide.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gpu_tailor.extender.snapshot import NodeInfo
from gpu_tailor.gpumodel import labels, mig
from gpu_tailor.gpumodel.devices.base import BackingKind, HealthState
from gpu_tailor.gpumodel.mig import layouts
from gpu_tailor.gpumodel.report import parse_time
from gpu_tailor.gpumodel.resources import ResourceKind, parse_resource
from gpu_tailor.gpumodel.schedule import demand_of


@dataclass
class UnsoldPod:
    pod: str  # namespace/name
    resource: str


@dataclass
class Advice:
    sku: str  # A100-40GB
    product: str  # as the nodes label it
    config: str  # the nvidia.com/mig.config value
    nodes: list[str] = field(default_factory=list)
    gpus_recut: int = 0
    places: int = 0
    pending: int = 0  # the pool's Pending MIG pods that no node can take now
    layout: dict[str, int] = field(default_factory=dict)  # instances per GPU
    holds: int = 0  # of the recent MIG asks this product serves, how many the re-cut nodes' instances would hold
    recent: int = 0  # the recent MIG asks this product serves
    hours: float = 24.0

    def line(self) -> str:
        recent = (f", holds {self.holds} of {self.recent} MIG ask(s) of the last {self.hours:g} h" if self.recent
                  else "")
        return (f"{self.product} ({self.sku}): label {', '.join(self.nodes)} {labels.MIG_CONFIG}={self.config} "
                f"({', '.join(f'{n} x {p}' for p, n in self.layout.items())} per GPU): places {self.places} of "
                f"{self.pending} Pending MIG pod(s){recent}, re-cuts {self.gpus_recut} GPU(s)")


def _mig_profile(resource: str) -> str | None:
    parsed = parse_resource(resource)
    return parsed.mig_profile if parsed is not None and parsed.kind is ResourceKind.MIG else None


def _created(pod: dict[str, Any]) -> dt.datetime | None:
    return parse_time((pod.get("metadata") or {}).get("creationTimestamp"))


def recent_demand(pods: list[dict[str, Any]], hours: float) -> Counter[str]:
    """Instances asked per MIG profile by the pods created within ``hours`` of the newest pod."""
    stamped = [(t, p) for p in pods if (t := _created(p)) is not None]
    if not stamped:
        return Counter()
    since = max(t for t, _ in stamped) - dt.timedelta(hours=hours)
    out: Counter[str] = Counter()
    for t, pod in stamped:
        if t >= since and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            demand = demand_of(pod)
            profile = _mig_profile(demand.resource) if demand.gpu and not demand.error else None
            if profile:
                out[profile] += demand.units
    return out


def advise(infos: list[NodeInfo], pods: list[dict[str, Any]],
           hours: float = 24.0) -> tuple[list[UnsoldPod], list[Advice]]:
    """The Pending MIG pods no node can take now, and per MIG product the layout that would place most of them
    (of those, the one that would hold most of the last ``hours``' MIG asks)."""
    usable = [i for i in infos if not i.state.inventory.unschedulable
              and i.state.inventory.health.state in (HealthState.HEALTHY, HealthState.DEGRADED)]
    free: Counter[str] = Counter()
    for info in usable:
        for o in info.state.inventory.offerings:
            free[str(o.resource)] += max(0, o.allocatable - info.state.units_used.get(str(o.resource), 0))
    waiting: list[tuple[str, str, int]] = []  # pod, resource, units
    for pod in pods:
        if (pod.get("spec") or {}).get("nodeName") or (pod.get("status") or {}).get("phase") not in (None, "Pending"):
            continue
        demand = demand_of(pod)
        if demand.gpu and not demand.error and _mig_profile(demand.resource):
            waiting.append((demand.key, demand.resource, demand.units))
    unsold, stuck = [], Counter[str]()
    for key, resource, units in waiting:
        if free[resource] >= units:
            free[resource] -= units  # it has a place; the next one may not
            continue
        unsold.append(UnsoldPod(key, resource))
        stuck[_mig_profile(resource) or ""] += units
    lately = recent_demand(pods, hours)
    advice: list[Advice] = []
    by_product: dict[str, list[NodeInfo]] = {}
    for info in usable:
        inv = info.state.inventory
        if inv.product is not None and any(o.backing is BackingKind.MIG for o in inv.offerings):
            by_product.setdefault(inv.labels.get(labels.GPU_PRODUCT, inv.product.raw), []).append(info)
    for product, members in sorted(by_product.items()):
        sku = mig.sku_for_product(product)
        if sku is None:
            continue
        want = {p: n for p, n in stuck.items() if sku.resolve(p) is not None}
        if not want:
            continue
        idle = sorted((i for i in members if all(s.idle for s in i.state.gpus.slots)),
                      key=lambda i: (i.state.inventory.gpu_count, i.state.inventory.name))
        asked = {p: n for p, n in lately.items() if sku.resolve(p) is not None}
        best: Advice | None = None
        for config, per_gpu in layouts(sku).items():
            gpus = 0
            for k, info in enumerate(idle, start=1):
                gpus += info.state.inventory.gpu_count
                places = sum(min(n, per_gpu.get(p, 0) * gpus) for p, n in want.items())
                holds = sum(min(n, per_gpu.get(p, 0) * gpus) for p, n in asked.items())
                if places and (best is None or (places, -gpus, holds) > (best.places, -best.gpus_recut, best.holds)):
                    best = Advice(sku.key, product, config, [i.state.inventory.name for i in idle[:k]], gpus,
                                  places, sum(want.values()), dict(per_gpu), holds, sum(asked.values()), hours)
        if best is not None:
            advice.append(best)
    return unsold, advice
