"""The certificate keeper against an in-memory store that behaves like the API server's optimistic
concurrency (a write at a stale resourceVersion is a Conflict)."""

from __future__ import annotations

import contextlib
import datetime as dt
import ssl
from pathlib import Path

import pytest
from cryptography import x509

from gpu_tailor.certs.authority import Names, renew, split_pem
from gpu_tailor.kube.certkeeper import CertKeeper, Conflict
from gpu_tailor.serving import CertReloader, server_context

NAMES = Names("gpu-tailor-webhook", "gpu-tailor", ips=("127.0.0.1",))
NOW = dt.datetime.now(dt.UTC)  # handshakes check validity against the real clock


class MemoryStore:
    def __init__(self, webhooks: int = 1) -> None:
        self.data: dict[str, bytes] = {}
        self.version = 0  # 0: no Secret
        self.bundles = [b""] * webhooks
        self.bundle_version = 0
        self.secret_writes = 0
        self.bundle_writes: list[bytes] = []
        self.before_write: list[object] = []  # callables run before the next secret write (a racing replica)
        self.before_bundle_write: list[object] = []  # ... and before the next bundle write

    async def read_secret(self) -> tuple[dict[str, bytes], str | None]:
        return dict(self.data), (str(self.version) if self.version else None)

    async def write_secret(self, data: dict[str, bytes], resource_version: str | None) -> None:
        while self.before_write:
            hook = self.before_write.pop(0)
            await hook()  # type: ignore[operator]
        current = str(self.version) if self.version else None
        if resource_version != current:
            raise Conflict("secret")
        self.data, self.version = dict(data), self.version + 1
        self.secret_writes += 1

    async def read_bundles(self) -> tuple[list[bytes], str]:
        return list(self.bundles), str(self.bundle_version)

    async def write_bundle(self, bundle: bytes, resource_version: str) -> None:
        while self.before_bundle_write:
            hook = self.before_bundle_write.pop(0)
            await hook()  # type: ignore[operator]
        if resource_version != str(self.bundle_version):
            raise Conflict("bundle")
        self.bundles = [bundle] * len(self.bundles)
        self.bundle_version += 1
        self.bundle_writes.append(bundle)


def keeper(store: MemoryStore, tmp: Path, now: dt.datetime = NOW, days: int = 90) -> CertKeeper:
    ctx = server_context()
    reloader = CertReloader(ctx, str(tmp / "tls.crt"), str(tmp / "tls.key"))
    return CertKeeper(store, NAMES, tmp, reloader, days=days, renew_before_days=30, clock=lambda: now)


def handshake(server: ssl.SSLContext, bundle: bytes, host: str = "127.0.0.1") -> int:
    """A real TLS handshake in memory against ``server``, by a client that trusts only ``bundle``
    and checks the name the API server would; the serial number of the certificate served."""
    client = ssl.create_default_context(cadata=bundle.decode())
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    c = client.wrap_bio(c_in, c_out, server_hostname=host)
    s = server.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        for end in (c, s):
            with contextlib.suppress(ssl.SSLWantReadError):
                end.do_handshake()
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        try:
            c.do_handshake()
            der = c.getpeercert(binary_form=True)
            assert der is not None
            return x509.load_der_x509_certificate(der).serial_number
        except ssl.SSLWantReadError:
            continue
    raise AssertionError("handshake did not complete")


def served_serial(k: CertKeeper) -> int:
    return x509.load_pem_x509_certificate(k.cert_path.read_bytes()).serial_number


async def test_first_start_creates_the_secret_writes_the_bundle_and_serves(tmp_path: Path) -> None:
    store = MemoryStore(webhooks=2)
    k = keeper(store, tmp_path)
    changed = await k.sync()
    assert changed == ["new CA", "serving certificate issued (missing)"]
    assert set(store.data) == {"ca.crt", "ca.key", "tls.crt", "tls.key"}
    assert store.bundles == [store.data["ca.crt"]] * 2
    assert k.cert_path.read_bytes() == store.data["tls.crt"]
    assert k.key_path.stat().st_mode & 0o077 == 0
    # the live context really holds the pair: a client trusting the bundle completes a handshake
    assert handshake(k.reloader.ctx, store.bundles[0]) == served_serial(k)
    assert handshake(k.reloader.ctx, store.bundles[0], "gpu-tailor-webhook.gpu-tailor.svc") == served_serial(k)
    # nothing to do the second time
    assert await k.sync() == [] and store.secret_writes == 1 and len(store.bundle_writes) == 1


async def test_a_cleared_bundle_is_put_back(tmp_path: Path) -> None:
    store = MemoryStore()
    k = keeper(store, tmp_path)
    await k.sync()
    store.bundles = [b""]  # e.g. a re-apply of a configuration that carried no caBundle
    store.bundle_version += 1
    assert await k.sync() == ["caBundle written"]
    assert store.bundles == [store.data["ca.crt"]] and store.secret_writes == 1


async def test_two_replicas_starting_together_end_on_one_certificate(tmp_path: Path) -> None:
    store = MemoryStore()
    a, b = keeper(store, tmp_path / "a"), keeper(store, tmp_path / "b")

    async def b_wins() -> None:
        await b.sync()

    store.before_write.append(b_wins)  # b creates the Secret between a's read and a's write
    await a.sync()
    assert store.secret_writes == 1
    assert a.cert_path.read_bytes() == b.cert_path.read_bytes() == store.data["tls.crt"]
    # the winner's CA leads the bundle; the loser's (whose key was never stored) may trail it
    assert split_pem(store.bundles[0])[0] == store.data["ca.crt"]
    assert handshake(a.reloader.ctx, store.bundles[0]) == handshake(b.reloader.ctx, store.bundles[0])


