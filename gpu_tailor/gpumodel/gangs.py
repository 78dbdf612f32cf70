"""Groups of pods placed whole: the NVLink domain a gang goes to, and each member's node and GPUs.

A gang is ``size`` pods of one shape that are useless until every one of them runs (the workers of a distributed
training or inference job). It is placed all at once or not at all: ``plan`` returns every member's place, or None.
Most such jobs also need all their members in one NVLink domain: the 18 trays of an NVL72 rack (the nodes that share
``nvidia.com/gpu.clique``), a rack or network block an admin names, or one node's NVSwitch where nothing else is said
(``Fleet.domain``). A gang asks for one domain ``REQUIRED``, ``PREFERRED`` (one if any holds it, else anywhere) or not
at all (``ANYWHERE``).

The domain is chosen at domain level as the policies choose at GPU level, by what the placement takes from the work
still to come:

1. a domain in use before an untouched one: a whole domain is what the next full-domain job needs;
2. the least loss for the gangs seen so far (``GangMix``): how many GPUs of each gang type (members x GPUs) the domain
   can no longer host once this one is in, weighted by that type's share of gang GPU demand (FGD's fragmentation, one
   level up);
3. the tightest: the fewest idle GPUs left in the domain;
4. the node rank, as between nodes.

Inside the domain each member is placed by the policy, one after the other, so the GPUs a gang takes are the ones the
packing policy would pick for single pods there. ``Fleet.spare_whole_domains`` is the other half: single pods keep off
an untouched domain while a domain in use still holds them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from gpu_tailor.gpumodel.fleet import MILLI, Array, Fleet, Shape
from gpu_tailor.gpumodel.policies.base import NodeChoice, Policy

REQUIRED, PREFERRED, ANYWHERE = "required", "preferred", "anywhere"
DOMAIN_ASKS = (REQUIRED, PREFERRED, ANYWHERE)
# domains a plan compares, the best by their bound first: it places the gang member by member in each until this many
# hold it, giving up after four times as many tries (the bound is an upper bound: NVLink sets, CPU per node)
TRIED_DOMAINS = 16
_MANY = 1 << 30


@dataclass(frozen=True, slots=True)
class Gang:
    """``size`` members of one ``member`` shape, and where they may be (``DOMAIN_ASKS``)."""

    size: int
    member: Shape
    domain: str = REQUIRED

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"a gang has at least one member, not {self.size}")
        if self.domain not in DOMAIN_ASKS:
            raise ValueError(f"domain ask {self.domain!r}: expected one of {', '.join(DOMAIN_ASKS)}")

    @property
    def kind(self) -> tuple[int, int, int]:
        """The gang type ``GangMix`` counts: members, GPUs and milli per member."""
        return (self.size, self.member.gpus, self.member.milli)


@dataclass(frozen=True, slots=True)
class GangPlan:
    """Every member's node and GPUs, and the domain that holds them all (-1: spread over several)."""

    domain: int
    members: tuple[NodeChoice, ...]

    @property
    def nodes(self) -> tuple[int, ...]:
        return tuple(m.node for m in self.members)


class GangMix:
    """The gang types seen so far, by the GPU milli they brought (the domain-level mix)."""

    def __init__(self) -> None:
        self.milli: Counter[tuple[int, int, int]] = Counter()
        self.shapes: dict[tuple[int, int, int], Shape] = {}

    def observe(self, gang: Gang) -> None:
        if gang.member.gpus and gang.size > 1:
            self.milli[gang.kind] += gang.size * gang.member.gpu_milli
            self.shapes.setdefault(gang.kind, gang.member)

    def weights(self) -> list[tuple[int, Shape, float]]:
        total = sum(self.milli.values())
        return [(k[0], self.shapes[k], m / total) for k, m in self.milli.items()] if total else []


