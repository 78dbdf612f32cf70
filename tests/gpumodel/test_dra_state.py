"""``DraState`` kept claim by claim: what the claims watch changes is counted from that claim alone (the usage, each
node's free GPUs, which nodes changed), and always equals what counting every claim again gives."""

from __future__ import annotations

import random
from typing import Any

from gpu_tailor.gpumodel.dra import DeviceType
from gpu_tailor.gpumodel.dra_state import CHANGES, DraState
from gpu_tailor.gpumodel.dra_usage import Usage
from tests.gpumodel.dra_slices import device_classes, dynamic_h100, hgx, shared_t4

SLICES = [hgx("dra-a"), hgx("dra-b"), *dynamic_h100("dra-dyn", gpus=2), shared_t4("dra-t4")]


def claim(uid: str, results: list[tuple[str, str, str]]) -> dict[str, Any]:
    """A claim allocated ``(pool, device, memory)`` each: a share of a shared device where memory is given."""
    out = [{"request": "gpu-0", "driver": "gpu.nvidia.com", "pool": pool, "device": device,
            **({"shareID": f"s-{uid}", "consumedCapacity": {"memory": memory}} if memory else {})}
           for pool, device, memory in results]
    return {"metadata": {"uid": uid, "name": uid, "namespace": "team"},
            "status": {"allocation": {"devices": {"results": out}}}}


def state() -> DraState:
    s = DraState()
    s.reset_slices(SLICES)
    s.reset_claims([])
    s.reset_classes(device_classes())
    return s


def recount(s: DraState) -> Usage:
    return Usage.of(s.holds.values(), s.inventory())


def free_gpus(s: DraState, usage: Usage, node: str) -> int:
    return sum(1 for p in s.inventory().on_node(node) for d in p.devices.values()
               if d.type is DeviceType.GPU and not d.shared and usage.free(d))


def test_the_usage_counted_claim_by_claim_is_the_usage_of_every_claim_counted_again() -> None:
    """Claims allocated, changed and released at random (whole GPUs, MIG partitions carved from shared counters,
    shares of shared GPUs, and a device two claims name at once, as the watch can show for a moment)."""
    rng = random.Random(7)
    s = state()
    devices = [(p.name, d.name, d.shared) for p in s.inventory().pools.values() for d in p.devices.values()]
    live: dict[str, dict[str, Any]] = {}
    for step in range(400):
        uid = f"c{rng.randrange(40)}"
        if uid in live and rng.random() < 0.4:
            s.apply_claim("DELETED", live.pop(uid))
        else:
            picked = rng.sample(devices, rng.randint(1, 2))
            event = "MODIFIED" if uid in live else "ADDED"
            live[uid] = claim(uid, [(pool, name, f"{rng.randint(1, 6)}Gi" if shared else "")
                                    for pool, name, shared in picked])
            s.apply_claim(event, live[uid])
        kept, again = s.usage(), recount(s)
        assert (kept.taken, kept.consumed, kept.left) == (again.taken, again.consumed, again.left), step
        for node in ("dra-a", "dra-b", "dra-dyn", "dra-t4"):
            assert s.free_gpus(node) == free_gpus(s, again, node), (step, node)


def test_a_usage_handed_out_stays_as_it_was_when_a_claim_changes() -> None:
    s = state()
    before = s.usage()
    s.apply_claim("ADDED", claim("c1", [("dra-a", "gpu-0", "")]))
    assert ("gpu.nvidia.com", "dra-a", "gpu-0") in s.usage().taken
    assert not before.taken  # what a request read before the claim came is not changed under it


def test_a_claim_changes_its_devices_nodes_alone_and_slices_or_classes_change_any() -> None:
    s = state()
    start = s.version
    assert s.changed_since(start) == set()
    s.apply_claim("ADDED", claim("c1", [("dra-a", "gpu-0", "")]))
    s.apply_claim("ADDED", claim("c2", [("dra-t4", "gpu-0", "4Gi")]))
    assert s.changed_since(start) == {"dra-a", "dra-t4"}
    middle = s.version
    s.apply_claim("MODIFIED", claim("c1", [("dra-b", "gpu-3", "")]))  # moved: both nodes changed
    assert s.changed_since(middle) == {"dra-a", "dra-b"}
    s.apply_claim("MODIFIED", claim("c1", [("dra-b", "gpu-3", "")]))  # the same hold again: no change
    assert s.changed_since(middle) == {"dra-a", "dra-b"}
    layout = s.layout
    s.apply_slice("MODIFIED", hgx("dra-a"))
    assert s.changed_since(middle) is None and s.layout == layout + 1
    now = s.version
    s.apply_class("ADDED", device_classes()[0])
    assert s.changed_since(now) is None


def test_changes_too_far_back_count_as_any_node() -> None:
    s = state()
    start = s.version
    for i in range(CHANGES + 1):
        s.apply_claim("ADDED" if i % 2 == 0 else "DELETED", claim("c", [("dra-a", "gpu-0", "")]))
    assert s.changed_since(start) is None
    assert s.changed_since(s.version - 1) == {"dra-a"}
