"""A tiny synchronous client for the Kubernetes REST API, and ``wait_for``: what the e2e tests talk with.

The tests check what the API server *stored* and *said*, so they use neither gpu-tailor's own client
code nor kubernetes-asyncio: ``http.client`` over TLS, JSON in and out, credentials from a kubeconfig
(the admin's embedded client certificate, or a ServiceAccount's bearer token).
"""

from __future__ import annotations

import base64
import builtins
import http.client
import json
import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlencode, urlsplit

import yaml

Obj = dict[str, Any]
T = TypeVar("T")

PATCH_TYPES = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
}


class ApiError(Exception):
    """A non-2xx answer; ``message`` is the Status message the API server wrote for people."""

    def __init__(self, method: str, path: str, status: int, body: Any) -> None:
        self.status = status
        self.body = body
        self.message = str(body.get("message", body)) if isinstance(body, dict) else str(body)
        self.reason = str(body.get("reason", "")) if isinstance(body, dict) else ""
        super().__init__(f"{method} {path}: HTTP {status}: {self.message}")


def api_path(resource: str, namespace: str | None = None, name: str | None = None, group: str = "",
             subresource: str | None = None) -> str:
    """``/api/v1/...`` for the core group, ``/apis/<group/version>/...`` otherwise."""
    out = f"/apis/{group}" if group else "/api/v1"
    if namespace:
        out += f"/namespaces/{namespace}"
    out += f"/{resource}"
    if name:
        out += f"/{name}"
    if subresource:
        out += f"/{subresource}"
    return out


@dataclass(frozen=True)
class Credentials:
    server: str
    ca_pem: bytes
    cert_pem: bytes | None = None
    key_pem: bytes | None = None
    token: str | None = None


def load_kubeconfig(path: Path) -> Credentials:
    """The current context's cluster and user; only embedded data (what control-plane.sh writes)."""
    cfg = yaml.safe_load(path.read_text())
    ctx_name = cfg["current-context"]
    ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
    cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
    user = next(u["user"] for u in cfg["users"] if u["name"] == ctx["user"])

    def data(key: str) -> bytes | None:
        return base64.b64decode(user[key]) if key in user else None

    return Credentials(server=cluster["server"], ca_pem=base64.b64decode(cluster["certificate-authority-data"]),
                       cert_pem=data("client-certificate-data"), key_pem=data("client-key-data"),
                       token=user.get("token"))


def write_token_kubeconfig(path: Path, creds: Credentials, user: str, token: str) -> None:
    """A kubeconfig for a ServiceAccount token: how the services reach the API server in these tests."""
    ca = base64.b64encode(creds.ca_pem).decode()
    cfg = {
        "apiVersion": "v1", "kind": "Config", "current-context": "e2e",
        "clusters": [{"name": "e2e", "cluster": {"server": creds.server, "certificate-authority-data": ca}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
    }
    path.write_text(yaml.safe_dump(cfg))
    path.chmod(0o600)


class Kube:
    """JSON over HTTPS to one API server. ``warnings`` holds the Warning headers of the last answer
    (where the API server puts the warnings a mutating webhook returned)."""

    def __init__(self, creds: Credentials, workdir: Path, timeout: float = 30.0) -> None:
        url = urlsplit(creds.server)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 443
        self.timeout = timeout
        self.token = creds.token
        self.ctx = ssl.create_default_context(cadata=creds.ca_pem.decode())
        if creds.cert_pem and creds.key_pem:
            workdir.mkdir(parents=True, exist_ok=True)
            cert, key = workdir / "client.crt", workdir / "client.key"
            cert.write_bytes(creds.cert_pem)
            key.touch(mode=0o600)
            key.write_bytes(creds.key_pem)
            self.ctx.load_cert_chain(str(cert), str(key))
        self.warnings: list[str] = []

    def request(self, method: str, path: str, body: Any = None, query: dict[str, str] | None = None,
                content_type: str = "application/json") -> Any:
        url = path + ("?" + urlencode(query) if query else "")
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=self.timeout)
        try:
            conn.request(method, url, body=payload, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
            self.warnings = resp.headers.get_all("Warning") or []
        finally:
            conn.close()
        try:
            data: Any = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            data = raw.decode(errors="replace")
        if not 200 <= resp.status <= 299:
            raise ApiError(method, url, resp.status, data)
        return data

    def get(self, path: str) -> Obj:
        out: Obj = self.request("GET", path)
        return out

    def exists(self, path: str) -> bool:
        try:
            self.get(path)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def list(self, path: str, label_selector: str = "", field_selector: str = "") -> builtins.list[Obj]:
        query = {k: v for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v}
        items: list[Obj] = self.request("GET", path, query=query)["items"]
        return items

    def create(self, path: str, obj: Obj, dry_run: bool = False) -> Obj:
        out: Obj = self.request("POST", path, obj, query={"dryRun": "All"} if dry_run else None)
        return out

    def patch(self, path: str, patch: Any, kind: Literal["merge", "strategic", "json"] = "merge") -> Obj:
        out: Obj = self.request("PATCH", path, patch, content_type=PATCH_TYPES[kind])
        return out

    def delete(self, path: str, grace_seconds: int | None = None, propagation: str | None = None) -> None:
        """Delete, ignoring 404. ``grace_seconds=0`` is ``kubectl delete --grace-period=0 --force``: without a
        kubelet nothing would ever finish a graceful deletion of a bound pod. ``propagation`` is the
        DeleteOptions propagationPolicy (Orphan, Background, Foreground)."""
        body: Obj | None = None
        if grace_seconds is not None or propagation is not None:
            body = {"apiVersion": "v1", "kind": "DeleteOptions"}
            if grace_seconds is not None:
                body["gracePeriodSeconds"] = grace_seconds
            if propagation is not None:
                body["propagationPolicy"] = propagation
        try:
            self.request("DELETE", path, body)
        except ApiError as exc:
            if exc.status != 404:
                raise

    def events(self, namespace: str, kind: str, name: str) -> builtins.list[Obj]:
        """Events about one object, oldest first, as ``kubectl describe`` lists them."""
        items = self.list(api_path("events", namespace),
                          field_selector=f"involvedObject.kind={kind},involvedObject.name={name}")
        return sorted(items, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))


def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.1,
             context: Callable[[], str] | None = None) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that. On timeout fail with
    ``what``, the last exception or value, and ``context()`` (e.g. log tails)."""
    deadline = time.monotonic() + timeout * float(os.environ.get("GPU_TAILOR_E2E_TIMEOUT_SCALE", "1"))
    last: str = "never polled"
    while True:
        try:
            value = predicate()
            if value:
                return value
            last = f"last value: {value!r}"
        except (ApiError, OSError, KeyError, ValueError) as exc:
            last = f"last error: {type(exc).__name__}: {exc}"
        if time.monotonic() >= deadline:
            extra = f"\n{context()}" if context else ""
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} ({last}){extra}")
        time.sleep(interval)
