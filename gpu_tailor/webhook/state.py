"""What the webhook knows of the cluster: node inventories (and, offline, pods), as candidates.

One writer (the watch or the cluster-file loader) calls ``reset``/``apply``; handlers call
``candidates()``, which is recomputed only when something changed.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.ask import from_pod
from gpu_tailor.gpumodel.catalog import Candidate, from_inventories
from gpu_tailor.gpumodel.inventory import BackingKind, NodeInventory, Sharing, from_node
from gpu_tailor.gpumodel.mig import profile_for, sku_for_product
from gpu_tailor.gpumodel.products import normalise
from gpu_tailor.gpumodel.quantity import parse_bytes
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
    product = normalise(o.product)
    sku = sku_for_product(o.product)
    gpu_memory = parse_bytes(o.gpuMemory) // 2**20 if o.gpuMemory else (sku.memory_mib if sku else 0)
    selector = tuple((k, "In", (v,)) for k, v in sorted(o.nodeSelector.items()))
    if o.backing == "mig":
        profile = profile_for(o.product, o.migProfile or "")
        assert profile is not None  # checked by the config model
        resource = labels.GPU_RESOURCE if o.migStrategy == "single" else f"{labels.MIG_LABEL_PREFIX}{profile.name}"
        return Candidate(backing=f"mig-{profile.name}", kind=BackingKind.MIG, resource=resource, product=o.product,
                         model=product.model, fraction=Fraction(profile.compute_slices, profile.total_compute_slices),
                         memory_mib=profile.memory_mib, max_units_per_node=o.gpusPerNode * profile.max_instances,
                         affinity=selector or ((labels.MIG_STRATEGY, "In", (o.migStrategy,)),), declared=True)
    if o.backing == "whole":
        return Candidate(backing="whole", kind=BackingKind.WHOLE, resource=labels.GPU_RESOURCE, product=o.product,
                         model=product.model, fraction=Fraction(1), memory_mib=gpu_memory,
                         max_units_per_node=o.gpusPerNode,
                         affinity=selector or ((labels.GPU_PRODUCT, "In", (o.product,)),), declared=True)
    replicas = o.replicas or 2
    sharing = Sharing(o.backing)
    return Candidate(backing=f"shared:{o.backing}:{replicas}", kind=BackingKind.SHARED,
                     resource=labels.GPU_SHARED_RESOURCE if o.renamed else labels.GPU_RESOURCE, product=o.product,
                     model=product.model, fraction=Fraction(1, replicas), memory_mib=gpu_memory // replicas,
                     sharing=sharing, fail_requests_gt_one=o.failRequestsGreaterThanOne,
                     max_units_per_node=o.gpusPerNode * replicas,
                     affinity=selector or ((labels.GPU_SHARING_STRATEGY, "In", (o.backing,)),
                                           (labels.GPU_REPLICAS, "In", (str(replicas),))), declared=True)
