"""What ``explain`` says of a pod's group and of the NVLink domains: the group's plan (its domain, each pod's node,
which are bound and which held), or why it fits nowhere; and per domain, the GPUs free and the largest group of pods
like this one that still fits there."""

from __future__ import annotations

from typing import Any

from gpu_tailor.extender.cache import Cache
from gpu_tailor.extender.gangbook import Answer
from gpu_tailor.gpumodel.domains import domain_rows
from gpu_tailor.gpumodel.groups import GroupError, group_of
from gpu_tailor.gpumodel.schedule import Demand, shape_of

SHOWN_DOMAINS = 8  # the domains listed, the roomiest first


def groups_said(cache: Cache, pod: dict[str, Any], demand: Demand, member: Answer | None) -> list[str]:
    """Lines for people: the pod's group and its plan, then the NVLink domains (only where nodes share them)."""
    out: list[str] = []
    try:
        ref = group_of(pod)
    except GroupError as exc:
        return [f"group: {exc}"]
    plan = cache.groups.plans.get(ref.key) if ref is not None else None
    if member is not None and plan is not None:
        ref = plan.ref  # sized and asked as its group's object says (a PodGroup's minCount and topology)
        where = f"in NVLink domain {plan.domain}" if plan.domain else "over several NVLink domains or nodes"
        slots = ", ".join(f"{s.node} (GPU {','.join(map(str, s.gpus))}{', bound' if s.bound else ', held'})"
                          for s in plan.slots)
        out.append(f"{ref.name}: {ref.size} pods ({ref.domain} one NVLink domain), planned {where}: {slots}; "
                   f"this pod: {member.node}")
    elif member is not None and member.reason:
        out.append(member.reason)
    fleet = cache.fleet
    claim = plan.claim if plan is not None else None  # on DRA nodes: each member's devices as the fleet sees them
    if (not demand.gpu and claim is None) or not fleet.shared_domains:
        return out
    if claim is not None:
        shape = claim
    else:
        offering = next((o for ns in cache.nodes.values()
                         if (o := ns.inventory.offering(demand.resource)) is not None), None)
        if offering is None:
            return out
        shape = shape_of(demand, offering)
    labelled = sorted(domain_rows(fleet, [shape]), key=lambda d: (-d.largest[shape.gpus], d.name))
    for d in labelled[:SHOWN_DOMAINS]:
        out.append(f"NVLink domain {d.name}: {d.free:g} of {d.gpus} GPUs free ({d.idle} idle); "
                   f"the largest group of pods like this one that still fits there: {d.largest[shape.gpus]}")
    if len(labelled) > SHOWN_DOMAINS:
        out.append(f"... and {len(labelled) - SHOWN_DOMAINS} more NVLink domains")
    return out
