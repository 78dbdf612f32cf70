"""Fragmentation gradient descent (FGD), the policy of Weng et al., "Beware of Fragmentation" (ATC'23).

``Mix`` is the pod-type distribution FGD weighs fragmentation by; ``FgdPolicy`` keeps each node's
fragmentation term cached and refreshes only the nodes that changed since the last call, so a
decision costs a few hundred microseconds on a 1,000-node cluster.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpu_tailor.gpumodel.fleet import MILLI, Array, Fleet, PlacementCandidates, Shape
from gpu_tailor.gpumodel.policies.base import Policy

Kind = tuple[int, int, int, frozenset[str]]


@dataclass(frozen=True, slots=True)
class Prior:
    """Pod types a learnt mix counts before it has seen them: a job of every GPU of a node, for each node size of
    at least ``min_gpus`` GPUs in the fleet (no CPU asked; the sizes share equally), so that breaking a whole node
    is never free of cost just because no such job has arrived yet (issue 28).

    ``weight``: how many pods they count as at the start (their share fades as pods are seen); ``floor``: the share
    of the mix they keep however many pods have been seen. Both 0: off. What each costs and keeps on the openb
    replay: docs/tailor-experiments.md ("A prior for shapes not seen yet")."""

    weight: float = 0.0
    floor: float = 0.0
    min_gpus: int = 8

    def pseudo(self, seen: int) -> float:
        """How many pods the prior's types count as, beside ``seen`` pods seen."""
        kept = self.floor * seen / (1 - self.floor) if 0 < self.floor < 1 else 0.0
        return max(self.weight, kept)


class Mix:
    """The typical pod types: the most common kinds covering ``coverage`` of pods, renormalised; with a ``prior``,
    its types beside them (``typical(expected)``)."""

    def __init__(self, coverage: float = 0.95, prior: Prior | None = None) -> None:
        self.coverage = coverage
        self.prior = prior or Prior()
        self.counts: Counter[Kind] = Counter()
        self.total = 0
        self._typical: list[tuple[Kind, float]] | None = None
        self._expected: tuple[Kind, ...] = ()

    def observe(self, shape: Shape) -> None:
        self.counts[shape.kind] += 1
        self.total += 1
        self._typical = None

    def typical(self, expected: Sequence[Kind] = ()) -> list[tuple[Kind, float]]:
        """The types and their shares; ``expected``: the prior's types for this fleet (``whole_node_kinds``)."""
        expected = tuple(expected)
        if self._typical is None or expected != self._expected:
            self._expected = expected
            ranked = sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0][:3], sorted(kv[0][3])))
            picked: list[tuple[Kind, float]] = []
            covered = 0
            for kind, n in ranked:
                if covered >= self.coverage * self.total:
                    break
                picked.append((kind, n))
                covered += n
            pseudo = self.prior.pseudo(self.total) if expected else 0.0
            weights = dict(picked)
            for kind in expected:
                weights[kind] = weights.get(kind, 0) + pseudo / len(expected)
            whole = covered + pseudo
            self._typical = [(k, n / whole) for k, n in weights.items() if n > 0] if whole else []
        return self._typical


def whole_node_kinds(fleet: Fleet, prior: Prior) -> tuple[Kind, ...]:
    """The prior's types for ``fleet``: a job of all the GPUs of each node size it holds of ``prior.min_gpus`` or
    more (none when the prior is off)."""
    if not (prior.weight or prior.floor):
        return ()
    sizes = np.unique(fleet.ngpu[: fleet.n][fleet.alive[: fleet.n]])
    return tuple((0, MILLI, int(g), frozenset()) for g in sizes if g >= max(prior.min_gpus, 2))


