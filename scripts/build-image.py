#!/usr/bin/env python3
"""Build gpu-tailor's image as an OCI archive, with no registry and no container engine: the image both Deployments
and the node agent run.

The image is assembled the way distroless images are: Debian's packages for a Python 3.11 runtime, unpacked with
``dpkg-deb -x`` (no package manager, shell or maintainer scripts in the image), the project and its runtime
dependencies installed from wheels, bytecode compiled ahead (the root filesystem is read-only at run time), one layer
made with ``umoci`` and written as an OCI archive with ``skopeo``::

    python3 scripts/build-image.py --out gpu-tailor.tar
    skopeo copy oci-archive:gpu-tailor.tar:0.1.0 docker://registry.example.com/gpu-tailor:0.1.0

It needs Debian's ``apt-get``, ``dpkg-deb``, ``umoci`` and ``skopeo``, and pip's access to PyPI for the wheels
(``--wheels DIR`` uses wheels already built instead). The image runs as 65532:65532 with ``HOME`` and ``TMPDIR`` on
``/tmp`` (an emptyDir in the manifests); its entrypoint is ``gpu-tailor``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHON = "python3.11"
# Debian's Python 3.11 and the C++ runtime manylinux wheels (grpcio, numpy) link against; their dependencies are
# looked up with apt-cache, less what only a package manager or another language needs
ROOTS = ("python3.11-minimal", "libpython3.11-stdlib", "libstdc++6", "netbase")
# (and readline, gdbm: only Python's readline and dbm.gnu modules load them, which no program of the image imports)
NOT_IN_IMAGE = frozenset({"dpkg", "install-info", "tar", "perl", "perl-base", "perl-modules-5.36", "libperl5.36",
                          "libgdbm-compat4", "mailcap", "mime-support", "debconf", "readline-common", "libreadline8",
                          "libgdbm6"})
DROP = ("usr/share/man", "usr/share/info", "usr/share/lintian", "usr/share/locale",
        "usr/lib/python3.11/test", "usr/lib/python3.11/idlelib", "usr/lib/python3.11/tkinter",
        "usr/lib/python3.11/ensurepip", "usr/lib/python3.11/lib2to3", "usr/lib/python3.11/pydoc_data")
UID = 65532


def run(*argv: str, cwd: Path | None = None) -> str:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"build-image: {' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def packages() -> list[str]:
    """The Debian packages of the runtime: ``ROOTS`` and everything they depend on, less ``NOT_IN_IMAGE``."""
    out = run("apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
              "--no-breaks", "--no-replaces", "--no-enhances", *ROOTS)
    names = {line.strip() for line in out.splitlines() if line and not line.startswith(" ")}
    return sorted(n for n in names if not n.startswith("<") and n not in NOT_IN_IMAGE)


def debian_root(root: Path, debs: Path) -> list[str]:
    """Unpack the runtime's packages into ``root``; the packages and versions, for the image's labels."""
    names = packages()
    debs.mkdir(parents=True, exist_ok=True)
    run("apt-get", "download", *names, cwd=debs)
    got = []
    for deb in sorted(debs.glob("*.deb")):
        run("dpkg-deb", "-x", str(deb), str(root))
        got.append(deb.name.removesuffix(".deb"))
    for sub in DROP:
        shutil.rmtree(root / sub, ignore_errors=True)
    # each package's copyright file stays (its licence travels with it); the rest of its documentation goes
    for doc in (root / "usr/share/doc").glob("*/*"):
        if doc.name != "copyright":
            shutil.rmtree(doc) if doc.is_dir() and not doc.is_symlink() else doc.unlink()
    return got


# what building the project's wheel reads (pyproject.toml names the README); built from a copy, so that the build
# writes nothing into the checkout and two builds at once (the test suite's two processes) never share a folder
SOURCES = ("pyproject.toml", "README.md", "gpu_tailor")


def wheels(into: Path) -> None:
    source = into.parent / "source"
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            source.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--prefer-binary", "--wheel-dir", str(into), str(source))


def version() -> str:
    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


def install(root: Path, wheel_dir: Path, ver: str) -> None:
    """The project and its dependencies into Debian's dist-packages of ``root``, from wheels only; bytecode compiled
    for the image's paths (Python is told not to write any at run time)."""
    site = root / "usr/lib/python3/dist-packages"
    run(sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--find-links", str(wheel_dir),
        "--no-compile", "--no-warn-script-location", "--target", str(site), f"gpu-tailor=={ver}")
    shutil.rmtree(site / "bin", ignore_errors=True)  # the console scripts name the builder's Python
    # what no program of the image reads: numpy's own test suites and C headers, and type stubs
    for path in [*site.glob("numpy/**/tests"), *site.glob("numpy/_core/include")]:
        shutil.rmtree(path, ignore_errors=True)
    for stub in site.rglob("*.pyi"):
        stub.unlink()
    launcher = root / "usr/local/bin/gpu-tailor"
    launcher.parent.mkdir(parents=True, exist_ok=True)
    launcher.write_text(f"#!/usr/bin/{PYTHON}\nimport sys\nfrom gpu_tailor.cli import main\n\nsys.exit(main())\n")
    launcher.chmod(0o755)
    for tree in (root / f"usr/lib/{PYTHON}", site):
        run(sys.executable, "-m", "compileall", "-q", "-j", "0", "-s", str(root), "-p", "/", str(tree))
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc/passwd").write_text(f"root:x:0:0:root:/root:/sbin/nologin\n"
                                     f"nonroot:x:{UID}:{UID}::/tmp:/sbin/nologin\n")
    (root / "etc/group").write_text(f"root:x:0:\nnonroot:x:{UID}:\n")
    (root / "tmp").mkdir(mode=0o1777, exist_ok=True)


