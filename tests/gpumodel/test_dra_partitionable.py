"""Partitionable GPUs (KEP-4815, NVIDIA's DynamicMIG): counter sets read from the pool's slices, a device free only
while the claims' devices leave its counters, MIG profiles offered as rungs, and claims placed where the carve
leaves the larger partitions possible."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from gpu_tailor.gpumodel.ask import Isolation, from_pod
from gpu_tailor.gpumodel.devices.dra import DraChoice, choose, claim_preference, ladders_for
from gpu_tailor.gpumodel.dra import DRIVER, read_slices
from gpu_tailor.gpumodel.dra_state import DraState
from gpu_tailor.gpumodel.dra_usage import Usage, carvable, gpu_column
from tests.gpumodel.dra_slices import device_classes, dynamic_h100

NODE = "dra-h100-dyn-0"


def pod(memory: str, isolation: str = "mig") -> dict[str, Any]:
    res = {"gpu-tailor.io/gpu-memory": memory}
    return {"metadata": {"name": "p", "namespace": "ns", "annotations": {"gpu-tailor.io/isolation": isolation}},
            "spec": {"containers": [{"name": "main", "resources": {"requests": res, "limits": res}}]}}


@pytest.mark.parametrize("split", [True, False])
def test_counter_sets_and_what_each_device_consumes_are_read(split: bool) -> None:
    inv = read_slices(dynamic_h100(gpus=2, split=split))
    assert inv.problems == []
    pool = inv.pools[NODE]
    assert pool.complete and set(pool.counter_sets) == {"gpu-0-counter-set", "gpu-1-counter-set"}
    assert pool.counter_sets["gpu-0-counter-set"]["memory"] == 80 * 2**30
    assert pool.counter_sets["gpu-0-counter-set"]["memory-slice-7"] == 1
    three = pool.devices["gpu-1-mig-3g40gb-9-4"]
    assert three.profile == "3g.40gb" and three.consumes == (("gpu-1-counter-set", (
        ("memory", Fraction(40 * 2**30)), *((f"memory-slice-{i}", Fraction(1)) for i in range(4, 8)))),)
    assert len(pool.devices) == 2 * (1 + 7 + 3 + 2 + 1 + 1)  # the whole GPU and every profile at every placement


def test_a_device_is_free_while_the_claims_leave_its_counters() -> None:
    inv = read_slices(dynamic_h100())
    devices = inv.pools[NODE].devices
    usage = Usage.of([], inv)
    assert all(usage.free(d) for d in devices.values()) and carvable(inv.pools[NODE], usage) == 8
    usage.take(devices["gpu-0-mig-3g40gb-9-4"])  # memory slices 4-7
    free = sorted(n for n, d in devices.items() if usage.free(d))
    assert free == ["gpu-0-mig-1g10gb-19-0", "gpu-0-mig-1g10gb-19-1", "gpu-0-mig-1g10gb-19-2",
                    "gpu-0-mig-1g10gb-19-3", "gpu-0-mig-2g20gb-14-0", "gpu-0-mig-2g20gb-14-2",
                    "gpu-0-mig-3g40gb-9-0", "gpu-0-mig-4g40gb-5-0"]
    assert carvable(inv.pools[NODE], usage) == 4 and usage.memory_left(devices["gpu-0"]) == 0
    assert gpu_column(inv.pools.values(), usage) is not None
    assert gpu_column(inv.pools.values(), usage).free == (0,)  # type: ignore[union-attr]  # the GPU is carved
    usage.take(devices["gpu-0-mig-4g40gb-5-0"])
    assert not any(usage.free(d) for d in devices.values()) and carvable(inv.pools[NODE], usage) == 0
    # the same, read from allocated claims
    state = DraState()
    state.reset_slices(dynamic_h100())
    state.reset_claims([{"metadata": {"uid": "c"}, "status": {"allocation": {"devices": {"results": [
        {"request": "gpu-0", "driver": DRIVER, "pool": NODE, "device": "gpu-0-mig-3g40gb-9-4"}]}}}}])
    assert sorted(n for n, d in devices.items() if state.usage().free(d)) == free


def test_mig_profiles_of_partitionable_gpus_are_offered_smallest_first() -> None:
    state = DraState()
    state.reset_slices(dynamic_h100())
    state.reset_claims([])
    state.reset_classes(device_classes())
    choice = choose(from_pod(pod("10Gi")), Isolation.MIG, state.inventory(), state.usage(), state.classes)
    assert isinstance(choice, DraChoice)
    assert [r.name for r in choice.rungs["main"]][:3] == ["mig-1g-10gb", "mig-2g-20gb", "mig-3g-40gb"]
    pick = choice.picks["main"]
    assert pick is not None and pick.device.name == "gpu-0-mig-1g10gb-19-0"  # the first placement, as listed


def held(node: str, *devices: str) -> dict[str, Any]:
    return {"metadata": {"uid": f"{node}-{'-'.join(devices)}"}, "status": {"allocation": {"devices": {"results": [
        {"request": "gpu-0", "driver": DRIVER, "pool": node, "device": d} for d in devices]}}}}


def preferences(claims: list[dict[str, Any]], memory: str = "10Gi") -> dict[str, tuple[Any, ...] | None]:
    state = DraState()
    state.reset_slices(dynamic_h100("dyn-a") + dynamic_h100("dyn-b"))
    state.reset_claims(claims)
    state.reset_classes(device_classes())
    inv, usage = state.inventory(), state.usage()
    planned = ladders_for(from_pod(pod(memory)), Isolation.MIG, inv, tuple(state.classes))
    assert isinstance(planned, tuple)
    return {node: claim_preference(planned[1], inv, usage, node) for node in ("dyn-a", "dyn-b")}


def test_a_partition_goes_where_the_carve_keeps_the_larger_profiles_possible() -> None:
    # a 1g.10gb carved on the GPU already cut (slice 1, beside the 1g at 0) leaves its 3g.40gb at 4-7 possible; on
    # the idle GPU it would break the 7g.80gb
    pref = preferences([held("dyn-a", "gpu-0-mig-1g10gb-19-0")])
    assert pref["dyn-a"] is not None and pref["dyn-b"] is not None
    assert (pref["dyn-a"][2], pref["dyn-b"][2]) == (0, 4) and pref["dyn-a"] < pref["dyn-b"]


def test_the_carve_outranks_fullness() -> None:
    # dyn-a holds a 3g.40gb at slices 4-7: a 1g there takes slice 0 and, with it, the 4g.40gb and 3g.40gb at 0-3.
    # dyn-b holds 1g.10gb at slices 0 and 4: a 1g there takes slice 1, and the 2g.20gb at 2-3 stays possible as
    # before. dyn-a would be the fuller after, yet the carve costs it more: dyn-b is preferred.
    pref = preferences([held("dyn-a", "gpu-0-mig-3g40gb-9-4"),
                        held("dyn-b", "gpu-0-mig-1g10gb-19-0", "gpu-0-mig-1g10gb-19-4")])
    a, b = pref["dyn-a"], pref["dyn-b"]
    assert a is not None and b is not None
    assert (a[2], b[2]) == (2, 0) and a[3] < b[3]  # the carve's loss, and the devices left free
    assert b < a


def test_odd_counters_are_reported_exact_amounts_kept_and_shared_partitionable_devices_left_out() -> None:
    bad = dynamic_h100(split=False)[0]
    bad["spec"]["sharedCounters"] = 5
    inv = read_slices([bad])
    assert inv.pools[NODE].devices == {} and any("sharedCounters and devices must be lists" in p for p in inv.problems)
    halves = dynamic_h100(split=False)[0]
    halves["spec"]["sharedCounters"] = [{"name": "s", "counters": {"half": {"value": "1"}}}]
    two = [d for d in halves["spec"]["devices"] if d["name"] in ("gpu-0-mig-1g10gb-19-0", "gpu-0-mig-1g10gb-19-1")]
    for d in two:
        d["consumesCounters"] = [{"counterSet": "s", "counters": {"half": {"value": "500m"}}}]
    shared = dict(two[1], name="shared", allowMultipleAllocations=True)
    halves["spec"]["devices"] = [*two, shared]
    inv = read_slices([halves])
    usage = Usage.of([], inv)
    first, second = inv.pools[NODE].devices.values()
    usage.take(first)
    assert usage.free(second)  # 500m + 500m of 1: both fit, where rounding each up to 1 would say no
    assert any("shared device that also consumes counters is not modelled" in p for p in inv.problems)
    assert Usage().free(first)  # a usage not counted against an inventory checks no counter
