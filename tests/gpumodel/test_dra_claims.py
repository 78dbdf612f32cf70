"""Portable asks written as claims for DRA pools (``gpumodel.devices.dra``): the rungs, smallest first, the
device the allocator would give now, the template, and the state a service keeps from watches."""

from __future__ import annotations

import json
from typing import Any

from gpu_tailor.gpumodel.ask import Isolation, from_pod
from gpu_tailor.gpumodel.devices.dra import DraChoice, DraRefusal, choose
from gpu_tailor.gpumodel.devices.dra_rungs import GPU_CLASS, MAX_RUNGS, RungKind
from gpu_tailor.gpumodel.dra import read_slices
from gpu_tailor.gpumodel.dra_state import DraState
from gpu_tailor.gpumodel.dra_usage import Usage
from tests.gpumodel.dra_slices import A100, H100, a100_mig, device_classes, gpu, hgx, mig, resource_slice, shared_t4

INV = read_slices([hgx(), a100_mig(), shared_t4()])


def pod(annotations: dict[str, str] | None = None, **resources: str) -> dict[str, Any]:
    res = {k.replace("_", "-").replace("gpu-tailor-io-", "gpu-tailor.io/"): v for k, v in resources.items()}
    return {"metadata": {"name": "p", "namespace": "ns", "annotations": annotations or {}},
            "spec": {"containers": [{"name": "main", "resources": {"requests": res, "limits": res}}]}}


def planned(p: dict[str, Any], isolation: Isolation = Isolation.ANY, usage: Usage | None = None) -> DraChoice:
    choice = choose(from_pod(p), isolation, INV, usage or Usage())
    assert isinstance(choice, DraChoice), choice
    return choice


def ladder(choice: DraChoice) -> list[str]:
    return [r.name for r in choice.rungs["main"]]


def test_a_memory_ask_takes_the_smallest_mig_device_that_holds_it_and_a_whole_gpu_only_after() -> None:
    choice = planned(pod(gpu_tailor_io_gpu_memory="20Gi"))
    assert ladder(choice) == ["mig-3g-20gb", "gpu-nvidia-h100-80gb-hbm3"]  # a 15 GiB shared T4 cannot hold it
    pick = choice.picks["main"]
    assert pick is not None and (pick.position, pick.device.pool, pick.device.name) == (
        0, "dra-a100-mig-0", "gpu-1-mig-3g20gb-9-4")
    assert choice.backing == "dra:mig-3g-20gb" and choice.free_now
    taken = Usage({("gpu.nvidia.com", "dra-a100-mig-0", "gpu-1-mig-3g20gb-9-4")})
    later = planned(pod(gpu_tailor_io_gpu_memory="20Gi"), usage=taken)
    pick = later.picks["main"]
    assert pick is not None and (pick.position, pick.device.name) == (1, "gpu-0")  # the same claim, its next rung
    assert later.template == choice.template  # the same template serves both: the allocator walks the ladder


def test_a_quarter_gpu_goes_where_the_pool_shares_and_asks_the_driver_to_time_slice() -> None:
    choice = planned(pod(gpu_tailor_io_gpu_milli="250"))
    assert ladder(choice) == ["shared-tesla-t4", "mig-2g-10gb", "mig-3g-20gb", "gpu-nvidia-h100-80gb-hbm3"]
    request = choice.template["spec"]["spec"]["devices"]["requests"][0]
    shared = request["firstAvailable"][0]
    assert shared["capacity"] == {"requests": {"memory": "3840Mi"}}  # a quarter of 15 GiB
    assert shared["selectors"][0]["cel"]["expression"] == (
        "device.attributes['gpu.nvidia.com'].productName == \"Tesla T4\" && device.allowMultipleAllocations")
    (config,) = choice.template["spec"]["spec"]["devices"]["config"]
    assert config["requests"] == ["gpu-0/shared-tesla-t4"]
    assert config["opaque"]["parameters"]["sharing"] == {"strategy": "TimeSlicing"}
    mps = planned(pod({"gpu-tailor.io/isolation": "mps"}, gpu_tailor_io_gpu_milli="250"), Isolation.MPS)
    assert ladder(mps) == ["shared-tesla-t4"]
    assert mps.template["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["sharing"] == {
        "strategy": "MPS"}
    assert mps.name != choice.name  # the template's name is a digest of what it asks


def test_four_quarters_share_one_gpu_until_its_memory_is_consumed() -> None:
    usage = Usage()
    pools = []
    for _ in range(9):
        choice = planned(pod(gpu_tailor_io_gpu_milli="250"), usage=usage)
        pick = choice.picks["main"]
        assert pick is not None
        pools.append((pick.rung.kind, pick.device.name))
        if pick.rung.kind is RungKind.SHARED:
            usage.consumed[pick.device.key] = usage.consumed.get(pick.device.key, 0) + pick.rung.request_bytes
        else:
            usage.taken.add(pick.device.key)
    assert pools[:8] == [(RungKind.SHARED, "gpu-0")] * 4 + [(RungKind.SHARED, "gpu-1")] * 4
    assert pools[8] == (RungKind.MIG, "gpu-1-mig-2g10gb-14-0")  # both T4s full: the next rung


