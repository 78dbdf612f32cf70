"""manifests/scheduler: the KubeSchedulerConfiguration and the Deployment agree with the extender."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpu_tailor.extender.server import make_app
from gpu_tailor.extender.state import ClusterState
from gpu_tailor.gpumodel import mig
from tests.conftest import FIXTURES

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "manifests" / "scheduler"


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((BASE / name).read_text()) if d]


def scheduler_config() -> dict[str, Any]:
    cm = docs("configmap.yaml")[0]
    config: dict[str, Any] = yaml.safe_load(cm["data"]["config.yaml"])
    return config


def test_scheduler_config_profile_and_extender() -> None:
    config = scheduler_config()
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["profiles"] == [{"schedulerName": "gpu-tailor-scheduler"}]
    assert config["percentageOfNodesToScore"] == 100 and config["leaderElection"]["leaderElect"] is True
    ext = config["extenders"][0]
    assert ext["nodeCacheCapable"] is True and ext["urlPrefix"].startswith("http://127.0.0.1:")
    # only field names a real v1.28.7 scheduler was configured with (the captured configs)
    real = yaml.safe_load((FIXTURES / "extender" / "scheduler-config-nodecache-true.yaml").read_text())
    assert set(ext) <= set(real["extenders"][0]) | {"httpTimeout"}
    routes = {r.resource.canonical for r in make_app(ClusterState()).router.routes() if r.resource}
    for verb in ("filterVerb", "prioritizeVerb", "bindVerb", "preemptVerb"):
        assert f"/{ext[verb]}" in routes


def test_every_nvidia_resource_we_model_is_managed() -> None:
    ext = scheduler_config()["extenders"][0]
    managed = {m["name"] for m in ext["managedResources"]}
    profiles = {p.name for s in mig.SKUS for p in s.profiles}
    expected = {"nvidia.com/gpu", "nvidia.com/gpu.shared"}
    expected |= {f"nvidia.com/mig-{p}{sfx}" for p in profiles for sfx in ("", ".shared")}
    assert managed == expected
    assert all(m["ignoredByScheduler"] is False for m in ext["managedResources"])


def test_sidecar_listens_where_the_scheduler_calls_and_both_mount_what_they_need() -> None:
    deploy = docs("deployment.yaml")[0]
    assert deploy["spec"]["replicas"] == 2
    pod = deploy["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    port = scheduler_config()["extenders"][0]["urlPrefix"].rsplit(":", 1)[1]
    args = containers["extender"]["args"]
    assert args[args.index("--listen") + 1] == f"127.0.0.1:{port}"
    assert "--config=/etc/gpu-tailor/config.yaml" in containers["kube-scheduler"]["command"]
    assert pod["serviceAccountName"] == "gpu-tailor-scheduler"


def test_rbac_grants_the_extender_exactly_what_it_calls() -> None:
    roles = {d["metadata"]["name"]: d for d in docs("rbac.yaml") if d["kind"] == "ClusterRole"}
    rules = {(tuple(r["resources"]), tuple(r["verbs"])) for r in roles["gpu-tailor-extender"]["rules"]}
    assert (("nodes",), ("get", "list", "watch")) in rules
    assert (("pods",), ("get", "list", "watch", "patch")) in rules
    assert (("pods/binding", "bindings"), ("create",)) in rules


def test_kustomization_lists_every_manifest() -> None:
    kust = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    assert sorted(kust["resources"]) == sorted(p.name for p in BASE.glob("*.yaml") if p.name != "kustomization.yaml")
    top = yaml.safe_load((ROOT / "manifests" / "kustomization.yaml").read_text())
    assert top["resources"] == ["webhook", "scheduler"]