async def test_a_racing_replicas_bundle_write_never_drops_the_ca_being_served(tmp_path: Path) -> None:
    """a rotates; b, rotating too, writes its bundle between a's bundle write and a's Secret write,
    and then loses the Secret. a serves its new certificate: the bundle must trust it."""
    store = MemoryStore()
    a = keeper(store, tmp_path / "a")
    b = keeper(store, tmp_path / "b")

    async def b_writes_its_bundle_only() -> None:
        stored, _ = await store.read_secret()
        material, _ = renew(stored, NAMES, 90, 30, NOW)
        await b._bundle(material)

    store.before_write.append(b_writes_its_bundle_only)
    await a.sync()
    assert handshake(a.reloader.ctx, store.bundles[0]) == served_serial(a)
    await b.sync()  # b adopts a's certificate
    assert served_serial(b) == served_serial(a)


async def test_renewal_by_one_replica_is_adopted_by_the_other(tmp_path: Path) -> None:
    store = MemoryStore()
    a = keeper(store, tmp_path / "a", NOW - dt.timedelta(days=70))
    await a.sync()
    first = served_serial(a)
    end = x509.load_pem_x509_certificate(store.data["tls.crt"]).not_valid_after_utc
    b = keeper(store, tmp_path / "b")  # now: within 30 days of the 90-day certificate's end
    changed = await b.sync()
    assert changed == [f"serving certificate issued (expires {end:%Y-%m-%d}, within 30 days)"]
    a.clock = lambda: NOW
    assert await a.sync() == []  # a adopts b's certificate: no second renewal
    assert served_serial(a) == served_serial(b) != first
    assert handshake(a.reloader.ctx, store.bundles[0]) == served_serial(b)
    assert store.secret_writes == 2 and len(store.bundle_writes) == 1  # same CA: bundle untouched


async def test_ca_rotation_writes_the_bundle_before_the_secret(tmp_path: Path) -> None:
    store = MemoryStore()
    keeper_a = keeper(store, tmp_path / "a", NOW - dt.timedelta(days=3650 - 10), days=3650)
    await keeper_a.sync()
    old_ca = store.data["ca.crt"]
    seen: list[bytes] = []

    async def record() -> None:  # what the API server trusts when the new Secret is written
        seen.append(store.bundles[0])

    store.before_write.append(record)
    await keeper(store, tmp_path / "b").sync()  # now: the CA ends within 30 days
    new_ca = store.data["ca.crt"]
    assert new_ca != old_ca and seen == [new_ca + old_ca] and store.bundles == [new_ca + old_ca]
    # the serving certificate is reissued under the new CA, and does not outlive it
    served_now = x509.load_pem_x509_certificate(store.data["tls.crt"])
    served_now.verify_directly_issued_by(x509.load_pem_x509_certificate(new_ca))
    # a replica still serving the old CA's certificate stays trusted by the new bundle
    assert handshake(keeper_a.reloader.ctx, store.bundles[0]) == served_serial(keeper_a)


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("tls.key", "other", "serving certificate issued (the key does not match the certificate)"),
    ("tls.key", "garbage", "serving certificate issued (the key does not match the certificate)"),
    ("tls.crt", "garbage", "serving certificate issued (unreadable certificate)"),
    ("ca.key", "other", "the CA key does not match the CA certificate: new CA"),
    ("ca.key", "garbage", "the CA key does not match the CA certificate: new CA"),
    ("ca.crt", "garbage", "the CA certificate is unreadable: new CA"),
], ids=["tls.key-of-another-pair", "tls.key-garbage", "tls.crt-garbage", "ca.key-of-another-ca", "ca.key-garbage",
        "ca.crt-garbage"])
async def test_a_damaged_secret_is_repaired_not_served(tmp_path: Path, key: str, value: str, expected: str) -> None:
    """A Secret edited by hand (or half-restored from a backup) must not take the webhook down: the
    replicas issue what is broken again, and serve only a pair the bundle trusts."""
    store = MemoryStore()
    k = keeper(store, tmp_path)
    await k.sync()
    other = MemoryStore()
    await keeper(other, tmp_path / "other").sync()
    store.data[key] = other.data[key] if value == "other" else b"-----BEGIN PRIVATE KEY-----\nnot base64\n"
    store.version += 1
    changed = await keeper(store, tmp_path / "restarted").sync()  # a replica starting on the damaged Secret
    assert expected in changed
    assert await k.sync() == []  # the running replica adopts the repaired Secret
    assert handshake(k.reloader.ctx, store.bundles[0]) == served_serial(k)
    if key.startswith("ca."):  # a CA that is not whole is not kept trusted
        assert "ca-previous.crt" not in store.data


async def test_a_bundle_written_between_read_and_write_is_merged_not_overwritten(tmp_path: Path) -> None:
    store = MemoryStore()
    a = keeper(store, tmp_path / "a")
    other = MemoryStore()
    await keeper(other, tmp_path / "other").sync()
    foreign_ca = other.data["ca.crt"]

    async def someone_writes() -> None:  # another replica's CA lands between a's read and a's write
        store.bundles = [foreign_ca]
        store.bundle_version += 1

    store.before_bundle_write.append(someone_writes)
    await a.sync()
    assert set(split_pem(store.bundles[0])) == {store.data["ca.crt"], foreign_ca}
