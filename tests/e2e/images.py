"""Container images without a registry: a root filesystem of Debian's ``busybox-static``, made an OCI image with
``umoci`` and a docker archive with ``skopeo`` (which keeps the image's name), for ``ctr images import``.

Two images come out of one root filesystem: ``BUSYBOX`` for the tests' pods (``sh``, ``sleep``, ``env``, ``cat``)
and ``PAUSE``, the sandbox image a real node's containerd is told to use (busybox sleeping forever).
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import tempfile
from pathlib import Path

BUSYBOX = "gpu-tailor.test/busybox:1.35"
PAUSE = "gpu-tailor.test/pause:1"
TOOLS = ("busybox", "umoci", "skopeo")
APPLETS = ("sh", "sleep", "cat", "env", "ls", "echo", "true", "wget")


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


@functools.cache
def archives() -> dict[str, Path]:
    """Each image name to a docker archive of it, built once per test session."""
    busybox = _static_busybox()
    out = Path(tempfile.mkdtemp(prefix="gpu-tailor-images-"))
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
