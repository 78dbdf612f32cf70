"""MIG layouts advised (issue 32): ``capacity`` names the Pending pods whose MIG instance no node has free, and per
MIG pool suggests a mig-parted standard layout for idle nodes that would place them, never relabelling anything."""

from __future__ import annotations

import copy
from typing import Any

from gpu_tailor.gpumodel import labels, mig
from gpu_tailor.gpumodel.mig import layouts
from gpu_tailor.tools.capacity import capacity, table
from gpu_tailor.tools.explain import explain
from gpu_tailor.tools.migadvice import recent_demand
from gpu_tailor.tools.source import Cluster
from gpu_tailor.webhook.config import AdmissionPolicy
from tests.conftest import node_fixture


def h100_cut_small(name: str) -> dict[str, Any]:
    """An 8-GPU H100 node that mig-manager cut all-1g.10gb: 56 instances of 1g.10gb, nothing else."""
    node = copy.deepcopy(node_fixture("a100-mig-mixed-0"))
    node["metadata"]["name"] = name
    node_labels = {k: v for k, v in node["metadata"]["labels"].items() if not k.startswith("nvidia.com/mig-")}
    node_labels.update({"kubernetes.io/hostname": name, labels.GPU_PRODUCT: "NVIDIA-H100-80GB-HBM3",
                        labels.MIG_CONFIG: "all-1g.10gb", "nvidia.com/mig-1g.10gb.count": "56",
                        "nvidia.com/mig-1g.10gb.memory": "9856", "nvidia.com/mig-1g.10gb.replicas": "1",
                        "nvidia.com/mig-1g.10gb.product": "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"})
    node["metadata"]["labels"] = node_labels
    for part in ("capacity", "allocatable"):
        alloc = {k: v for k, v in node["status"][part].items() if not k.startswith("nvidia.com/mig-")}
        node["status"][part] = alloc | {"nvidia.com/mig-1g.10gb": "56"}
    return node


def pod(name: str, resource: str, node: str = "", created: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"limits": {resource: "1"},
                                                                        "requests": {resource: "1"}}}]}
    if node:
        spec["nodeName"] = node
    meta: dict[str, Any] = {"name": name, "namespace": "team-a", "uid": name}
    if created:
        meta["creationTimestamp"] = created
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
            "status": {"phase": "Running" if node else "Pending"}}


def test_pending_3g_pods_on_a_pool_cut_into_1g_get_a_layout_that_places_them() -> None:
    busy = pod("small-0", "nvidia.com/mig-1g.10gb", node="h100-mig-a")  # h100-mig-a holds a pod: not re-cut
    pending = [pod(f"big-{i}", "nvidia.com/mig-3g.40gb") for i in range(3)]
    cluster = Cluster([h100_cut_small("h100-mig-a"), h100_cut_small("h100-mig-b")], [busy, *pending], None, "test")
    report = capacity(cluster)
    assert [(u.pod, u.resource) for u in report.unsold] == [(f"team-a/big-{i}", "nvidia.com/mig-3g.40gb")
                                                            for i in range(3)]
    (advice,) = report.mig_advice
    assert (advice.sku, advice.nodes, advice.places, advice.pending, advice.gpus_recut) == (
        "H100-80GB", ["h100-mig-b"], 3, 3, 8)
    assert advice.layout.get("3g.40gb", 0) >= 1 and advice.config in layouts(mig.H100_80GB)
    text = table(report)
    assert "team-a/big-0: nvidia.com/mig-3g.40gb" in text
    assert f"label h100-mig-b {labels.MIG_CONFIG}={advice.config}" in text and "places 3 of 3" in text


def test_no_advice_where_every_pending_pod_has_a_place() -> None:
    cluster = Cluster([h100_cut_small("h100-mig-a")], [pod("small", "nvidia.com/mig-1g.10gb")], None, "test")
    report = capacity(cluster)
    assert report.unsold == [] and report.mig_advice == []


def test_the_standard_layouts_are_valid_cuts_of_their_gpu() -> None:
    for sku in mig.SKUS:
        for config, per_gpu in layouts(sku).items():
            cut = [p for name, n in per_gpu.items() for p in [sku.resolve(name)] * n]
            assert all(cut) and mig.fits_together(sku, [p for p in cut if p]), (sku.key, config)
    assert layouts(mig.A100_40GB)["all-balanced"] == {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}


def test_among_layouts_that_place_as_many_the_recent_demand_decides() -> None:
    """One Pending 3g.40gb pod: all-3g.40gb and all-balanced both place it on one idle node. Ten 1g.10gb pods asked
    for in the last day (bound on the other node) tip it to all-balanced, whose 1g instances would hold them; the
    same asks two days before the newest pod do not count."""
    big = pod("big", "nvidia.com/mig-3g.40gb", created="2026-11-26T11:00:00Z")
    nodes = [h100_cut_small("h100-mig-a"), h100_cut_small("h100-mig-b")]
    alone = capacity(Cluster(nodes, [big, pod("old", "nvidia.com/mig-1g.10gb", "h100-mig-a",
                                              "2026-11-20T11:00:00Z")], None, "test"))
    assert [a.config for a in alone.mig_advice] == ["all-3g.40gb"] and alone.mig_advice[0].recent == 1  # itself
    lately = [pod(f"small-{i}", "nvidia.com/mig-1g.10gb", "h100-mig-a", f"2026-11-26T0{i}:00:00Z") for i in range(9)]
    lately.append(pod("small-9", "nvidia.com/mig-1g.10gb", "h100-mig-a", "2026-11-24T11:00:00Z"))  # too old
    report = capacity(Cluster(nodes, [big, *lately], None, "test"))
    (advice,) = report.mig_advice
    assert (advice.config, advice.nodes, advice.places, advice.holds, advice.recent) == (
        "all-balanced", ["h100-mig-b"], 1, 10, 10)  # the nine 1g asks and the Pending 3g one itself
    assert "holds 10 of 10 MIG ask(s) of the last 24 h" in table(report)
    wider = capacity(Cluster(nodes, [big, *lately], None, "test"), recent_hours=72)
    assert wider.mig_advice[0].recent == 11


def test_explain_names_a_mig_ask_no_node_sells_any_more() -> None:
    cluster = Cluster([h100_cut_small("h100-mig-a")], [], None, "test")
    said = explain(pod("big", "nvidia.com/mig-3g.40gb"), "pod", cluster, AdmissionPolicy())
    assert said.chosen is None
    assert any(n.startswith("no node sells nvidia.com/mig-3g.40gb now") and "gpu-tailor capacity" in n
               for n in said.notes), said.notes
    sold = explain(pod("small", "nvidia.com/mig-1g.10gb"), "pod", cluster, AdmissionPolicy())
    assert sold.chosen == "h100-mig-a" and not any("no node sells" in n for n in sold.notes)


def test_timestamps_without_a_zone_are_read_as_utc() -> None:
    pods = [pod("a", "nvidia.com/mig-1g.10gb", created="2026-11-26T10:00:00"),  # no zone: as a hand-made dump
            pod("b", "nvidia.com/mig-1g.10gb", created="2026-11-26T11:00:00Z"),
            pod("c", "nvidia.com/mig-2g.20gb", created="not a time")]
    assert recent_demand(pods, 24) == {"1g.10gb": 2}
