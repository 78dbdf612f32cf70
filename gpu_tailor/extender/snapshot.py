"""What one request decides on: the nodes as of the last change, read-only, and the verdicts kept per ask.

kube-scheduler takes one snapshot of its cache per scheduling cycle, updated only for the nodes
whose generation moved, and its plugins never read the live maps. The extender does the same per
request: ``Cache.snapshot()`` clones the nodes that changed since the last request into ``NodeInfo``
entries and writes their fleet rows, then the verbs read only the ``Snapshot``. A snapshot stays as
it is until the next ``snapshot()`` call (one per request; requests are answered one at a time, and
nothing awaits between taking it and answering).

Fit verdicts are kept per ask (a pod's demand without its name) and node, stamped with the node's
generation: every change to a node (its object, a pod placed or removed) gives it a new generation,
so a kept verdict is reused only while the node is exactly as it was. kube-scheduler asks prioritize
right after filter about the same pod, and the replicas of a Job or Deployment arrive one after
another with the same ask; between two of them only the nodes that changed are checked again. The
part of a verdict that depends on the inventory alone is kept per ask and node *kind* (same health,
product and offerings, as the nodes of one pool are): a first ask works it out once per pool.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from gpu_tailor.extender.draholds import HeldGpus
from gpu_tailor.extender.records import PodRecord
from gpu_tailor.gpumodel.dra_state import DraState
from gpu_tailor.gpumodel.fleet import Fleet
from gpu_tailor.gpumodel.inventory import Offering
from gpu_tailor.gpumodel.policies import TailorPolicy
from gpu_tailor.gpumodel.schedule import Demand, Fit, NodeState, fit, inventory_verdict

KEPT_ASKS = 64  # distinct asks whose per-node verdicts are kept (least recently asked dropped first)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node as a snapshot holds it: a private copy of its state, never changed after it is taken.

    ``generation`` is new after every change to the node; ``kind`` groups nodes whose inventory verdicts
    agree; ``pods`` are the records of the pods counted there (bound, or assumed at bind), by
    namespace/name.
    """

    state: NodeState
    generation: int
    kind: int
    pods: Mapping[str, PodRecord]


@dataclass
class Kept:
    """What is kept for one ask: verdicts per node (generation, verdict), inventory verdicts per kind."""

    by_node: dict[str, tuple[int, Fit]] = field(default_factory=dict)
    by_kind: dict[int, Fit | Offering] = field(default_factory=dict)


class Verdicts:
    """``fit(node, demand, place=False)`` per ask and node, kept while the node's generation stands."""

    def __init__(self) -> None:
        self.asks: OrderedDict[Demand, Kept] = OrderedDict()
        # the nodes the last filter passed: (its ask, the snapshot's generation, their names)
        self.passed: tuple[Demand, int, frozenset[str]] | None = None
        # the nodes DRA serves a native resource on (``verbs.dra_served``), for (node layout, DRA layout, resource)
        self.served: tuple[tuple[int, int, str], frozenset[str]] | None = None

    def clear(self) -> None:
        self.asks.clear()
        self.passed = None
        self.served = None

    def filtered(self, demand: Demand, generation: int, passed: list[str]) -> None:
        """What filter passed for ``demand`` on the snapshot of ``generation``."""
        self.passed = (replace(demand, key=""), generation, frozenset(passed))

    def all_passed(self, demand: Demand, generation: int, names: list[str]) -> bool:
        """Whether the last filter, on a snapshot exactly like this one and for the same ask, passed every one of
        ``names``: prioritize, asked right after it about the nodes it passed, then need not fit them again."""
        last = self.passed
        if last is None or last[1] != generation or last[0] != replace(demand, key=""):
            return False
        return last[2].issuperset(names)

    def drop(self, node: str) -> None:
        """Forget a node that is gone."""
        for kept in self.asks.values():
            kept.by_node.pop(node, None)

    def fits(self, nodes: Mapping[str, NodeInfo], names: list[str], demand: Demand) -> list[Fit]:
        ask = replace(demand, key="")
        kept = self.asks.get(ask)
        if kept is None:
            kept = self.asks[ask] = Kept()
            if len(self.asks) > KEPT_ASKS:
                self.asks.popitem(last=False)
        else:
            self.asks.move_to_end(ask)
        out: list[Fit] = []
        append, by_kind, by_node = out.append, kept.by_kind, kept.by_node  # a loop over every candidate
        for name in names:
            info = nodes.get(name)
            if info is None:
                append(Fit(False, "node not known to gpu-tailor yet (watch catching up)"))
                continue
            hit = by_node.get(name)  # kept: nothing has changed on the node since it was asked
            if hit is not None and hit[0] == info.generation:
                append(hit[1])
                continue
            settled = by_kind.get(info.kind)
            if settled is None:
                settled = by_kind[info.kind] = inventory_verdict(info.state.inventory, demand)
            if isinstance(settled, Fit):  # the inventory settles it, whatever runs there
                append(settled)
                continue
            verdict = fit(info.state, demand, place=False, settled=settled)
            by_node[name] = (info.generation, verdict)
            append(verdict)
        return out


@dataclass(frozen=True)
class Snapshot:
    """The read side of the cache for one request.

    ``fleet`` holds a row per node of ``nodes`` with the same numbers (written when the snapshot was
    taken), and ``policy`` scores those rows with the pod mix learnt so far. ``verdicts`` only keeps
    answers of pure functions: reading through it changes no decision.
    """

    nodes: Mapping[str, NodeInfo]
    fleet: Fleet
    policy: TailorPolicy
    degraded: frozenset[str]
    verdicts: Verdicts
    ready: bool
    dra: DraState = field(default_factory=lambda: DraState(enabled=False))  # DRA pools (read, not copied)
    generation: int = 0  # the cache's last node generation when taken: equal snapshots have equal generations
    node_layout: int = 0  # the cache's count of nodes added, removed or changed in kind when taken
    held: Mapping[str, Mapping[str, HeldGpus]] = field(default_factory=dict)  # DRA nodes' GPUs plans hold (read)

    def fits(self, names: list[str], demand: Demand) -> list[Fit]:
        """``fit(node, demand, place=False)`` per node name, kept while a node is unchanged."""
        return self.verdicts.fits(self.nodes, names, demand)