def test_whole_gpus_isolation_and_products() -> None:
    two = planned(pod(gpu_tailor_io_gpu_milli="2000"))
    assert ladder(two) == ["gpu-nvidia-h100-80gb-hbm3"] and two.rungs["main"][0].count == 2
    assert two.template["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"][0]["count"] == 2
    assert ladder(planned(pod(gpu_tailor_io_gpu_memory="4Gi"), Isolation.MIG)) == ["mig-1g-5gb", "mig-2g-10gb",
                                                                                   "mig-3g-20gb"]
    assert ladder(planned(pod(gpu_tailor_io_gpu_memory="4Gi"), Isolation.EXCLUSIVE)) == [
        "gpu-nvidia-h100-80gb-hbm3"]
    a100 = planned(pod({"gpu-tailor.io/gpu-product": "A100"}, gpu_tailor_io_gpu_memory="4Gi"))
    assert ladder(a100) == ["mig-1g-5gb", "mig-2g-10gb", "mig-3g-20gb"]
    cel = a100.template["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"][0]["selectors"][0]["cel"]
    assert cel["expression"].endswith(f"productName in [\"{A100}\"]")


def test_refusals_say_why() -> None:
    too_big = choose(from_pod(pod(gpu_tailor_io_gpu_memory="100Gi")), Isolation.ANY, INV, Usage())
    assert isinstance(too_big, DraRefusal)
    assert too_big.message == ("container main: needs 100Gi of GPU memory; the largest DRA device is "
                               f"{H100} (80Gi)")
    linked = choose(from_pod(pod({"gpu-tailor.io/topology": "nvlink"}, gpu_tailor_io_gpu_milli="2000")),
                    Isolation.ANY, INV, Usage())
    assert isinstance(linked, DraRefusal) and "publishes no NVLink topology" in linked.message
    assert isinstance(choose(from_pod(pod(gpu_tailor_io_gpu_memory="4Gi")), Isolation.ANY, read_slices([]), Usage()),
                      DraRefusal)
    no_mig_class = choose(from_pod(pod(gpu_tailor_io_gpu_memory="4Gi")), Isolation.MIG, INV, Usage(), [GPU_CLASS])
    assert isinstance(no_mig_class, DraRefusal) and "DeviceClass mig.nvidia.com does not exist" in no_mig_class.message
    native = pod(gpu_tailor_io_gpu_memory="4Gi")
    native["spec"]["containers"].append({"name": "side", "resources": {"limits": {"nvidia.com/gpu": "1"}}})
    assert isinstance(choose(from_pod(native), Isolation.ANY, INV, Usage()), DraRefusal)


def test_at_most_eight_rungs_smallest_first() -> None:
    profiles = [("1g.5gb", 5), ("1g.10gb", 10), ("2g.10gb", 10), ("1g.20gb", 20), ("2g.20gb", 20), ("3g.20gb", 20),
                ("3g.40gb", 40), ("4g.40gb", 40), ("7g.80gb", 80)]
    devices = [mig(i, p, 19, 0, m, f"GPU-{i}") for i, (p, m) in enumerate(profiles)]
    inv = read_slices([resource_slice("many", devices), hgx()])
    choice = choose(from_pod(pod(gpu_tailor_io_gpu_memory="1Gi")), Isolation.ANY, inv, Usage())
    assert isinstance(choice, DraChoice)
    assert len(choice.rungs["main"]) == MAX_RUNGS
    assert [r.identity for r in choice.rungs["main"]][:3] == ["1g.5gb", "1g.10gb", "1g.20gb"]


def test_two_containers_get_two_requests_of_one_claim_on_one_node() -> None:
    """The A100 node holds one 20Gi MIG device, not two: one claim's devices are on one node, so both go whole on
    the HGX node (the allocator would refuse the claim on the A100 node)."""
    p = pod(gpu_tailor_io_gpu_memory="20Gi")
    p["spec"]["containers"].append({"name": "side", "resources": {"limits": {"gpu-tailor.io/gpu-memory": "20Gi"}}})
    choice = planned(p)
    assert choice.requests == {"main": "gpu-0", "side": "gpu-1"}
    first, second = choice.picks["main"], choice.picks["side"]
    assert first is not None and second is not None
    assert {first.device.pool, second.device.pool} == {"dra-h100-hgx-0"}
    assert (first.device.name, second.device.name) == ("gpu-0", "gpu-1")
    assert [r["name"] for r in choice.template["spec"]["spec"]["devices"]["requests"]] == ["gpu-0", "gpu-1"]


