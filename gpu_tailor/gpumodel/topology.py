"""GPU interconnect of a node and the device plugin's way of scoring a set of GPUs.

The NVIDIA device plugin's best-effort allocator (go-gpuallocator) rates a pair of GPUs by the link
between them as NVML reports it -- the further apart, the lower -- and a set by the sum over its
pairs, then hands out the best-rated set. Scoring sets the same way here means the GPUs the extender
scores are the GPUs the kubelet will actually pick.

Pair scores (per link): across CPU sockets 10, same NUMA node 20, host bridge 30, several PCIe
switches 40, one PCIe switch 50, same board 60, and 100 per NVLink lane (an NVSwitch HGX board
reports every pair as NVLink with the GPU's full lane count: 12 on A100, 18 on H100/H200).

GFD publishes no topology label, so platforms are inferred: 8-GPU A100/H100/H200 SXM (HGX) boards
are NVSwitch all-to-all; otherwise GPUs are on PCIe split evenly over two sockets. An operator may
say better with the ``gpu-tailor.io/gpu-topology`` node label (``nvswitch``, ``nvlink-pairs``,
``pcie``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from itertools import combinations
from math import comb

from gpu_tailor.gpumodel import labels


class Link(IntEnum):
    """Per-link scores of go-gpuallocator's best-effort policy."""

    CROSS_CPU = 10
    SAME_CPU = 20
    HOST_BRIDGE = 30
    MULTI_SWITCH = 40
    SINGLE_SWITCH = 50
    SAME_BOARD = 60
    NVLINK = 100  # per lane


NVLINK_LANES = {"A100": 12, "H100": 18, "H200": 18, "H800": 8, "A800": 8, "V100": 6, "P100": 4}
EXHAUSTIVE_LIMIT = 20_000  # combinations; above it the best set is built greedily


@dataclass(frozen=True, slots=True)
class GpuTopology:
    kind: str  # nvswitch | nvlink-pairs | pcie | none
    scores: tuple[tuple[int, ...], ...]  # symmetric pair scores, 0 on the diagonal

    @property
    def size(self) -> int:
        return len(self.scores)

    def nvlinked(self, a: int, b: int) -> bool:
        return self.scores[a][b] >= Link.NVLINK

    def set_score(self, gpus: Sequence[int]) -> int:
        """go-gpuallocator's score of a set: the sum of its pair scores."""
        s = self.scores
        return sum(s[a][b] for a, b in combinations(gpus, 2))

    def all_nvlinked(self, gpus: Sequence[int]) -> bool:
        return all(self.nvlinked(a, b) for a, b in combinations(gpus, 2))

    def best_set(self, free: Sequence[int], k: int) -> tuple[int, ...] | None:
        """The free set of ``k`` GPUs with the highest set score (lowest indices on ties)."""
        found = self.best_sets(free, k)
        return found[0] if found is not None else None

    def best_sets(self, free: Sequence[int], k: int) -> tuple[tuple[int, ...], frozenset[int]] | None:
        """``best_set`` and every GPU of a free set that scores as well: the device plugin's allocator takes
        the first of the sets that tie in the order the kubelet lists the free GPUs, and the kubelet lists them
        in no fixed order (a Go map's), so any of them may be handed out."""
        pool = sorted(free)
        if k <= 0:
            return (), frozenset()
        if k > len(pool):
            return None
        if k == len(pool):
            return tuple(pool), frozenset(pool)
        if k == 1 or self.alike(pool):
            return tuple(pool[:k]), frozenset(pool)
        if comb(len(pool), k) <= EXHAUSTIVE_LIMIT:
            best: tuple[int, ...] = ()
            best_score = -1
            alike: set[int] = set()
            for cand in combinations(pool, k):
                sc = self.set_score(cand)
                if sc > best_score:
                    best, best_score, alike = cand, sc, set(cand)
                elif sc == best_score:
                    alike.update(cand)
            return best, frozenset(alike)
        chosen = self._greedy(pool, k)
        return chosen, frozenset(chosen)

    def alike(self, pool: Sequence[int]) -> bool:
        """Every pair of ``pool`` linked alike (an NVSwitch board, one PCIe switch): every set scores the same."""
        s = self.scores
        pairs = {s[a][b] for a, b in combinations(pool, 2)}
        return len(pairs) <= 1

    def _greedy(self, pool: list[int], k: int) -> tuple[int, ...]:
        chosen = [pool[0]]  # greedy: grow from the best-connected pair
        rest = [g for g in pool if g != pool[0]]
        while len(chosen) < k:
            nxt = max(rest, key=lambda g: (sum(self.scores[g][c] for c in chosen), -g))
            chosen.append(nxt)
            rest.remove(nxt)
        return tuple(sorted(chosen))

    def largest_nvlink_set(self, free: Sequence[int]) -> int:
        """Size of the largest all-NVLink-connected subset of ``free`` (a clique)."""
        pool = sorted(free)
        best = 1 if pool else 0
        for size in range(len(pool), 1, -1):
            if size <= best:
                break
            if comb(len(pool), size) > EXHAUSTIVE_LIMIT:
                continue
            if any(self.all_nvlinked(c) for c in combinations(pool, size)):
                return size
        return best


