"""``gpu-tailor webhook`` as a real process: cluster file in, HTTPS out, SIGTERM for a clean stop."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import ssl
import sys
from pathlib import Path

import aiohttp

from gpu_tailor.certs.authority import Names, ensure
from tests.conftest import FIXTURES, free_port, review_fixture


def write_cluster_file(path: Path) -> None:
    items = [json.loads(p.read_text()) for p in sorted((FIXTURES / "nodes").glob("*.json"))]
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))


async def test_webhook_process_answers_fixture_reviews_over_tls_and_stops_on_sigterm(tmp_path: Path) -> None:
    ensure(tmp_path, Names("gpu-tailor-webhook", "gpu-tailor"), days=30, renew_before_days=7)
    write_cluster_file(tmp_path / "cluster.json")
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpu_tailor", "webhook", "--listen", f"127.0.0.1:{port}",
        "--tls-cert", str(tmp_path / "tls.crt"), "--tls-key", str(tmp_path / "tls.key"),
        "--cluster-file", str(tmp_path / "cluster.json"), stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    try:
        log = b""
        while b"webhook serving" not in log:  # the process says when its socket is listening
            line = await asyncio.wait_for(proc.stderr.readline(), 30)
            assert line, f"webhook exited early: {log.decode()}"
            log += line
        ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        ctx.check_hostname = False  # the certificate names the Service; we dial 127.0.0.1
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:
            base = f"https://127.0.0.1:{port}"
            async with session.get(f"{base}/readyz") as resp:
                assert resp.status == 200
            answers = {}
            for letter in "bcg":
                async with session.post(f"{base}/mutate", json=review_fixture(letter)) as resp:
                    assert resp.status == 200
                    answers[letter] = (await resp.json())["response"]
        patch = json.loads(base64.b64decode(answers["b"]["patch"]))
        assert answers["b"]["allowed"] and answers["b"]["patchType"] == "JSONPatch"
        assert {"op": "add", "path": "/spec/containers/0/resources/limits",
                "value": {"nvidia.com/gpu": "1"}} in patch
        assert not answers["c"]["allowed"]
        assert "1" in answers["c"]["status"]["message"] and "2" in answers["c"]["status"]["message"]
        assert answers["g"]["allowed"] and answers["g"]["warnings"]
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 30) == 0
