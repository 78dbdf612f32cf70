"""Prioritize scores: the policy's raw scores turned into kube-scheduler's 0..10, by rank.

kube-scheduler reads an extender's HostPriority scores as integers 0..``MaxExtenderPriority`` (10),
multiplies them by the extender's weight and by MaxNodeScore / MaxExtenderPriority (100 / 10), and
adds them to its plugins' scores. Mapping raw scores min-max onto 1..10 lets one outlier squeeze the
rest: `tailor` adds 1000 to a multi-GPU placement on an NVLink set, so beside one PCIe node every HGX
node became 10, and kube-scheduler then chose among them by its own plugins or at random.

Scores here go by rank instead. The candidates that fit are ordered by the policy's raw score (best
first) and, on equal raw scores, by free GPU share (least first: what packing prefers, and what a
MostAllocated NodeResourcesFit agrees with). The first gets 10, each next distinct (score, free share)
9, 8, ... down to 1, and every later one 1: a node that fits never gets 0. Nodes that do not fit, and
degraded nodes, get 0. So the policy's first choice is the only 10 whatever the gaps between raw
scores, and nodes the policy tells apart get different scores down to the ninth.
"""

from __future__ import annotations

import numpy as np

from gpu_tailor.gpumodel.fleet import Array, Fleet

MAX_SCORE = 10  # k8s.io/kube-scheduler/extender/v1 MaxExtenderPriority


def free_share(fleet: Fleet, rows: Array) -> Array:
    """Free GPU milli per fleet row (the packing tie-break: least free first)."""
    g = fleet.gpu[rows]
    out: Array = np.where(g > 0, g, 0).sum(axis=1)
    return out


def extender_scores(raw: Array, ok: Array, free: Array) -> Array:
    """0..MAX_SCORE per candidate: 0 where ``ok`` is false, else by rank of (raw desc, free asc)."""
    out = np.zeros(len(raw), np.int64)
    idx = np.flatnonzero(ok)
    if not len(idx):
        return out
    r, f = raw[idx], free[idx]
    order = np.lexsort((f, -r))
    rs, fs = r[order], f[order]
    new = np.ones(len(order), bool)
    new[1:] = (rs[1:] != rs[:-1]) | (fs[1:] != fs[:-1])
    rank = np.cumsum(new) - 1  # dense: equal keys share a rank
    out[idx[order]] = np.maximum(1, MAX_SCORE - rank)
    return out