def nvswitch(n: int, lanes: int = 18) -> GpuTopology:
    return _build("nvswitch", n, lambda a, b: Link.NVLINK * lanes)


def nvlink_pairs(n: int, lanes: int = 4) -> GpuTopology:
    """NVLink bridges between GPUs 0-1, 2-3, ...; other pairs over PCIe (two sockets)."""
    half = max(1, n // 2)
    return _build("nvlink-pairs", n, lambda a, b: Link.NVLINK * lanes if a // 2 == b // 2 else _pcie(a, b, half))


def pcie(n: int, sockets: int = 2) -> GpuTopology:
    per = max(1, -(-n // sockets))
    return _build("pcie", n, lambda a, b: _pcie(a, b, per))


def _pcie(a: int, b: int, per_socket: int) -> int:
    return int(Link.SAME_CPU if a // per_socket == b // per_socket else Link.CROSS_CPU)


def _build(kind: str, n: int, pair: object) -> GpuTopology:
    assert callable(pair)
    rows = tuple(tuple(0 if a == b else int(pair(a, b)) for b in range(n)) for a in range(n))
    return GpuTopology(kind, rows)


def infer(model: str, product: str, gpu_count: int, node_labels: dict[str, str]) -> GpuTopology:
    """A node's topology from an explicit label, else from what its platform is known to be."""
    lanes = NVLINK_LANES.get(model, 4)
    declared = node_labels.get(labels.TOPOLOGY_LABEL, "").lower()
    if declared == "nvswitch":
        return nvswitch(gpu_count, lanes)
    if declared == "nvlink-pairs":
        return nvlink_pairs(gpu_count, lanes)
    if declared == "pcie":
        return pcie(gpu_count)
    upper = product.upper()
    sxm = "SXM" in upper or "HBM3" in upper or model == "H200"
    if gpu_count == 8 and model in ("A100", "H100", "H200", "A800", "H800") and sxm:
        return nvswitch(gpu_count, lanes)
    return pcie(gpu_count)


def from_peers(peers: Sequence[Sequence[int]]) -> GpuTopology:
    """The topology a node agent reported: NVLink between the peers NVML lists (full lanes), the rest on
    PCIe (scored as across CPU sockets: NVML's PCIe detail is not reported)."""
    n = len(peers)
    linked = {(a, b) for a in range(n) for b in peers[a] if 0 <= b < n and b != a}
    linked |= {(b, a) for a, b in linked}
    scores = tuple(tuple(0 if a == b else Link.NVLINK * 12 if (a, b) in linked else Link.CROSS_CPU
                         for b in range(n)) for a in range(n))
    everyone = len(linked) == n * (n - 1)
    return GpuTopology("nvswitch" if everyone and n > 2 else "nvlink" if linked else "pcie", scores)
