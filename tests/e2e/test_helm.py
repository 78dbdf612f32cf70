"""The Helm chart on a real control plane (issue 29): ``helm install`` brings up admission and scheduling as the
kustomize path does, ``helm upgrade`` keeps admission working (the caBundle the webhook wrote survives it), and
``helm uninstall`` leaves no MutatingWebhookConfiguration behind and no pod create refused. A second release in the same
cluster is refused (the chart's ``lookup`` of the webhook configuration, which ``helm template`` cannot exercise).

A control plane of its own (free ports, beside the session's kustomize one), the chart installed with ``helm``
(v4, ``scripts/k8s-tools.py``) and two settings only a control plane without kubelets needs: the API server calls
the webhook at its local URL (``webhook.url``), and no node agent DaemonSet. The webhook, the extender and
gpu-tailor-scheduler then run from what the release rendered (``helm get manifest``), as ``services.start_stack``
runs them for the kustomize path."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import helm
from tests.e2e.cluster import (
    OPTED_IN,
    PLAIN,
    REPO,
    ControlPlane,
    Release,
    Rendered,
    create_namespace,
    fixture_nodes,
    install_node,
)
from tests.e2e.kube import ApiError, Kube, Obj, api_path, wait_for
from tests.e2e.pods import Pods, pod_from_review
from tests.e2e.services import SCHEDULER_NAME, Stack, control_plane_with_gpu_tailor

pytestmark = pytest.mark.e2e

CHART = REPO / "charts" / "gpu-tailor"
NAMESPACE = "gpu-tailor"


def run_helm(cp: ControlPlane, *args: str) -> str:
    out = subprocess.run([helm(), *args, "--kubeconfig", str(cp.kubeconfig)], capture_output=True, text=True,
                         timeout=180, check=False)
    assert out.returncode == 0, f"helm {' '.join(args)}: {out.stdout}{out.stderr}"
    return out.stdout


def helm_may_fail(cp: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm(), *args, "--kubeconfig", str(cp.kubeconfig)], capture_output=True, text=True,
                          timeout=180, check=False)


def helm_install(cp: ControlPlane, kube: Kube, workdir: Path, webhook_port: int) -> Rendered:
    run_helm(cp, "install", "gpu-tailor", str(CHART), "--namespace", NAMESPACE, "--create-namespace",
             "--set", f"webhook.url=https://127.0.0.1:{webhook_port}", "--set", "agent.enabled=false")
    create_namespace(kube, OPTED_IN, {"gpu-tailor.io/enabled": "true"})
    create_namespace(kube, PLAIN, {})
    for node in fixture_nodes():
        install_node(kube, node)
    return Rendered([d for d in yaml.safe_load_all(run_helm(cp, "get", "manifest", "gpu-tailor", "-n", NAMESPACE))
                     if d])


@pytest.fixture(scope="module")
def helm_stack(release: Release, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    helm()  # skips, saying why, where scripts/k8s-tools.py could not fetch it
    workdir = tmp_path_factory.mktemp(f"e2e-helm-{release.version}")
    with control_plane_with_gpu_tailor(release, workdir, installer=helm_install) as running:
        yield running


def webhook_configuration(stack: Stack) -> Obj | None:
    path = api_path("mutatingwebhookconfigurations", name="gpu-tailor", group="admissionregistration.k8s.io/v1")
    return stack.kube.get(path) if stack.kube.exists(path) else None


def test_install_upgrade_and_uninstall(helm_stack: Stack) -> None:
    stack = helm_stack
    pods = Pods(stack.kube)
    try:
        # installed: a portable ask is rewritten and bound by gpu-tailor-scheduler, as on the kustomize path
        quarter = pods.wait_bound(pods.create(stack.opted_in, pod_from_review("d")))
        assert quarter["spec"]["schedulerName"] == SCHEDULER_NAME and quarter["spec"]["nodeName"] == "t4-timeslice-0"
        assert "gpu-tailor.io/gpu-milli" not in quarter["spec"]["containers"][0]["resources"]["limits"]
        before = webhook_configuration(stack)
        assert before is not None and all(h["clientConfig"].get("caBundle") for h in before["webhooks"])

        # upgraded: a value that changes the webhook configuration; the caBundle the webhook wrote survives it
        run_helm(stack.cp, "upgrade", "gpu-tailor", str(CHART), "--namespace", NAMESPACE, "--reuse-values",
                 "--set", "webhook.timeoutSeconds=7")
        after = webhook_configuration(stack)
        assert after is not None
        hooks = after["webhooks"]
        assert hooks[0]["timeoutSeconds"] == 7 and all(h["clientConfig"].get("caBundle") for h in hooks)
        stack.wait_admission_works()
        again = pods.wait_bound(pods.create(stack.opted_in, pod_from_review("d")))
        assert again["spec"]["schedulerName"] == SCHEDULER_NAME

        # a second release, under another name and namespace, is refused before it creates anything
        second = helm_may_fail(stack.cp, "install", "second", str(CHART), "--namespace", "second",
                               "--create-namespace", "--set", "webhook.url=https://127.0.0.1:1", "--set",
                               "agent.enabled=false")
        assert second.returncode != 0, second.stdout
        assert "gpu-tailor is installed once per cluster" in second.stderr, second.stderr
        assert f"Helm release gpu-tailor in namespace {NAMESPACE}" in second.stderr, second.stderr
        assert not stack.kube.exists(api_path("clusterroles", name="second-gpu-tailor-extender",
                                              group="rbac.authorization.k8s.io/v1"))
        assert helm_may_fail(stack.cp, "status", "second", "-n", "second").returncode != 0  # no release recorded

        # uninstalled: no webhook configuration left, and pod creates go through untouched
        run_helm(stack.cp, "uninstall", "gpu-tailor", "--namespace", NAMESPACE)  # no --wait: no kubelet ends pods
        wait_for(lambda: webhook_configuration(stack) is None, 30, "the MutatingWebhookConfiguration gone")
        try:
            plain = pods.create(stack.opted_in, pod_from_review("a"))
        except ApiError as exc:
            raise AssertionError(f"a pod create was refused after helm uninstall: {exc}") from exc
        assert plain["spec"].get("schedulerName", "default-scheduler") == "default-scheduler"
        assert not stack.kube.exists(api_path("clusterroles", name="gpu-tailor-extender",
                                              group="rbac.authorization.k8s.io/v1"))
    finally:
        pods.cleanup()
