"""Portable asks on DRA pools, end to end (issue 27): on a release that serves ``resource.k8s.io/v1`` (1.34 and
later), NVIDIA-shaped ResourceSlices published by hand for an 8xH100 HGX node, an H100 node in MIG mode and a node
that shares T4s, next to the device-plugin fixture nodes; the real kube-scheduler (gpu-tailor-scheduler with the
extender) allocates the claims and binds the pods. On an older release both services say DRA is off.

The device-plugin nodes are cordoned for the DRA-only part, so that each ask has only DRA pools to go to; then they
are uncordoned and the same cluster serves both dialects.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.e2e.cluster import Release, fixture_nodes, install_node
from tests.e2e.kube import ApiError, Obj, api_path, wait_for
from tests.e2e.pods import Pods, gpu_pod, gpus_annotation, unique
from tests.e2e.services import Stack
from tests.e2e.test_explain import assert_stored_as_explained, explain
from tests.gpumodel.dra_slices import (
    device_classes,
    dynamic_h100,
    h100_mig,
    hgx,
    plain_node,
    resource_slice,
    shared_t4,
)

pytestmark = pytest.mark.e2e

GROUP = "resource.k8s.io/v1"
HGX, MIG, SHARED = "dra-h100-hgx-0", "dra-h100-mig-0", "dra-t4-shared-0"


def cordon(cluster: Stack, on: bool) -> None:
    for node in fixture_nodes():
        cluster.kube.patch(api_path("nodes", name=node["metadata"]["name"]), {"spec": {"unschedulable": on or None}})


def dry_run(cluster: Stack, pod: Obj) -> Obj:
    return cluster.kube.create(api_path("pods", cluster.opted_in), pod, dry_run=True)


@contextmanager
def dra_pools(cluster: Stack, nodes: list[Obj] | None = None, slices: list[Obj] | None = None,
              probe: dict[str, str] | None = None) -> Iterator[Stack]:
    """DeviceClasses, DRA nodes and their slices (by default three: an HGX node, one in MIG mode, one that shares
    T4s), the device-plugin nodes cordoned, until the webhook sends ``probe`` (an ask) to DRA; all undone after
    (delete the pods bound there first). On a release that serves ``resource.k8s.io/v1`` only."""
    kube = cluster.kube
    made: list[str] = []
    nodes = [plain_node(n) for n in (HGX, MIG, SHARED)] if nodes is None else nodes
    slices = [hgx(HGX), h100_mig(MIG), shared_t4(SHARED)] if slices is None else slices
    probe = {"gpu-tailor.io/gpu-memory": "20Gi"} if probe is None else probe
    try:
        for cls in device_classes():
            made.append(api_path("deviceclasses", name=cls["metadata"]["name"], group=GROUP))
            kube.create(api_path("deviceclasses", group=GROUP), cls)
        for node in nodes:
            made.append(api_path("nodes", name=node["metadata"]["name"]))
            install_node(kube, node)
        for s in slices:
            made.append(api_path("resourceslices", name=s["metadata"]["name"], group=GROUP))
            kube.create(api_path("resourceslices", group=GROUP), s)
        cordon(cluster, True)

        def routed_to_dra() -> bool:  # the webhook has seen the slices and the cordons
            return bool(dry_run(cluster, gpu_pod(unique("probe"), probe))["spec"].get("resourceClaims"))

        wait_for(routed_to_dra, 30, f"the webhook to send {probe} to the DRA pools")
        yield cluster
    finally:
        cordon(cluster, False)
        for path in reversed(made):
            if kube.exists(path):
                kube.delete(path)
        for t in kube.list(api_path("resourceclaimtemplates", cluster.opted_in, group=GROUP)):
            kube.delete(api_path("resourceclaimtemplates", cluster.opted_in, t["metadata"]["name"], group=GROUP))


@pytest.fixture
def dra(cluster: Stack, release: Release) -> Iterator[Stack]:
    if release.minor < 34:
        pytest.skip(f"{release.version} serves no {GROUP} (DRA is GA from 1.34): test_dra_is_off covers it")
    with dra_pools(cluster) as ready:
        yield ready


def claim_of(cluster: Stack, pod: Obj) -> Obj:
    """The pod's ResourceClaim, allocated (kube-scheduler's PreBind writes the allocation before the binding)."""
    statuses = pod["status"].get("resourceClaimStatuses") or []
    extended = pod["status"].get("extendedResourceClaimStatus") or {}
    names = [s["resourceClaimName"] for s in statuses if s.get("resourceClaimName")]
    if extended.get("resourceClaimName"):
        names.append(extended["resourceClaimName"])
    assert len(names) == 1, f"expected one claim, got {names}: {pod['status']}"
    claim = cluster.kube.get(api_path("resourceclaims", pod["metadata"]["namespace"], names[0], group=GROUP))
    assert claim["status"].get("allocation"), f"claim {names[0]} is not allocated"
    return claim


def devices(claim: Obj) -> list[tuple[str, str, str]]:
    """(pool, device, request) of each allocated device."""
    return [(r["pool"], r["device"], r["request"]) for r in claim["status"]["allocation"]["devices"]["results"]]


def slice_device(cluster: Stack, pool: str, name: str) -> Obj:
    for s in cluster.kube.list(api_path("resourceslices", group=GROUP)):
        if s["spec"]["pool"]["name"] == pool:
            for d in s["spec"]["devices"]:
                if d["name"] == name:
                    found: Obj = d
                    return found
    raise AssertionError(f"no device {name} in pool {pool}")


def memory_gib(device: Obj) -> float:
    value = device["capacity"]["memory"]["value"]
    assert value.endswith("Gi")
    return float(value[:-2])


def bound(pods: Pods, namespace: str, pod: Obj) -> Obj:
    created = pods.create(namespace, pod)
    return pods.wait_bound(created, timeout=60)


def test_portable_asks_land_on_dra_pools(dra: Stack, pods: Pods, tmp_path: Path) -> None:
    ns = dra.opted_in
    twenty = {"gpu-tailor.io/gpu-memory": "20Gi"}

    # explain tells the story first: the claim, the node, the device the allocator picks there
    asked = gpu_pod(unique("dra-20gi"), twenty)
    said = explain(dra, asked, tmp_path, ns)
    assert said["chosen"] == MIG
    assert {v["node"]: v["detail"] for v in said["nodes"]}[MIG] == (
        "claim: MIG 2g.20gb (20Gi) -> device gpu-0-mig-2g20gb-14-0")
    # 20Gi: the smallest MIG device that holds it (2g.20gb, though 3g.40gb holds it too) ...
    first = bound(pods, ns, asked)
    assert_stored_as_explained(said, first)
    assert first["spec"]["nodeName"] == MIG
    assert first["metadata"]["annotations"]["gpu-tailor.io/backing"] == "dra:mig-2g-20gb"
    assert "gpu-tailor.io/gpus" not in first["metadata"]["annotations"]  # the claim's allocation is the record
    ((pool, device, request),) = devices(claim_of(dra, first))
    assert (pool, request) == (MIG, "gpu-0/mig-2g-20gb") and "mig-2g20gb" in device
    # ... then the next one that does ...
    second = bound(pods, ns, gpu_pod(unique("dra-20gi"), twenty))
    ((pool, device, request),) = devices(claim_of(dra, second))
    assert (second["spec"]["nodeName"], request) == (MIG, "gpu-0/mig-3g-40gb")
    # ... and a whole GPU only once no MIG device holds 20Gi (two 1g.10gb are left)
    third = bound(pods, ns, gpu_pod(unique("dra-20gi"), twenty))
    ((pool, device, request),) = devices(claim_of(dra, third))
    assert (third["spec"]["nodeName"], pool, request) == (HGX, HGX, "gpu-0/gpu-nvidia-h100-80gb-hbm3")
    assert memory_gib(slice_device(dra, pool, device)) >= 20

    # a quarter of a GPU, twice: the pool that shares, both on one T4, each holding a quarter of its memory
    quarters = [bound(pods, ns, gpu_pod(unique("dra-quarter"), {"gpu-tailor.io/gpu-milli": "250"}))
                for _ in range(2)]
    held = []
    for q in quarters:
        claim = claim_of(dra, q)
        ((pool, device, request),) = devices(claim)
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        held.append((q["spec"]["nodeName"], device, request, result["consumedCapacity"]["memory"]))
        config = claim["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"]
        assert config["sharing"] == {"strategy": "TimeSlicing"}
    assert held == [(SHARED, "gpu-0", "gpu-0/shared-tesla-t4", "3840Mi")] * 2

    # nvidia.com/gpu: 2 in an opted-in namespace: served by DRA on the HGX node (DeviceClass gpu.nvidia.com has
    # extendedResourceName nvidia.com/gpu), the extender agreeing
    native = bound(pods, ns, gpu_pod(unique("dra-native"), {"nvidia.com/gpu": "2"}))
    assert native["spec"]["nodeName"] == HGX
    assert native["status"]["extendedResourceClaimStatus"]["requestMappings"][0]["resourceName"] == "nvidia.com/gpu"
    assert [p for p, _, _ in devices(claim_of(dra, native))] == [HGX, HGX]
    assert gpus_annotation(native) == []

    # an ask no device holds is refused at admission, with the reason
    with pytest.raises(ApiError) as refused:
        pods.create(ns, gpu_pod(unique("dra-huge"), {"gpu-tailor.io/gpu-memory": "200Gi"}))
    message = str(refused.value.body)
    assert "the largest DRA device is NVIDIA H100 80GB HBM3 (80Gi)" in message, message

    # a dry run makes no template
    before = {t["metadata"]["name"] for t in dra.kube.list(api_path("resourceclaimtemplates", ns, group=GROUP))}
    dry_run(dra, gpu_pod(unique("dra-dry"), {"gpu-tailor.io/gpu-memory": "33Gi"}))
    after = {t["metadata"]["name"] for t in dra.kube.list(api_path("resourceclaimtemplates", ns, group=GROUP))}
    assert after == before


def predicted(said: Obj, node: str) -> list[str]:
    """The devices explain says the allocator gives the claim on ``node`` (``... -> device gpu-0`` or
    ``-> devices gpu-2, gpu-3``)."""
    detail = {v["node"]: v["detail"] for v in said["nodes"]}[node]
    return [d.strip() for d in detail.split(" -> ", 1)[1].removeprefix("devices ").removeprefix("device ").split(",")]


def test_claims_land_on_the_devices_predicted_and_keep_a_node_whole(dra: Stack, pods: Pods, tmp_path: Path) -> None:
    """Whole-GPU and shared-GPU claims, ranked by the placement policy on the device kube-scheduler's allocator is
    predicted to take: for every claim the allocated devices are the predicted ones, and whole-GPU claims of 1, 1, 2
    and 4 GPUs fill one HGX node while the other stays whole. The second HGX node's pool is two slices, created in
    the reverse of their names' order: the allocator searches by slice name."""
    kube, ns = dra.kube, dra.opted_in
    second = "dra-h100-hgx-1"
    whole = hgx(second)["spec"]["devices"]
    parts = [resource_slice(second, whole[4:], count=2, part=1), resource_slice(second, whole[:4], count=2, part=0)]
    install_node(kube, plain_node(second))
    try:
        for s in parts:
            kube.create(api_path("resourceslices", group=GROUP), s)
        wait_for(lambda: not [c for c in kube.list(api_path("resourceclaims", ns, group=GROUP))
                              if c.get("status", {}).get("allocation")], 60, "the claims of earlier tests to go")
        placed: dict[str, list[str]] = {}
        shares = {"gpu-tailor.io/isolation": "time-slicing"}  # a share of a shared T4 and nothing else
        asks = [({"gpu-tailor.io/gpu-milli": m}, None) for m in ("1000", "1000", "2000", "4000")] + \
               [({"gpu-tailor.io/gpu-milli": "400"}, shares)] * 3
        for limits, annotations in asks:
            pod = gpu_pod(unique("dra-packed"), limits, annotations=annotations)
            said = explain(dra, pod, tmp_path, ns)
            got = bound(pods, ns, pod)
            node = got["spec"]["nodeName"]
            allocated = [device for _, device, _ in devices(claim_of(dra, got))]
            assert allocated == predicted(said, node), (limits, node, said["nodes"])
            placed.setdefault(node, []).extend(allocated)
        # each claim on the node already in use, in the allocator's order there: one node full, the other whole
        assert [d for n, d in placed.items() if n in (HGX, second)] == [[f"gpu-{i}" for i in range(8)]], placed
        assert placed[SHARED] == ["gpu-0", "gpu-0", "gpu-1"]  # 6Gi twice on the first T4, the third on the next
    finally:
        pods.cleanup()  # the pods on the second node go before it does
        for s in parts:
            if kube.exists(api_path("resourceslices", name=s["metadata"]["name"], group=GROUP)):
                kube.delete(api_path("resourceslices", name=s["metadata"]["name"], group=GROUP))
        kube.delete(api_path("nodes", name=second))