def slots(fleet: Fleet, shape: Shape, rows: Array) -> Array:
    """Per row: how many members of ``shape`` it holds at once, counting GPUs, CPU and memory (an upper bound where
    a member needs an NVLink set on a node whose GPUs are not all linked)."""
    if shape.gpus == 0:
        by_gpu = np.full(len(rows), _MANY, np.int64)
    else:
        free = np.maximum(fleet.gpu[rows], 0)
        by_gpu = (free // shape.milli).sum(axis=1) if shape.sharing else (free >= shape.milli).sum(axis=1) // shape.gpus
    by_cpu = fleet.cpu[rows] // shape.cpu if shape.cpu > 0 else by_gpu
    by_mem = fleet.mem[rows] // shape.mem if shape.mem > 0 else by_gpu
    out: Array = np.where(fleet.model_allowed(shape, rows), np.minimum(np.minimum(by_gpu, by_cpu), by_mem), 0)
    return np.maximum(out, 0)


def domain_slots(fleet: Fleet, shape: Shape, rows: Array) -> Array:
    """Per domain id: how many members of ``shape`` its ``rows`` hold at once (``slots`` summed)."""
    out: Array = np.bincount(fleet.domain[rows], weights=slots(fleet, shape, rows),
                             minlength=len(fleet.domain_names)).astype(np.int64)
    return out


def idle_gpus(fleet: Fleet, rows: Array) -> Array:
    """Per domain id: its idle GPUs among ``rows``."""
    out: Array = np.bincount(fleet.domain[rows], weights=(fleet.gpu[rows] == MILLI).sum(axis=1),
                             minlength=len(fleet.domain_names)).astype(np.int64)
    return out


def members_of(fleet: Fleet, rows: Array) -> dict[int, Array]:
    """The rows of each domain among ``rows``."""
    order = np.argsort(fleet.domain[rows], kind="stable")
    ids, starts = np.unique(fleet.domain[rows][order], return_index=True)
    return {int(d): rows[part] for d, part in zip(ids, np.split(order, starts[1:]), strict=True)}


def _place(policy: Policy, gang: Gang, rows: Array) -> list[NodeChoice] | None:
    """Every member placed by ``policy`` on ``rows``, one after the other, taken on the fleet; None (and nothing
    taken) where one does not fit."""
    fleet = policy.fleet
    taken: list[NodeChoice] = []
    for _ in range(gang.size):
        choice = policy.choose(gang.member, rows)
        if choice is None:
            _release(fleet, gang.member, taken)
            return None
        fleet.take(choice.node, gang.member, choice.gpus)
        taken.append(choice)
    return taken


def _release(fleet: Fleet, shape: Shape, taken: list[NodeChoice]) -> None:
    for c in reversed(taken):
        fleet.release(c.node, shape, c.gpus)


def _loss(fleet: Fleet, mix: list[tuple[int, Shape, float]], rows: Array, before: list[int]) -> float:
    """What placing the gang took from the gang types seen, in GPUs weighted by their share (``before``: how many
    gangs of each type ``rows`` held before)."""
    loss = 0.0
    for (size, shape, weight), had in zip(mix, before, strict=True):
        now = int(slots(fleet, shape, rows).sum()) // size
        loss += weight * (had - now) * size * shape.gpus
    return loss


def plan(policy: Policy, gang: Gang, mix: GangMix | None = None, rows: Array | None = None) -> GangPlan | None:
    """Where every member of ``gang`` goes, all in one domain where it asks for one (``Gang.domain``); None where the
    gang cannot be placed whole. Nothing is taken on the fleet: the caller takes the plan's members (the simulator) or
    holds their GPUs for them (the extender)."""
    fleet = policy.fleet
    rows = fleet.rows() if rows is None else rows
    rows = rows[fleet.feasible(gang.member, rows)] if len(rows) else rows
    if gang.domain != ANYWHERE:
        chosen = _in_one_domain(policy, gang, mix, rows)
        if chosen is not None or gang.domain == REQUIRED:
            return chosen
    taken = _place(policy, gang, rows)
    if taken is None:
        return None
    _release(fleet, gang.member, taken)
    domains = {int(fleet.domain[c.node]) for c in taken}
    return GangPlan(domains.pop() if len(domains) == 1 else -1, tuple(taken))


def _in_one_domain(policy: Policy, gang: Gang, mix: GangMix | None, rows: Array) -> GangPlan | None:
    fleet = policy.fleet
    hold = domain_slots(fleet, gang.member, rows)
    fit = np.flatnonzero(hold >= gang.size)
    if not len(fit):
        return None
    groups = members_of(fleet, rows)
    untouched = fleet.untouched_domains()
    idle = idle_gpus(fleet, fleet.rows())
    rank = {d: int(fleet.rank[groups[d]].min()) for d in map(int, fit)}
    # the bound's order: in use first, then the fewest idle GPUs (tightest), then the rank
    order = sorted(map(int, fit), key=lambda d: (bool(untouched[d]), int(idle[d]), rank[d]))[:4 * TRIED_DOMAINS]
    weights = mix.weights() if mix is not None else []
    best: tuple[tuple[float, ...], GangPlan] | None = None
    alive = fleet.rows()
    held = 0  # domains that held it
    for d in order:
        if best is not None and untouched[d]:
            break  # a domain in use holds the gang: no untouched one comes before it (the key's first term)
        if held == TRIED_DOMAINS or (held and not weights):
            break  # without a gang mix, domains in the bound's order are already the tightest first
        domain_rows = alive[fleet.domain[alive] == d]
        lone = len(order) == 1  # nothing to compare: the loss is not needed
        before = [] if lone else [int(slots(fleet, shape, domain_rows).sum()) // size for size, shape, _ in weights]
        taken = _place(policy, gang, groups[d])
        if taken is None:
            continue
        held += 1
        loss = 0.0 if lone else round(_loss(fleet, weights, domain_rows, before), 6)
        key = (float(untouched[d]), loss, float((fleet.gpu[domain_rows] == MILLI).sum()), float(rank[d]))
        _release(fleet, gang.member, taken)
        if best is None or key < best[0]:
            best = (key, GangPlan(d, tuple(taken)))
    return best[1] if best is not None else None
