"""DRA pools packed by the placement policy: a node's DRA GPUs become its fleet row (whole devices, or the memory left
on shared ones, in the order kube-scheduler's allocator searches them), the allocator's pick is what the fleet
predicts (first fit), and a claim of whole GPUs or of a share of a shared GPU is ranked by the fragmentation that
pick leaves, as a device-plugin ask is."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from gpu_tailor.extender import verbs, wire
from gpu_tailor.extender.cache import Cache
from gpu_tailor.gpumodel.devices import dra as claims
from gpu_tailor.gpumodel.dra import read_slices
from gpu_tailor.gpumodel.dra_state import DraState
from gpu_tailor.gpumodel.dra_usage import Usage, gpu_column
from gpu_tailor.gpumodel.fleet import MILLI, PICK_ANY, PICK_FIRST, Fleet, Shape, candidates
from gpu_tailor.gpumodel.policies import POLICIES
from tests.extender.builders import cluster, gpu_pod
from tests.extender.test_dra import claim_pod, held
from tests.gpumodel.dra_slices import (
    H100,
    T4,
    a100_mig,
    device_classes,
    gpu,
    hgx,
    plain_node,
    resource_slice,
    shared_gpu,
    shared_t4,
)

GIB = 2**30


def dra_cluster(slices: list[dict[str, Any]], claims_held: list[dict[str, Any]] = ()) -> Cache:  # type: ignore[assignment]
    nodes = sorted({s["spec"]["nodeName"] for s in slices})
    cache = cluster([], extra_nodes=[plain_node(n) for n in nodes])
    state = DraState()
    state.reset_slices(slices)
    state.reset_claims(list(claims_held))
    state.reset_classes(device_classes())
    cache.dra = state
    return cache


def row(cache: Cache, node: str) -> tuple[list[int], int]:
    snap = cache.snapshot()
    at = snap.fleet.index[node]
    return snap.fleet.gpu[at, : snap.fleet.ngpu[at]].tolist(), int(snap.fleet.pick[at])


def ranked(cache: Cache, pod: dict[str, Any], names: list[str], teach: int = 0) -> list[str]:
    """The candidates by prioritize's score, best first (ties by name); ``teach``: the policy first learns the pod's
    shape that many times, as it does from every pod it is asked to prioritize."""
    args = {"Pod": pod, "NodeNames": names}
    for i in range(teach):
        asked = verbs.shape_asked(cache.snapshot(), args)
        assert asked is not None
        cache.observe(f"{asked[0]}-{i}", asked[1])
    scores = {h["Host"]: h["Score"] for h in verbs.prioritize(cache.snapshot(), args)}
    return sorted((n for n in names if scores[n]), key=lambda n: (-scores[n], n))


def test_a_nodes_dra_gpus_are_its_fleet_row_in_the_allocators_order() -> None:
    # one pool in two slices, listed out of order: the allocator searches by slice name, then as each lists them
    parts = [resource_slice("dra-split", [gpu(i, H100, 80, f"GPU-s{i}") for i in (4, 5)], count=2, part=1),
             resource_slice("dra-split", [gpu(i, H100, 80, f"GPU-s{i}") for i in (0, 1, 2, 3)], count=2, part=0)]
    inv = read_slices(parts)
    assert [d.name for d in inv.pools["dra-split"].devices.values()] == [f"gpu-{i}" for i in range(6)]
    cache = dra_cluster([hgx(), shared_t4(), a100_mig(), *parts],
                        [held("dra-h100-hgx-0", "gpu-0", "gpu-3"), held("dra-t4-shared-0", "gpu-0", memory="10Gi"),
                         held("dra-split", "gpu-4")])
    assert row(cache, "dra-h100-hgx-0") == ([0, 1000, 1000, 0, 1000, 1000, 1000, 1000], PICK_FIRST)
    assert row(cache, "dra-t4-shared-0") == ([5 * 1000 // 15, 1000], PICK_FIRST)  # 5 of 15 GiB left on gpu-0
    assert row(cache, "dra-split") == ([1000, 1000, 1000, 1000, 0, 1000], PICK_FIRST)
    assert row(cache, "dra-a100-mig-0") == ([], PICK_ANY)  # static MIG: no GPU is published whole
    # an allocation the claims watch brings, and one released: the next snapshot writes the rows again
    cache.dra.apply_claim("ADDED", held("dra-h100-hgx-0", "gpu-1"))
    cache.dra.apply_claim("DELETED", held("dra-h100-hgx-0", "gpu-0", "gpu-3"))
    assert row(cache, "dra-h100-hgx-0")[0] == [1000, 0, 1000, 1000, 1000, 1000, 1000, 1000]
    cache.dra.apply_slice("DELETED", hgx())  # the driver gone from the node: nothing of DRA left there
    assert row(cache, "dra-h100-hgx-0") == ([], PICK_ANY)


def test_a_node_with_shared_and_whole_devices_is_not_one_row() -> None:
    both = resource_slice("dra-mixed", [gpu(0, T4, 15, "GPU-m0"), shared_gpu(1, T4, 15, "GPU-m1")])
    assert gpu_column(read_slices([both]).pools.values(), Usage()) is None
    assert row(dra_cluster([both]), "dra-mixed") == ([], PICK_ANY)


def test_the_allocators_pick_is_the_first_device_with_room() -> None:
    fleet = Fleet()
    fleet.upsert("dra", 1000, 1000, [200, 1000, 700, 1000], pick=PICK_FIRST)
    fleet.upsert("plugin", 1000, 1000, [200, 1000, 700, 1000])  # the policy chooses the GPU
    c = candidates(fleet, Shape(0, 0, 1, 300), fleet.rows())
    assert sorted(c.gpu[c.node == 0].tolist()) == [1] and sorted(c.gpu[c.node == 1].tolist()) == [1, 2]
    policy = POLICIES["tailor"](fleet, 0)
    assert policy.whole_gpus(0, Shape(0, 0, 2, MILLI)) == (1, 3)  # the first idle ones, as the allocator takes


def test_a_whole_gpu_claim_goes_where_the_rest_stays_usable_not_merely_to_the_fullest_node() -> None:
    # 3 GPUs free on one node, 4 on the other: a 2-GPU claim on the first strands one GPU no 2-GPU claim can use
    three, four = hgx("dra-three"), hgx("dra-four")
    cache = dra_cluster([three, four], [held("dra-three", *(f"gpu-{i}" for i in range(5))),
                                        held("dra-four", *(f"gpu-{i}" for i in range(4)))])
    pod = claim_pod("pair", {"gpuMilli": 2000}, "dra:gpu-nvidia-h100-80gb-hbm3")
    ladders = verbs.claim_ladders(cache.snapshot(), pod)
    assert ladders is not None and claims.fleet_shape(ladders, 0, 0) == (Shape(0, 0, 2, MILLI), False)
    inv, usage = cache.dra.inventory(), cache.dra.usage()
    fullest = min(["dra-three", "dra-four"], key=lambda n: claims.claim_preference(ladders, inv, usage, n) or ())
    assert fullest == "dra-three"  # what the fixed order (fullest first) picks
    assert ranked(cache, pod, ["dra-three", "dra-four"], teach=20) == ["dra-four", "dra-three"]


def test_a_shared_claim_fills_the_device_the_allocator_would_fill_exactly() -> None:
    # a 5 GiB claim of 15 GiB T4s: on one node the allocator's first device with room has exactly 5 GiB left, which
    # the 9 GiB claims of the mix cannot use; on the other it would cut into an idle T4
    exact, fresh = shared_t4("dra-t4-exact"), shared_t4("dra-t4-fresh")
    cache = dra_cluster([exact, fresh], [held("dra-t4-exact", "gpu-0", memory="10Gi")])
    pod = claim_pod("third", {"gpuMemory": "5Gi"}, "dra:shared-tesla-t4")
    ladders = verbs.claim_ladders(cache.snapshot(), pod)
    assert ladders is not None
    shape, shared = claims.fleet_shape(ladders, 0, 0) or (None, False)
    assert shared and shape == Shape(0, 0, 1, 5 * 1000 // 15)
    picks = claims.node_picks(ladders, cache.dra.inventory(), cache.dra.usage(), "dra-t4-exact")
    pick = next(iter(picks.values())) if picks else None
    assert pick is not None and pick.device.name == "gpu-0"  # the allocator: the exact fit
    snap = cache.snapshot()
    c = candidates(snap.fleet, shape, np.array([snap.fleet.index["dra-t4-exact"]]))
    assert c.gpu.tolist() == [0] and c.after.tolist() == [0]  # the fleet predicts the same device, left empty
    ranked(cache, claim_pod("nine", {"gpuMemory": "9Gi"}, "dra:shared-tesla-t4"), ["dra-t4-fresh"], teach=10)
    assert ranked(cache, pod, ["dra-t4-fresh", "dra-t4-exact"], teach=10) == ["dra-t4-exact", "dra-t4-fresh"]
    full = dra_cluster([exact, fresh], [held("dra-t4-exact", f"gpu-{i}", memory="12Gi") for i in range(2)])
    assert ranked(full, pod, ["dra-t4-fresh", "dra-t4-exact"]) == ["dra-t4-fresh"]  # 3 GiB left: no room there


def test_claims_the_fleet_cannot_hold_keep_the_fixed_order() -> None:
    # a 20 GiB ask on a cluster with MIG devices and whole GPUs: rungs of two kinds, ranked as before
    cache = dra_cluster([hgx(), a100_mig()])
    pod = claim_pod("twenty", {"gpuMemory": "20Gi"}, "dra:mig-3g-20gb")
    ladders = verbs.claim_ladders(cache.snapshot(), pod)
    assert ladders is not None and claims.fleet_shape(ladders, 0, 0) is None
    assert ranked(cache, pod, ["dra-h100-hgx-0", "dra-a100-mig-0"]) == ["dra-a100-mig-0", "dra-h100-hgx-0"]


def test_the_policy_learns_a_claims_share_of_the_gpus() -> None:
    cache = dra_cluster([hgx()])
    pod = copy.deepcopy(claim_pod("four", {"gpuMilli": 4000}, "dra:gpu-nvidia-h100-80gb-hbm3"))
    asked = verbs.shape_asked(cache.snapshot(), {"Pod": pod, "NodeNames": ["dra-h100-hgx-0"]})
    assert asked is not None and (asked[1].gpus, asked[1].milli) == (4, MILLI)


def test_the_nodes_dra_serves_a_native_ask_on_follow_the_slices_and_classes() -> None:
    cache = dra_cluster([hgx(), shared_t4()])
    demand = wire.extender_args({"Pod": gpu_pod("two", 2), "NodeNames": []}).demand
    assert verbs.dra_served(cache.snapshot(), demand) == {"dra-h100-hgx-0", "dra-t4-shared-0"}
    cache.dra.apply_slice("DELETED", shared_t4())  # the nodes unchanged, DRA not: asked again
    assert verbs.dra_served(cache.snapshot(), demand) == {"dra-h100-hgx-0"}
    cache.dra.apply_class("DELETED", device_classes()[0])  # nothing maps nvidia.com/gpu to DRA any more
    assert verbs.dra_served(cache.snapshot(), demand) == frozenset()


def big_shared(node: str) -> list[dict[str, Any]]:
    """Two shared GPUs of 81559 MiB (an H100's memory as the driver reports it)."""
    devices = [shared_gpu(i, H100, 80, f"GPU-{node}-{i}") for i in range(2)]
    for d in devices:
        d["capacity"]["memory"]["value"] = "81559Mi"
    return [resource_slice(node, devices)]


def test_a_share_the_rounding_would_put_on_a_device_the_allocator_skips_is_not_scored_there() -> None:
    # 19999 MiB left on gpu-0 of one node, a 20000 MiB claim: in thousandths both are 245, yet the allocator takes
    # gpu-1; scored as the exact fill it is not, the node would win
    edge, fresh = big_shared("dra-edge"), big_shared("dra-fresh")
    cache = dra_cluster([*edge, *fresh], [held("dra-edge", "gpu-0", memory=f"{81559 - 19999}Mi")])
    pod = claim_pod("twenty", {"gpuMemory": "20000Mi"}, "dra:shared-nvidia-h100-80gb-hbm3")
    picks = claims.node_picks(verbs.claim_ladders(cache.snapshot(), pod) or {}, cache.dra.inventory(),
                              cache.dra.usage(), "dra-edge")
    assert picks is not None and next(iter(picks.values())).device.name == "gpu-1"  # type: ignore[union-attr]
    assert ranked(cache, pod, ["dra-edge", "dra-fresh"], teach=3) == ["dra-fresh"]
    over = dra_cluster(big_shared("dra-over"), [held("dra-over", "gpu-0", memory="90000Mi")])
    assert row(over, "dra-over")[0] == [0, 1000]  # more consumed than it has: no room, never a negative share


def test_a_node_the_fleet_cannot_hold_the_claim_on_puts_every_node_back_to_the_fixed_order() -> None:
    both = resource_slice("dra-mixed", [shared_gpu(0, T4, 15, "GPU-m0"), gpu(1, T4, 15, "GPU-m1")])
    cache = dra_cluster([both, shared_t4("dra-t4-shared-0")])
    pod = claim_pod("third", {"gpuMemory": "5Gi"}, "dra:shared-tesla-t4")
    out = ranked(cache, pod, ["dra-mixed", "dra-t4-shared-0"])
    assert set(out) == {"dra-mixed", "dra-t4-shared-0"}  # both ranked, on one scale, neither scored 0
