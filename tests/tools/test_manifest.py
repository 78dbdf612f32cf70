"""Which pod a manifest makes: a Pod as written, a workload's pod template, in which namespace."""

from __future__ import annotations

import pytest
import yaml

from gpu_tailor.tools.manifest import ManifestError, pod_of

TEMPLATE = {"metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "main", "image": "busybox",
                                     "resources": {"limits": {"gpu-tailor.io/gpu-milli": "250"}}}]}}


def workload(kind: str) -> dict[str, object]:
    if kind == "CronJob":
        spec: dict[str, object] = {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": TEMPLATE}}}
    else:
        spec = {"template": TEMPLATE}
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": "web", "namespace": "team-a"}, "spec": spec}


@pytest.mark.parametrize("kind", ["Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob"])
def test_a_workload_stands_for_its_pods(kind: str) -> None:
    pod, subject = pod_of(yaml.safe_dump(workload(kind)), "w.yaml", None, "default")
    assert subject == f"{kind} team-a/web"
    assert pod["kind"] == "Pod" and pod["metadata"] == {"labels": {"app": "web"}, "name": "web-explain",
                                                        "namespace": "team-a"}
    assert pod["spec"] == TEMPLATE["spec"]


@pytest.mark.parametrize(("flag", "written", "context", "expected"), [
    pytest.param("team-b", "team-a", "ctx-ns", "team-b", id="-n wins"),
    pytest.param(None, "team-a", "ctx-ns", "team-a", id="the manifest's next"),
    pytest.param(None, None, "ctx-ns", "ctx-ns", id="else the kubeconfig context's"),
])
def test_namespace_as_kubectl_apply_picks_it(flag: str | None, written: str | None, context: str,
                                             expected: str) -> None:
    meta = {"name": "p", **({"namespace": written} if written else {})}
    text = yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": TEMPLATE["spec"]})
    pod, subject = pod_of(text, "p.yaml", flag, context)
    assert pod["metadata"]["namespace"] == expected and subject == f"Pod {expected}/p"


def test_the_first_pod_of_a_multi_document_file_and_lists() -> None:
    text = "---\napiVersion: v1\nkind: Service\nmetadata: {name: s}\n---\n" + yaml.safe_dump(
        {"kind": "List", "items": [{"kind": "ConfigMap"}, workload("Job")]})
    assert pod_of(text, "f.yaml", None, "default")[1] == "Job team-a/web"


@pytest.mark.parametrize(("text", "message"), [
    pytest.param("kind: Service\nmetadata: {name: s}\n", "found Service", id="no pod in it"),
    pytest.param("kind: Deployment\nmetadata: {name: d}\nspec: {}\n", "has no spec.template", id="no template"),
    pytest.param("a: [", "not YAML or JSON", id="not YAML"),
])
def test_what_is_not_a_pod_is_said(text: str, message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        pod_of(text, "x.yaml", None, "default")
