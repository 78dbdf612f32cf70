"""A pod cannot forge gpu-tailor's own annotations (issue 19).

``gpu-tailor.io/ask`` and ``/backing`` are the webhook's record of a rewrite, ``/gpus`` the
extender's Binding's. A pod that arrives carrying them used to be let through untouched, virtual
resources and all. Now CREATE decides from the pod's real ask: ``gpus`` is always dropped, ``ask`` and
``backing`` are rewritten, or dropped from a pod that is not the webhook's own rewrite; reinvocation
of a rewritten pod stays a no-op. UPDATE may not change any ``gpu-tailor.io/*`` annotation (the
manifest routes such updates here with a matchCondition).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
import pytest

from gpu_tailor.gpumodel import labels
from gpu_tailor.webhook.config import AdmissionPolicy
from gpu_tailor.webhook.mutate import Decision, decide
from gpu_tailor.webhook.state import ClusterView
from tests.conftest import FIXTURES, review_fixture
from tests.webhook.test_mutate import assert_kubernetes_valid

NODES = [json.loads(p.read_text()) for p in sorted((FIXTURES / "nodes").glob("*.json"))]
LETTERS = "abcdefghijkl"
DENIED = {"c"}  # requests 1, limits 2
EXTENDER = "system:serviceaccount:gpu-tailor:gpu-tailor-scheduler"
FORGED = {labels.ANN_BACKING: "whole", labels.ANN_ASK: '{"containers":{"main":{"native":{"nvidia.com/gpu":8}}}}',
          labels.ANN_GPUS: "0,1,2,3"}


def answer(request: dict[str, Any]) -> Decision:
    view = ClusterView(AdmissionPolicy())
    view.reset(NODES)
    return decide(request, view.candidates(), view.policy)


def admitted(request: dict[str, Any]) -> tuple[Decision, dict[str, Any]]:
    d = answer(request)
    assert d.allowed, d.message
    pod: dict[str, Any] = jsonpatch.apply_patch(request["object"], d.patch)
    assert_kubernetes_valid(pod)
    return d, pod


def forged(letter: str, annotations: dict[str, str]) -> dict[str, Any]:
    request: dict[str, Any] = copy.deepcopy(review_fixture(letter))["request"]
    meta = request["object"]["metadata"]
    meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
    return request


def annotations_of(pod: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = pod["metadata"].get("annotations") or {}
    return out


@pytest.mark.parametrize("letter", LETTERS)
@pytest.mark.parametrize("key", [*FORGED, "all"])
def test_create_decides_from_the_real_ask_whatever_the_annotations_say(letter: str, key: str) -> None:
    request = forged(letter, FORGED if key == "all" else {key: FORGED[key]})
    if letter in DENIED:
        d = answer(request)
        assert (d.allowed, d.message) == (False, answer(copy.deepcopy(review_fixture(letter))["request"]).message)
        return
    honest_d, honest = admitted(copy.deepcopy(review_fixture(letter))["request"])
    d, pod = admitted(request)
    assert d.backing in (honest_d.backing, "none")
    # the same pod as without the forgery: same resources, scheduler, affinity, tolerations
    assert pod["spec"] == honest["spec"]
    assert annotations_of(pod) == annotations_of(honest)
    assert labels.ANN_GPUS not in annotations_of(pod)


def test_virtual_ask_under_a_forged_backing_is_rewritten() -> None:
    d, pod = admitted(forged("d", {labels.ANN_BACKING: "whole"}))
    assert d.backing == "shared:time-slicing:4"
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert not any(k.startswith("gpu-tailor.io/") for k in limits)
    assert annotations_of(pod)[labels.ANN_BACKING] == "shared:time-slicing:4"


@pytest.mark.parametrize("letter", ["a", "l"])
def test_forged_records_on_a_native_or_gpu_less_pod_are_removed_with_a_warning(letter: str) -> None:
    d, pod = admitted(forged(letter, FORGED))
    assert not {k for k, v in FORGED.items() if annotations_of(pod).get(k) == v}
    assert sorted(w.split()[1] for w in d.warnings if "removed" in w) == sorted(FORGED)
    # a native ask gets the webhook's own records instead (the marker the second webhook entry reads); none else
    assert annotations_of(pod).get(labels.ANN_BACKING) == ("native" if letter == "a" else None)


def test_gpus_is_removed_from_a_reinvoked_pod_too() -> None:
    _, rewritten = admitted(copy.deepcopy(review_fixture("d"))["request"])
    request = copy.deepcopy(review_fixture("d"))["request"]
    request["object"] = rewritten
    rewritten["metadata"]["annotations"][labels.ANN_GPUS] = "0"
    _, pod = admitted(request)
    assert labels.ANN_GPUS not in annotations_of(pod)
    assert annotations_of(pod)[labels.ANN_BACKING] == "shared:time-slicing:4"


@pytest.mark.parametrize("letter", sorted(set(LETTERS) - DENIED))
def test_reinvocation_of_the_webhooks_own_rewrite_is_a_no_op(letter: str) -> None:
    first, pod = admitted(copy.deepcopy(review_fixture(letter))["request"])
    request = copy.deepcopy(review_fixture(letter))["request"]
    request["object"] = pod
    again = answer(request)
    assert again.allowed and again.patch == []
    # a pod the webhook recorded (rewritten, or native) had its warnings with the first answer; a GPU-less pod's are
    # the same again
    assert again.warnings == (() if first.backing != "none" else first.warnings)


def test_user_input_annotations_still_steer_the_choice() -> None:
    d, pod = admitted(copy.deepcopy(review_fixture("f"))["request"])
    assert d.backing.startswith("mig-")
    assert annotations_of(pod)[labels.ANN_ISOLATION] == "mig"


def update(old: dict[str, str] | None, new: dict[str, str] | None, user: str = "alice") -> dict[str, Any]:
    base = copy.deepcopy(review_fixture("d"))["request"]
    request: dict[str, Any] = {**base, "operation": "UPDATE", "userInfo": {"username": user, "groups": []}}
    request["oldObject"] = copy.deepcopy(base["object"])
    request["oldObject"]["metadata"]["annotations"] = old
    request["object"]["metadata"]["annotations"] = new
    request["object"]["metadata"]["labels"] = {"changed": "yes"}
    return request


@pytest.mark.parametrize(("old", "new"), [
    pytest.param({labels.ANN_BACKING: "mig-1g.5gb"}, {labels.ANN_BACKING: "whole"}, id="change-backing"),
    pytest.param(None, {labels.ANN_GPUS: "0,1"}, id="add-gpus"),
    pytest.param({labels.ANN_GPUS: "0"}, {labels.ANN_GPUS: "1"}, id="move-gpus"),
    pytest.param({labels.ANN_GPUS: "0"}, {}, id="remove-gpus"),
    pytest.param({}, {labels.ANN_ISOLATION: "mig"}, id="add-isolation"),
    pytest.param({labels.ANN_ASK: "{}"}, {labels.ANN_ASK: "{}", "gpu-tailor.io/anything": "x"}, id="add-new-key"),
])
def test_update_may_not_change_gpu_tailor_annotations(old: dict[str, str] | None, new: dict[str, str] | None) -> None:
    d = answer(update(old, new))
    assert not d.allowed and d.code == 403
    assert "cannot be changed once the pod exists" in d.message
    assert answer(update(old, new, user=EXTENDER)).allowed


@pytest.mark.parametrize(("old", "new"), [
    pytest.param(None, None, id="no-annotations"),
    pytest.param({labels.ANN_GPUS: "0"}, {labels.ANN_GPUS: "0", "team": "a"}, id="other-annotation-added"),
    pytest.param({labels.ANN_BACKING: "whole", "team": "a"}, {labels.ANN_BACKING: "whole"}, id="other-removed"),
])
def test_update_leaving_them_alone_is_allowed_untouched(old: dict[str, str] | None,
                                                      new: dict[str, str] | None) -> None:
    d = answer(update(old, new))
    assert d.allowed and d.patch == []


@pytest.mark.parametrize("user", [{"username": {"a": 1}}, {"username": ["x"]}, "alice", None, {}],
                         ids=["username-object", "username-list", "userinfo-string", "userinfo-null", "no-username"])
def test_update_from_a_malformed_user_is_refused_not_a_crash(user: Any) -> None:
    # found by tests/webhook/test_fuzz_webhook.py: an unhashable username raised inside the set lookup
    request = update({}, {labels.ANN_GPUS: "0"})
    request["userInfo"] = user
    d = answer(request)
    assert (d.allowed, d.code) == (False, 403)


def test_update_with_malformed_annotations_is_400() -> None:
    request = update({}, {})
    request["object"]["metadata"]["annotations"] = ["x"]
    d = answer(request)
    assert (d.allowed, d.code) == (False, 400)


def test_a_native_record_forged_on_a_gpu_less_pod_is_removed() -> None:
    """A CPU-only pod claiming a native record (no GPU in it) is no reinvocation of the webhook's own: dropped, said."""
    native = {labels.ANN_BACKING: "native", labels.ANN_ASK: '{"containers":{"main":{"native":{}}}}'}
    d, pod = admitted(forged("l", native))
    assert not set(native) & set(annotations_of(pod))
    assert sorted(w.split()[1] for w in d.warnings if "removed" in w) == sorted(native)


def test_a_native_pod_with_copied_records_is_still_labelled_admitted() -> None:
    """A native GPU pod created with records copied from another (consistent, so taken as the webhook's own) still
    leaves labelled as admitted: the second webhook entry skips it, one call."""
    _, first = admitted(copy.deepcopy(review_fixture("a"))["request"])
    copied = {k: v for k, v in annotations_of(first).items() if k in (labels.ANN_ASK, labels.ANN_BACKING)}
    _, pod = admitted(forged("a", copied))
    assert pod["metadata"]["labels"][labels.POD_ADMITTED_LABEL] == "gpu"
