"""Container images without a registry: a root filesystem of Debian's ``busybox-static``, made an OCI image with
``umoci`` and a docker archive with ``skopeo`` (which keeps the image's name), for ``ctr images import``.

Two images come out of one root filesystem: ``BUSYBOX`` for the tests' pods (``sh``, ``sleep``, ``env``, ``cat``)
and ``PAUSE``, the sandbox image a real node's containerd is told to use (busybox sleeping forever). A third holds the
control plane's own ``kube-scheduler`` binary (``kube_scheduler``), named as the manifests name kube-scheduler's
image, so that gpu-tailor-scheduler runs as a pod of a real node with the release under test.
"""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

BUSYBOX = "gpu-tailor.test/busybox:1.35"
PAUSE = "gpu-tailor.test/pause:1"
TOOLS = ("busybox", "umoci", "skopeo")
APPLETS = ("sh", "sleep", "cat", "env", "ls", "echo", "true", "wget")


def _scratch(prefix: str) -> Path:
    """A folder removed when the test session ends (the archives are tens of MiB)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, True)
    return path


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


def _run(*argv: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stdout}{proc.stderr}")


def _static_busybox() -> Path:
    path = Path(shutil.which("busybox") or "/bin/busybox").resolve()
    head = path.read_bytes()[:4096]
    if b"ld-linux" in head or b"/lib64/ld" in head:
        raise RuntimeError(f"{path} is dynamically linked: install Debian's busybox-static")
    return path


def _image(layout: Path, tag: str, rootfs_of: Path, entrypoint: list[str]) -> None:
    _run("umoci", "new", "--image", f"{layout}:{tag}")
    bundle = layout.parent / f"bundle-{tag}"
    _run("umoci", "unpack", "--rootless", "--image", f"{layout}:{tag}", str(bundle))
    rootfs = bundle / "rootfs"
    for sub in ("bin", "tmp", "etc", "proc", "sys", "dev"):
        (rootfs / sub).mkdir(exist_ok=True)
    shutil.copy2(rootfs_of, rootfs / "bin" / "busybox")
    for applet in APPLETS:
        (rootfs / "bin" / applet).symlink_to("busybox")
    (rootfs / "etc" / "passwd").write_text("root:x:0:0:root:/:/bin/sh\nnobody:x:65532:65532:nobody:/:/bin/sh\n")
    _run("umoci", "repack", "--image", f"{layout}:{tag}", str(bundle))
    _run("umoci", "config", "--image", f"{layout}:{tag}", "--config.entrypoint", entrypoint[0],
         *[a for arg in entrypoint[1:] for a in ("--config.cmd", arg)])
    shutil.rmtree(bundle)


REPO = Path(__file__).resolve().parents[2]
BUILD_TOOLS = ("umoci", "skopeo", "apt-get", "dpkg-deb")


def manifests_image() -> str:
    """The image the manifests run gpu-tailor's pods from (the agent DaemonSet's)."""
    doc = yaml.safe_load((REPO / "manifests" / "agent" / "daemonset.yaml").read_text())
    return str(doc["spec"]["template"]["spec"]["containers"][0]["image"])


@functools.cache
def built() -> dict[str, Any] | str:
    """gpu-tailor's own image as ``scripts/build-image.py`` builds it (once per test session): what it printed as
    JSON (``archive``, ``tag``, ``unpacked_bytes`` ...); or why it cannot be built here."""
    lacking = [t for t in BUILD_TOOLS if shutil.which(t) is None]
    if lacking:
        return f"no {', '.join(lacking)} to build gpu-tailor's image"
    out = _scratch("gpu-tailor-image-")
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "build-image.py"), "--out", str(out / "oci.tar"),
                           "--json", str(out / "built.json")], capture_output=True, text=True, timeout=900,
                          check=False)
    if proc.returncode != 0:
        return f"scripts/build-image.py failed: {proc.stdout}{proc.stderr}"
    said: dict[str, Any] = json.loads((out / "built.json").read_text())
    return said


@functools.cache
def gpu_tailor() -> tuple[str, Path] | str:
    """gpu-tailor's own image as a docker archive named as the manifests name it (so a kubelet runs it without a
    registry); or why it cannot be built here."""
    image = built()
    if isinstance(image, str):
        return image
    name, archive = manifests_image(), Path(image["archive"]).with_name("image.tar")
    _run("skopeo", "copy", "--quiet", f"oci-archive:{image['archive']}:{image['tag']}",
         f"docker-archive:{archive}:{name}")
    return name, archive


@functools.cache
def kube_scheduler(binary: Path, version: str) -> tuple[str, Path]:
    """``binary`` (a static kube-scheduler of ``version``) as an image named ``registry.k8s.io/kube-scheduler:VERSION``,
    a docker archive: the binary on ``PATH``, a passwd naming uid 65532, and nothing else."""
    out = _scratch("gpu-tailor-kube-scheduler-")
    layout, tag = out / "oci", "kube-scheduler"
    _run("umoci", "init", "--layout", str(layout))
    _run("umoci", "new", "--image", f"{layout}:{tag}")
    bundle = out / "bundle"
    _run("umoci", "unpack", "--rootless", "--image", f"{layout}:{tag}", str(bundle))
    rootfs = bundle / "rootfs"
    for sub in ("usr/local/bin", "etc", "tmp"):
        (rootfs / sub).mkdir(parents=True, exist_ok=True)
    shutil.copy2(binary, rootfs / "usr/local/bin/kube-scheduler")
    (rootfs / "etc" / "passwd").write_text("root:x:0:0:root:/:/sbin/nologin\nnonroot:x:65532:65532::/:/sbin/nologin\n")
    _run("umoci", "repack", "--image", f"{layout}:{tag}", str(bundle))
    _run("umoci", "config", "--image", f"{layout}:{tag}", "--config.env", "PATH=/usr/local/bin:/usr/bin:/bin",
         "--config.entrypoint", "/usr/local/bin/kube-scheduler")
    shutil.rmtree(bundle)
    name, archive = f"registry.k8s.io/kube-scheduler:{version}", out / "kube-scheduler.tar"
    _run("skopeo", "copy", "--quiet", f"oci:{layout}:{tag}", f"docker-archive:{archive}:{name}")
    return name, archive


@functools.cache
def archives() -> dict[str, Path]:
    """Each image name to a docker archive of it, built once per test session."""
    busybox = _static_busybox()
    out = _scratch("gpu-tailor-images-")
    layout = out / "oci"
    _run("umoci", "init", "--layout", str(layout))
    found: dict[str, Path] = {}
    for name, tag, entrypoint in ((BUSYBOX, "busybox", ["/bin/sh"]),
                                  (PAUSE, "pause", ["/bin/sleep", "2147483647"])):
        _image(layout, tag, busybox, entrypoint)
        archive = out / f"{tag}.tar"
        _run("skopeo", "copy", "--quiet", f"oci:{layout}:{tag}", f"docker-archive:{archive}:{name}")
        found[name] = archive
    return found