def test_dynamic_mig_partitions_are_carved_where_a_whole_gpu_stays_possible(dra: Stack, pods: Pods,
                                                                          tmp_path: Path) -> None:
    """Two single-H100 nodes under the driver's DynamicMIG (partitionable devices, KEP-4815: beta and on in 1.36), the
    other DRA nodes cordoned: two 1g.10gb partitions, then a 40 GiB one, are carved on one GPU, each on the device the
    allocator was predicted to take, so that an 80 GiB partition (7g.80gb) still fits on the other. Spread one per
    node, as kube-scheduler alone would by CPU, the two 1g partitions would leave no GPU whole."""
    kube, ns = dra.kube, dra.opted_in
    nodes = ["dra-h100-dyn-a", "dra-h100-dyn-b"]
    slices = [s for n in nodes for s in dynamic_h100(n)]
    for n in nodes:
        install_node(kube, plain_node(n))
    for n in (HGX, MIG, SHARED):
        kube.patch(api_path("nodes", name=n), {"spec": {"unschedulable": True}})
    try:
        for s in slices:
            kube.create(api_path("resourceslices", group=GROUP), s)
        mig_only = {"gpu-tailor.io/isolation": "mig"}

        def routed_to_dynamic() -> bool:  # the webhook has seen the slices and the cordons
            probe = dry_run(dra, gpu_pod(unique("probe"), {"gpu-tailor.io/gpu-memory": "10Gi"}, annotations=mig_only))
            return bool(probe["spec"].get("resourceClaims"))

        wait_for(routed_to_dynamic, 30, "the webhook to offer the partitionable GPUs")
        placed: list[tuple[str, str]] = []
        for memory in ("10Gi", "10Gi", "40Gi", "80Gi"):
            pod = gpu_pod(unique("dra-dyn"), {"gpu-tailor.io/gpu-memory": memory}, annotations=mig_only)
            said = explain(dra, pod, tmp_path, ns)
            got = bound(pods, ns, pod)
            node = got["spec"]["nodeName"]
            ((_, device, _),) = devices(claim_of(dra, got))
            assert [device] == predicted(said, node), (memory, node, said["nodes"])
            placed.append((node, device))
        first = placed[0][0]
        assert [n for n, _ in placed[:3]] == [first] * 3, placed  # carved on one GPU ...
        assert [d for _, d in placed[:3]] == ["gpu-0-mig-1g10gb-19-0", "gpu-0-mig-1g10gb-19-1", "gpu-0-mig-3g40gb-9-4"]
        assert placed[3] == (next(n for n in nodes if n != first), "gpu-0-mig-7g80gb-0-0")  # ... the other whole
    finally:
        pods.cleanup()
        for n in (HGX, MIG, SHARED):
            kube.patch(api_path("nodes", name=n), {"spec": {"unschedulable": None}})
        for s in slices:
            if kube.exists(api_path("resourceslices", name=s["metadata"]["name"], group=GROUP)):
                kube.delete(api_path("resourceslices", name=s["metadata"]["name"], group=GROUP))
        for n in nodes:
            kube.delete(api_path("nodes", name=n))


