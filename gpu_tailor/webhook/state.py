"""What the webhook knows of the cluster: node inventories (and, offline, pods), as candidates.

One writer (the watch or the cluster-file loader) calls ``reset``/``apply``; handlers call
``candidates()``, which is recomputed only when something changed.
"""

from __future__ import annotations

from typing import Any

from gpu_tailor.gpumodel import catalog
from gpu_tailor.gpumodel.ask import from_pod
from gpu_tailor.gpumodel.catalog import Candidate, from_inventories
from gpu_tailor.gpumodel.inventory import NodeInventory, from_node
from gpu_tailor.webhook.config import AdmissionPolicy, DeclaredOffering


class ClusterView:
    def __init__(self, policy: AdmissionPolicy) -> None:
        self.policy = policy
        self.nodes: dict[str, NodeInventory] = {}
        self.used: dict[str, dict[str, int]] = {}
        self.ready = False
        self._cache: list[Candidate] | None = None
        self._declared = [declared_candidate(o) for o in policy.offerings]

    def reset(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]] | None = None) -> None:
        self.nodes = {inv.name: inv for inv in map(from_node, nodes)}
        self.used = usage(pods or [])
        self.ready = True
        self._cache = None

    def apply(self, event: str, node: dict[str, Any]) -> None:
        name = str((node.get("metadata") or {}).get("name", ""))
        if event == "DELETED":
            self.nodes.pop(name, None)
        else:
            self.nodes[name] = from_node(node)
        self._cache = None

    def candidates(self) -> list[Candidate]:
        if self._cache is None:
            self._cache = from_inventories(self.nodes.values(), self.used) + self._declared
        return self._cache


def usage(pods: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Units of each NVIDIA resource held per node by pods that are bound and not finished."""
    out: dict[str, dict[str, int]] = {}
    for pod in pods:
        spec = pod.get("spec") or {}
        node = spec.get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for resource, count in from_pod(pod).effective_native.items():
            per = out.setdefault(node, {})
            per[resource] = per.get(resource, 0) + count
    return out


def declared_candidate(o: DeclaredOffering) -> Candidate:
    return catalog.declared_candidate(o.spec())
