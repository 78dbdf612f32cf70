"""The baseline policies of Weng et al., "Beware of Fragmentation" (USENIX ATC'23).

random, dotprod, bestfit, gpupacking and gpuclustering, scored in the paper's integer points (a
sharing pod's ties go to the node's fitting GPU with the least free share), so that their allocation
on the openb trace can be checked against the paper's (docs/design.md, "Results on the openb trace").
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from gpu_tailor.gpumodel.fleet import MILLI, Array, Fleet, PlacementCandidates, Shape
from gpu_tailor.gpumodel.policies.base import Policy, least_free_fitting


class RandomPolicy(Policy):
    name = "random"

    def score(self, shape: Shape, c: PlacementCandidates) -> Array:
        # a uniform node, then a uniform fitting GPU on it
        nodes, inv = np.unique(c.node, return_inverse=True)
        node_draw = self.rng.random(len(nodes))[inv]
        return node_draw * 2 + self.rng.random(len(c.node)) * 1e-3


class DotProdPolicy(Policy):
    name = "dotprod"

    def score(self, shape: Shape, c: PlacementCandidates) -> Array:
        f = self.fleet
        cap_cpu, cap_gpu = f.max_cpu, f.max_gpus * MILLI
        free = np.where(f.gpu[c.node] >= 0, f.gpu[c.node], 0).sum(axis=1)
        dot = (f.cpu[c.node] / cap_cpu) * (shape.cpu / cap_cpu) + (free / cap_gpu) * (shape.gpu_milli / cap_gpu)
        out: Array = np.floor(100 * (1 - 0.5 * dot)) + least_free_fitting(f, shape, c) * 1e-3
        return out


class BestFitPolicy(Policy):
    name = "bestfit"

    def score(self, shape: Shape, c: PlacementCandidates) -> Array:
        f = self.fleet
        free = np.where(f.gpu[c.node] >= 0, f.gpu[c.node], 0).sum(axis=1)
        left = 0.5 * (f.cpu[c.node] - shape.cpu) / f.max_cpu + 0.5 * (free - shape.gpu_milli) / (f.max_gpus * MILLI)
        raw = np.floor(100 * (1 - left))
        lo, hi = raw.min(), raw.max()
        scaled = (raw - lo) * 100 // (hi - lo) if hi > lo else np.full(len(raw), 100.0)
        return scaled + least_free_fitting(f, shape, c) * 1e-3


class GpuPackingPolicy(Policy):
    """Shared GPUs first, then idle GPUs of used nodes, then idle nodes (fewest GPUs first)."""

    name = "gpupacking"

    def score(self, shape: Shape, c: PlacementCandidates) -> Array:
        f = self.fleet
        gpu = f.gpu[c.node]
        present = gpu >= 0
        idle = ((gpu == MILLI) & present).sum(axis=1)
        ngpu = f.ngpu[c.node]
        if shape.gpus == 0:
            return np.zeros(len(c.node))
        whole_node_idle = idle == ngpu
        case3 = np.maximum(100 // 3 - idle, idle)
        case2 = np.maximum(100 // 2 - shape.gpus, 100 // 3) if not shape.sharing else 0
        if shape.sharing:
            case1 = np.maximum(100 - (c.before * 100 // MILLI) // 10, 100 // 2)
            uses_idle = c.before == MILLI
            case2_share = np.maximum(100 // 2 - 1, 100 // 3)
            s = np.where(whole_node_idle, case3, np.where(uses_idle, case2_share, case1))
            out: Array = s + least_free_fitting(f, shape, c) * 1e-3
            return out
        return np.where(whole_node_idle, case3, case2).astype(float)


class GpuClusteringPolicy(Policy):
    """Pods with the same GPU ask together: nodes already running only that ask first."""

    name = "gpuclustering"

    def __init__(self, fleet: Fleet, seed: int = 0) -> None:
        super().__init__(fleet, seed)
        self.asks: dict[int, Counter[int]] = {}

    @staticmethod
    def tag(shape: Shape) -> int:
        """The pod's clustering tag: any sharing ask is one tag (0), whole asks by GPU count."""
        return 0 if shape.sharing else shape.gpus

    def placed(self, node: int, shape: Shape) -> None:
        if shape.gpus:
            self.asks.setdefault(node, Counter())[self.tag(shape)] += 1

    def score(self, shape: Shape, c: PlacementCandidates) -> Array:
        f = self.fleet
        if shape.gpus == 0:
            return np.zeros(len(c.node))
        spec = f.max_gpus * MILLI
        free = np.where(f.gpu[c.node] >= 0, f.gpu[c.node], 0).sum(axis=1)
        base = 25 * (spec - free) // spec
        tiers = np.empty(len(c.node))
        for j, node in enumerate(c.node):
            asks = self.asks.get(int(node), Counter())
            if asks.get(self.tag(shape)):
                tiers[j] = 75 if len(asks) == 1 else 50
            else:
                tiers[j] = 25 if not asks else 0
        out: Array = base + tiers + least_free_fitting(f, shape, c) * 1e-3
        return out
