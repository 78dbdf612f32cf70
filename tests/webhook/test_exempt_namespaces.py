"""The webhook's own namespace and kube-system can never be blocked by it (issue 19).

With ``failurePolicy: Fail``, a webhook that selected its own namespace could never come back once
down (its pods could not be created), and one that selected kube-system could take DNS and the
network with it. The namespaceSelector excludes both by ``kubernetes.io/metadata.name`` -- a label the
API server sets and nobody can change -- even when someone labels them opted in; checked here on the
manifests as kubectl renders them, and in-process, where ``decide`` lets their pods through untouched.
"""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_tailor.gpumodel import labels
from gpu_tailor.webhook.config import AdmissionPolicy
from gpu_tailor.webhook.mutate import decide
from gpu_tailor.webhook.registration import webhook_configuration
from gpu_tailor.webhook.state import ClusterView
from tests.conftest import FIXTURES, load_fixture, release_kubectl, review_fixture

ROOT = Path(__file__).resolve().parents[2]
NODES = [load_fixture("nodes", p.name) for p in sorted((FIXTURES / "nodes").glob("*.json"))]


def selects(selector: dict[str, Any], labels_: dict[str, str]) -> bool:
    """metav1.LabelSelector semantics (matchLabels and matchExpressions, all ANDed)."""
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels_.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        ok = {"In": key in labels_ and labels_[key] in values,
              "NotIn": key not in labels_ or labels_[key] not in values,
              "Exists": key in labels_, "DoesNotExist": key not in labels_}[op]
        if not ok:
            return False
    return True


def namespace_labels(name: str, opted_in: bool) -> dict[str, str]:
    out = {"kubernetes.io/metadata.name": name}  # set by the API server on every namespace
    if opted_in:
        out[labels.NAMESPACE_OPT_IN_LABEL] = "true"
    return out


@pytest.fixture(scope="module")
def rendered_hooks() -> list[dict[str, Any]]:
    kubectl = release_kubectl()
    hooks: list[dict[str, Any]] = []
    for path in (ROOT / "manifests", ROOT / "manifests" / "overlays" / "cert-manager"):
        out = subprocess.run([kubectl, "kustomize", str(path)], check=True,
                             capture_output=True, text=True).stdout
        hooks += [h for d in yaml.safe_load_all(out) if d and d["kind"] == "MutatingWebhookConfiguration"
                  for h in d["webhooks"]]
    assert hooks
    return hooks


def pod_hooks(hooks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries for pods. The third, for the agents' cluster-scoped reports, selects no namespace: the
    API server never skips it by namespace (and it reviews the agents' own writes only)."""
    pods = [h for h in hooks if h["rules"][0]["resources"] == ["pods"]]
    for h in hooks:
        if h not in pods:
            assert h["rules"][0]["scope"] == "Cluster" and "namespaceSelector" not in h
    return pods


@pytest.mark.parametrize("namespace", ["gpu-tailor", "kube-system"])
def test_rendered_manifests_never_select_the_exempt_namespaces(rendered_hooks: list[dict[str, Any]],
                                                                namespace: str) -> None:
    for hook in pod_hooks(rendered_hooks):
        assert not selects(hook["namespaceSelector"], namespace_labels(namespace, opted_in=True))
        assert selects(hook["namespaceSelector"], namespace_labels("team-a", opted_in=True))
        assert not selects(hook["namespaceSelector"], namespace_labels("team-a", opted_in=False))


@pytest.mark.parametrize("namespace", ["gpu-tailor", "kube-system"])
def test_the_code_never_selects_them_either(namespace: str) -> None:
    hooks = pod_hooks(webhook_configuration("gpu-tailor-webhook", "gpu-tailor")["webhooks"])
    assert len(hooks) == 2
    for hook in hooks:
        assert not selects(hook["namespaceSelector"], namespace_labels(namespace, opted_in=True))


def in_namespace(request: dict[str, Any], namespace: str) -> dict[str, Any]:
    request = copy.deepcopy(request)
    request["namespace"] = namespace
    request["object"]["metadata"]["namespace"] = namespace
    return request


@pytest.mark.parametrize("namespace", ["gpu-tailor", "kube-system"])
@pytest.mark.parametrize("letter", "abcdefghijkl")
def test_decide_lets_their_pods_through_untouched(namespace: str, letter: str) -> None:
    view = ClusterView(AdmissionPolicy())
    view.reset(NODES)
    request = in_namespace(review_fixture(letter)["request"], namespace)
    d = decide(request, view.candidates(), view.policy)
    assert (d.allowed, d.patch, d.warnings) == (True, [], ())
    # even a malformed pod or an annotation update there is not the webhook's to refuse
    request["object"]["spec"] = ["x"]
    assert decide(request, view.candidates(), view.policy).allowed
    update = {**request, "operation": "UPDATE", "oldObject": {"metadata": {}},
              "object": {"metadata": {"annotations": {labels.ANN_GPUS: "0"}}}}
    assert decide(update, view.candidates(), view.policy).allowed


def test_team_namespaces_are_still_mutated() -> None:
    view = ClusterView(AdmissionPolicy())
    view.reset(NODES)
    d = decide(in_namespace(review_fixture("d")["request"], "team-b"), view.candidates(), view.policy)
    assert d.allowed and d.patch