def image(root: Path, work: Path, out: Path, ver: str, debs: list[str]) -> None:
    layout, tag = work / "oci", ver
    run("umoci", "init", "--layout", str(layout))
    run("umoci", "new", "--image", f"{layout}:{tag}")
    bundle = work / "bundle"
    run("umoci", "unpack", "--rootless", "--image", f"{layout}:{tag}", str(bundle))
    shutil.rmtree(bundle / "rootfs")
    shutil.copytree(root, bundle / "rootfs", symlinks=True)
    run("umoci", "repack", "--image", f"{layout}:{tag}", str(bundle))
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
           "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
    labels = {"org.opencontainers.image.title": "gpu-tailor", "org.opencontainers.image.version": ver,
              "org.opencontainers.image.description": "Portable GPU asks for Kubernetes: admission webhook, "
              "scheduler extender and node agent",
              # gpu-tailor's; the Debian packages' and the wheels' licences are in the image beside them
              # (/usr/share/doc/*/copyright, each wheel's *.dist-info)
              "org.opencontainers.image.licenses": "Apache-2.0",
              "io.gpu-tailor.debian-packages": " ".join(debs)}
    run("umoci", "config", "--image", f"{layout}:{tag}", "--clear=config.env", "--clear=config.cmd",
        "--clear=config.entrypoint", f"--config.user={UID}:{UID}", "--config.workingdir=/tmp",
        "--config.entrypoint=/usr/local/bin/gpu-tailor", "--config.cmd=--help", "--config.exposedports=8443/tcp",
        *[f"--config.env={k}={v}" for k, v in env.items()],
        *[f"--config.label={k}={v}" for k, v in labels.items()], f"--tag={tag}")
    out.unlink(missing_ok=True)
    run("skopeo", "copy", "--quiet", f"oci:{layout}:{tag}", f"oci-archive:{out}:{tag}")


def unpacked_size(root: Path) -> int:
    return sum(p.lstat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO / "build" / "gpu-tailor.tar", help="the OCI archive to write")
    p.add_argument("--wheels", type=Path, help="a folder of wheels of the project and its dependencies (default: "
                   "built with pip)")
    p.add_argument("--json", type=Path, help="also write what was built (size, packages) as JSON")
    args = p.parse_args()
    missing = [t for t in ("apt-get", "apt-cache", "dpkg-deb", "umoci", "skopeo") if shutil.which(t) is None]
    if missing:
        raise SystemExit(f"build-image: needs {', '.join(missing)} (Debian: apt-get install umoci skopeo)")
    ver = version()
    with tempfile.TemporaryDirectory(prefix="gpu-tailor-image-") as tmp:
        work = Path(tmp)
        root = work / "rootfs"
        root.mkdir()
        debs = debian_root(root, work / "debs")
        wheel_dir = args.wheels
        if wheel_dir is None:
            wheel_dir = work / "wheels"
            wheels(wheel_dir)
        install(root, wheel_dir, ver)
        size = unpacked_size(root)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        image(root, work, args.out.resolve(), ver, debs)
    said = {"archive": str(args.out), "tag": ver, "unpacked_bytes": size, "archive_bytes": args.out.stat().st_size,
            "debian_packages": debs}
    if args.json:
        args.json.write_text(json.dumps(said, indent=2))
    print(f"{args.out} ({ver}): {size / 2**20:.0f} MiB unpacked, {said['archive_bytes'] / 2**20:.0f} MiB archived, "
          f"{len(debs)} Debian packages")
    return 0


if __name__ == "__main__":
    os.umask(0o022)
    raise SystemExit(main())