def test_a_plain_init_container_uses_the_request_of_an_app_container_that_holds_its_ask() -> None:
    p = pod(gpu_tailor_io_gpu_memory="4Gi")
    p["spec"]["initContainers"] = [{"name": "warm", "resources": {"limits": {"gpu-tailor.io/gpu-memory": "4Gi"}}},
                                   {"name": "big", "resources": {"limits": {"gpu-tailor.io/gpu-memory": "30Gi"}}}]
    choice = planned(p)
    assert choice.requests == {"main": "gpu-0", "init:warm": "gpu-0", "init:big": "gpu-1"}
    assert list(choice.rungs) == ["main", "init:big"]  # one request each for what runs at once


def test_no_allow_multiple_allocations_in_cel_where_no_pool_shares() -> None:
    """Consumable capacity is alpha and off in 1.34 and 1.35, where CEL does not know the field: a template naming
    it is refused. It is named only where some pool shares (and so the gate is on)."""
    plain = choose(from_pod(pod(gpu_tailor_io_gpu_milli="1000")), Isolation.ANY, read_slices([hgx(), a100_mig()]),
                   Usage())
    assert isinstance(plain, DraChoice)
    cel = json.dumps(plain.template)
    assert "allowMultipleAllocations" not in cel
    mixed = planned(pod(gpu_tailor_io_gpu_milli="1000"))
    (rung,) = mixed.template["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]
    assert rung["selectors"][0]["cel"]["expression"].endswith("&& !device.allowMultipleAllocations")


def test_a_shared_request_is_whole_mib_never_less_than_the_ask() -> None:
    choice = planned(pod(gpu_tailor_io_gpu_memory="10G"))  # 10^10 bytes: 9536.74 MiB
    shared = [r for r in choice.rungs["main"] if r.kind is RungKind.SHARED]
    assert shared and shared[0].request_bytes == 9537 * 2**20 >= 10**10
    assert shared[0].subrequest()["capacity"] == {"requests": {"memory": "9537Mi"}}


def test_cordoned_nodes_pools_are_left_out() -> None:
    everywhere = planned(pod(gpu_tailor_io_gpu_memory="20Gi"))
    assert everywhere.picks["main"] is not None and everywhere.picks["main"].device.pool == "dra-a100-mig-0"
    elsewhere = choose(from_pod(pod(gpu_tailor_io_gpu_memory="20Gi")), Isolation.ANY, INV, Usage(),
                       nodes={"dra-h100-hgx-0", "dra-t4-shared-0"})
    assert isinstance(elsewhere, DraChoice) and [r.name for r in elsewhere.rungs["main"]] == [
        "gpu-nvidia-h100-80gb-hbm3"]
    assert isinstance(choose(from_pod(pod(gpu_tailor_io_gpu_memory="20Gi")), Isolation.ANY, INV, Usage(),
                             nodes=set()), DraRefusal)


def test_state_follows_slices_claims_and_classes() -> None:
    state = DraState()
    assert not state.ready
    state.reset_slices([hgx(), {"spec": {"driver": "other"}, "metadata": {"name": "x"}}])
    state.reset_claims([])
    state.reset_classes(device_classes())
    assert state.ready and list(state.slices) == ["dra-h100-hgx-0-gpu.nvidia.com-0"]
    assert state.extended() == {"nvidia.com/gpu": "gpu.nvidia.com"}
    assert len(state.inventory().pools["dra-h100-hgx-0"].devices) == 8
    claim = {"metadata": {"uid": "u1"}, "status": {"allocation": {"devices": {"results": [
        {"request": "gpu-0", "driver": "gpu.nvidia.com", "pool": "dra-h100-hgx-0", "device": "gpu-0"}]}}}}
    state.apply_claim("MODIFIED", claim)
    assert state.usage().taken == {("gpu.nvidia.com", "dra-h100-hgx-0", "gpu-0")}
    state.apply_claim("DELETED", claim)
    assert state.usage().taken == set()
    state.apply_slice("ADDED", resource_slice("n2", [gpu(0, H100, 80, "z")]))
    assert set(state.inventory().pools) == {"dra-h100-hgx-0", "n2"}
    state.apply_slice("DELETED", hgx())
    assert set(state.inventory().pools) == {"n2"}
    state.apply_class("DELETED", device_classes()[0])
    assert state.extended() == {}
    assert DraState(enabled=False).ready


def test_an_ask_record_that_gpu_tailor_did_not_write_reads_as_none() -> None:
    from gpu_tailor.gpumodel.ask import from_canonical
    assert from_canonical('{"containers":{"main":{"gpuMilli":1e999}}}') is None
    assert from_canonical("[" * 100_000) is None
    assert from_canonical('{"containers":{"main":{"gpuMemory":"20Gi"}},"isolation":"any"}') is not None
