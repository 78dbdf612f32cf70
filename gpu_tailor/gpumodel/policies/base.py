"""What every placement policy shares: the ``Policy`` base, its choice of a node, and score helpers.

A policy scores the ``PlacementCandidates`` that ``fleet.candidates`` lists (higher is better);
``Policy.choose`` and ``Policy.node_scores`` turn the scores into a ``NodeChoice`` (the simulator)
or one score per node (the extender's prioritize).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpu_tailor.gpumodel.fleet import PICK_FIRST, Array, Fleet, PlacementCandidates, Shape, candidates


@dataclass(frozen=True, slots=True)
class NodeChoice:
    """Where a policy puts a pod: the node's row, the GPUs it takes there, and the placement's score."""

    node: int
    gpus: tuple[int, ...]
    score: float


class Policy:
    """A placement policy: scores candidate placements (higher is better)."""

    name = "policy"
    # With keep_whole_nodes, equal scores of a pod of whole GPUs are told apart by ``Fleet.ties`` (``tie_keys``)
    # before the node rank (issue 28); sharing pods keep the rank alone (with them too, gpuspec10 placed 0.18 point
    # less at 90% arrived). The FGD paper's policies use the rank alone, as the paper replays them; tailor sets both.
    keep_whole_nodes = False
    tie_keys = "whole"  # with keep_whole_nodes: which keys of ``Fleet.ties``
    # Single pods keep off an untouched NVLink domain while one in use holds them (``Fleet.spare_whole_domains``):
    # tailor's rule, so that a gang that needs a whole domain finds one
    keep_whole_domains = False

    def __init__(self, fleet: Fleet, seed: int = 0) -> None:
        self.fleet = fleet
        self.rng = np.random.default_rng(seed)

    def observe(self, shape: Shape) -> None:
        """A pod arrived (scheduled or not): policies that learn the workload mix learn here."""

    def placed(self, node: int, shape: Shape) -> None:
        """The pod was placed on ``node`` (policies that remember what runs where)."""

    def score(self, shape: Shape, c: PlacementCandidates) -> Array:
        raise NotImplementedError

    def whole_gpus(self, node: int, shape: Shape) -> tuple[int, ...]:
        """Which idle GPUs a whole-GPU pod takes on the chosen node (where a DRA allocator picks, ``PICK_FIRST``: the
        first idle ones in the pool's order)."""
        free = self.fleet.free_gpus(node)
        topo = self.fleet.topologies[node]
        if topo is not None and shape.gpus > 1 and self.fleet.pick[node] != PICK_FIRST:
            best = topo.best_set(free, shape.gpus)
            if best is not None:
                return best
        return tuple(free[: shape.gpus])

    def node_scores(self, shape: Shape, rows: Array) -> tuple[Array, Array]:
        """Best score per row (NaN where the pod does not fit, or keeps off the row's whole domain) and the row's
        best sharing GPU."""
        c = candidates(self.fleet, shape, self._spared(shape, rows))
        best = np.full(len(rows), np.nan)
        gpu = np.full(len(rows), -1)
        if len(c.node):
            s = self.score(shape, c).astype(float)
            pos = np.full(self.fleet.n, -1, np.int64)
            pos[rows] = np.arange(len(rows))
            order = np.lexsort((c.gpu, -s))  # best first, lowest GPU on ties
            at = pos[c.node[order]]
            _, first = np.unique(at, return_index=True)  # each row's first (best) candidate
            take = order[first]
            best[at[first]], gpu[at[first]] = s[take], c.gpu[take]
        return best, gpu

    def _spared(self, shape: Shape, rows: Array) -> Array:
        return self.fleet.spare_whole_domains(shape, rows) if self.keep_whole_domains else rows

    def choose(self, shape: Shape, rows: Array | None = None) -> NodeChoice | None:
        rows = self.fleet.rows() if rows is None else rows
        c = candidates(self.fleet, shape, self._spared(shape, rows))
        if not len(c.node):
            return None
        s = self.score(shape, c).astype(float)
        keep = self.keep_whole_nodes and shape.gpus > 0 and not shape.sharing
        whole = self.fleet.ties(c.node, shape, self.tie_keys) if keep else np.zeros(len(s), np.int64)
        k = int(np.lexsort((c.gpu, self.fleet.rank[c.node], whole, -s))[0])
        node = int(c.node[k])
        gpus = (int(c.gpu[k]),) if shape.sharing else self.whole_gpus(node, shape) if shape.gpus else ()
        return NodeChoice(node, gpus, float(s[k]))


def least_free_fitting(fleet: Fleet, shape: Shape, c: PlacementCandidates) -> Array:
    """Per candidate: 1 where it is its node's fitting GPU with the least free share (ties: lowest)."""
    order = np.lexsort((c.gpu, c.before, c.node))
    first = np.ones(len(order), bool)
    first[1:] = c.node[order][1:] != c.node[order][:-1]
    out = np.zeros(len(order), bool)
    out[order[first]] = True
    return out
