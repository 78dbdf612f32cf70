"""A private CA and a serving certificate the kube-apiserver will trust for a webhook Service.

The API server calls ``https://NAME.NS.svc:443`` and checks the certificate against the
``caBundle`` of the webhook configuration: the serving certificate must carry the DNS names as
subjectAltNames (the Common Name is ignored by Go's TLS since 1.15), be signed by the CA in the
bundle, and use a key usage of digitalSignature + serverAuth. The CA lives long (10 years) and is
kept across renewals, so the caBundle written once stays valid while serving certificates rotate.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650


@dataclass(frozen=True)
class Material:
    ca_cert: bytes
    ca_key: bytes
    cert: bytes
    key: bytes


def dns_names(service: str, namespace: str) -> list[str]:
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_ca(now: dt.datetime, common_name: str = "gpu-tailor-ca") -> tuple[bytes, bytes]:
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def make_serving(ca_cert_pem: bytes, ca_key_pem: bytes, service: str, namespace: str, days: int,
                 now: dt.datetime) -> tuple[bytes, bytes]:
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = _key()
    names = dns_names(service, namespace)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[2])]))
        .issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, key_cert_sign=False,
                                     crl_sign=False, content_commitment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def needs_renewal(cert_pem: bytes, service: str, namespace: str, renew_before_days: int, now: dt.datetime,
                  ca_cert_pem: bytes) -> str | None:
    """Why the serving certificate must be reissued, or None when it is fine as it is."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        ca = x509.load_pem_x509_certificate(ca_cert_pem)
    except ValueError:
        return "unreadable certificate"
    if cert.issuer != ca.subject:
        return "not issued by this CA"
    try:
        sans = set(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
                   .get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        return "no subjectAltName"
    if not set(dns_names(service, namespace)) <= sans:
        return "names do not match the service"
    if cert.not_valid_after_utc - now <= dt.timedelta(days=renew_before_days):
        return f"expires {cert.not_valid_after_utc:%Y-%m-%d}, within {renew_before_days} days"
    return None


def ensure(out: Path, service: str, namespace: str, days: int, renew_before_days: int,
           now: dt.datetime | None = None) -> tuple[Material, list[str]]:
    """Create or renew what is missing or stale under ``out``; returns the material and what changed."""
    now = now or dt.datetime.now(dt.UTC)
    out.mkdir(parents=True, exist_ok=True)
    paths = {n: out / n for n in ("ca.crt", "ca.key", "tls.crt", "tls.key")}
    changed: list[str] = []
    if paths["ca.crt"].exists() and paths["ca.key"].exists():
        ca_cert, ca_key = paths["ca.crt"].read_bytes(), paths["ca.key"].read_bytes()
        ca = x509.load_pem_x509_certificate(ca_cert)
        if ca.not_valid_after_utc - now <= dt.timedelta(days=renew_before_days):
            changed.append("CA near expiry: new CA (update the caBundle)")
            ca_cert, ca_key = make_ca(now)
    else:
        ca_cert, ca_key = make_ca(now)
        changed.append("new CA")
    reason = "missing"
    if paths["tls.crt"].exists() and paths["tls.key"].exists() and not changed:
        reason = needs_renewal(paths["tls.crt"].read_bytes(), service, namespace, renew_before_days, now, ca_cert) or ""
    if reason:
        cert, key = make_serving(ca_cert, ca_key, service, namespace, days, now)
        changed.append(f"serving certificate issued ({reason})")
    else:
        cert, key = paths["tls.crt"].read_bytes(), paths["tls.key"].read_bytes()
    for name, data in (("ca.crt", ca_cert), ("ca.key", ca_key), ("tls.crt", cert), ("tls.key", key)):
        if not paths[name].exists() or paths[name].read_bytes() != data:
            paths[name].write_bytes(data)
            if name.endswith(".key"):
                paths[name].chmod(0o600)
    return Material(ca_cert, ca_key, cert, key), changed
