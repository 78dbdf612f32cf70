"""``capacity`` on the fixture nodes: GPUs per pool and product, what more fits, fragmentation, stranded
GPUs, and the nodes that cannot take GPU pods."""

from __future__ import annotations

import pytest

from gpu_tailor.tools.capacity import capacity, pool_of, table
from tests.tools.builders import fixture_cluster, pod

HGX = "h100-hgx-0"

EMPTY_FITS = {
    "1x H100": 13,  # 8 on the HGX board, 5 on the degraded node
    "8x H100 on NVLink": 1,  # only the healthy board has 8
    "mig-1g.5gb (A100)": 16, "mig-2g.10gb (A100)": 8, "mig-3g.20gb (A100)": 8,  # the all-balanced layout
    "mig-1g.5gb (A100) as nvidia.com/gpu": 56,  # single strategy: 8 GPUs x 7
    "quarter T4 (time-slicing)": 16, "quarter T4 (time-slicing) as nvidia.com/gpu.shared": 16,
    "1/10 V100 (mps)": 8,  # 10 replicas, but each counted pod asks 1 CPU and the node has 8
}


def test_what_fits_on_the_empty_fixture_nodes() -> None:
    r = capacity(fixture_cluster())
    assert r.fits == EMPTY_FITS
    assert r.mix.startswith("no GPU pods bound")
    h100 = next(p for p in r.pools if p.product == "H100")
    assert (h100.pool, h100.nodes, h100.gpus, h100.in_use, h100.free, h100.unavailable) == ("h100pool", 2, 16, 0,
                                                                                            13, 3)
    assert h100.units == {"nvidia.com/gpu": "0/13"}
    assert {p["node"]: p["state"] for p in r.problems} == {"h100-degraded-0": "degraded",
                                                           "h100-initializing-0": "initializing"}


def test_bound_pods_use_gpus_and_fewer_fit() -> None:
    pods = [pod("two", {"nvidia.com/gpu": "2"}, node=HGX, annotations={"gpu-tailor.io/gpus": "0,1"}),
            pod("slice", {"nvidia.com/mig-1g.5gb": "1"}, node="a100-mig-mixed-0")]
    r = capacity(fixture_cluster(pods))
    assert r.fits["1x H100"] == 11 and r.fits["8x H100 on NVLink"] == 0
    assert r.fits["mig-1g.5gb (A100)"] == 15
    assert r.mix == "learnt from 2 GPU pod(s) bound now"
    h100 = next(p for p in r.pools if p.product == "H100")
    assert (h100.in_use, h100.free) == (2, 11)
    assert h100.fragmentation_gpus == 0  # the mix (2 GPUs, a MIG slice) still fits wherever GPUs are free


def test_fragmentation_is_fgds_measure_over_the_learnt_mix() -> None:
    # the only GPU pod bound takes all 8 GPUs of the HGX board: the learnt mix is 8-GPU pods, which the
    # degraded node's 5 GPUs can never hold, so all 5 are fragments
    eight = pod("eight", {"nvidia.com/gpu": "8"}, node=HGX, annotations={"gpu-tailor.io/gpus": "0,1,2,3,4,5,6,7"})
    r = capacity(fixture_cluster([eight]))
    h100 = next(p for p in r.pools if p.product == "H100")
    assert (h100.in_use, h100.free, h100.fragmentation_gpus, h100.fragmentation_pct) == (8, 5, 5.0, 100.0)


def test_gpus_beside_too_little_cpu_are_stranded() -> None:
    # a CPU-only pod takes all but half a core of the T4 node: its 4 GPUs cannot feed a 1-CPU pod
    node = next(n for n in fixture_cluster().nodes if n["metadata"]["name"] == "t4-timeslice-0")
    cpu = node["status"]["allocatable"]["cpu"]
    cores = float(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
    hog = pod("hog", {}, node="t4-timeslice-0", cpu=f"{int(cores * 1000) - 500}m")
    r = capacity(fixture_cluster([hog]))
    t4 = next(p for p in r.pools if p.product == "T4")
    assert t4.stranded_nodes == ["t4-timeslice-0"] and t4.stranded_gpus == 4
    assert r.fits["quarter T4 (time-slicing)"] == 0
    assert "stranded: free GPUs beside less than 1 CPU or 4 GiB free, on t4-timeslice-0" in table(r)


@pytest.mark.parametrize(("labels", "pool"), [
    ({"cloud.google.com/gke-nodepool": "a"}, "a"), ({"kubernetes.azure.com/agentpool": "b"}, "b"),
    ({"eks.amazonaws.com/nodegroup": "c"}, "c"), ({}, "-")])
def test_node_pools_by_cloud_label(labels: dict[str, str], pool: str) -> None:
    assert pool_of(labels) == pool


def test_pools_by_a_label_of_ones_own() -> None:
    r = capacity(fixture_cluster(), pool_label="topology.kubernetes.io/region")
    assert {(p.pool, p.product) for p in r.pools} >= {("eastus", "H100"), ("us-east-1", "V100")}


def test_capacity_lists_the_nvlink_domains_and_the_largest_group_each_still_holds() -> None:
    from gpu_tailor.gpumodel import labels
    from gpu_tailor.tools.capacity import capacity, table
    from gpu_tailor.tools.source import Cluster
    from tests.extender.test_gangs import NODES as TRAYS
    from tests.tools.builders import pod

    busy = pod("busy", {"nvidia.com/gpu": "2"}, node="gb-1-0", annotations={"gpu-tailor.io/gpus": "0,1"})
    r = capacity(Cluster(TRAYS, [busy], None, "trays"))
    rows = {d.name: d for d in r.domains}
    used = rows[f"{labels.GPU_CLIQUE}=uuid-1.1"]
    assert (used.nodes, used.gpus, used.idle, used.whole_nodes, used.largest) == (4, 16, 14, 3, {1: 14, 4: 3})
    assert rows[f"{labels.GPU_CLIQUE}=uuid-0.0"].largest == {1: 16, 4: 4}
    assert "GROUP OF 4-GPU PODS" in table(r)
    assert capacity(Cluster([], [], None, "none")).domains == []
