"""The DRA watches keep only what they read (``kube.dra.slim_claim``, ``slim_slice``), from dicts and from
objects simdjson parsed lazily, as list pages and watch events arrive."""

from __future__ import annotations

from typing import Any

import orjson
import simdjson

from gpu_tailor.gpumodel.dra import claim_hold, read_slices
from gpu_tailor.kube.dra import slim_claim, slim_slice
from tests.gpumodel.dra_slices import h100_mig, shared_t4

CLAIM: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
    "metadata": {"name": "p1-gpu-2vdfx", "namespace": "team-a", "uid": "u1", "managedFields": [{"manager": "x"}],
                 "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"}},
    "spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [{"name": "shared", "deviceClassName":
                                                                         "gpu.nvidia.com"}]}]}},
    "status": {"allocation": {"devices": {
        "config": [{"source": "FromClaim", "requests": ["gpu/shared"], "opaque": {"driver": "gpu.nvidia.com"}}],
        "results": [{"consumedCapacity": {"memory": "4Gi"}, "device": "gpu-0", "driver": "gpu.nvidia.com",
                     "pool": "n1", "request": "gpu/shared", "shareID": "5a2e5eb3"},
                    {"device": "gpu-1", "driver": "gpu.nvidia.com", "pool": "n1", "request": "other"}]},
        "nodeSelector": {"nodeSelectorTerms": []}},
        "reservedFor": [{"name": "p1", "resource": "pods", "uid": "277afea1"}]}}


def lazy(obj: dict[str, Any]) -> Any:
    return simdjson.Parser().parse(orjson.dumps(obj))


def test_a_claim_keeps_its_identity_and_what_it_holds_only() -> None:
    for source in (CLAIM, lazy(CLAIM)):
        slim = slim_claim(source)
        assert slim["metadata"] == {"name": "p1-gpu-2vdfx", "namespace": "team-a", "uid": "u1"}
        assert list(slim) == ["metadata", "status"] and list(slim["status"]["allocation"]["devices"]) == ["results"]
        assert claim_hold(slim) == claim_hold(CLAIM) and claim_hold(slim)


def test_an_unallocated_or_odd_claim_holds_nothing() -> None:
    pending = {"metadata": {"name": "c", "uid": "u"}, "status": {}}
    odd = {"metadata": {"name": "c"}, "status": {"allocation": {"devices": {"results": "nope"}}}}
    for source in (pending, odd, lazy(pending), lazy(odd)):
        assert not claim_hold(slim_claim(source)) and "status" not in slim_claim(source)


def test_a_slice_keeps_its_name_and_spec() -> None:
    full = h100_mig()
    full["metadata"]["managedFields"] = [{"manager": "kubelet"}]
    for source in (full, lazy(full)):
        slim = slim_slice(source)
        assert slim["metadata"] == {"name": full["metadata"]["name"]} and slim["spec"] == full["spec"]
    assert read_slices([slim_slice(lazy(s)) for s in (h100_mig(), shared_t4())]).problems == []
