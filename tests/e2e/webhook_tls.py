"""How the webhook under test gets a certificate that the API server trusts: the one place that knows.

The API server dials ``https://127.0.0.1:<port>/mutate`` (see the overlay in ``cluster.py``), so the
serving certificate needs an IP SAN 127.0.0.1, and the MutatingWebhookConfiguration's ``caBundle`` must
hold its CA. While the Deployment passes ``--tls-cert/--tls-key`` (files from a Secret), the test makes
both and patches the caBundle itself. Once the webhook manages its own certificate (``--certs-secret``),
the test only asks it for the extra IP SAN and the webhook does the rest.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.e2e.kube import Kube, api_path


def webhook_tls_args(argv: list[str], kube: Kube, workdir: Path) -> list[str]:
    """``argv`` (the Deployment's) with its TLS flags made to work on loopback."""
    if "--certs-secret" in argv or any(a.startswith("--certs-secret=") for a in argv):
        return [*argv, "--ip", "127.0.0.1"]
    ca_pem, cert_pem, key_pem = _ca_and_serving_cert()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "tls.crt").write_bytes(cert_pem)
    (workdir / "tls.key").touch(mode=0o600)
    (workdir / "tls.key").write_bytes(key_pem)
    path = api_path("mutatingwebhookconfigurations", name="gpu-tailor", group="admissionregistration.k8s.io/v1")
    hooks = kube.get(path)["webhooks"]
    kube.patch(path, [{"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle",
                       "value": base64.b64encode(ca_pem).decode()} for i in range(len(hooks))], "json")
    return _set_flag(_set_flag(argv, "--tls-cert", str(workdir / "tls.crt")), "--tls-key", str(workdir / "tls.key"))


def _set_flag(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    if flag in out:
        out[out.index(flag) + 1] = value
    else:
        out = [a for a in out if not a.startswith(flag + "=")] + [flag, value]
    return out


def _ca_and_serving_cert() -> tuple[bytes, bytes, bytes]:
    now = dt.datetime.now(dt.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpu-tailor-e2e-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpu-tailor-webhook")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return ca.public_bytes(serialization.Encoding.PEM), cert.public_bytes(serialization.Encoding.PEM), key_pem
