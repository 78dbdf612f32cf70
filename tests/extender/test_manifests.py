"""manifests/scheduler: the KubeSchedulerConfiguration and the Deployment agree with the extender."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp.test_utils import TestServer

from gpu_tailor.extender.cache import Cache
from gpu_tailor.extender.server import make_app
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
    assert [p["schedulerName"] for p in config["profiles"]] == ["gpu-tailor-scheduler"]  # see test_scheduler_profile
    assert config["percentageOfNodesToScore"] == 100 and config["leaderElection"]["leaderElect"] is True
    ext = config["extenders"][0]
    assert ext["nodeCacheCapable"] is True and ext["urlPrefix"].startswith("http://127.0.0.1:")
    # only field names a real v1.28.7 scheduler was configured with (the captured configs)
    real = yaml.safe_load((FIXTURES / "extender" / "scheduler-config-nodecache-true.yaml").read_text())
    assert set(ext) <= set(real["extenders"][0]) | {"httpTimeout"}
    routes = {r.resource.canonical for r in make_app(Cache()).router.routes() if r.resource}
    for verb in ("filterVerb", "prioritizeVerb", "preemptVerb"):
        assert f"/{ext[verb]}" in routes
    assert "/bind" in routes  # for a profile that gives the extender the bind (the chart's scheduler.extender.bind)


def gpu_resource_names() -> set[str]:
    """Every resource name the device plugin can advertise for what gpumodel models."""
    profiles = {p.name for s in mig.SKUS for p in s.profiles}
    expected = {"nvidia.com/gpu", "nvidia.com/gpu.shared"}
    return expected | {f"nvidia.com/mig-{p}{sfx}" for p in profiles for sfx in ("", ".shared")}


def scored_resources() -> list[str]:
    fit = next(c for c in scheduler_config()["profiles"][0]["pluginConfig"] if c["name"] == "NodeResourcesFit")
    return [r["name"] for r in fit["args"]["scoringStrategy"]["resources"]]


def test_every_nvidia_resource_we_model_is_scored() -> None:
    names = [n for n in scored_resources() if n not in ("cpu", "memory")]
    assert len(names) == len(set(names)) and set(names) == gpu_resource_names()  # v1.28.7 refuses duplicates too
    assert not [n for n in names if "+" in n]  # '+me' is no resource name: the scheduler refused it


def test_every_pod_of_the_profile_goes_to_the_extender_and_kube_scheduler_counts_gpus_too() -> None:
    # No managedResources: kube-scheduler asks the extender about every pod of the profile (the webhook
    # sends CPU-only pods of opted-in namespaces there too), and no GPU resource is ignoredByScheduler,
    # which would blind DefaultPreemption to GPUs (its dry run runs the in-tree filters only, finds no
    # GPU victim and never asks the extender's preempt): see the config's comment
    ext = scheduler_config()["extenders"][0]
    assert "managedResources" not in ext
    assert "preemptVerb" in ext
    assert "bindVerb" not in ext  # kube-scheduler binds; the extender records the GPUs after (extender/recorder.py)


def test_client_connection_lifts_the_default_rate_limit() -> None:
    conn = scheduler_config()["clientConnection"]
    assert conn == {"qps": 500, "burst": 1000}  # no kubeconfig: in-cluster service account


def _load_with_kube_scheduler(binary: Path, config: dict[str, Any], work: Path) -> tuple[int, str, dict[str, Any]]:
    """Run the real config loading and validation (no API server needed): exit code, stderr, config written."""
    work.mkdir()
    kubeconfig = work / "kubeconfig"  # kube-scheduler insists on one outside a cluster; it is never dialled
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "unused"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    config = {**config, "clientConnection": {**config.get("clientConnection", {}), "kubeconfig": str(kubeconfig)}}
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    written = work / "written.yaml"
    # --secure-port=0: serve nothing, so a control plane running beside us does not matter
    proc = subprocess.run([str(binary), f"--config={work / 'config.yaml'}", "--secure-port=0",
                           f"--write-config-to={written}"], capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stderr, yaml.safe_load(written.read_text()) if written.exists() else {}


def test_kube_scheduler_accepts_the_config_and_refuses_a_plus_me_name(kube_scheduler: Path, tmp_path: Path) -> None:
    binary = kube_scheduler
    code, err, written = _load_with_kube_scheduler(binary, scheduler_config(), tmp_path / "ours")
    assert code == 0, err
    assert (written["clientConnection"]["qps"], written["clientConnection"]["burst"]) == (500, 1000)
    assert not written["extenders"][0].get("managedResources")
    fit = next(c for c in written["profiles"][0]["pluginConfig"] if c["name"] == "NodeResourcesFit")
    assert {r["name"] for r in fit["args"]["scoringStrategy"]["resources"]} == set(scored_resources())
    bad = scheduler_config()  # a '+me' name, had the list of GPU resources one
    bad["extenders"][0]["managedResources"] = [{"name": "nvidia.com/mig-1g.10gb+me", "ignoredByScheduler": False}]
    code, err, _ = _load_with_kube_scheduler(binary, bad, tmp_path / "plus-me")
    assert code != 0, "kube-scheduler took a resource name with a +"
    # v1.28 writes `Invalid value: nvidia.com/mig-1g.10gb+me: name part must ...`, v1.36 quotes the value
    assert "managedResources[0].name: Invalid value" in err and "nvidia.com/mig-1g.10gb+me" in err, err
    assert "name part must consist of alphanumeric characters" in err


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


def test_every_probe_asks_the_extenders_metrics_listener() -> None:
    """The kubelet sends httpGet probes to the pod IP: they go to --metrics-listen (the verbs' loopback
    listener is out of its reach), on paths that listener serves; kube-scheduler's liveness is the pair's."""
    pod = docs("deployment.yaml")[0]["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    args = containers["extender"]["args"]
    port = int(args[args.index("--metrics-listen") + 1].rsplit(":", 1)[1])
    assert {p["name"]: p["containerPort"] for p in containers["extender"]["ports"]} == {"metrics": port}
    assert not args[args.index("--listen") + 1].startswith("0.0.0.0")
    probes = {(c, kind): containers[c][kind]["httpGet"] for c in ("extender", "kube-scheduler")
              for kind in ("livenessProbe", "readinessProbe")}
    assert probes[("extender", "livenessProbe")] == {"path": "/healthz", "port": "metrics"}
    assert probes[("extender", "readinessProbe")] == {"path": "/readyz", "port": "metrics"}
    # a named port resolves only among the probed container's own ports: kube-scheduler names the number
    assert probes[("kube-scheduler", "livenessProbe")] == {"path": "/livez", "port": port}
    for (container, _), get in probes.items():
        named = {p["name"] for p in containers[container].get("ports") or []}
        assert isinstance(get["port"], int) or get["port"] in named, (container, get)
    healthz = args[args.index("--scheduler-healthz") + 1]
    assert healthz == f"https://127.0.0.1:{probes[('kube-scheduler', 'readinessProbe')]['port']}/healthz"
    assert float(args[args.index("--unhealthy-after") + 1]) <= 300


@pytest.mark.parametrize(("path", "synced", "status"), [
    pytest.param("/healthz", False, 200, id="alive-before-sync"),
    pytest.param("/readyz", False, 503, id="not-ready-before-sync"),
    pytest.param("/readyz", True, 200, id="ready-after-sync"),
])
async def test_probe_paths_answer_as_the_kubelet_needs(path: str, synced: bool, status: int) -> None:
    cache = Cache()
    cache.nodes_synced = cache.pods_synced = synced
    server = TestServer(make_app(cache), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session, session.get(server.make_url(path)) as resp:
            assert resp.status == status
    finally:
        await server.close()


def test_kustomization_lists_every_manifest() -> None:
    kust = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    assert sorted(kust["resources"]) == sorted(p.name for p in BASE.glob("*.yaml") if p.name != "kustomization.yaml")
    top = yaml.safe_load((ROOT / "manifests" / "kustomization.yaml").read_text())
    assert top["resources"] == ["webhook", "scheduler", "agent"]
    agent = ROOT / "manifests" / "agent"
    assert sorted(yaml.safe_load((agent / "kustomization.yaml").read_text())["resources"]) == sorted(
        p.name for p in agent.glob("*.yaml") if p.name != "kustomization.yaml")
