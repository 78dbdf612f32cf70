"""What the webhook knows of the cluster: node inventories and the GPU units bound pods hold.

Two writers, one per kind, each the only writer of its half (the node watch and the pod watch, or the
cluster-file loader for both): ``reset_nodes``/``apply_node`` and ``reset_pods``/``apply_pod``.
Handlers call ``candidates()``, which is recomputed only when something changed. Usage is what makes
"prefer capacity that is free now" and the "no X is free right now" warning true in a cluster.

Per pod only a slim record is kept -- its node and the NVIDIA units it holds there -- and only for
pods that are bound, not finished, and hold some; the pod object itself is dropped. The watch hands pods
over projected (``kube.podfields.slim_pod``: never managedFields, env, volumes or status), and a relist page
by page (``PodRelist``), so memory follows the GPU pods held, not the cluster's pod objects.

Ready means able to answer correctly: both halves listed once. A watch that has gone quiet afterwards
(an API server brown-out) does not make the webhook unready -- what it protects is only a preference and
a warning -- it shows as the staleness metric, a log line, and a warning on the GPU pods admitted meanwhile.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Iterable
from typing import Any

from gpu_tailor.gpumodel import catalog
from gpu_tailor.gpumodel.ask import from_pod
from gpu_tailor.gpumodel.catalog import Candidate, from_inventories
from gpu_tailor.gpumodel.dra import DeviceType
from gpu_tailor.gpumodel.dra_state import DraState
from gpu_tailor.gpumodel.inventory import NodeInventory, from_node
from gpu_tailor.gpumodel.schedule import domain_of
from gpu_tailor.kube.freshness import STALE_AFTER, Freshness
from gpu_tailor.webhook.config import AdmissionPolicy, DeclaredOffering

# The pods that can hold GPUs: what the pod list and watch ask the API server for. A pod that finishes
# stops matching, and the watch then delivers it as DELETED.
ACTIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"

Held = tuple[str, tuple[tuple[str, int], ...]]  # (node, ((resource, units), ...))

log = logging.getLogger(__name__)


class ClusterView:
    def __init__(self, policy: AdmissionPolicy, stale_after: float = STALE_AFTER) -> None:
        self.policy = policy
        self.stale_after = stale_after  # seconds without news from the API server before the view is stale
        self.nodes: dict[str, NodeInventory] = {}
        self.used: dict[str, dict[str, int]] = {}  # node -> resource -> units held by bound pods
        self.held: dict[str, Held] = {}  # pod (uid, else namespace/name) -> what it holds where
        self.nodes_synced = False
        self.pods_synced = False
        self.freshness: dict[str, Freshness] = {}  # per watched resource, when watches keep the view
        self.dra = DraState(enabled=False)  # DRA pools; on where watches find resource.k8s.io/v1
        self._cache: list[Candidate] | None = None
        self._largest: tuple[int, int] | None = None  # ``largest_domain``, until a node changes (or DRA's slices)
        self._largest_at: tuple[int, int] | None = None  # the DRA state and layout it was counted at
        self._takes_pods: frozenset[str] = frozenset()
        self._declared = [declared_candidate(o) for o in policy.offerings]
        self._was_stale = False

    @property
    def ready(self) -> bool:
        """Both halves listed once (and DRA's three kinds, where it is on): from then on every answer is correct,
        if perhaps not the best."""
        return self.nodes_synced and self.pods_synced and self.dra.ready

    def staleness(self) -> float:
        """Seconds since the API server last showed the staler half current (0 without watches)."""
        return max((f.staleness() for f in self.freshness.values()), default=0.0)

    def stale(self) -> float | None:
        """The staleness once a watch has gone quiet for longer than the API server would keep it open, else
        None; logs the moment the view turns stale and the moment it is current again."""
        age = self.staleness()
        stale = age > self.stale_after and self.ready
        if stale != self._was_stale:
            self._was_stale = stale
            if stale:
                log.warning("no news from the API server for %.0fs: still admitting pods, but 'prefer what is "
                            "free now' works from what was known then (metric gpu_tailor_webhook_watch_staleness_"
                            "seconds)", age)
            else:
                log.info("the API server is heard from again: the view of the cluster is current")
        return age if stale and math.isfinite(age) else None

    def reset(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]] | None = None) -> None:
        """Both halves at once (``--cluster-file``, tests)."""
        self.reset_nodes(nodes)
        self.reset_pods(pods or [])

    def reset_nodes(self, nodes: list[dict[str, Any]]) -> None:
        self.nodes = {inv.name: inv for inv in map(from_node, nodes)}
        self.nodes_synced = True
        self._cache = self._largest = None

    def apply_node(self, event: str, node: dict[str, Any]) -> None:
        name = str((node.get("metadata") or {}).get("name", ""))
        if event == "DELETED":
            self.nodes.pop(name, None)
        else:
            self.nodes[name] = from_node(node)
        self._cache = self._largest = None

    def reset_pods(self, pods: list[dict[str, Any]]) -> None:
        relist = self.relist_pods()
        relist.page(pods)
        relist.done()

    def relist_pods(self) -> PodRelist:
        """A pod relist, fed page by page (``kube.watch.Relist``)."""
        return PodRelist(self)

    def _install(self, held: dict[str, Held]) -> None:
        self.held = held
        self.used = {}
        for h in held.values():
            self._count(h, +1)
        self.pods_synced = True
        self._cache = None

    def apply_pod(self, event: str, pod: dict[str, Any]) -> None:
        key = pod_id(pod)
        before = self.held.pop(key, None)
        after = None if event == "DELETED" else holding(pod)
        if after is not None:
            self.held[key] = after
        if before != after:
            if before is not None:
                self._count(before, -1)
            if after is not None:
                self._count(after, +1)
            self._cache = None

    def _count(self, held: Held, sign: int) -> None:
        node, units = held
        per = self.used.setdefault(node, {})
        for resource, n in units:
            left = per.get(resource, 0) + sign * n
            if left:
                per[resource] = left
            else:
                per.pop(resource, None)
        if not per:
            del self.used[node]

    def candidates(self) -> list[Candidate]:
        if self._cache is None:
            self._cache = from_inventories(self.nodes.values(), self.used) + self._declared
            self._takes_pods = frozenset(name for name, inv in self.nodes.items() if not inv.unschedulable)
        return self._cache

    def largest_domain(self, dra: bool = True) -> int:
        """The most GPUs one NVLink domain has: the nodes sharing a domain label (``schedule.domain_of``), or a node
        alone. A DRA node's GPUs are the GPU devices its pools publish; ``dra`` False: the device plugin's alone."""
        state = self.dra
        at = (id(state), state.layout) if state.enabled else None  # slices and classes as they were
        if self._largest is None or self._largest_at != at:
            per: dict[str, int] = {}
            plugin: dict[str, int] = {}
            inventory = state.inventory() if state.enabled else None
            pooled = inventory.nodes() if inventory is not None else set()
            for name, inv in self.nodes.items():
                key = domain_of(inv.labels) or f"node/{name}"
                plugin[key] = plugin.get(key, 0) + inv.gpu_count
                gpus = inv.gpu_count
                if not gpus and inventory is not None and name in pooled:
                    gpus = sum(1 for p in inventory.on_node(name) for d in p.devices.values()
                               if d.type is DeviceType.GPU)
                per[key] = per.get(key, 0) + gpus
            self._largest = (max(per.values(), default=0), max(plugin.values(), default=0))
            self._largest_at = at
        return self._largest[0] if dra else self._largest[1]

    def nodes_taking_pods(self) -> frozenset[str]:
        """The nodes not cordoned (DRA pools elsewhere are left out of a choice), as of the last change."""
        self.candidates()
        return self._takes_pods


class PodRelist:
    """A pod relist: each page is folded into slim records as it arrives, so no more than one page of pods
    is held at a time; the view takes the new records (and drops every old one) once the list is complete."""

    def __init__(self, view: ClusterView) -> None:
        self.view = view
        self.held: dict[str, Held] = {}

    def page(self, items: list[dict[str, Any]]) -> Iterable[None]:
        for pod in items:
            held = holding(pod)
            if held is not None:
                self.held[pod_id(pod)] = held
        return ()

    def done(self) -> Iterable[None]:
        self.view._install(self.held)
        return ()


def pod_id(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}")


def holding(pod: dict[str, Any]) -> Held | None:
    """The node a pod is bound to and the NVIDIA units it holds there; None for a pod that holds none
    (not bound, finished, or asking for no GPU)."""
    spec = pod.get("spec") or {}
    node = spec.get("nodeName")
    if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return None
    units = tuple(sorted((r, n) for r, n in from_pod(pod).effective_native.items() if n > 0))
    return (sys.intern(str(node)), units) if units else None  # one string per node, however many pods


def usage(pods: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Units of each NVIDIA resource held per node by pods that are bound and not finished."""
    view = ClusterView(AdmissionPolicy())
    view.reset_pods(pods)
    return view.used


def declared_candidate(o: DeclaredOffering) -> Candidate:
    return catalog.declared_candidate(o.spec())
