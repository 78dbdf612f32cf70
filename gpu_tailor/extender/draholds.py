"""The GPUs group plans hold on DRA nodes, for the members still to come.

On a DRA node kube-scheduler's allocator picks a pod's devices (the first free ones that satisfy its claim, in the
order the slices list them) in that pod's own cycle; nothing can be reserved with it. So the extender holds them in
its own books: each slot of a plan on a DRA node holds its GPUs (or its share of one) here, the node's fleet row counts
them as taken (``held_free``), and the filter passes another claim pod, or a native ask DRA serves, on that node only
where its devices leave room for what is held (``room``). The allocator hands the member the first devices free when
it comes, which need not be the ones the plan named: what is held is how many, and how much of a shared GPU.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.ask import from_canonical
from gpu_tailor.gpumodel.devices import dra as claims
from gpu_tailor.gpumodel.devices.dra_rungs import RungKind
from gpu_tailor.gpumodel.dra_state import DraState
from gpu_tailor.gpumodel.fleet import MILLI, Array

HeldGpus = tuple[tuple[int, ...], int]  # the GPUs a slot was planned on, and the milli it takes of each


@dataclass
class DraHolds:
    """Per DRA node, what each reservation there holds (by the reservation's key)."""

    by_node: dict[str, dict[str, HeldGpus]] = field(default_factory=dict)

    def hold(self, node: str, key: str, gpus: tuple[int, ...], milli: int) -> None:
        self.by_node.setdefault(node, {})[key] = (gpus, milli)

    def drop(self, node: str, key: str) -> None:
        held = self.by_node.get(node)
        if held is not None and held.pop(key, None) is not None and not held:
            del self.by_node[node]

    def on(self, node: str) -> Iterable[HeldGpus]:
        return (self.by_node.get(node) or {}).values()


def claimed(pod: dict[str, Any]) -> bool:
    """Whether the webhook sent the pod's GPUs to DRA pools (backing ``dra:...``: its claim is the allocator's)."""
    return str(((pod.get("metadata") or {}).get("annotations") or {}).get(labels.ANN_BACKING, "")).startswith("dra:")


def claim_ladders(dra: DraState, pod: dict[str, Any]) -> claims.Ladders | None:
    """The rungs of a pod the webhook sent to DRA pools (``claimed``), from its ask annotation; None for any other
    pod."""
    if not dra.enabled or not claimed(pod):
        return None
    raw = str((pod["metadata"].get("annotations") or {}).get(labels.ANN_ASK, ""))
    # kept with the DRA state until its slices or classes change: filter, prioritize and a group's plan read a claim
    # pod's rungs several times, and reading them costs more the more pools there are (a few ms at 1,000 DRA nodes)
    kept = dra.by_layout.get(key := f"rungs:{raw}", dra)
    if kept is not dra:
        return cast(claims.Ladders | None, kept)
    ask = from_canonical(raw)
    planned = claims.ladders_for(ask, ask.isolation, dra.inventory(), tuple(dra.classes)) if ask is not None else None
    out = planned[1] if planned is not None and not isinstance(planned, claims.DraRefusal) else None
    if len(dra.by_layout) >= KEPT_LADDERS:
        dra.by_layout.clear()
    dra.by_layout[key] = out
    return out


KEPT_LADDERS = 512  # asks whose rungs are kept per DRA layout


def held_free(free: tuple[int, ...], held: Iterable[HeldGpus]) -> tuple[int, ...]:
    """A DRA node's free milli per GPU (the allocator's order) less what ``held`` keeps: each slot's planned GPUs
    where they still have its share, else the first that have (as the allocator will pick for the member)."""
    out = np.array(free, np.int64)
    for gpus, milli in held:
        for g in gpus:
            if not 0 <= g < len(out) or out[g] < milli:
                room = np.flatnonzero(out >= milli)
                if not len(room):
                    break  # more held than is free: the row shows none left
                g = int(room[0])
            out[g] -= milli
    return tuple(int(v) for v in out)


def room(free: Array, whole: int, shares: Iterable[int]) -> bool:
    """Whether a row's free milli per GPU (holdings taken out) has ``whole`` idle GPUs and, on others, a GPU with room
    for each share (milli), taken one after the other."""
    left = free.copy()
    idle = np.flatnonzero(left == MILLI)
    if len(idle) < whole:
        return False
    left[idle[:whole]] = 0
    for milli in shares:
        fits = np.flatnonzero(left >= milli)
        if not len(fits):
            return False
        left[fits[0]] -= milli
    return True


def claim_need(picks: Iterable[claims.Pick | None]) -> tuple[int, list[int]]:
    """The whole GPUs and the shares (milli of a GPU) the allocator's picks for a claim take; a MIG device takes
    neither (plans hold whole GPUs and shares, never MIG devices)."""
    whole, shares = 0, []
    for p in picks:
        if p is None:
            continue
        if p.rung.kind is RungKind.GPU:
            whole += p.rung.count
        elif p.rung.kind is RungKind.SHARED:
            c = p.rung.consumed
            shares.append(max(1, c.numerator * MILLI // c.denominator))
    return whole, shares
