"""The NVLink domains as people and dashboards see them: per domain shared by several nodes (an NVL72 rack's clique,
or what an admin's label names), its GPUs, how many are idle, its whole free nodes, and the largest group of pods of
each shape that still fits in it (``gangs.slots``: GPUs, CPU and memory counted on each node).

``capacity``, ``explain`` and the extender's pool gauges read it; nodes that are a domain alone are left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpu_tailor.gpumodel.fleet import MILLI, Fleet, Shape
from gpu_tailor.gpumodel.gangs import slots


@dataclass
class DomainRow:
    name: str
    nodes: int
    gpus: int
    idle: int
    free: float  # GPUs free, shares added up
    whole_nodes: int  # nodes with every GPU idle
    largest: dict[int, int] = field(default_factory=dict)  # GPUs per pod -> the most such pods it holds now
    model: str = ""  # the GPU model most of its nodes have (a pool's ``model``)


def member_shapes(fleet: Fleet, cpu_milli: int, memory_mib: int) -> list[Shape]:
    """Pods of one GPU and of each node size found in a shared domain (every GPU of a node), asking for ``cpu_milli``
    and ``memory_mib`` per GPU."""
    rows = fleet.rows()
    shared = np.asarray(fleet.labelled, bool)[fleet.domain[rows]] if len(rows) else np.zeros(0, bool)
    sizes = sorted({1, *map(int, np.unique(fleet.ngpu[rows][shared]))} - {0})
    return [Shape(cpu_milli * g, memory_mib * g, g, MILLI) for g in sizes]


def domain_rows(fleet: Fleet, shapes: list[Shape]) -> list[DomainRow]:
    """One row per shared domain with live nodes, in name order."""
    rows = fleet.rows()
    out: list[DomainRow] = []
    if not fleet.shared_domains or not len(rows):
        return out
    held = {s.gpus: slots(fleet, s, rows) for s in shapes}
    idle = (fleet.gpu[rows] == MILLI).sum(axis=1)
    whole = fleet.untouched(rows)
    for d in sorted(set(map(int, fleet.domain[rows])), key=lambda d: fleet.domain_names[d]):
        if not fleet.labelled[d]:
            continue
        here = fleet.domain[rows] == d
        models = fleet.model[rows][here]
        known = models[models >= 0]
        model = fleet.models[int(np.bincount(known).argmax())] if len(known) else ""
        out.append(DomainRow(fleet.domain_names[d], int(here.sum()), int(fleet.ngpu[rows][here].sum()),
                             int(idle[here].sum()), float(np.maximum(fleet.gpu[rows][here], 0).sum()) / MILLI,
                             int(whole[here].sum()), {g: int(h[here].sum()) for g, h in held.items()}, model))
    return out
