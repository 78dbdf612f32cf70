"""The policy file's validation, the certs command, and the manifests' webhook configuration."""

from __future__ import annotations

import base64
import datetime as dt
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from gpu_tailor.certs.__main__ import run as certs_run
from gpu_tailor.certs.__main__ import webhook_configuration
from gpu_tailor.certs.authority import Names, ensure, needs_renewal
from gpu_tailor.cli import build_parser
from gpu_tailor.webhook.config import ConfigError, load_policy, parse_policy

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("text", "fragment"), [
    ("onMismatch: maybe", "onMismatch"),
    ("defaultIsolation: strong", "defaultIsolation"),
    ("offerings: [{backing: mig, product: NVIDIA-H100-80GB-HBM3, migProfile: 9g.1gb}]", "offerings[0]"),
    ("offerings: [{backing: mps, product: Tesla-V100}]", "needs replicas"),
    ("offerings: [{backing: whole, product: Tesla-T4}]", "gpuMemory is required"),
    ("offerings: [{backing: whole, product: Tesla-T4, gpuMemory: lots}]", "offerings[0].gpuMemory"),
    ("bogus: 1", "bogus"),
    ("- a list", "mapping"),
    ("a: [unclosed", "not valid YAML"),
])
def test_bad_policy_names_the_field(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_policy(text)
    assert fragment in str(exc.value)


def test_policy_defaults_and_missing_file(tmp_path: Path) -> None:
    p = parse_policy("")
    assert (p.schedulerName, p.onMismatch, p.offerings) == ("gpu-tailor-scheduler", "deny", ())
    with pytest.raises(ConfigError, match="No such file"):
        load_policy(tmp_path / "missing.yaml")


def test_certs_are_idempotent_and_renew_keeping_the_ca(tmp_path: Path) -> None:
    now = dt.datetime(2026, 11, 21, tzinfo=dt.UTC)
    m1, changed = ensure(tmp_path, Names("svc", "ns"), days=90, renew_before_days=30, now=now)
    assert changed == ["new CA", "serving certificate issued (missing)"]
    m2, changed = ensure(tmp_path, Names("svc", "ns"), days=90, renew_before_days=30, now=now + dt.timedelta(days=10))
    assert changed == [] and m2 == m1
    m3, changed = ensure(tmp_path, Names("svc", "ns"), days=90, renew_before_days=30, now=now + dt.timedelta(days=70))
    assert m3.ca_cert == m1.ca_cert and m3.cert != m1.cert
    assert "within 30 days" in changed[0]
    cert = x509.load_pem_x509_certificate(m3.cert)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert sans == ["svc", "svc.ns", "svc.ns.svc", "svc.ns.svc.cluster.local"]
    assert needs_renewal(m3.cert, Names("other", "ns"), 30, now, m3.ca_cert) == "names do not match the service"


def test_certs_command_writes_secret_and_ca_bundle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["certs", "--out", str(tmp_path), "--ip", "127.0.0.1", "--host", "hooks.local"])
    assert certs_run(args) == 0
    cert = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert "hooks.local" in san.get_values_for_type(x509.DNSName)
    # the private key and the Secret that carries it are never readable by others
    assert (tmp_path / "tls.key").stat().st_mode & 0o077 == 0
    assert (tmp_path / "secret.yaml").stat().st_mode & 0o077 == 0
    secret = yaml.safe_load((tmp_path / "secret.yaml").read_text())
    assert secret["type"] == "kubernetes.io/tls" and secret["metadata"]["name"] == "gpu-tailor-webhook-tls"
    hook = yaml.safe_load((tmp_path / "mutatingwebhookconfiguration.yaml").read_text())["webhooks"][0]
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == (tmp_path / "ca.crt").read_bytes()
    assert certs_run(args) == 0
    assert "up to date" in capsys.readouterr().out


def test_manifest_webhook_configuration_matches_the_code() -> None:
    on_disk = yaml.safe_load((ROOT / "manifests" / "webhook" / "mutatingwebhookconfiguration.yaml").read_text())
    assert on_disk == webhook_configuration("gpu-tailor-webhook", "gpu-tailor")
    hook = on_disk["webhooks"][0]
    assert (hook["sideEffects"], hook["failurePolicy"], hook["timeoutSeconds"], hook["reinvocationPolicy"]) == (
        "NoneOnDryRun", "Fail", 5, "IfNeeded")
    assert hook["admissionReviewVersions"] == ["v1"]


