"""The extender on DRA pools (issue 27): it never refuses a node where DRA serves a native ask (KEP-5004: the
scheduler's DynamicResources plugin allocated the claim there before asking), scores claim pods by the rung the
allocator would take on each node and then by fullness, keeps device-plugin nodes first for native asks, and binds
DRA pods without a GPU annotation (the claim's allocation is the record)."""

from __future__ import annotations

import copy
import json
from typing import Any

from gpu_tailor.extender import verbs, wire
from gpu_tailor.extender.cache import Cache
from gpu_tailor.extender.records import pod_record
from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.dra_state import DraState
from tests.extender.builders import NODE_NAMES, cluster, gpu_pod, pod_of
from tests.gpumodel.dra_slices import a100_mig, device_classes, hgx, plain_node, shared_t4

DRA_NODES = ["dra-h100-hgx-0", "dra-a100-mig-0", "dra-t4-shared-0"]


def held(pool: str, *devices: str, memory: str = "") -> dict[str, Any]:
    results = [{"request": "gpu-0", "driver": "gpu.nvidia.com", "pool": pool, "device": d,
                **({"shareID": "s", "consumedCapacity": {"memory": memory}} if memory else {})} for d in devices]
    return {"metadata": {"uid": f"claim-{pool}-{'-'.join(devices)}-{memory}"},
            "status": {"allocation": {"devices": {"results": results}}}}


def dra_cache(claims: list[dict[str, Any]] = (), pods: list[dict[str, Any]] = (),  # type: ignore[assignment]
              slices: list[dict[str, Any]] | None = None) -> Cache:
    cache = cluster(pods, extra_nodes=[plain_node(n) for n in DRA_NODES])
    state = DraState()
    state.reset_slices(slices if slices is not None else [hgx(), a100_mig(), shared_t4()])
    state.reset_claims(claims)
    state.reset_classes(device_classes())
    cache.dra = state
    return cache


def claim_pod(name: str, ask: dict[str, Any], backing: str) -> dict[str, Any]:
    """A pod as the webhook leaves it on a DRA pool: no GPU resources, its ask and backing annotated."""
    pod = copy.deepcopy(pod_of("filter-nodecache-true-pod-gpu4"))
    canonical = {"containers": {"main": ask}, "isolation": "any", "topology": "prefer-nvlink"}
    pod["metadata"].update(name=name, uid=f"uid-{name}", annotations={
        labels.ANN_ASK: json.dumps(canonical), labels.ANN_BACKING: backing})
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu-tailor", "request": "gpu-0"}]}
    pod["spec"]["resourceClaims"] = [{"name": "gpu-tailor", "resourceClaimTemplateName": "gpu-tailor-x"}]
    return pod


