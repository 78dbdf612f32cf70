"""manifests/ as the real kubectl renders it (``kubectl kustomize``, no cluster needed).

One kustomize ``images:`` entry names the gpu-tailor image, so setting it (``kustomize edit set image``
or an overlay's ``images:``) re-points every gpu-tailor container. The containers also carry what a
read-only root filesystem and a rolling update need: /tmp on an emptyDir and a preStop wait.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import release_kubectl

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = ROOT / "manifests"
IMAGE = "ghcr.io/gpu-tailor/gpu-tailor"
DEPLOYMENTS = ("gpu-tailor-webhook", "gpu-tailor-scheduler")
# the gpu-tailor subcommands the Deployments run; the other container is kube-scheduler's own image
SERVICES = ("webhook", "extender")


@pytest.fixture(scope="module")
def kubectl() -> str:
    return release_kubectl()


def render(kubectl: str, path: Path) -> list[dict[str, Any]]:
    out = subprocess.run([kubectl, "kustomize", str(path)], check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def pod_specs(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in objs if d["kind"] == "Deployment"}


def gpu_tailor_containers(objs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(Deployment, container) -> container, for every container that runs a gpu-tailor subcommand."""
    return {(name, c["name"]): c for name, spec in pod_specs(objs).items()
            for c in spec.get("initContainers", []) + spec["containers"] if c.get("args", [""])[0] in SERVICES}


def managed_image() -> str:
    kust = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    (entry,) = [i for i in kust.get("images", []) if i["name"] == IMAGE]
    return f"{entry['newName']}:{entry['newTag']}"


def test_every_gpu_tailor_container_runs_the_kustomize_managed_image(kubectl: str) -> None:
    objs = render(kubectl, MANIFESTS)
    containers = gpu_tailor_containers(objs)
    assert {d for d, _ in containers} == set(DEPLOYMENTS)
    assert {c["image"] for c in containers.values()} == {managed_image()}
    # nothing else runs an image kustomize would not re-point: the rest is kube-scheduler's own
    others = {c["image"] for spec in pod_specs(objs).values() for c in spec["containers"]} - {managed_image()}
    assert all(i.startswith("registry.k8s.io/kube-scheduler:") for i in others)


def test_an_overlay_images_entry_reaches_both_deployments(kubectl: str, tmp_path: Path) -> None:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [os.path.relpath(MANIFESTS, overlay)],  # kustomize wants a relative path to the base
        "images": [{"name": IMAGE, "newName": "registry.example.com/platform/gpu-tailor", "newTag": "0.2.0-rc1"}],
    }))
    containers = gpu_tailor_containers(render(kubectl, overlay))
    assert {d for d, _ in containers} == set(DEPLOYMENTS)
    assert {c["image"] for c in containers.values()} == {"registry.example.com/platform/gpu-tailor:0.2.0-rc1"}


def test_editing_the_images_entry_re_points_both_deployments(kubectl: str, tmp_path: Path) -> None:
    # what `kustomize edit set image ghcr.io/gpu-tailor/gpu-tailor=REGISTRY/gpu-tailor:TAG` writes
    copy = tmp_path / "manifests"
    shutil.copytree(MANIFESTS, copy)
    kust = yaml.safe_load((copy / "kustomization.yaml").read_text())
    kust["images"] = [{"name": IMAGE, "newName": "registry.example.com/gpu-tailor", "newTag": "dev"}]
    (copy / "kustomization.yaml").write_text(yaml.safe_dump(kust))
    containers = gpu_tailor_containers(render(kubectl, copy))
    assert {d for d, _ in containers} == set(DEPLOYMENTS)
    assert {c["image"] for c in containers.values()} == {"registry.example.com/gpu-tailor:dev"}


def test_gpu_tailor_containers_get_a_writable_tmp_and_a_prestop_wait(kubectl: str) -> None:
    objs = render(kubectl, MANIFESTS)
    specs = pod_specs(objs)
    for (deployment, _), c in gpu_tailor_containers(objs).items():
        spec = specs[deployment]
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        # the image's HOME and TMPDIR
        (tmp,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
        volume = {v["name"]: v for v in spec["volumes"]}[tmp["name"]]
        assert "emptyDir" in volume and not tmp.get("readOnly", False)
        assert c["lifecycle"]["preStop"] == {"exec": {"command": ["sleep", "5"]}}
        # the preStop wait, --drain and 20 s for requests in flight all pass before the kubelet's SIGKILL
        args = c["args"]
        drain = float(args[args.index("--drain") + 1]) if "--drain" in args else 2.0
        assert spec["terminationGracePeriodSeconds"] >= 5 + drain + 20