def test_kustomization_lists_existing_files() -> None:
    base = ROOT / "manifests" / "webhook"
    kust = yaml.safe_load((base / "kustomization.yaml").read_text())
    for res in kust["resources"]:
        docs = list(yaml.safe_load_all((base / res).read_text()))
        assert all(d["apiVersion"] and d["kind"] for d in docs)


def test_certs_command_refuses_a_bad_ip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert certs_run(build_parser().parse_args(["certs", "--out", str(tmp_path), "--ip", "300.1.1.1"])) == 2
    assert "--ip" in capsys.readouterr().err
    assert not (tmp_path / "tls.key").exists()


def test_a_new_ip_or_host_reissues_the_serving_certificate_under_the_same_ca(tmp_path: Path) -> None:
    m1, _ = ensure(tmp_path, Names("svc", "ns"), days=90, renew_before_days=30)
    m2, changed = ensure(tmp_path, Names("svc", "ns", ips=("127.0.0.1",)), days=90, renew_before_days=30)
    assert changed == ["serving certificate issued (IP addresses do not match)"]
    assert m2.ca_cert == m1.ca_cert and m2.cert != m1.cert


def test_ca_rotation_keeps_the_old_ca_trusted_until_it_expires(tmp_path: Path) -> None:
    now = dt.datetime(2026, 11, 21, tzinfo=dt.UTC)
    m1, _ = ensure(tmp_path, Names("svc", "ns"), days=90, renew_before_days=30, now=now)
    near_end = now + dt.timedelta(days=3650 - 20)
    m2, changed = ensure(tmp_path, Names("svc", "ns"), days=90, renew_before_days=30, now=near_end)
    assert changed[0].startswith("CA near expiry") and m2.ca_cert != m1.ca_cert
    assert m2.previous_ca == m1.ca_cert and m2.ca_bundle() == m2.ca_cert + m1.ca_cert
    assert (tmp_path / "ca-previous.crt").read_bytes() == m1.ca_cert
    # the new serving certificate is signed by the new CA
    assert needs_renewal(m2.cert, Names("svc", "ns"), 30, near_end, m2.ca_cert) is None
    m3, changed = ensure(tmp_path, Names("svc", "ns"), days=90, renew_before_days=30,
                         now=now + dt.timedelta(days=3651))
    assert "previous CA expired: dropped from the caBundle" in changed
    assert m3.ca_bundle() == m2.ca_cert and not (tmp_path / "ca-previous.crt").exists()


def test_after_a_ca_rotation_no_certificate_signed_by_the_old_ca_is_kept(tmp_path: Path) -> None:
    """Every CA is named gpu-tailor-ca: the serving certificate must be checked against the CA's key,
    or a certificate from the old CA would be kept past the old CA's end (and stop being trusted)."""
    start = dt.datetime(2026, 11, 21, tzinfo=dt.UTC)
    ensure(tmp_path, Names("svc", "ns"), days=365, renew_before_days=30, now=start)
    rotation = start + dt.timedelta(days=3650 - 20)  # CA within 30 days of its end
    m, changed = ensure(tmp_path, Names("svc", "ns"), days=365, renew_before_days=30, now=rotation)
    assert "serving certificate issued (not issued by this CA)" in changed
    cert, ca = x509.load_pem_x509_certificate(m.cert), x509.load_pem_x509_certificate(m.ca_cert)
    cert.verify_directly_issued_by(ca)
    # and a serving certificate never outlives the CA that signed it
    old_ca = x509.load_pem_x509_certificate(m.previous_ca)
    _, changed = ensure(tmp_path, Names("svc", "ns"), days=365, renew_before_days=30,
                        now=old_ca.not_valid_after_utc + dt.timedelta(days=1))
    assert changed == ["previous CA expired: dropped from the caBundle"]
    assert cert.not_valid_after_utc <= ca.not_valid_after_utc
