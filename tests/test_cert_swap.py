"""A certificate swap seen half-way never breaks TLS: the live context keeps serving the last pair
that loads until the new one is complete (issue 19: every handshake used to fail between the write
of ``tls.crt`` and that of ``tls.key``). Handshakes are real TLS, client and server in memory."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

import pytest

from gpu_tailor.certs.authority import Names, ensure, write_atomic, write_pair
from gpu_tailor.serving import CertReloader, tls_context

NAMES = Names("gpu-tailor-webhook", "gpu-tailor")


def served_certificate(server: ssl.SSLContext, ca: Path) -> bytes:
    """The certificate a client sees in a full handshake with ``server`` (DER); raises if it fails."""
    client = ssl.create_default_context(cafile=str(ca))
    bios = [ssl.MemoryBIO() for _ in range(4)]
    c = client.wrap_bio(bios[0], bios[1], server_hostname=f"{NAMES.service}.{NAMES.namespace}.svc")
    s = server.wrap_bio(bios[2], bios[3], server_side=True)
    done = {"c": False, "s": False}
    for _ in range(20):
        for side, obj in (("c", c), ("s", s)):
            if not done[side]:
                try:
                    obj.do_handshake()
                    done[side] = True
                except ssl.SSLWantReadError:
                    pass
        bios[2].write(bios[1].read())  # client -> server
        bios[0].write(bios[3].read())  # server -> client
        if all(done.values()):
            cert = c.getpeercert(binary_form=True)
            assert cert is not None
            return cert
    raise AssertionError("handshake did not finish")


def der(pem_path: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem_path.read_text())


def test_a_new_certificate_beside_the_old_key_keeps_the_old_pair_serving(tmp_path: Path) -> None:
    ensure(tmp_path, NAMES, days=30, renew_before_days=7)
    crt, key, ca = tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "ca.crt"
    old = der(crt)
    ctx = tls_context(str(crt), str(key))
    reloader = CertReloader(ctx, str(crt), str(key))
    assert served_certificate(ctx, ca) == old

    fresh = tmp_path / "fresh"  # the next pair under the same CA, as a renewal makes it
    fresh.mkdir()
    for name in ("ca.crt", "ca.key"):
        (fresh / name).write_bytes((tmp_path / name).read_bytes())
    ensure(fresh, NAMES, days=30, renew_before_days=7)
    new_cert = (fresh / "tls.crt").read_bytes()
    write_atomic(crt, new_cert)  # the swap seen half-way: the certificate is new, the key is not
    assert reloader.check() is False  # the half pair is refused ...
    assert served_certificate(ctx, ca) == old  # ... and handshakes go on with the whole old one

    write_atomic(key, (fresh / "tls.key").read_bytes(), 0o600)
    assert reloader.check() is True
    assert served_certificate(ctx, ca) == ssl.PEM_cert_to_DER_cert(new_cert.decode()) != old


def test_a_pair_is_written_key_first_and_the_key_is_never_readable_by_others(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    crt, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    seen: list[tuple[str, int]] = []
    real_replace = os.replace

    def replace(src: str, dst: str) -> None:
        seen.append((Path(dst).name, os.stat(src).st_mode & 0o777))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    write_pair(crt, key, b"CERT", b"KEY")
    assert seen == [("tls.key", 0o600), ("tls.crt", 0o644)]  # in place with its mode before it is visible
