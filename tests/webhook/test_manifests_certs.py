"""The webhook's certificate wiring as kustomize renders it: the base (the webhook keeps its own
certificate) and overlays/cert-manager (cert-manager issues it and injects the CA)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_tailor.certs.authority import dns_names
from tests.conftest import release_kubectl

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def kubectl() -> str:
    return release_kubectl()


def render(kubectl: str, path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    out = subprocess.run([kubectl, "kustomize", str(path)], check=True, capture_output=True, text=True).stdout
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out) if d}


def container(objs: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    c: dict[str, Any] = objs[("Deployment", "gpu-tailor-webhook")]["spec"]["template"]["spec"]["containers"][0]
    return c


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_base_webhook_keeps_its_certificate_with_exactly_the_grants_it_needs(kubectl: str) -> None:
    objs = render(kubectl, ROOT / "manifests")
    args = container(objs)["args"]
    namespace, secret = flag(args, "--certs-secret").split("/")
    config = flag(args, "--webhook-config")
    assert "--tls-cert" not in args and "--in-cluster" in args
    mwc = objs[("MutatingWebhookConfiguration", config)]
    # no caBundle in what is applied: the webhook patches it in, so a re-apply never removes it
    assert all("caBundle" not in h["clientConfig"] for h in mwc["webhooks"])
    service = mwc["webhooks"][0]["clientConfig"]["service"]
    assert (flag(args, "--service"), namespace) == (service["name"], service["namespace"])
    role = objs[("Role", "gpu-tailor-webhook-certs")]
    assert role["metadata"]["namespace"] == namespace
    assert {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [secret],
            "verbs": ["get", "update"]} in role["rules"]
    cluster_role = objs[("ClusterRole", "gpu-tailor-webhook-cabundle")]
    assert cluster_role["rules"] == [{"apiGroups": ["admissionregistration.k8s.io"],
                                      "resources": ["mutatingwebhookconfigurations"],
                                      "resourceNames": [config], "verbs": ["get", "patch"]}]
    for kind, name in (("RoleBinding", "gpu-tailor-webhook-certs"),
                       ("ClusterRoleBinding", "gpu-tailor-webhook-cabundle")):
        assert objs[(kind, name)]["subjects"] == [{"kind": "ServiceAccount", "name": "gpu-tailor-webhook",
                                                   "namespace": namespace}]
    # the pair is written under /tmp, which must be writable under readOnlyRootFilesystem
    assert container(objs)["securityContext"]["readOnlyRootFilesystem"] is True
    assert any(m["mountPath"] == "/tmp" for m in container(objs)["volumeMounts"])


def test_cert_manager_overlay_serves_the_issued_secret_and_injects_its_ca(kubectl: str) -> None:
    objs = render(kubectl, ROOT / "manifests" / "overlays" / "cert-manager")
    c = container(objs)
    args = c["args"]
    assert "--certs-secret" not in args
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert flag(args, "--tls-cert") == f"{mounts['tls']}/tls.crt"
    assert flag(args, "--tls-key") == f"{mounts['tls']}/tls.key"
    volumes = {v["name"]: v for v in objs[("Deployment", "gpu-tailor-webhook")]["spec"]["template"]["spec"]["volumes"]}
    cert = objs[("Certificate", "gpu-tailor-webhook")]
    assert volumes["tls"]["secret"]["secretName"] == cert["spec"]["secretName"]
    mwc = objs[("MutatingWebhookConfiguration", "gpu-tailor")]
    ns = cert["metadata"]["namespace"]
    assert mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{ns}/gpu-tailor-webhook"
    service = mwc["webhooks"][0]["clientConfig"]["service"]
    assert cert["spec"]["dnsNames"] == dns_names(service["name"], service["namespace"])
    issuer = objs[("Issuer", cert["spec"]["issuerRef"]["name"])]
    assert objs[("Certificate", "gpu-tailor-ca")]["spec"]["secretName"] == issuer["spec"]["ca"]["secretName"]
    # the webhook writes neither Secrets nor the caBundle there
    assert not {("Role", "gpu-tailor-webhook-certs"), ("ClusterRole", "gpu-tailor-webhook-cabundle")} & set(objs)
    # both services are still there
    assert ("Deployment", "gpu-tailor-scheduler") in objs
