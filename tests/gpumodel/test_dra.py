"""Reading NVIDIA-shaped ResourceSlices and allocated claims (``gpumodel.dra``)."""

from __future__ import annotations

import copy

from gpu_tailor.gpumodel.dra import DeviceType, read_slices
from gpu_tailor.gpumodel.dra_usage import Usage, allocated, smallest_holding
from tests.gpumodel.dra_slices import GIB, H100, a100_mig, gpu, hgx, resource_slice, t4


def test_pools_per_node_with_each_devices_type_memory_and_names() -> None:
    inv = read_slices([hgx(), a100_mig(), t4()])
    assert inv.problems == []
    assert inv.nodes() == {"dra-h100-hgx-0", "dra-a100-mig-0", "dra-t4-0"}
    (hgx_pool,) = inv.on_node("dra-h100-hgx-0")
    assert hgx_pool.complete and len(hgx_pool.devices) == 8
    g0 = hgx_pool.devices["gpu-0"]
    assert (g0.type, g0.memory_bytes, g0.product, g0.uuid) == (DeviceType.GPU, 80 * GIB, H100, "GPU-h100-0")
    (mig_pool,) = inv.on_node("dra-a100-mig-0")
    big = mig_pool.devices["gpu-1-mig-3g20gb-9-4"]
    assert (big.type, big.profile, big.memory_bytes, big.parent_uuid) == (DeviceType.MIG, "3g.20gb", 20 * GIB,
                                                                          "GPU-a100-1")
    assert sorted(d.profile for d in mig_pool.devices.values()).count("1g.5gb") == 9


def test_only_the_newest_generation_counts_and_an_incomplete_pool_says_so() -> None:
    old = resource_slice("n", [gpu(0, H100, 80, "a"), gpu(1, H100, 80, "b")], generation=1)
    new = resource_slice("n", [gpu(0, H100, 80, "a")], generation=2, count=2)
    inv = read_slices([new, old])
    (pool,) = inv.pools.values()
    assert list(pool.devices) == ["gpu-0"] and pool.generation == 2 and not pool.complete
    assert inv.problems == ["pool n on n: 1 of 2 slices seen (the driver is still publishing it)"]
    rest = resource_slice("n", [gpu(1, H100, 80, "b")], generation=2, count=2, part=1)
    inv = read_slices([new, rest, old])
    assert inv.problems == [] and sorted(inv.pools["n"].devices) == ["gpu-0", "gpu-1"]


def test_qualified_attribute_names_other_drivers_and_bad_devices() -> None:
    qualified = copy.deepcopy(hgx("q"))
    for d in qualified["spec"]["devices"]:
        d["attributes"] = {f"gpu.nvidia.com/{k}": v for k, v in d["attributes"].items()}
    other = resource_slice("x", [gpu(0, H100, 80, "a")])
    other["spec"]["driver"] = "dra.example.com"
    bad = resource_slice("b", [{"name": "gpu-0", "attributes": {"type": {"string": "nic"}}},
                               {"name": "gpu-1", "attributes": {"type": {"string": "gpu"}},
                                "capacity": {"memory": {"value": "eighty"}}},
                               {"attributes": {}}])
    inv = read_slices([qualified, other, bad])
    assert len(inv.pools["q"].devices) == 8 and "x" not in inv.pools
    assert inv.pools["b"].devices == {}
    assert len(inv.problems) == 3 and "type 'nic' is neither" in inv.problems[0]
    assert "memory:" in inv.problems[1] and "without a name" in inv.problems[2]


def test_the_smallest_free_device_that_holds_an_ask() -> None:
    inv = read_slices([hgx(), a100_mig()])
    pools = list(inv.pools.values())
    assert smallest_holding(pools, 20 * GIB).name == "gpu-1-mig-3g20gb-9-4"  # type: ignore[union-attr]
    assert smallest_holding(pools, 6 * GIB).profile == "2g.10gb"  # type: ignore[union-attr]
    held = Usage({("gpu.nvidia.com", "dra-a100-mig-0", "gpu-1-mig-3g20gb-9-4")})
    whole = smallest_holding(pools, 20 * GIB, held)
    assert whole is not None and whole.type == DeviceType.GPU  # no MIG device left holds it: a whole GPU
    assert smallest_holding(pools, 81 * GIB) is None


def test_allocated_claims_name_the_devices_they_hold() -> None:
    claim = {"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "dra-h100-hgx-0", "device": "gpu-3"}]}}}}
    shared = {"status": {"allocation": {"devices": {"results": [
        {"request": "gpu/shared-tesla-t4", "driver": "gpu.nvidia.com", "pool": "dra-t4-0", "device": "gpu-0",
         "shareID": "5a2e5eb3", "consumedCapacity": {"memory": "4Gi"}}]}}}}
    other = {"status": {"allocation": {"devices": {"results": [
        {"request": "nic", "driver": "dra.example.com", "pool": "dra-h100-hgx-0", "device": "gpu-4"}]}}}}
    usage = allocated([claim, shared, shared, other, {"status": {}}, {},
                       {"status": {"allocation": {"devices": {"results": [{}]}}}}])
    assert usage.taken == {("gpu.nvidia.com", "dra-h100-hgx-0", "gpu-3")}
    assert usage.consumed == {("gpu.nvidia.com", "dra-t4-0", "gpu-0"): 8 * GIB}


def test_admin_access_holds_nothing_and_a_device_of_a_counter_set_the_pool_lacks_is_left_out() -> None:
    monitor = {"status": {"allocation": {"devices": {"results": [
        {"request": "dcgm", "driver": "gpu.nvidia.com", "pool": "p", "device": "gpu-0", "adminAccess": True}]}}}}
    assert allocated([monitor]).taken == set()
    dynamic = gpu(1, H100, 80, "b")
    dynamic["consumesCounters"] = [{"counterSet": "gpu-1-counter-set", "counters": {"memory": {"value": "80Gi"}}}]
    inv = read_slices([resource_slice("n", [gpu(0, H100, 80, "a"), dynamic])])
    assert list(inv.pools["n"].devices) == ["gpu-0"]
    assert "consumes counter set gpu-1-counter-set, which the pool does not define" in inv.problems[0]
