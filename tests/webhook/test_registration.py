"""The MutatingWebhookConfiguration (``webhook.registration``, manifests/webhook): what reaches the webhook.

Whether kube-apiserver accepts it (the CEL matchCondition included) is checked where it is applied
for real: tests/e2e installs manifests/ on a v1.28.7 control plane.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpu_tailor.webhook import guard, registration

ROOT = Path(__file__).resolve().parents[2]


def manifest(*parts: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(ROOT.joinpath("manifests", *parts).read_text()) if d]


def hook() -> dict[str, Any]:
    (doc,) = manifest("webhook", "mutatingwebhookconfiguration.yaml")
    h: dict[str, Any] = doc["webhooks"][0]
    return h


def test_updates_reach_the_webhook_only_when_gpu_tailor_annotations_change() -> None:
    h = hook()
    (rule,) = h["rules"]
    assert rule["operations"] == ["CREATE", "UPDATE"] and rule["resources"] == ["pods"]  # not pods/binding
    (cond,) = h["matchConditions"]
    expr = cond["expression"]
    assert expr.startswith("request.operation == 'CREATE' ||")
    assert expr.count("k.startsWith('gpu-tailor.io/')") == 2  # added or changed, and removed
    assert "\n" not in expr


def test_the_one_other_annotation_writer_is_the_extenders_service_account() -> None:
    rbac = manifest("scheduler", "rbac.yaml")
    binding = next(d for d in rbac
                   if d["kind"] == "ClusterRoleBinding" and d["metadata"]["name"] == "gpu-tailor-extender")
    users = {f"system:serviceaccount:{s['namespace']}:{s['name']}" for s in binding["subjects"]}
    assert users == set(guard.ANNOTATION_WRITERS)
    (deployment,) = [d for d in manifest("scheduler", "deployment.yaml") if d["kind"] == "Deployment"]
    sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    assert f"system:serviceaccount:{deployment['metadata']['namespace']}:{sa}" in guard.ANNOTATION_WRITERS


def test_the_manifest_is_the_code() -> None:
    (doc,) = manifest("webhook", "mutatingwebhookconfiguration.yaml")
    assert doc == registration.webhook_configuration("gpu-tailor-webhook", "gpu-tailor")