def body(pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {"Pod": pod, "NodeNames": names}


def scores(cache: Cache, pod: dict[str, Any], names: list[str]) -> dict[str, int]:
    return {h["Host"]: h["Score"] for h in verbs.prioritize(cache.snapshot(), body(pod, names))}


def test_native_gpus_pass_on_dra_nodes_that_sell_none_of_them_themselves() -> None:
    cache = dra_cache()
    out = verbs.filter_nodes(cache.snapshot(), body(gpu_pod("two", 2), NODE_NAMES + DRA_NODES))
    assert set(DRA_NODES) <= set(out["NodeNames"])
    refused = {**out["FailedNodes"], **out["FailedAndUnresolvableNodes"]}
    assert "h100-hgx-0" in out["NodeNames"] and "cpu-node-0" in refused
    plain = cluster([], extra_nodes=[plain_node(n) for n in DRA_NODES])  # DRA off: as before
    before = verbs.filter_nodes(plain.snapshot(), body(gpu_pod("two", 2), DRA_NODES))
    assert before["NodeNames"] == [] and set(before["FailedAndUnresolvableNodes"]) == set(DRA_NODES)


def test_native_asks_keep_device_plugin_nodes_first_then_the_fullest_dra_node() -> None:
    cache = dra_cache()
    everything = scores(cache, gpu_pod("two", 2), NODE_NAMES + DRA_NODES)
    assert everything["h100-hgx-0"] > 0 and all(everything[n] == 0 for n in DRA_NODES)
    second = hgx("dra-h100-hgx-1")
    cache = dra_cache(claims=[held("dra-h100-hgx-1", *(f"gpu-{i}" for i in range(5)))],
                      slices=[hgx(), second, a100_mig(), shared_t4()])
    cache.reset_nodes([plain_node(n) for n in [*DRA_NODES, "dra-h100-hgx-1"]])
    only_dra = scores(cache, gpu_pod("two", 2), ["dra-h100-hgx-0", "dra-h100-hgx-1", "dra-a100-mig-0"])
    assert only_dra["dra-h100-hgx-1"] > only_dra["dra-h100-hgx-0"] > 0  # 3 free there: fill it first
    assert only_dra["dra-a100-mig-0"] == 0  # MIG devices only: no whole GPU to serve nvidia.com/gpu


def test_a_claim_pod_is_scored_by_the_smallest_device_each_node_would_give() -> None:
    pod = claim_pod("twenty", {"gpuMemory": "20Gi"}, "dra:mig-3g-20gb")
    names = NODE_NAMES + DRA_NODES
    first = scores(dra_cache(), pod, names)
    assert first["dra-a100-mig-0"] > first["dra-h100-hgx-0"] > 0
    assert first["dra-t4-shared-0"] == 0 and all(first[n] == 0 for n in NODE_NAMES)
    taken = scores(dra_cache([held("dra-a100-mig-0", "gpu-1-mig-3g20gb-9-4")]), pod, names)
    assert taken["dra-h100-hgx-0"] == 10 and taken["dra-a100-mig-0"] == 0
    assert verbs.filter_nodes(dra_cache().snapshot(), body(pod, names))["NodeNames"] == names  # no GPU resource


def test_a_quarter_claim_goes_to_the_shared_pool_until_its_memory_is_consumed() -> None:
    pod = claim_pod("quarter", {"gpuMilli": 250}, "dra:shared-tesla-t4")
    assert max(scores(dra_cache(), pod, DRA_NODES).items(), key=lambda kv: kv[1])[0] == "dra-t4-shared-0"
    full = [held("dra-t4-shared-0", f"gpu-{i}", memory="15Gi") for i in range(2)]
    after = scores(dra_cache(full), pod, DRA_NODES)
    assert after["dra-t4-shared-0"] == 0 and after["dra-a100-mig-0"] == 10  # a 2g.10gb MIG device next


def test_binding_on_a_dra_node_writes_no_gpu_annotation() -> None:
    cache = dra_cache()
    pod = gpu_pod("two", 2)
    plan = verbs.plan_bind(cache.snapshot(), pod_record(pod), "dra-h100-hgx-0")
    assert plan.error == "" and plan.placement is None and plan.gpus is None
    off = cluster([], extra_nodes=[plain_node(n) for n in DRA_NODES])
    assert verbs.plan_bind(off.snapshot(), pod_record(pod), "dra-h100-hgx-0").error  # DRA off: no GPUs there


def test_bound_native_pods_on_dra_nodes_are_counted_for_cpu_and_memory_only() -> None:
    bound = gpu_pod("on-dra", 2, node="dra-h100-hgx-0")
    bound["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "4"
    info = dra_cache(pods=[bound]).snapshot().nodes["dra-h100-hgx-0"]
    (key,) = info.pods
    assert info.pods[key].uid == "uid-on-dra" and info.state.cpu_used == 4000
    assert info.state.gpus.slots == [] and not info.state.inventory.has_gpus  # no GPU of its own to count on


def test_not_ready_until_dra_is_listed() -> None:
    cache = cluster([])
    assert cache.ready
    cache.dra = DraState()
    assert not cache.ready
    cache.dra.reset_slices([])
    cache.dra.reset_claims([])
    cache.dra.reset_classes([])
    assert cache.ready


def test_a_claim_allocated_rewrites_its_nodes_row_alone(monkeypatch: Any) -> None:
    """What the claims watch brings is written into the fleet on the next snapshot, for the claim's node alone: a
    cluster of many DRA nodes is not copied again for each claim kube-scheduler allocates."""
    cache = dra_cache(slices=[hgx(), hgx("dra-h100-hgx-1"), a100_mig(), shared_t4()])
    cache.reset_nodes([plain_node(n) for n in [*DRA_NODES, "dra-h100-hgx-1"]])
    cache.snapshot()
    refreshed: list[str] = []
    real = Cache._refresh

    def spy(self: Cache, name: str) -> None:
        refreshed.append(name)
        real(self, name)

    monkeypatch.setattr(Cache, "_refresh", spy)
    cache.dra.apply_claim("ADDED", held("dra-h100-hgx-1", "gpu-0", "gpu-1"))
    snap = cache.snapshot()
    at = snap.fleet.index["dra-h100-hgx-1"]
    assert refreshed == ["dra-h100-hgx-1"]
    assert snap.fleet.gpu[at, :8].tolist() == [0, 0] + [1000] * 6
    refreshed.clear()
    cache.dra.apply_slice("MODIFIED", hgx())  # a slice republished: every DRA node's row is written again
    cache.snapshot()
    assert set(refreshed) == {*DRA_NODES, "dra-h100-hgx-1"}


def test_where_dra_serves_native_gpus_follows_a_node_that_starts_selling_them() -> None:
    """The nodes DRA serves ``nvidia.com/gpu`` on are kept across pods and claims, and found again when a node
    comes, goes, or starts selling the resource through the device plugin."""
    cache = dra_cache()
    pod = gpu_pod("two", 2)
    assert set(DRA_NODES) <= verbs.dra_served(cache.snapshot(), wire.extender_args(body(pod, DRA_NODES)).demand)
    cache.dra.apply_claim("ADDED", held("dra-h100-hgx-0", "gpu-0"))
    demand = wire.extender_args(body(pod, DRA_NODES)).demand
    assert "dra-h100-hgx-0" in verbs.dra_served(cache.snapshot(), demand)
    selling = plain_node("dra-h100-hgx-0")
    for key in ("capacity", "allocatable"):
        selling["status"][key] = {**selling["status"][key], "nvidia.com/gpu": "8"}
    cache.apply_node("MODIFIED", selling)
    assert "dra-h100-hgx-0" not in verbs.dra_served(cache.snapshot(), demand)
    cache.apply_node("DELETED", selling)
    assert "dra-h100-hgx-0" in verbs.dra_served(cache.snapshot(), demand)  # slices without a node: served


def test_a_group_device_plugin_nodes_serve_is_refused_there_whole_not_left_to_dra() -> None:
    """Where device-plugin nodes serve the ask, the group is planned there, or refused, as without DRA: its pods are
    never placed one by one over device-plugin nodes because DRA serves the resource elsewhere."""
    group = {labels.ANN_GROUP: "trio", labels.ANN_GROUP_SIZE: "3", labels.ANN_GROUP_DOMAIN: "required"}
    pod = gpu_pod("trio-0", 4, annotations=group)
    names = [*NODE_NAMES, *DRA_NODES]
    answer = dra_cache().group_answer(pod, wire.extender_args(body(pod, names)).demand, names)
    assert answer is not None and answer.node is None and "fits in no NVLink domain as a whole" in answer.reason
