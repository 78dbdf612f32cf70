"""``explain`` and ``capacity`` on DRA pools (issue 27): the claim the pod would get, the device the allocator would
pick on each node, and free devices and memory per pool."""

from __future__ import annotations

import json
from typing import Any

from gpu_tailor.tools.capacity import capacity, table
from gpu_tailor.tools.explain import explain
from gpu_tailor.tools.source import Cluster, dra_state, load_dump
from gpu_tailor.webhook.config import AdmissionPolicy
from tests.gpumodel.dra_slices import device_classes, dynamic_h100, h100_mig, hgx, plain_node, resource_slice, shared_t4

NODES = ["dra-h100-hgx-0", "dra-h100-mig-0", "dra-t4-shared-0"]


def held(pool: str, device: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"uid": f"c-{device}"},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu-0", "driver": "gpu.nvidia.com", "pool": pool, "device": device}]}}}}


def cluster(claims: list[dict[str, Any]] = ()) -> Cluster:  # type: ignore[assignment]
    return Cluster([plain_node(n) for n in NODES], [], {"team-a": {"gpu-tailor.io/enabled": "true"}}, "test",
                   dra=dra_state([hgx(), h100_mig(), shared_t4()], list(claims), device_classes()))


def pod(limits: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"},
            "spec": {"containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}]}}


def test_explain_tells_the_claim_and_the_device_before_the_pod_exists() -> None:
    e = explain(pod({"gpu-tailor.io/gpu-memory": "20Gi"}), "pod p", cluster(), AdmissionPolicy())
    assert e.admission.allowed and e.stored["spec"]["resourceClaims"][0]["resourceClaimTemplateName"].startswith(
        "gpu-tailor-")
    assert e.chosen == "dra-h100-mig-0"
    by = {v.node: v for v in e.nodes}
    assert by["dra-h100-mig-0"].detail == "claim: MIG 2g.20gb (20Gi) -> device gpu-0-mig-2g20gb-14-0"
    assert by["dra-h100-hgx-0"].fits and by["dra-h100-hgx-0"].score < by["dra-h100-mig-0"].score  # type: ignore
    assert by["dra-t4-shared-0"].reasons == ["cannot allocate all claims"]
    taken = explain(pod({"gpu-tailor.io/gpu-memory": "20Gi"}), "pod p",
                    cluster([held("dra-h100-mig-0", "gpu-0-mig-2g20gb-14-0")]), AdmissionPolicy())
    assert {v.node: v.detail for v in taken.nodes}["dra-h100-mig-0"] == (
        "claim: MIG 3g.40gb (40Gi) -> device gpu-1-mig-3g40gb-9-4")


def test_explain_a_native_ask_served_by_dra_and_an_impossible_one() -> None:
    e = explain(pod({"nvidia.com/gpu": "2"}), "pod p", cluster(), AdmissionPolicy())
    assert e.chosen == "dra-h100-hgx-0"
    assert {v.node: v.detail for v in e.nodes}["dra-h100-hgx-0"] == (
        "claim of 2 x nvidia.com/gpu through DRA (6 GPUs left free)")
    huge = explain(pod({"gpu-tailor.io/gpu-memory": "200Gi"}), "pod p", cluster(), AdmissionPolicy())
    assert not huge.admission.allowed and "largest DRA device is NVIDIA H100 80GB HBM3" in huge.admission.message


def test_capacity_lists_dra_pools_from_a_dump(tmp_path: Any) -> None:
    dump = tmp_path / "dump.json"
    items = [plain_node(n) for n in NODES] + [hgx(), h100_mig(), shared_t4(), *device_classes(),
                                              held("dra-h100-hgx-0", "gpu-3")]
    dump.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    report = capacity(load_dump(str(dump)))
    rows = {r.node: r for r in report.dra}
    assert (rows["dra-h100-hgx-0"].free_devices, rows["dra-h100-hgx-0"].devices_total) == (7, 8)
    assert rows["dra-h100-hgx-0"].free_memory_gib == 560
    assert rows["dra-h100-mig-0"].devices == {"MIG 1g.10gb": "2/2", "MIG 2g.20gb": "1/1", "MIG 3g.40gb": "1/1"}
    assert rows["dra-t4-shared-0"].devices == {"Tesla T4 (shared)": "2/2"}
    text = table(report)
    assert "DRA pools" in text and "dra-h100-hgx-0   7/8" in text
    assert "DRA: off" in table(capacity(Cluster([], [], None, "empty")))


def test_capacity_says_what_partitionable_gpus_can_still_carve(tmp_path: Any) -> None:
    # two H100s under DynamicMIG: a 3g.40gb carved at slices 4-7 of GPU 0
    dump = tmp_path / "dump.json"
    items = [plain_node("dra-h100-dyn-0"), *dynamic_h100(gpus=2), *device_classes(),
             held("dra-h100-dyn-0", "gpu-0-mig-3g40gb-9-4")]
    dump.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    report = capacity(load_dump(str(dump)))
    (row,) = report.dra
    assert row.devices == {"GPU (partitionable)": "1/2"} and (row.free_devices, row.devices_total) == (1, 2)
    assert (row.memory_gib, row.free_memory_gib) == (160, 120)  # the counter sets' memory, not every placement's
    # GPU 0 has slices 0-3 left: 4 x 1g.10gb, 2 x 2g.20gb, one 3g.40gb or one 4g.40gb; GPU 1 all of its own
    assert row.carvable == {"1g.10gb": 4 + 7, "2g.20gb": 2 + 3, "3g.40gb": 1 + 2, "4g.40gb": 1 + 1, "7g.80gb": 1,
                            "whole GPU": 1}
    text = table(report)
    assert "dra-h100-dyn-0: 1g.10gb 11, 2g.20gb 5, 3g.40gb 3, 4g.40gb 2, 7g.80gb 1, whole GPU 1" in text


def test_explain_says_where_the_allocator_may_take_other_devices_than_predicted() -> None:
    half = resource_slice("dra-h100-hgx-0", hgx()["spec"]["devices"][:4], count=2, part=0)  # 1 of 2 slices seen
    c = Cluster([plain_node("dra-h100-hgx-0")], [], {"team-a": {"gpu-tailor.io/enabled": "true"}}, "test",
                dra=dra_state([half], [], device_classes()))
    e = explain(pod({"gpu-tailor.io/gpu-milli": "2000"}), "pod p", c, AdmissionPolicy())
    detail = {v.node: v.detail for v in e.nodes}["dra-h100-hgx-0"]
    assert detail.startswith("claim: 2 x NVIDIA H100 80GB HBM3 (80Gi) -> devices gpu-0, gpu-1")
    assert detail.endswith("(may differ: pool dra-h100-hgx-0 is not wholly published yet)")
    whole = explain(pod({"gpu-tailor.io/gpu-milli": "2000"}), "pod p", cluster(), AdmissionPolicy())
    assert "may differ" not in {v.node: v.detail for v in whole.nodes}["dra-h100-hgx-0"]
