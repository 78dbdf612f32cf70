"""How much a placement policy could still win: GPU-only packing references for a replay.

A policy's allocation at 100% arrived is what it loses to failed pods. Part of that loss no policy
can avoid: an 810-milli pod leaves 190 milli that only the rare pods of 190 milli or less can use.
These references pack the same arrivals (up to the moment they reach the fleet's GPU capacity) with
CPU, memory, GPU models and node boundaries ignored -- whole-GPU asks take any idle GPUs -- so they
are optimistic for any real scheduler. The one exception: an ask that no node of the fleet could hold
even empty (more CPU, memory or GPUs than any node of an allowed model has) fails under every
policy, so it fails here too.

- ``online``: each ask as it arrives, sharing asks best-fit (the fitting GPU with least left over,
  an idle GPU only when none fits): what a scheduler that cannot read ahead reaches on GPUs alone.
- ``offline``: the whole prefix known in advance, whole-GPU asks first, then the sharing asks
  best-fit in decreasing size: near the best any packing of these GPUs reaches.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpu_tailor.gpumodel.fleet import MILLI, Shape
from gpu_tailor.simulate.trace import TraceNode


@dataclass(frozen=True, slots=True)
class Headroom:
    online: float  # allocation % of the fleet's GPUs
    offline: float


class _Gpus:
    """Idle GPUs and the free milli of the partly used ones (sorted)."""

    def __init__(self, idle: int) -> None:
        self.idle = idle
        self.gaps: list[int] = []

    def whole(self, count: int) -> bool:
        if self.idle < count:
            return False
        self.idle -= count
        return True

    def share(self, size: int) -> bool:
        """Best fit: the partly used GPU with least left over, an idle one only when none fits."""
        i = bisect.bisect_left(self.gaps, size)
        if i < len(self.gaps):
            gap = self.gaps.pop(i)
        elif self.whole(1):
            gap = MILLI
        else:
            return False
        if gap > size:
            bisect.insort(self.gaps, gap - size)
        return True


def hostable(shape: Shape, nodes: Sequence[TraceNode]) -> bool:
    """Whether some node of ``nodes`` could hold ``shape`` if it ran nothing else."""
    return any(n.cpu >= shape.cpu and n.mem >= shape.mem and n.gpus >= shape.gpus
               and (not shape.models or n.model in shape.models) for n in nodes)


def headroom(asks: Iterable[Shape], nodes: Sequence[TraceNode]) -> Headroom:
    """Both references for ``asks`` (in arrival order) on the GPUs of ``nodes``, at 100% arrived."""
    gpus = sum(n.gpus for n in nodes)
    capacity = gpus * MILLI
    prefix: list[Shape] = []
    arrived = 0
    known: dict[Shape, bool] = {}
    for shape in asks:
        if arrived + shape.gpu_milli > capacity:
            break
        arrived += shape.gpu_milli
        if shape.gpus:
            if shape not in known:
                known[shape] = hostable(shape, nodes)
            if known[shape]:
                prefix.append(shape)

    online, placed = _Gpus(gpus), 0
    for shape in prefix:
        if online.share(shape.milli) if shape.sharing else online.whole(shape.gpus):
            placed += shape.gpu_milli

    # offline: whole asks first (they leave nothing over), then sharing asks in decreasing size
    offline = _Gpus(gpus)
    best = sum(s.gpu_milli for s in prefix if not s.sharing and offline.whole(s.gpus))
    best += sum(m for m in sorted((s.milli for s in prefix if s.sharing), reverse=True) if offline.share(m))
    return Headroom(100 * placed / capacity, 100 * best / capacity)