class FgdPolicy(Policy):
    """Fragmentation gradient descent: place where the expected fragmentation grows least.

    frag_m(n) is the GPU share of node n that pod type m could not use (all of it when m does not
    fit at all, otherwise the GPUs too small for m); F_n = sum_m p_m frag_m(n). The score of a
    placement is 100 sigmoid((F_n before - F_n after) / 1000), floored to an integer as the paper
    does. ``mix`` is the pod-type distribution; the paper hands FGD the whole trace's.
    """

    name = "fgd"

    def __init__(self, fleet: Fleet, seed: int = 0, mix: Mix | None = None) -> None:
        super().__init__(fleet, seed)
        self.mix = mix or Mix()
        self._mix_key: object = None
        self._mix_total = 0
        self._gen = np.zeros(0, np.int64)

    # per-type arrays and the per-node cache
    def _types(self) -> None:
        typical = self.mix.typical(whole_node_kinds(self.fleet, self.mix.prior))
        key = (tuple(k for k, _ in typical), len(self.fleet.models))
        # the shares drift as a learnt mix grows: re-derive them every 5% more pods
        if key == self._mix_key and self.mix.total <= self._mix_total * 1.05:
            return
        self._mix_key, self._mix_total = key, self.mix.total
        f = self.fleet
        m = len(typical)
        self.t_cpu = np.array([k[0] for k, _ in typical], np.int64)
        self.t_milli = np.array([k[1] for k, _ in typical], np.int64)
        self.t_gpus = np.array([k[2] for k, _ in typical], np.int64)
        self.t_p = np.array([p for _, p in typical], float)
        self.t_gpu = self.t_gpus > 0
        allowed = np.ones((m, max(1, len(f.models)) + 1), bool)  # last column: a node without model
        for j, (k, _) in enumerate(typical):
            if k[3]:
                allowed[j, :] = False
                for model in k[3]:
                    if model in f.model_ids:
                        allowed[j, f.model_ids[model]] = True
        self.t_allowed = allowed
        self._gen = np.full(len(f.gen), -1, np.int64)  # everything stale
        self._cnt = np.zeros((len(f.gen), m), np.int64)
        self._small = np.zeros((len(f.gen), m), np.int64)
        self._free = np.zeros(len(f.gen), np.int64)
        self._frag = np.zeros(len(f.gen), float)

    def _refresh(self) -> None:
        self._types()
        f = self.fleet
        if len(self._gen) < len(f.gen):  # the fleet grew
            grow = len(f.gen) - len(self._gen)
            self._gen = np.concatenate([self._gen, np.full(grow, -1, np.int64)])
            self._cnt = np.vstack([self._cnt, np.zeros((grow, self._cnt.shape[1]), np.int64)])
            self._small = np.vstack([self._small, np.zeros((grow, self._small.shape[1]), np.int64)])
            self._free = np.concatenate([self._free, np.zeros(grow, np.int64)])
            self._frag = np.concatenate([self._frag, np.zeros(grow)])
        stale = np.flatnonzero(self._gen[: f.n] != f.gen[: f.n])
        if not len(stale):
            return
        gpu = f.gpu[stale][:, :, None]  # (S, G, 1) against types (M,)
        present = gpu >= 0
        fits = present & (gpu >= self.t_milli)
        self._cnt[stale] = fits.sum(axis=1)
        self._small[stale] = np.where(present & ~fits, gpu, 0).sum(axis=1)
        self._free[stale] = np.where(f.gpu[stale] >= 0, f.gpu[stale], 0).sum(axis=1)
        self._frag[stale] = self._fragmentation(stale, f.cpu[stale], self._cnt[stale],
                                                self._small[stale], self._free[stale])
        self._gen[stale] = f.gen[stale]

    def _fragmentation(self, nodes: Array, cpu: Array, cnt: Array, small: Array, free: Array) -> Array:
        model = self.fleet.model[nodes]
        allowed = self.t_allowed[:, model].T  # (C, M)
        fits = allowed & (cpu[:, None] >= self.t_cpu) & (cnt >= self.t_gpus) & self.t_gpu
        frag = np.where(fits, small, free[:, None])
        out: Array = frag @ self.t_p
        return out

    def observe(self, shape: Shape) -> None:
        pass  # the paper's FGD is given the trace's mix up front

    def delta(self, shape: Shape, c: PlacementCandidates) -> Array:
        """F_n before minus F_n after, per candidate (milli of expected fragmentation avoided)."""
        self._refresh()
        n = c.node
        if not len(self.t_p):
            return np.zeros(len(n))
        k = c.count[:, None]
        b, a = c.before[:, None], c.after[:, None]
        d = self.t_milli
        cnt = self._cnt[n] - k * (b >= d) + k * (a >= d)
        small = self._small[n] - k * np.where(b < d, b, 0) + k * np.where(a < d, a, 0)
        free = self._free[n] - c.count * (c.before - c.after)
        f = self.fleet
        after = self._fragmentation(n, f.cpu[n] - shape.cpu, cnt, small, free)
        out: Array = self._frag[n] - after
        return out

    def node_fragmentation(self) -> Array:
        """F_n per fleet row (milli), as of now (a copy)."""
        self._refresh()
        out: Array = self._frag[: self.fleet.n].copy()
        return out

    def fragmentation(self) -> float:
        """Cluster fragmentation F = sum_n F_n (milli)."""
        self._refresh()
        rows = self.fleet.rows()
        return float(self._frag[rows].sum())

    def score(self, shape: Shape, c: PlacementCandidates) -> Array:
        x = self.delta(shape, c) / 1000.0
        sig = 1.0 / (1.0 + np.exp(-x))
        return np.floor(100 * sig)
