"""The webhook looks after its own certificate: a CA and a serving certificate kept in a Secret, and
the CA written into the MutatingWebhookConfiguration's ``caBundle``, at start and before expiry.

This is what Kyverno and Gatekeeper do, and it removes the second step that breaks admission:
``kubectl apply -k manifests/`` never carries a caBundle, and the webhook *patches* it in (it does
not apply it), so a re-apply leaves it alone. A periodic sync puts it back if anything else clears it.

Two replicas (or more) share one Secret safely. Each writes with the resourceVersion it read, so
only one wins a race (409 Conflict for the others, who read again and adopt the winner's
certificate). The caBundle is set from what the Secret holds *before* a new CA is written to the
Secret: a replica that still serves a certificate from the previous CA stays trusted, because the
previous CA stays in the bundle until it expires (``authority.renew``).

The serving pair reaches the live SSLContext through files in a private directory, written key
first and both atomically, and ``CertReloader`` (which tries a pair on a scratch context first).
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cryptography import x509

from gpu_tailor.certs.authority import FILES, Material, Names, merge_bundle, renew, split_pem, write_pair
from gpu_tailor.serving import CertReloader

log = logging.getLogger(__name__)


class Conflict(Exception):
    """Someone else wrote the object since we read it: read again."""


class CertStore(Protocol):
    """Where the material and the bundle live: the API server, or a fake in tests."""

    async def read_secret(self) -> tuple[dict[str, bytes], str | None]:
        """The Secret's data and resourceVersion; ``({}, None)`` when there is no Secret."""

    async def write_secret(self, data: dict[str, bytes], resource_version: str | None) -> None:
        """Create (``resource_version`` None) or replace at that version; Conflict if it moved."""

    async def read_bundles(self) -> tuple[list[bytes], str]:
        """The caBundle of each webhook of the configuration, in order, and its resourceVersion."""

    async def write_bundle(self, bundle: bytes, resource_version: str) -> None:
        """Set every webhook's caBundle to ``bundle``; Conflict if the configuration moved since
        ``resource_version``."""


@dataclass
class CertKeeper:
    store: CertStore
    names: Names
    directory: Path
    reloader: CertReloader
    days: int = 365
    renew_before_days: int = 30
    clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)
    material: Material | None = None

    @property
    def cert_path(self) -> Path:
        return self.directory / "tls.crt"

    @property
    def key_path(self) -> Path:
        return self.directory / "tls.key"

    async def sync(self, attempts: int = 5) -> list[str]:
        """Bring the Secret, the caBundle and the served pair up to date; returns what changed."""
        for _ in range(attempts):
            stored, rv = await self.store.read_secret()
            material, changed = renew({k: v for k, v in stored.items() if k in FILES}, self.names, self.days,
                                      self.renew_before_days, self.clock())
            if changed:
                # the bundle first: nothing may serve a certificate the API server does not trust yet
                await self._bundle(material)
                try:
                    await self.store.write_secret(material.files(), rv)
                except Conflict:
                    log.info("certificate Secret changed under us (another replica): reading it again")
                    continue
                log.info("webhook certificate: %s", "; ".join(changed))
                await self._bundle(material)  # still trusted after the write (nothing removes a live CA)
            else:
                changed = await self._bundle(material)
            self._serve(material)
            return changed
        raise Conflict(f"certificate Secret still changing after {attempts} attempts")

    async def _bundle(self, material: Material) -> list[str]:
        """Make every webhook's caBundle trust ``material``'s CAs.

        CAs already in the bundle stay until they expire, even ones the Secret does not name. Two
        replicas that rotate the CA at once each add their new CA before writing the Secret; the
        loser's write fails, and if its bundle write landed after the winner's, an exact bundle
        would drop the CA the winner is about to serve. A loser's CA is harmless to keep: its key
        was never stored anywhere. (To revoke a CA, delete the Secret and clear the caBundle.)
        """
        for _ in range(5):
            bundles, rv = await self.store.read_bundles()
            want = merge_bundle(material.ca_bundle(), [ca for b in bundles for ca in split_pem(b)], self.clock())
            if bundles and all(b == want for b in bundles):
                return []
            try:
                await self.store.write_bundle(want, rv)
            except Conflict:  # another replica wrote it since we read it: merge with theirs
                continue
            log.info("caBundle written into the webhook configuration")
            return ["caBundle written"]
        raise Conflict("the webhook configuration kept changing while its caBundle was written")

    def _serve(self, material: Material) -> None:
        if self.material is not None and (self.material.cert, self.material.key) == (material.cert, material.key):
            self.material = material
            return
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_pair(self.cert_path, self.key_path, material.cert, material.key)
        self.reloader.load()  # raises if the Secret's pair does not load; the live context keeps the last good one
        self.material = material
        log.info("serving the certificate from the Secret (serial %x)",
                 x509.load_pem_x509_certificate(material.cert).serial_number)

    async def start(self, deadline: float = 60.0) -> None:
        """The first sync, retried with backoff: the webhook cannot listen without a certificate.
        Gives up after ``deadline`` seconds with the last error (RBAC missing, no configuration)."""
        loop = asyncio.get_running_loop()
        end, delay = loop.time() + deadline, 0.5
        while True:
            try:
                await self.sync()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if loop.time() + delay > end:
                    raise RuntimeError(f"could not set up the webhook certificate: {exc}") from exc
                log.warning("certificate setup failed (retrying in %.1fs): %s", delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 8.0)

    async def run(self, interval: float) -> None:
        """Sync every ``interval`` seconds (with jitter, so replicas do not move in step), for ever."""
        while True:
            await asyncio.sleep(interval * random.uniform(0.8, 1.2))
            try:
                await self.sync()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # an outage: the certificate in hand stays valid for weeks
                log.warning("certificate sync failed (retrying in about %.0fs): %s", interval, exc)


