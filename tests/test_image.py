"""The image ``scripts/build-image.py`` builds, run under a real OCI runtime (runc) as the Deployments run it: as uid
65532 with a read-only root and ``/tmp`` its only writable place; ``gpu-tailor --help``, then the webhook serving TLS
and answering AdmissionReviews. Skipped where the tools are absent (Debian's umoci, skopeo, runc; root)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_tailor.certs.authority import Names, ensure
from tests.conftest import free_port, review_fixture
from tests.e2e import images
from tests.e2e.kube import wait_for
from tests.webhook.test_process import write_cluster_file

TOOLS = ("runc", "umoci", "skopeo", "apt-get", "dpkg-deb")
LIMIT_MIB = 250


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    lacking = [t for t in TOOLS if shutil.which(t) is None] + ([] if os.geteuid() == 0 else ["root"])
    if lacking:
        pytest.skip(f"cannot build and run the image here: no {', '.join(lacking)}")
    image = images.built()  # shared with the real nodes' agent (tests/e2e/test_real_node.py)
    if isinstance(image, str):
        pytest.fail(image)
    return {**image, "dir": tmp_path_factory.mktemp("image")}


def bundle(built: dict[str, Any], name: str) -> Path:
    """The image unpacked as runc runs it (ownership kept: umoci as root)."""
    layout, at = Path(built["dir"]) / "layout", Path(built["dir"]) / name
    if not layout.exists():
        subprocess.run(["skopeo", "copy", "--quiet", f"oci-archive:{built['archive']}:{built['tag']}",
                        f"oci:{layout}:{built['tag']}"], check=True, capture_output=True, timeout=300)
    subprocess.run(["umoci", "unpack", "--image", f"{layout}:{built['tag']}", str(at)], check=True,
                   capture_output=True, timeout=300)
    return at


def configure(at: Path, args: list[str] | None = None, mounts: list[dict[str, Any]] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    """The bundle's config as a pod of the Deployments gets it: read-only root, a tmpfs on /tmp (the emptyDir), the
    host's network (to reach it from the test), the image's own user and entrypoint unless ``args`` replaces them."""
    path = at / "config.json"
    config: dict[str, Any] = json.loads(path.read_text())
    config["root"]["readonly"] = True
    config["process"]["terminal"] = False
    if args is not None:
        config["process"]["args"] = args
    config["mounts"] = [m for m in config["mounts"] if m["destination"] != "/tmp"] + [
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]},
        *mounts]
    config["linux"]["namespaces"] = [n for n in config["linux"]["namespaces"] if n["type"] != "network"]
    path.write_text(json.dumps(config))
    return config


@pytest.fixture
def container(built: dict[str, Any], request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"gpu-tailor-test-{request.node.name[:20].replace('_', '-')}-{os.getpid()}"
    yield name
    subprocess.run(["runc", "kill", name, "KILL"], capture_output=True, check=False)
    subprocess.run(["runc", "delete", "--force", name], capture_output=True, check=False)


def test_the_image_is_small_and_runs_as_the_deployments_run_it(built: dict[str, Any], container: str) -> None:
    assert built["unpacked_bytes"] < LIMIT_MIB * 2**20, f"{built['unpacked_bytes'] / 2**20:.0f} MiB unpacked"
    at = bundle(built, "help")
    config = configure(at)
    assert config["process"]["user"]["uid"] == 65532 and config["process"]["user"]["gid"] == 65532
    assert config["process"]["args"] == ["/usr/local/bin/gpu-tailor", "--help"]
    proc = subprocess.run(["runc", "run", "--bundle", str(at), container], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for command in ("webhook", "extender", "agent", "explain", "capacity", "simulate"):
        assert command in proc.stdout


def test_the_webhook_in_the_image_serves_tls_and_answers_reviews(built: dict[str, Any], container: str,
                                                                tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    ensure(certs, Names("gpu-tailor-webhook", "gpu-tailor"), days=30, renew_before_days=7)
    write_cluster_file(tmp_path / "cluster.json")
    for f in (*certs.iterdir(), tmp_path / "cluster.json"):
        f.chmod(0o644)  # readable by uid 65532, as a Secret's files are by the pod's fsGroup
    port = free_port()
    at = bundle(built, "webhook")
    ro = ["rbind", "ro"]
    configure(at, ["/usr/local/bin/gpu-tailor", "webhook", "--listen", f"127.0.0.1:{port}", "--tls-cert",
                   "/certs/tls.crt", "--tls-key", "/certs/tls.key", "--cluster-file", "/data/cluster.json"],
              [{"destination": "/certs", "type": "bind", "source": str(certs), "options": ro},
               {"destination": "/data/cluster.json", "type": "bind", "source": str(tmp_path / "cluster.json"),
                "options": ro}])
    log = (tmp_path / "webhook.log").open("wb")
    proc = subprocess.Popen(["runc", "run", "--bundle", str(at), container], stdout=log, stderr=subprocess.STDOUT)
    try:
        ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        ctx.check_hostname = False  # the certificate names the Service; the test dials 127.0.0.1
        base = f"https://127.0.0.1:{port}"

        def ready() -> bool:
            assert proc.poll() is None, (tmp_path / "webhook.log").read_text()
            try:
                with urllib.request.urlopen(f"{base}/readyz", timeout=2, context=ctx) as resp:
                    return bool(resp.status == 200)
            except OSError:
                return False

        wait_for(ready, 60, "the webhook in the image ready", interval=0.2,
                 context=lambda: (tmp_path / "webhook.log").read_text())
        state = json.loads(subprocess.run(["runc", "state", container], capture_output=True, text=True,
                                          check=True).stdout)
        status = Path(f"/proc/{state['pid']}/status").read_text()
        assert [line.split()[1:] for line in status.splitlines() if line.startswith("Uid:")] == [["65532"] * 4]
        request = urllib.request.Request(f"{base}/mutate", data=json.dumps(review_fixture("b")).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=10, context=ctx) as resp:
            answer = json.loads(resp.read())["response"]
        assert answer["allowed"] and answer["patchType"] == "JSONPatch"
        assert {"op": "add", "path": "/spec/containers/0/resources/limits",
                "value": {"nvidia.com/gpu": "1"}} in json.loads(base64.b64decode(answer["patch"]))
    finally:
        subprocess.run(["runc", "kill", container, "TERM"], capture_output=True, check=False)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    assert "webhook serving" in (tmp_path / "webhook.log").read_text()
