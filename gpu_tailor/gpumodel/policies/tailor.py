"""gpu-tailor's own placement policy: FGD that also keeps scarce GPU models and hosts for the pods
that need them, and counts the GPUs that CPU cannot feed.

How each rule and constant was arrived at, with the measurements: docs/tailor-experiments.md.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from gpu_tailor.gpumodel.fleet import MILLI, NO_TOPOLOGY, PICK_FIRST, Array, Fleet, PlacementCandidates, Shape
from gpu_tailor.gpumodel.policies.fgd import FgdPolicy, Mix

# A placement is charged for what it takes from the pods restricted to a GPU model once they are
# expected to need this much of the model's free share (``model_pressure``), and for the hosts it
# spoils of a multi-GPU kind only some nodes can host once that kind is expected to need this much
# of them (``host_cost``); fully so at 1.0. They start below 1.0 because pods arrive at random. A
# model is reserved earlier than hosts: from 0.4 every model-restricted workload placed more than from
# 0.8, while reserving hosts below 0.8 placed no more (docs/tailor-experiments.md).
MODEL_RESERVE_FROM = 0.4
HOST_RESERVE_FROM = 0.8
# An idle GPU counts as fed while its node's free memory covers this quantile of the memory per GPU
# that whole-GPU pods have asked for (``memory_cost``). The lower quartile placed more than the mean
# on the multi-GPU heavy workloads (docs/tailor-experiments.md).
MEMORY_QUANTILE = 0.25


def _reserve(pressure: Array | float, start: float) -> Array:
    """How much of what a placement takes from a reserved pool is charged: 0 up to ``start``, 1 at 1.0."""
    return np.clip((pressure - start) / (1 - start), 0.0, 1.0)


class TailorPolicy(FgdPolicy):
    """gpu-tailor's policy: fragmentation gradient descent that also counts GPUs CPU cannot feed.

    What it changes in FGD (why each, with the measurements: docs/tailor-experiments.md):

    - The pod-type mix is learnt from the pods seen so far (a live scheduler cannot read ahead).
    - FGD asks whether ONE pod of type m still fits a node. For the GPU-sharing types tailor also
      asks how many: a node whose free CPU feeds only ``b`` pods of type m while its GPUs could take
      ``u > b`` of them strands the GPUs of the other ``u - b`` pods, and those count as
      fragmentation for m. FGD's own rule (nothing fits: all free GPU is lost) is the ``b == 0`` end
      of the same term. Whole-GPU types are left to FGD's rule: a GPU that a 19-core pod's CPU cannot
      reach still takes a 3-core sharing pod.
    - GPU models that pods restricted to them will need are kept for them: once those pods are
      expected to need more than ``MODEL_RESERVE_FROM`` of a model's free share
      (``model_pressure``), a placement there is charged what it takes of them, in the same units
      as the fragmentation (``model_cost``): the GPU milli those pods could still have used, which
      a node's free CPU may cap. FGD sees a restricted pod type only through its small share of the
      mix, so unrestricted pods would fill the scarce models early and the restricted ones fail.
    - A GPU of a model that a type may never use is no fragment for that type. FGD counts all of it,
      so once some pods name models, every placement on a model they exclude "removes
      fragmentation", and other pods rush the excluded models first. Keeping models for the pods
      that name them is left to ``model_pressure``.
    - Nodes that only some multi-GPU pods can use are kept for them the same way (``host_cost``): the
      128-core nodes of the openb cluster are the only hosts of its 120-core 8-GPU pods.
    - A placement that leaves idle GPUs without the memory to feed them is charged those GPUs
      (``memory_cost``): on the 96-core G2 nodes a 4-GPU pod asking 313 GiB leaves 4 GPUs with
      71 GiB, and at full load those stay idle while 1-GPU pods fail.
    - Multi-GPU pods go to an all-NVLink set of GPUs whenever one is free anywhere, and single whole
      GPUs are taken so that NVLink pairs and islands stay whole.
    - The score keeps FGD's integer sigmoid points: coarse points let the node rank act as a
      first-fit order, which did better than exact comparison.
    - Memory stays out of the types, as in FGD (adding it did no better); it enters only through
      ``memory_cost``.
    """

    name = "tailor"
    # Where it scores placements of whole GPUs alike: a node in use before a whole free one, then (pods of several
    # GPUs) the smallest free NVLink block and the fewest GPUs stranded (``Fleet.ties``; for one-GPU pods those two
    # cost 0.2 point on openb, for multi-GPU pods nothing: docs/tailor-experiments.md), then the node rank.
    keep_whole_nodes = True
    tie_keys = "multi-blocks"
    keep_whole_domains = True

    def __init__(self, fleet: Fleet, seed: int = 0, mix: Mix | None = None) -> None:
        super().__init__(fleet, seed, mix)
        self.gpu_seen = 0  # GPU milli of every GPU pod seen
        self.typed: Counter[frozenset[str]] = Counter()  # ... of those that allow only some models
        self.typed_cpu: Counter[frozenset[str]] = Counter()  # the CPU milli those asked for
        self.multi: Counter[tuple[int, int, frozenset[str]]] = Counter()  # ... of multi-GPU pods by kind
        self.gpu_mem: Counter[int] = Counter()  # whole-GPU pods by the memory they ask per GPU (MiB)
        self.gpu_mem_seen = 0  # ... and how many there were
        self._fed_mem, self._fed_at = 0, 0  # MEMORY_QUANTILE of those, and how many it was taken over

    def observe(self, shape: Shape) -> None:
        self.mix.observe(shape)
        if shape.gpus:
            self.gpu_seen += shape.gpu_milli
            if shape.models:
                self.typed[shape.models] += shape.gpu_milli
                self.typed_cpu[shape.models] += shape.cpu
            if shape.gpus > 1:
                self.multi[(shape.gpus, shape.cpu, shape.models)] += shape.gpu_milli
            if not shape.sharing:
                self.gpu_mem[shape.mem // shape.gpus] += 1
                self.gpu_mem_seen += 1

    def fed_memory(self) -> int:
        """The memory (MiB) an idle GPU needs beside it to count as fed: ``MEMORY_QUANTILE`` of the
        memory per GPU that whole-GPU pods asked for so far, taken again every 5% more pods."""
        seen = self.gpu_mem_seen
        if seen > self._fed_at * 1.05:
            mem = sorted(self.gpu_mem)
            counts = np.cumsum([self.gpu_mem[m] for m in mem])
            self._fed_mem = mem[int(np.searchsorted(counts, MEMORY_QUANTILE * seen))]
            self._fed_at = seen
        return self._fed_mem

    def model_pressure(self) -> Array:
        """Per GPU model: the GPU share that pods restricted to it are expected to need, over its free share.

        Pods allowing the models S have brought ``share_S`` of all GPU demand so far; filling what is
        free now brings ``share_S x free`` more of theirs, spread over S by free share. A model at
        1.0 is exactly used up by them; other pods should keep off it well before that.
        """
        f = self.fleet
        rho = np.zeros(len(f.models))
        if not self.typed:
            return rho
        self._refresh()  # the per-node free milli is FGD's cache
        rows = f.rows()
        model, free = f.model[rows], self._free[rows]
        known = model >= 0
        per_model = np.bincount(model[known], weights=free[known], minlength=len(f.models))
        for models, milli in self.typed.items():
            ids = [f.model_ids[m] for m in models if m in f.model_ids]
            if ids:
                rho[ids] += milli / self.gpu_seen * free.sum() / max(float(per_model[ids].sum()), 1.0)
        return rho

    def host_groups(self) -> list[tuple[int, int, Array, float]]:
        """The multi-GPU kinds seen, grouped by the nodes able to host them.

        One entry per group: GPUs per pod ``k``, the least CPU among its kinds, whether each row's
        capacity (GPU count, CPU, model) can host them, and the group's share of all GPU demand.
        """
        f = self.fleet
        rows = f.rows()
        groups: dict[tuple[int, bytes], tuple[int, Array, float]] = {}
        for (k, cpu, models), milli in self.multi.items():
            able = (f.ngpu[rows] >= k) & (f.cpu_cap[rows] >= cpu)
            if models:
                able &= f.model_allowed(Shape(cpu, 0, k, MILLI, models), rows)
            least, _, share = groups.get((k, able.tobytes()), (cpu, able, 0.0))
            groups[k, able.tobytes()] = (min(least, cpu), able, share + milli / self.gpu_seen)
        return [(k, cpu, able, share) for (k, _), (cpu, able, share) in groups.items()]

    def host_cost(self, shape: Shape, c: PlacementCandidates) -> Array:
        """Per candidate: the GPU milli of the hosts it takes from multi-GPU pods only some nodes can host.

        A host is ``k`` idle GPUs on a node able to host the group, with the group's CPU free beside
        them. Like ``model_pressure``: a group expected to need more than ``HOST_RESERVE_FROM`` of the
        hosts left (its demand share times the free GPU milli, over the hosts' milli) has every host
        a placement spoils charged to it, scaled up to the full ``k x 1000`` at 1.0.
        """
        f = self.fleet
        cost = np.zeros(len(c.node))
        if not self.multi:
            return cost
        self._refresh()  # the per-node free milli is FGD's cache
        rows = f.rows()
        pos = np.full(f.n, -1, np.int64)
        pos[rows] = np.arange(len(rows))
        at = pos[c.node]
        idle = (f.gpu[rows] == MILLI).sum(axis=1)
        free = float(self._free[rows].sum())
        took = np.where(c.before == MILLI, c.count, 0)  # idle GPUs the placement takes
        for k, cpu, able, share in self.host_groups():
            hosts = np.where(able & (f.cpu[rows] >= cpu), idle // k, 0)
            pressure = share * free / max(float(hosts.sum() * k * MILLI), 1.0)
            reserve = float(_reserve(pressure, HOST_RESERVE_FROM))
            if reserve > 0:
                left = np.where(able[at] & (f.cpu[c.node] - shape.cpu >= cpu), (idle[at] - took) // k, 0)
                cost += (hosts[at] - left) * k * MILLI * reserve
        return cost

    def model_cost(self, shape: Shape, c: PlacementCandidates) -> Array:
        """Per candidate: the GPU milli it takes from the pods restricted to the node's model, reserved.

        Those pods can use a node's free GPU milli only as far as its free CPU feeds them: at most free
        CPU x their GPU milli per CPU milli (over all restricted pods allowing the model). A placement
        is charged the drop in that usable share, times the model's reservation (``model_pressure``).
        So taking GPUs whose CPU is already gone costs next to nothing, and eating the CPU beside GPUs
        they need costs those GPUs.
        """
        f = self.fleet
        n = len(f.models)
        milli, cpu = np.zeros(n), np.zeros(n)
        for models, m in self.typed.items():
            ids = [f.model_ids[x] for x in models if x in f.model_ids]
            milli[ids] += m
            cpu[ids] += self.typed_cpu[models]
        reserve = _reserve(self.model_pressure(), MODEL_RESERVE_FROM)  # refreshes FGD's per-node cache
        model = f.model[c.node]
        known = model >= 0
        at = np.maximum(model, 0)
        per_cpu = np.where(cpu > 0, milli / np.maximum(cpu, 1.0), 0.0)[at]
        free_gpu = self._free[c.node].astype(float)
        free_cpu = f.cpu[c.node].astype(float)
        took = (c.count * (c.before - c.after)).astype(float)
        fed = cpu[at] > 0  # restricted pods that ask for no CPU are never short of it

        def usable(gpu: Array, cpu_left: Array) -> Array:
            return np.where(fed, np.minimum(gpu, cpu_left * per_cpu), gpu)

        drop = usable(free_gpu, free_cpu) - usable(free_gpu - took, np.maximum(free_cpu - shape.cpu, 0))
        out: Array = np.where(known, drop * reserve[at], 0.0)
        return out

    def memory_cost(self, shape: Shape, c: PlacementCandidates) -> Array:
        """Per candidate: the GPU milli of the idle GPUs it leaves without the memory to feed them.

        A node's free memory feeds ``free memory // fed_memory()`` idle GPUs; the rest are stranded
        for whole-GPU pods. A placement is charged the idle GPUs it strands beyond those already
        stranded, 1000 milli each. FGD leaves memory out, so it sent 4-GPU pods asking 313 GiB to
        96-core G2 nodes of 384 GiB, whose other 4 GPUs then stayed idle at full load.
        """
        f = self.fleet
        per_gpu = self.fed_memory()
        if per_gpu <= 0:
            return np.zeros(len(c.node))
        idle = (f.gpu[c.node] == MILLI).sum(axis=1)
        left = idle - np.where(c.before == MILLI, c.count, 0)  # less the idle GPUs the placement takes
        mem = f.mem[c.node]
        unfed = np.maximum(idle - mem // per_gpu, 0)
        unfed_after = np.maximum(left - np.maximum(mem - shape.mem, 0) // per_gpu, 0)
        out: Array = np.maximum(unfed_after - unfed, 0) * float(MILLI)
        return out

    def delta(self, shape: Shape, c: PlacementCandidates) -> Array:
        """FGD's delta, less the GPU milli a placement takes from pods that only some GPUs or nodes fit,
        and the idle GPUs it leaves without memory."""
        d = super().delta(shape, c)
        if not (shape.gpus and len(c.node)):
            return d
        if self.typed:
            d = d - self.model_cost(shape, c)
        return d - self.host_cost(shape, c) - self.memory_cost(shape, c)

    def _fragmentation(self, nodes: Array, cpu: Array, cnt: Array, small: Array, free: Array) -> Array:
        model = self.fleet.model[nodes]
        allowed = self.t_allowed[:, model].T  # (C, M)
        per_pod = np.maximum(self.t_gpus, 1)
        by_gpu = cnt // per_pod  # pods of each type the free GPUs could take
        by_cpu = np.where(self.t_cpu > 0, cpu[:, None] // np.maximum(self.t_cpu, 1), by_gpu)
        fits = allowed & self.t_gpu & (by_gpu >= 1) & (by_cpu >= 1)
        # the GPUs that fit type m hold (free - small) milli between them: those of the pods that
        # CPU cannot feed are stranded
        mean_fit = (free[:, None] - small) / np.maximum(cnt, 1)
        stranded = np.where(self.t_milli < MILLI, np.maximum(0, by_gpu - by_cpu) * per_pod * mean_fit, 0.0)
        # a GPU of a model type m may never use is not a fragment for m (see the class notes)
        frag = np.where(fits, small + stranded, np.where(allowed, free[:, None], 0.0))
        out: Array = frag @ self.t_p
        return out

    def score(self, shape: Shape, c: PlacementCandidates) -> Array:
        f = self.fleet
        s = super().score(shape, c)
        if shape.gpus > 1 and (f.link[: f.n] != NO_TOPOLOGY).any():
            s = s + np.where(f.nvlinked(c.node, shape.gpus), 1000.0, 0.0)
        return s

    def whole_gpus(self, node: int, shape: Shape) -> tuple[int, ...]:
        topo = self.fleet.topologies[node]
        free = self.fleet.free_gpus(node)
        if topo is not None and shape.gpus == 1 and len(free) > 1 and self.fleet.pick[node] != PICK_FIRST:
            # take the idle GPU with the fewest idle NVLink neighbours: islands stay whole
            return (min(free, key=lambda g: (sum(topo.nvlinked(g, h) for h in free if h != g), g)),)
        return super().whole_gpus(node, shape)