def test_device_plugin_pools_beside_dra_pools_behave_as_before(dra: Stack, pods: Pods) -> None:
    cordon(dra, False)
    wait_for(lambda: not dry_run(dra, gpu_pod(unique("probe"), {"gpu-tailor.io/gpu-memory": "4Gi"}))["spec"].get(
        "resourceClaims"), 30, "the webhook to see the device-plugin nodes again")
    # 4Gi: a 1g.5gb MIG device of the device-plugin A100 node (1/7 of a GPU) beats every DRA device (1g.10gb)
    small = bound(pods, dra.opted_in, gpu_pod(unique("dp-4gi"), {"gpu-tailor.io/gpu-memory": "4Gi"}))
    assert small["metadata"]["annotations"]["gpu-tailor.io/backing"] == "mig-1g.5gb"
    assert not small["spec"].get("resourceClaims")
    assert small["spec"]["nodeName"] in ("a100-mig-single-0", "a100-mig-mixed-0")
    # a native ask goes to a device-plugin node first, and gets its GPUs recorded
    native = bound(pods, dra.opted_in, gpu_pod(unique("dp-native"), {"nvidia.com/gpu": "2"}))
    assert native["spec"]["nodeName"] in {n["metadata"]["name"] for n in fixture_nodes()}
    assert len(gpus_annotation(native)) == 2


def test_dra_is_on_or_off_by_release(cluster: Stack, release: Release) -> None:
    """Both services say which, from discovery of resource.k8s.io/v1."""
    word = "DRA is on" if release.minor >= 34 else "DRA is off"
    for service in (cluster.webhook, cluster.extender):
        assert word in service.log.read_text(), f"{service.name}: no '{word}' in its log"
    if release.minor < 34:
        with pytest.raises(ApiError) as absent:
            cluster.kube.get(f"/apis/{GROUP}")
        assert absent.value.status == 404

