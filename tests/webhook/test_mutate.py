"""The admission decision on the real AdmissionReviews (a..l) against the nine real fixture nodes.

Every allowed answer's JSONPatch is applied to the original pod, and the result is checked against
Kubernetes' own rules for extended resources: integer values, requests == limits.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
import pytest

from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.catalog import Candidate
from gpu_tailor.gpumodel.quantity import parse_count
from gpu_tailor.webhook.config import AdmissionPolicy, parse_policy
from gpu_tailor.webhook.mutate import Decision, decide
from gpu_tailor.webhook.state import ClusterView
from tests.conftest import FIXTURES, review_fixture

NODES = [json.loads(p.read_text()) for p in sorted((FIXTURES / "nodes").glob("*.json"))]


def view(policy: AdmissionPolicy | None = None, pods: list[dict[str, Any]] | None = None) -> ClusterView:
    v = ClusterView(policy or AdmissionPolicy())
    v.reset(NODES, pods)
    return v


def run(letter: str, policy: AdmissionPolicy | None = None, review: dict[str, Any] | None = None,
        candidates: list[Candidate] | None = None) -> tuple[Decision, dict[str, Any]]:
    req = (review or review_fixture(letter))["request"]
    v = view(policy)
    d = decide(req, candidates if candidates is not None else v.candidates(), v.policy)
    pod = jsonpatch.apply_patch(req["object"], d.patch) if d.allowed else req["object"]
    if d.allowed:
        assert_kubernetes_valid(pod)
    return d, pod


def assert_kubernetes_valid(pod: dict[str, Any]) -> None:
    for key in ("containers", "initContainers"):
        for c in pod["spec"].get(key) or []:
            res = c.get("resources") or {}
            req, lim = res.get("requests") or {}, res.get("limits") or {}
            for name in set(req) | set(lim):
                if "/" in name and not name.startswith("kubernetes.io"):
                    assert not name.startswith("gpu-tailor.io/"), f"virtual resource left: {name}"
                    assert name in lim, f"{c['name']}: {name} requested without a limit"
                    assert req.get(name, lim[name]) == lim[name], f"{c['name']}: {name} requests != limits"
                    parse_count(lim[name])  # integer, as the API server requires


def resources(pod: dict[str, Any], container: int = 0, key: str = "containers") -> dict[str, Any]:
    res: dict[str, Any] = pod["spec"][key][container]["resources"]
    return res


def affinity(pod: dict[str, Any]) -> list[dict[str, Any]]:
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    exprs: list[dict[str, Any]] = terms["nodeSelectorTerms"][0]["matchExpressions"]
    return exprs


def test_a_native_limits_only_passes_and_gets_scheduler_and_toleration() -> None:
    d, pod = run("a")
    assert d.allowed and d.warnings == ()
    assert resources(pod)["limits"] == {"nvidia.com/gpu": "2"}
    assert pod["spec"]["schedulerName"] == labels.GPU_TAILOR_SCHEDULER
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]


def test_b_requests_only_gets_limits() -> None:
    d, pod = run("b")
    assert d.allowed
    assert resources(pod)["limits"]["nvidia.com/gpu"] == "1"


def test_c_mismatch_is_denied_naming_both_values() -> None:
    d, _ = run("c")
    assert not d.allowed and d.code == 422
    assert "container main" in d.message and "nvidia.com/gpu" in d.message
    assert "(1)" in d.message and "(2)" in d.message


def test_c_mismatch_repaired_under_use_limits() -> None:
    d, pod = run("c", parse_policy("onMismatch: useLimits"))
    assert d.allowed
    assert resources(pod)["requests"]["nvidia.com/gpu"] == resources(pod)["limits"]["nvidia.com/gpu"] == "2"


@pytest.mark.parametrize("letter", ["d", "j"])
def test_d_and_j_quarter_gpu_becomes_a_quarter_t4_replica(letter: str) -> None:
    d, pod = run(letter)
    assert d.allowed and d.backing == "shared:time-slicing:4"
    res = resources(pod)
    assert res["limits"] == res["requests"] and len(res["limits"]) == 1
    (resource,) = res["limits"]
    assert resource in ("nvidia.com/gpu", "nvidia.com/gpu.shared") and res["limits"][resource] == "1"
    keys = {e["key"]: e for e in affinity(pod)}
    assert keys["nvidia.com/gpu.sharing-strategy"]["values"] == ["time-slicing"]
    assert keys["nvidia.com/gpu.replicas"]["values"] == ["4"]
    ann = pod["metadata"]["annotations"]
    assert ann[labels.ANN_BACKING] == "shared:time-slicing:4"
    assert json.loads(ann[labels.ANN_ASK])["containers"] == {"main": {"gpuMilli": 250}}


def test_e_ten_gib_becomes_the_smallest_mig_slice_with_that_memory() -> None:
    d, pod = run("e")
    assert d.allowed and d.backing == "mig-2g.10gb"
    assert resources(pod)["limits"] == {"nvidia.com/mig-2g.10gb": "1"}
    assert {"key": "nvidia.com/mig.strategy", "operator": "In", "values": ["mixed"]} in affinity(pod)


def test_f_isolation_mig_and_product_choose_a_mig_profile() -> None:
    d, pod = run("f")
    assert d.allowed and d.backing == "mig-2g.10gb"  # 2/7 >= 0.25 on the A100-40GB
    assert {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-A100-SXM4-40GB"]} in affinity(pod)


def test_g_two_time_sliced_replicas_allowed_with_a_warning() -> None:
    d, _ = run("g")
    assert d.allowed
    assert len(d.warnings) == 1 and "not combined into more GPU" in d.warnings[0]


def test_g_denied_where_the_pool_fails_requests_greater_than_one() -> None:
    v = view()
    cands = [c if c.resource != "nvidia.com/gpu.shared" else Candidate(**{**_fields(c), "fail_requests_gt_one": True})
             for c in v.candidates()]
    d, _ = run("g", candidates=cands)
    assert not d.allowed and "more than one replica" in d.message


def test_several_gpus_denied_where_nvidia_com_gpu_is_only_sold_as_slices() -> None:
    """Without the H100s, every node selling nvidia.com/gpu sells replicas or MIG devices under that name:
    the extender would never place two of them as two GPUs, so the pod is denied, saying why."""
    v = ClusterView(AdmissionPolicy())
    v.reset([n for n in NODES if not n["metadata"]["name"].startswith("h100")])
    review = review_fixture("a")
    d = decide(review["request"], v.candidates(), v.policy)
    assert not d.allowed and d.code == 403
    assert d.message == ("nvidia.com/gpu: 2 requested in one container means 2 GPUs, but every node selling "
                         "nvidia.com/gpu sells it as slices (mig-1g.5gb on NVIDIA-A100-SXM4-40GB-MIG-1g.5gb, "
                         "shared:mps:10 on Tesla-V100-SXM2-16GB-SHARED, shared:time-slicing:4 on Tesla-T4-SHARED): "
                         "there 2 units would be 2 slices or replicas, not 2 GPUs; ask for 1 per container, or for "
                         "part of a GPU with gpu-tailor.io/gpu-milli")


def test_mig_instances_are_admitted_without_a_warning() -> None:
    review = copy.deepcopy(review_fixture("h"))
    for part in ("limits", "requests"):
        review["request"]["object"]["spec"]["containers"][0]["resources"][part] = {"nvidia.com/mig-1g.5gb": "2"}
    d = decide(review["request"], view().candidates(), AdmissionPolicy())
    assert d.allowed and d.warnings == ()


def _fields(c: Candidate) -> dict[str, Any]:
    return {f: getattr(c, f) for f in c.__dataclass_fields__}


def test_h_native_mig_passes_through() -> None:
    d, pod = run("h")
    assert d.allowed and d.backing == "native"
    assert resources(pod)["limits"] == {"nvidia.com/mig-1g.5gb": "1"}


def test_i_controller_pod_without_name_is_mutated() -> None:
    review = review_fixture("i")
    assert "name" not in review["request"]["object"]["metadata"]
    d, pod = run("i")
    assert d.allowed and d.backing == "whole"  # 500 milli: no slice of >= 1/2 here, so a whole H100
    assert resources(pod)["limits"] == {"nvidia.com/gpu": "1"}


def test_j_dry_run_is_answered_identically() -> None:
    dry = review_fixture("j")
    assert dry["request"]["dryRun"] is True
    real = copy.deepcopy(dry)
    real["request"]["dryRun"] = False
    real["request"].pop("options", None)
    d_dry, _ = run("j", review=dry)
    d_real, _ = run("j", review=real)
    assert d_dry == d_real and d_dry.backing == run("d")[0].backing


def test_k_init_container_and_virtual_container_share_one_node() -> None:
    d, pod = run("k")
    assert d.allowed and d.backing == "whole"  # the node must also offer the init container's nvidia.com/gpu
    assert resources(pod, 0)["limits"] == {"nvidia.com/gpu": "1"}
    assert resources(pod, 0, "initContainers")["limits"] == {"nvidia.com/gpu": "1"}


def test_l_no_gpu_goes_to_gpu_tailors_scheduler_and_nothing_else_changes() -> None:
    d, _ = run("l")
    assert d.allowed and d.backing == "none" and d.warnings == ()
    assert d.patch == [{"op": "replace", "path": "/spec/schedulerName", "value": labels.GPU_TAILOR_SCHEDULER}]


@pytest.mark.parametrize(("policy", "spec"), [
    pytest.param("cpuOnlyPods: false", {}, id="policy-off"),
    pytest.param("schedulerName: ''", {}, id="no-scheduler-name"),
    pytest.param("", {"schedulerName": "volcano"}, id="names-another-scheduler"),
    pytest.param("", {"nodeName": "worker-1"}, id="created-bound"),
    pytest.param("", {"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent",
                                                        "uid": "u", "controller": True}]}}, id="daemonset-pod"),
])
def test_l_no_gpu_is_left_alone(policy: str, spec: dict[str, Any]) -> None:
    review = copy.deepcopy(review_fixture("l"))
    obj = review["request"]["object"]
    obj["metadata"].update(spec.pop("metadata", {}))
    obj["spec"].update(spec)
    d, _ = run("l", parse_policy(policy), review=review)
    assert d.allowed and d.patch == []


def test_reinvocation_leaves_a_rewritten_pod_unchanged() -> None:
    _, pod = run("d")
    review = copy.deepcopy(review_fixture("d"))
    review["request"]["object"] = pod
    d, _ = run("d", review=review)
    assert d.allowed and d.patch == []


def with_limits(letter: str, limits: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    review = copy.deepcopy(review_fixture(letter))
    c = review["request"]["object"]["spec"]["containers"][0]
    c["resources"] = {"limits": dict(limits), "requests": dict(limits)}
    if annotations:
        review["request"]["object"]["metadata"].setdefault("annotations", {}).update(annotations)
    return review


def test_impossible_memory_lists_the_largest_offering() -> None:
    d, _ = run("d", review=with_limits("d", {"gpu-tailor.io/gpu-memory": "100Gi"}))
    assert not d.allowed
    assert "needs 100Gi of GPU memory; largest offering is whole (" in d.message
    assert "NVIDIA-H100-80GB-HBM3" in d.message


def test_impossible_memory_under_mig_isolation() -> None:
    d, _ = run("d", review=with_limits("d", {"gpu-tailor.io/gpu-memory": "50Gi"}, {"gpu-tailor.io/isolation": "mig"}))
    assert not d.allowed
    assert "largest offering is mig-3g.20gb" in d.message and "NVIDIA-A100-SXM4-40GB" in d.message


def test_too_many_whole_gpus_for_any_node() -> None:
    d, _ = run("d", review=with_limits("d", {"gpu-tailor.io/gpu-milli": "16000"}))
    assert not d.allowed and "needs 16 whole GPUs" in d.message and "8 x whole" in d.message


def test_two_thousand_milli_is_two_whole_gpus() -> None:
    d, pod = run("d", review=with_limits("d", {"gpu-tailor.io/gpu-milli": "2000"}))
    assert d.allowed and resources(pod)["limits"] == {"nvidia.com/gpu": "2"}


def test_product_constraint_nothing_matches() -> None:
    d, _ = run("d", review=with_limits("d", {"gpu-tailor.io/gpu-milli": "100"}, {"gpu-tailor.io/gpu-product": "L4"}))
    assert not d.allowed and "no offering matches" in d.message and "the cluster offers" in d.message


def test_invalid_annotation_is_denied() -> None:
    d, _ = run("d", review=with_limits("d", {"gpu-tailor.io/gpu-milli": "100"}, {"gpu-tailor.io/isolation": "x"}))
    assert not d.allowed and d.code == 422 and "gpu-tailor.io/isolation" in d.message


def test_virtual_mixed_with_native_is_denied() -> None:
    d, _ = run("d", review=with_limits("d", {"gpu-tailor.io/gpu-milli": "100", "nvidia.com/gpu": "1"}))
    assert not d.allowed and "mixes" in d.message


def test_mps_isolation_and_more_than_one_mps_replica() -> None:
    d, _pod = run("d", review=with_limits("d", {"gpu-tailor.io/gpu-milli": "100"}, {"gpu-tailor.io/isolation": "mps"}))
    assert d.allowed and d.backing == "shared:mps:10"
    d2, _ = run("d", review=with_limits("d", {"gpu-tailor.io/gpu-milli": "150"}, {"gpu-tailor.io/isolation": "mps"}))
    assert not d2.allowed  # a tenth of a V100 is the only MPS offering


def test_declared_offering_for_a_pool_scaled_to_zero() -> None:
    policy = parse_policy((FIXTURES / "webhook" / "policy-h100-mig.yaml").read_text())
    d, pod = run("e", policy, review=with_limits("e", {"gpu-tailor.io/gpu-memory": "10Gi"},
                                                     {"gpu-tailor.io/isolation": "mig",
                                                      "gpu-tailor.io/gpu-product": "H100"}))
    assert d.allowed and d.backing == "mig-1g.10gb"
    assert resources(pod)["limits"] == {"nvidia.com/mig-1g.10gb": "1"}
    assert {"key": "agentpool", "operator": "In", "values": ["h100mig"]} in affinity(pod)
    assert any("no mig-1g.10gb is free right now" in w for w in d.warnings)


def test_scheduler_name_left_alone_when_empty_or_custom() -> None:
    _, pod = run("a", parse_policy("schedulerName: ''"))
    assert pod["spec"]["schedulerName"] == "default-scheduler"
    review = copy.deepcopy(review_fixture("a"))
    review["request"]["object"]["spec"]["schedulerName"] = "volcano"
    _, pod = run("a", review=review)
    assert pod["spec"]["schedulerName"] == "volcano"


def test_existing_required_affinity_terms_are_anded() -> None:
    review = with_limits("d", {"gpu-tailor.io/gpu-milli": "250"})
    required = "requiredDuringSchedulingIgnoredDuringExecution"
    review["request"]["object"]["spec"]["affinity"] = {"nodeAffinity": {required: {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                              {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}]}}}
    _, pod = run("d", review=review)
    terms = pod["spec"]["affinity"]["nodeAffinity"][required]["nodeSelectorTerms"]
    assert len(terms) == 2
    for term in terms:
        assert any(e["key"] == "nvidia.com/gpu.sharing-strategy" for e in term["matchExpressions"])


@pytest.mark.parametrize(("old", "new"), [
    ({"a": 1}, {"a": 1}),
    ({"a": 1, "b": 2}, {"a": 2, "c": {"d": [1]}}),
    ({"m": {"x/y~z": "1"}}, {"m": {"x/y~z": "2", "n/1": "3"}}),
    ({"l": [1, 2]}, {"l": [1, 3, {"k": "v"}]}),
    ({"l": [1, 2, 3]}, {"l": [1]}),
    ({"v": 1}, {"v": True}),
    ({"v": "1"}, {"v": {"nested": []}}),
], ids=["same", "keys", "escaped", "list-grew", "list-shrank", "bool-not-int", "type-changed"])
def test_diff_patch_turns_old_into_new(old: dict[str, Any], new: dict[str, Any]) -> None:
    from gpu_tailor.webhook.mutate import _diff

    patch: list[dict[str, Any]] = []
    _diff(old, new, "", patch)
    out = jsonpatch.apply_patch(old, patch)
    assert out == new and all(type(out[k]) is type(new[k]) for k in new)
    assert (patch == []) == (json.dumps(old) == json.dumps(new))
