"""The webhook over HTTP(S): wire format, error statuses, probes, metrics, real TLS and rotation."""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gpu_tailor.certs.authority import Names, ensure
from gpu_tailor.serving import CertReloader, tls_context
from gpu_tailor.webhook.config import AdmissionPolicy
from gpu_tailor.webhook.server import MAX_BODY, make_app
from gpu_tailor.webhook.state import ClusterView
from tests.conftest import FIXTURES, review_fixture

NODES = [json.loads(p.read_text()) for p in sorted((FIXTURES / "nodes").glob("*.json"))]


def ready_view() -> ClusterView:
    v = ClusterView(AdmissionPolicy())
    v.reset(NODES)
    return v


@pytest.fixture
async def client() -> AsyncIterator[TestClient[web.Request, web.Application]]:
    async with TestClient(TestServer(make_app(ready_view()))) as c:
        yield c


async def test_mutation_echoes_uid_with_base64_jsonpatch(client: TestClient[web.Request, web.Application]) -> None:
    review = review_fixture("d")
    resp = await client.post("/mutate", json=review)
    assert resp.status == 200
    body = await resp.json()
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    out = body["response"]
    assert out["uid"] == review["request"]["uid"] and out["allowed"] is True
    assert out["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(out["patch"]))
    assert {"op": "add", "path": "/spec/containers/0/resources/limits/nvidia.com~1gpu", "value": "1"} in ops or any(
        op["path"].endswith("nvidia.com~1gpu.shared") for op in ops)


async def test_denial_is_http_200_with_status(client: TestClient[web.Request, web.Application]) -> None:
    review = review_fixture("c")
    body = await (await client.post("/mutate", json=review)).json()
    out = body["response"]
    assert out["allowed"] is False and out["uid"] == review["request"]["uid"]
    assert out["status"]["code"] == 422 and "must equal limits" in out["status"]["message"]
    assert "patch" not in out


async def test_warnings_travel(client: TestClient[web.Request, web.Application]) -> None:
    body = await (await client.post("/mutate", json=review_fixture("g"))).json()
    assert "not combined into more GPU" in body["response"]["warnings"][0]


@pytest.mark.parametrize("payload", [
    b"{not json", b"[]",
    b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {"uid": "x"}}',
    b'{"apiVersion": "admission.k8s.io/v1", "kind": "Pod", "request": {"uid": "x"}}',
    b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}',
    b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": ""}}',
], ids=["garbage", "array", "v1beta1", "wrong-kind", "no-request", "empty-uid"])
async def test_malformed_body_is_400(client: TestClient[web.Request, web.Application], payload: bytes) -> None:
    resp = await client.post("/mutate", data=payload, headers={"Content-Type": "application/json"})
    assert resp.status == 400
    assert "not an AdmissionReview v1" in (await resp.json())["error"]


async def test_huge_body_is_413(client: TestClient[web.Request, web.Application]) -> None:
    import io
    resp = await client.post("/mutate", data=io.BytesIO(b"x" * (MAX_BODY + 1)),
                             headers={"Content-Type": "application/json"})
    assert resp.status == 413


async def test_probes_and_metrics() -> None:
    view = ClusterView(AdmissionPolicy())
    async with TestClient(TestServer(make_app(view))) as c:
        assert (await c.get("/healthz")).status == 200
        assert (await c.get("/readyz")).status == 503
        view.reset(NODES)
        assert (await c.get("/readyz")).status == 200
        await c.post("/mutate", json=review_fixture("d"))
        text = await (await c.get("/metrics")).text()
        assert 'gpu_tailor_webhook_reviews_total{backing="shared:time-slicing:4",outcome="mutated"} 1.0' in text
        assert "gpu_tailor_webhook_review_seconds_bucket" in text


async def test_real_tls_with_a_ca_from_gpu_tailor_certs(tmp_path: Path) -> None:
    ensure(tmp_path, Names("gpu-tailor-webhook", "gpu-tailor"), days=30, renew_before_days=7)
    ctx = tls_context(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    runner = web.AppRunner(make_app(ready_view()))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    client_ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    try:
        resolver = {"gpu-tailor-webhook.gpu-tailor.svc": "127.0.0.1"}
        conn = aiohttp.TCPConnector(ssl=client_ctx, resolver=StaticResolver(resolver))
        async with aiohttp.ClientSession(connector=conn) as session:
            url = f"https://gpu-tailor-webhook.gpu-tailor.svc:{port}/mutate"
            async with session.post(url, json=review_fixture("e")) as resp:
                assert resp.status == 200
                assert (await resp.json())["response"]["allowed"] is True
        # a client that trusts another CA is refused
        other = tmp_path / "other"
        ensure(other, Names("x", "y"), days=30, renew_before_days=7)
        bad_ctx = ssl.create_default_context(cafile=str(other / "ca.crt"))
        conn = aiohttp.TCPConnector(ssl=bad_ctx, resolver=StaticResolver(resolver))
        async with aiohttp.ClientSession(connector=conn) as session:
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await session.post(f"https://gpu-tailor-webhook.gpu-tailor.svc:{port}/healthz")
    finally:
        await runner.cleanup()


def test_certificate_rotation_reloads_the_live_context(tmp_path: Path) -> None:
    ensure(tmp_path, Names("svc", "ns"), days=30, renew_before_days=7)
    ctx = tls_context(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    reloader = CertReloader(ctx, str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    assert reloader.check() is False
    (tmp_path / "tls.crt").unlink()
    _, changed = ensure(tmp_path, Names("svc", "ns"), days=30, renew_before_days=7)
    assert any("serving certificate issued" in c for c in changed)
    import os
    os.utime(tmp_path / "tls.crt", (1, 1))  # a distinct mtime even on coarse clocks
    assert reloader.check() is True


class StaticResolver(aiohttp.abc.AbstractResolver):
    def __init__(self, table: dict[str, str]) -> None:
        self.table = table

    async def resolve(self, host: str, port: int = 0, family: int = 0) -> list[aiohttp.abc.ResolveResult]:
        import socket
        return [{"hostname": host, "host": self.table[host], "port": port, "family": socket.AF_INET, "proto": 0,
                 "flags": socket.AI_NUMERICHOST}]

    async def close(self) -> None:
        return None
