"""kube-scheduler 1.36's topology-aware workload scheduling, as the extender sees it: the group it places one NVLink
domain at a time (``GroupRef.by_domain``), and the nodes it passed in each domain it asked about."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpu_tailor.gpumodel.fleet import Fleet


@dataclass
class Placements:
    """What kube-scheduler's topology-aware workload scheduling (1.36) showed of a group it places one NVLink domain
    at a time (``GroupRef.by_domain``): each cycle it tries every domain as a "placement", asking about each member
    with that domain's nodes only (those its own filters pass), and keeps a placement where every member passed.
    Planned on the first domain asked about, the group would go wherever kube-scheduler happens to look first; it is
    planned on every domain instead, each with the nodes last passed there, and a domain that is not the plan's
    passes no member. Until kube-scheduler has gone through its domains once, the ones it has not asked about yet
    count with all their nodes; after that, only those it asked about (it asks about none where its filters pass no
    node)."""

    passed: dict[int, np.ndarray] = field(default_factory=dict)  # domain id -> the rows kube-scheduler passed there
    asked: set[tuple[str, int]] = field(default_factory=set)  # (member uid, domain) asked about this cycle
    went_round: bool = False

    def seen(self, uid: str, domain: int, rows: np.ndarray) -> None:
        if (uid, domain) in self.asked:  # the same member asked about the same domain again: a new cycle
            self.went_round = True
            self.asked.clear()
        self.asked.add((uid, domain))
        self.passed[domain] = rows

    def rows(self, fleet: Fleet) -> np.ndarray:
        parts = list(self.passed.values())
        if not self.went_round:  # kube-scheduler makes placements of the nodes with the label only
            alive = fleet.rows()
            domains = fleet.domain[alive]
            parts.append(alive[np.asarray(fleet.labelled, bool)[domains] & ~np.isin(domains, list(self.passed))])
        rows = np.concatenate(parts)
        live: np.ndarray = rows[fleet.alive[rows]]
        return live
