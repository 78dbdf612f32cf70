"""The MutatingWebhookConfiguration (``webhook.registration``, manifests/webhook): what reaches the webhook.

Whether kube-apiserver accepts it (the CEL matchCondition included) is checked where it is applied
for real: tests/e2e installs manifests/ on a v1.28.7 control plane.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpu_tailor.gpumodel import labels
from gpu_tailor.webhook import guard, registration

ROOT = Path(__file__).resolve().parents[2]


def manifest(*parts: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(ROOT.joinpath("manifests", *parts).read_text()) if d]


def hooks() -> dict[str, dict[str, Any]]:
    (doc,) = manifest("webhook", "mutatingwebhookconfiguration.yaml")
    return {h["name"]: h for h in doc["webhooks"]}


def test_gpu_asks_fail_closed_and_everything_else_fails_open() -> None:
    """What each entry sees and what an outage does to it; which pods each takes is
    tests/webhook/test_match_conditions.py's (the CEL evaluated)."""
    gpu, cpu = hooks()["pods.gpu-tailor.io"], hooks()["cpu-pods.gpu-tailor.io"]
    assert (gpu["failurePolicy"], cpu["failurePolicy"]) == ("Fail", "Ignore")
    ((gpu_rule,), (cpu_rule,)) = gpu["rules"], cpu["rules"]
    assert gpu_rule["operations"] == ["CREATE", "UPDATE"] and gpu_rule["resources"] == ["pods"]  # not pods/binding
    assert cpu_rule["operations"] == ["CREATE"] and cpu_rule["resources"] == ["pods"]
    assert cpu["timeoutSeconds"] < gpu["timeoutSeconds"]  # a CPU pod waits less for an answer it can do without
    assert cpu["clientConfig"] == gpu["clientConfig"] and cpu["namespaceSelector"] == gpu["namespaceSelector"]
    # the second entry skips what the first admitted (its label): one call per pod
    assert cpu["objectSelector"]["matchExpressions"] == [*gpu["objectSelector"]["matchExpressions"],
                                                         {"key": labels.POD_ADMITTED_LABEL, "operator": "DoesNotExist"}]
    (cond,) = gpu["matchConditions"]
    assert "\n" not in cond["expression"]
    assert "matchConditions" not in cpu  # a CEL condition costs the API server a conversion of the whole pod


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