class ApiCertStore:
    """The Secret and the MutatingWebhookConfiguration through the API server (kubernetes-asyncio's
    transport, plain JSON bodies)."""

    def __init__(self, api: Any, namespace: str, secret: str, webhook_config: str) -> None:
        self.api, self.namespace, self.secret, self.webhook_config = api, namespace, secret, webhook_config
        self._hooks: list[str] = []  # the webhooks' names as last read
        self._secret: dict[str, Any] = {}  # the Secret as last read (its type, labels and annotations are kept)

    async def _call(self, method: str, path: str, body: Any = None,
                    content_type: str = "application/json") -> tuple[int, Any]:
        resp = await self.api.call_api(
            path, method, header_params={"Accept": "application/json", "Content-Type": content_type},
            body=body, auth_settings=["BearerToken"], _preload_content=False, _return_http_data_only=True)
        raw = await resp.read()
        status = int(resp.status)
        data = json.loads(raw) if raw else {}
        if status >= 300 and status not in (404, 409, 422):
            raise RuntimeError(f"{method} {path}: HTTP {status}: {data.get('message', raw[:200])}")
        return status, data

    @property
    def _secret_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/secrets/{self.secret}"

    @property
    def _config_path(self) -> str:
        return f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{self.webhook_config}"

    async def read_secret(self) -> tuple[dict[str, bytes], str | None]:
        status, obj = await self._call("GET", self._secret_path)
        if status == 404:
            self._secret = {}
            return {}, None
        self._secret = obj
        data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        return data, str(obj["metadata"]["resourceVersion"])

    async def write_secret(self, data: dict[str, bytes], resource_version: str | None) -> None:
        # An update keeps what others put on the Secret: its type (immutable: an Opaque Secret made
        # by hand stays Opaque), labels, annotations and data keys that are not ours.
        last = self._secret if resource_version is not None else {}
        last_meta = last.get("metadata") or {}
        meta: dict[str, Any] = {"name": self.secret, "namespace": self.namespace,
                                "labels": {**(last_meta.get("labels") or {}),
                                           "app.kubernetes.io/name": "gpu-tailor-webhook",
                                           "app.kubernetes.io/managed-by": "gpu-tailor"}}
        if last_meta.get("annotations"):
            meta["annotations"] = last_meta["annotations"]
        if resource_version is not None:
            meta["resourceVersion"] = resource_version
        others = {k: v for k, v in (last.get("data") or {}).items() if k not in FILES}
        body = {"apiVersion": "v1", "kind": "Secret", "type": last.get("type") or "kubernetes.io/tls",
                "metadata": meta,
                "data": {**others, **{k: base64.b64encode(v).decode() for k, v in sorted(data.items())}}}
        if resource_version is None:
            status, _ = await self._call("POST", f"/api/v1/namespaces/{self.namespace}/secrets", body)
        else:
            status, _ = await self._call("PUT", self._secret_path, body)
        if status in (404, 409):  # created by another replica meanwhile, or replaced since we read it
            raise Conflict(self._secret_path)

    async def read_bundles(self) -> tuple[list[bytes], str]:
        status, obj = await self._call("GET", self._config_path)
        if status == 404:
            raise RuntimeError(f"MutatingWebhookConfiguration {self.webhook_config} not found: apply manifests/")
        self._hooks = [str(h["name"]) for h in obj.get("webhooks") or []]
        bundles = [base64.b64decode((h.get("clientConfig") or {}).get("caBundle") or "") for h in obj.get("webhooks")
                   or []]
        return bundles, str(obj["metadata"]["resourceVersion"])

    async def write_bundle(self, bundle: bytes, resource_version: str) -> None:
        value = base64.b64encode(bundle).decode()
        # a JSON patch guarded by the resourceVersion that was read and each webhook's name: it changes
        # nothing but the caBundle, and fails rather than overwrite a configuration that changed since
        ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion", "value": resource_version}]
        for i, name in enumerate(self._hooks):
            ops.append({"op": "test", "path": f"/webhooks/{i}/name", "value": name})
            ops.append({"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": value})
        status, _ = await self._call("PATCH", self._config_path, ops, "application/json-patch+json")
        if status in (404, 409, 422):  # a failed "test" op is 422 Unprocessable Entity
            raise Conflict(self._config_path)
