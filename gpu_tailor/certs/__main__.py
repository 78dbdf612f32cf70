"""``gpu-tailor certs``: PEM files, a kubernetes.io/tls Secret, and the caBundle in the webhook config."""

from __future__ import annotations

import argparse
import base64
import sys
from pathlib import Path
from typing import Any

import yaml

from gpu_tailor.certs.authority import Material, Names, ensure, write_atomic
from gpu_tailor.webhook import registration

WEBHOOK_CONFIG_NAME = registration.WEBHOOK_CONFIG_NAME


def secret_manifest(m: Material, service: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": f"{service}-tls", "namespace": namespace},
        "data": {"tls.crt": base64.b64encode(m.cert).decode(), "tls.key": base64.b64encode(m.key).decode(),
                 "ca.crt": base64.b64encode(m.ca_bundle()).decode()},
    }


def webhook_configuration(service: str, namespace: str) -> dict[str, Any]:
    """The MutatingWebhookConfiguration of manifests/webhook (``webhook.registration`` defines it)."""
    return registration.webhook_configuration(service, namespace)


def inject_ca_bundle(doc: dict[str, Any], ca_pem: bytes) -> dict[str, Any]:
    """Put ``ca_pem`` (one or more PEM certificates) in every webhook's clientConfig.caBundle."""
    bundle = base64.b64encode(ca_pem).decode()
    for hook in doc.get("webhooks") or []:
        hook.setdefault("clientConfig", {})["caBundle"] = bundle
    return doc


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    names = Names(args.service, args.namespace, tuple(args.host or ()), tuple(args.ip or ()))
    try:
        names.ip_addresses()
    except ValueError as exc:
        print(f"gpu-tailor certs: --ip: {exc}", file=sys.stderr)
        return 2
    material, changed = ensure(out, names, args.days, args.renew_before)
    secret = yaml.safe_dump(secret_manifest(material, args.service, args.namespace), sort_keys=False)
    write_atomic(out / "secret.yaml", secret.encode(), 0o600)  # it holds the private key
    doc = inject_ca_bundle(webhook_configuration(args.service, args.namespace), material.ca_bundle())
    write_atomic(out / "mutatingwebhookconfiguration.yaml", yaml.safe_dump(doc, sort_keys=False).encode())
    for line in changed or ["up to date: nothing changed"]:
        print(f"{out}: {line}")
    return 0
