"""Prioritize scores: the policy's raw scores turned into kube-scheduler's 0..10, by rank.

kube-scheduler reads an extender's HostPriority scores as integers 0..``MaxExtenderPriority`` (10),
multiplies them by the extender's weight and by MaxNodeScore / MaxExtenderPriority (100 / 10), and
adds them to its plugins' scores. Mapping raw scores min-max onto 1..10 lets one outlier squeeze the
rest: `tailor` adds 1000 to a multi-GPU placement on an NVLink set, so beside one PCIe node every HGX
node became 10, and kube-scheduler then chose among them by its own plugins or at random.

Scores here go by rank instead. The candidates that fit are ordered by the policy's raw score (best
first) and, on equal raw scores, by ``tie_order``. The first gets 10, each next distinct (score, tie
order) 9, 8, ... down to 1, and every later one 1: a node that fits never gets 0. Nodes that do not
fit, and degraded nodes, get 0. So the policy's first choice is the only 10 whatever the gaps between
raw scores, and nodes the policy tells apart get different scores down to the ninth.

Ties, for a pod of whole GPUs, go first to a node already in use over a whole free one: the policy's mix holds
only the shapes seen so far, so it may score breaking the only empty 8-GPU node as free of cost, and the next job
of all its GPUs would then wait (issue 28). After that, and for sharing pods, they go by a fixed order of the nodes
(``node_order``: a hash of the name, the same in every replica and after every restart). For a pod without GPUs,
nodes without GPUs come first and the rest stay tied, so kube-scheduler's own plugins choose among them: its
default topology spread keeps a Deployment's replicas apart, which a fixed order would stack on the same few nodes.

Why a fixed order for GPU pods' ties, and not the fuller node: the policy's scores are coarse on purpose, and
a fixed node order among equal scores makes placement a first fit, as the simulator's node rank does
(docs/tailor-experiments.md: best-fit tie breaks did worse there). On the openb replay
(benchmarks/cluster_replay.py, seeds 42-44, simulator with kube-scheduler modelled) breaking ties
by least free GPU share instead gave 0.2-0.9 point less with every pod through gpu-tailor, and
3.4-4.0 points less with CPU-only pods placed by another scheduler; on the real control plane
(seed 42) 97.68-98.00 against 98.00-98.13, and 91.12-91.78 against 94.46-94.65.
"""

from __future__ import annotations

import hashlib

import numpy as np

from gpu_tailor.gpumodel.fleet import Array, Fleet, Shape

MAX_SCORE = 10  # k8s.io/kube-scheduler/extender/v1 MaxExtenderPriority


def node_order(name: str) -> int:
    """A node's place in the fixed tie-break order: the first 7 bytes of a BLAKE2b hash of its name
    (a pseudo-random order, stable across replicas and restarts, independent of listing order)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=7).digest(), "big")


def tie_order(fleet: Fleet, rows: Array, gpu: bool, whole: Shape | None = None, keys: str = "whole") -> Array:
    """The tie-break key per row (lower first). For a GPU pod ``node_order`` (kept in ``fleet.rank``); for a pod of
    whole GPUs (``whole``, its shape) first ``Fleet.ties`` with ``keys`` (``Policy.tie_keys``): a node in use before
    a whole free one (never break a whole node blindly: the next job of all its GPUs needs one), and the finer keys,
    as the simulator places (``Policy.choose``). For a pod without GPUs 0 on nodes without GPUs and 1 elsewhere, so
    their CPU goes to GPU nodes only when the policy has a reason."""
    if gpu:
        rank: Array = fleet.rank[rows]
        if whole is None or whole.gpus <= 0 or whole.sharing:
            return rank
        order = np.lexsort((rank, fleet.ties(rows, whole, keys)))
        out = np.empty(len(rows), np.int64)
        out[order] = np.arange(len(rows))
        return out
    has: Array = (fleet.ngpu[rows] > 0).astype(np.int64)
    return has


def extender_scores(raw: Array, ok: Array, order: Array) -> Array:
    """0..MAX_SCORE per candidate: 0 where ``ok`` is false, else by rank of (raw desc, order asc)."""
    out = np.zeros(len(raw), np.int64)
    idx = np.flatnonzero(ok)
    if not len(idx):
        return out
    r, f = raw[idx], order[idx]
    order = np.lexsort((f, -r))
    rs, fs = r[order], f[order]
    new = np.ones(len(order), bool)
    new[1:] = (rs[1:] != rs[:-1]) | (fs[1:] != fs[:-1])
    rank = np.cumsum(new) - 1  # dense: equal keys share a rank
    out[idx[order]] = np.maximum(1, MAX_SCORE - rank)
    return out
