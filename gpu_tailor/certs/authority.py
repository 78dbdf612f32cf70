"""A private CA and a serving certificate the kube-apiserver will trust for a webhook Service.

The API server calls ``https://NAME.NS.svc:443`` and checks the certificate against the
``caBundle`` of the webhook configuration: the serving certificate must carry the DNS names as
subjectAltNames (the Common Name is ignored by Go's TLS since 1.15), be signed by the CA in the
bundle, and use a key usage of digitalSignature + serverAuth. The CA lives long (10 years) and is
kept across renewals, so the caBundle written once stays valid while serving certificates rotate.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
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
    previous_ca: bytes = b""  # a CA being rotated out, trusted until it expires

    def ca_bundle(self) -> bytes:
        """What the API server must trust: the CA, and the previous one while it lives."""
        return self.ca_cert + self.previous_ca

    def files(self) -> dict[str, bytes]:
        out = {"ca.crt": self.ca_cert, "ca.key": self.ca_key, "tls.crt": self.cert, "tls.key": self.key}
        if self.previous_ca:
            out["ca-previous.crt"] = self.previous_ca
        return out


@dataclass(frozen=True)
class Names:
    """Who the serving certificate speaks for: the Service's DNS names, plus extra hosts and IPs
    (a webhook registered by ``clientConfig.url`` is checked against that URL's host)."""

    service: str
    namespace: str
    hosts: tuple[str, ...] = ()
    ips: tuple[str, ...] = ()

    def dns(self) -> list[str]:
        s, ns = self.service, self.namespace
        return [s, f"{s}.{ns}", f"{s}.{ns}.svc", f"{s}.{ns}.svc.cluster.local",
                *(h for h in self.hosts if h not in (s, f"{s}.{ns}", f"{s}.{ns}.svc", f"{s}.{ns}.svc.cluster.local"))]

    def ip_addresses(self) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
        return [ipaddress.ip_address(ip) for ip in self.ips]


def dns_names(service: str, namespace: str) -> list[str]:
    return Names(service, namespace).dns()


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


def make_serving(ca_cert_pem: bytes, ca_key_pem: bytes, names: Names, days: int,
                 now: dt.datetime) -> tuple[bytes, bytes]:
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = _key()
    dns = names.dns()
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns]
    sans += [x509.IPAddress(ip) for ip in names.ip_addresses()]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns[2])]))
        .issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc))  # never outlive the CA
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, key_cert_sign=False,
                                     crl_sign=False, content_commitment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def needs_renewal(cert_pem: bytes, names: Names, renew_before_days: int, now: dt.datetime,
                  ca_cert_pem: bytes, key_pem: bytes | None = None) -> str | None:
    """Why the serving certificate must be reissued, or None when it is fine as it is."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        ca = x509.load_pem_x509_certificate(ca_cert_pem)
    except ValueError:
        return "unreadable certificate"
    try:  # the signature, not just the issuer's name: every CA of ours has the same name
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return "not issued by this CA"
    if key_pem is not None and not _pair(cert, key_pem):
        return "the key does not match the certificate"
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return "no subjectAltName"
    if not set(names.dns()) <= set(san.get_values_for_type(x509.DNSName)):
        return "names do not match the service"
    if not set(names.ip_addresses()) <= set(san.get_values_for_type(x509.IPAddress)):
        return "IP addresses do not match"
    if cert.not_valid_after_utc - now <= dt.timedelta(days=renew_before_days):
        return f"expires {cert.not_valid_after_utc:%Y-%m-%d}, within {renew_before_days} days"
    return None


def _pair(cert: x509.Certificate, key_pem: bytes) -> bool:
    """Whether ``key_pem`` is the private key of ``cert``."""
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        return False
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    return bool(key.public_key().public_bytes(serialization.Encoding.DER, public)
                == cert.public_key().public_bytes(serialization.Encoding.DER, public))


def _ca_problem(ca_cert: bytes, ca_key: bytes, renew_before_days: int, now: dt.datetime) -> tuple[str, bool]:
    """Why the stored CA must be replaced ("" if it is fine), and whether it can still be trusted
    meanwhile (a CA near its end can; an unreadable one, or one whose key is not its own, cannot)."""
    try:
        ca = x509.load_pem_x509_certificate(ca_cert)
    except ValueError:
        return "the CA certificate is unreadable: new CA", False
    if not _pair(ca, ca_key):
        return "the CA key does not match the CA certificate: new CA", False
    if ca.not_valid_after_utc - now <= dt.timedelta(days=renew_before_days):
        return ("CA near expiry: new CA (the old one stays in the caBundle until it expires)",
                ca.not_valid_after_utc > now)
    return "", True


def _expired(pem: bytes, now: dt.datetime) -> bool:
    try:
        return x509.load_pem_x509_certificate(pem).not_valid_after_utc <= now
    except ValueError:
        return True


def renew(stored: dict[str, bytes], names: Names, days: int, renew_before_days: int,
          now: dt.datetime) -> tuple[Material, list[str]]:
    """What should be stored, given what is (``ca.crt``, ``ca.key``, ``tls.crt``, ``tls.key``,
    ``ca-previous.crt``; any may be missing), and what changed.

    A CA near its end is replaced, and the old one is kept in ``ca-previous.crt`` until it expires,
    so the caBundle trusts both while the serving certificates signed by the old one are rotated out.
    """
    changed: list[str] = []
    ca_cert, ca_key = stored.get("ca.crt", b""), stored.get("ca.key", b"")
    previous = stored.get("ca-previous.crt", b"")
    if ca_cert and ca_key:
        problem, trusted = _ca_problem(ca_cert, ca_key, renew_before_days, now)
        if problem:
            changed.append(problem)
            previous = ca_cert if trusted else b""
            ca_cert, ca_key = make_ca(now)
    else:
        ca_cert, ca_key = make_ca(now)
        changed.append("new CA")
    if previous and _expired(previous, now):
        previous = b""
        changed.append("previous CA expired: dropped from the caBundle")
    cert, key = stored.get("tls.crt", b""), stored.get("tls.key", b"")
    reason = "missing" if not (cert and key) else needs_renewal(cert, names, renew_before_days, now, ca_cert, key)
    if reason:
        cert, key = make_serving(ca_cert, ca_key, names, days, now)
        changed.append(f"serving certificate issued ({reason})")
    return Material(ca_cert, ca_key, cert, key, previous), changed


_PEM_END = b"-----END CERTIFICATE-----"


def split_pem(bundle: bytes) -> list[bytes]:
    """The certificates of a PEM bundle, each as its own PEM block (with its newline)."""
    out = []
    for part in bundle.split(_PEM_END)[:-1]:
        begin = part.find(b"-----BEGIN CERTIFICATE-----")
        if begin >= 0:
            out.append(part[begin:] + _PEM_END + b"\n")
    return out


def merge_bundle(want: bytes, present: list[bytes], now: dt.datetime) -> bytes:
    """``want``'s certificates, then those of ``present`` that are still valid and not already in
    ``want`` (compared by the certificate itself, not by its PEM spelling)."""
    out = split_pem(want)
    seen = {x509.load_pem_x509_certificate(c).fingerprint(hashes.SHA256()) for c in out}
    for pem in present:
        try:
            cert = x509.load_pem_x509_certificate(pem)
        except ValueError:
            continue  # not a certificate: dropped
        fp = cert.fingerprint(hashes.SHA256())
        if fp not in seen and cert.not_valid_after_utc > now:
            seen.add(fp)
            out.append(pem)
    return b"".join(out)


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` in one step: a reader sees the old file or the new one, never a part, and a
    private key is never readable by others, not even for a moment."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_pair(cert_path: Path, key_path: Path, cert: bytes, key: bytes) -> None:
    """Write a certificate and its key so that a reloader never pairs a new certificate with an
    old key for long: the key first (a new key with the old certificate fails to load and is
    retried; the serving context keeps the last good pair), then the certificate."""
    write_atomic(key_path, key, 0o600)
    write_atomic(cert_path, cert, 0o644)


FILES = ("ca.crt", "ca.key", "tls.crt", "tls.key", "ca-previous.crt")


def ensure(out: Path, names: Names, days: int, renew_before_days: int,
           now: dt.datetime | None = None) -> tuple[Material, list[str]]:
    """Create or renew what is missing or stale under ``out``; returns the material and what changed."""
    now = now or dt.datetime.now(dt.UTC)
    out.mkdir(parents=True, exist_ok=True)
    stored = {n: (out / n).read_bytes() for n in FILES if (out / n).exists()}
    material, changed = renew(stored, names, days, renew_before_days, now)
    for name, data in material.files().items():
        if stored.get(name) != data and name not in ("tls.crt", "tls.key"):
            write_atomic(out / name, data, 0o600 if name.endswith(".key") else 0o644)
    if (stored.get("tls.crt"), stored.get("tls.key")) != (material.cert, material.key):
        write_pair(out / "tls.crt", out / "tls.key", material.cert, material.key)
    if not material.previous_ca:
        (out / "ca-previous.crt").unlink(missing_ok=True)
    return material, changed
