"""The Helm chart (issue 29): real ``helm`` (lint, template, the values schema) and real ``kubectl kustomize``, both
from ``scripts/k8s-tools.py``. With its defaults, installed as release gpu-tailor on a v1.28.7 cluster, the chart
renders the objects of ``manifests/``, and with ``certificates=cert-manager`` those of
``manifests/overlays/cert-manager`` (the Namespace aside: Helm installs into one with ``--create-namespace``; the labels
only Helm writes aside), so the two cannot drift; each value people change reaches the object it names.
``tests/test_chart_conventions.py`` checks Helm's conventions: names from the release, the standard labels, the
kube-scheduler image that follows the cluster."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_tailor.gpumodel import labels
from tests.conftest import helm, release_kubectl

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "gpu-tailor"
Obj = dict[str, Any]
Key = tuple[str, str, str]
# the cluster manifests/ pins kube-scheduler for (registry.k8s.io/kube-scheduler:v1.28.7), where the chart follows it
KUBE_VERSION = "v1.28.7"
# written by Helm only: kustomize has no chart, and manages nothing after the apply
HELM_ONLY_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")


def objects(text: str) -> dict[Key, Obj]:
    """Rendered objects by (kind, namespace, name), as comparable data: the Namespace left out, the ConfigMaps' YAML
    parsed (comments differ), the labels only Helm writes and the pod templates' checksum annotations (Helm's, to roll
    on config changes) dropped."""
    out: dict[Key, Obj] = {}
    for doc in yaml.safe_load_all(text):
        if not doc or doc["kind"] == "Namespace":
            continue
        meta = (doc.get("spec") or {}).get("template", {}).get("metadata", {})
        for labelled in (doc["metadata"], meta):
            for key in HELM_ONLY_LABELS:
                (labelled.get("labels") or {}).pop(key, None)
        kept = {k: v for k, v in (meta.get("annotations") or {}).items() if not k.startswith("checksum/")}
        if "annotations" in meta:
            meta.pop("annotations")
            if kept:
                meta["annotations"] = kept
        if doc["kind"] == "ConfigMap":
            doc["data"] = {k: yaml.safe_load(v) for k, v in doc["data"].items()}
        out[(doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])] = doc
    return out


def template(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm(), "template", "gpu-tailor", str(CHART), "-n", "gpu-tailor", "--kube-version",
                           KUBE_VERSION, *args],
                          capture_output=True, text=True, check=check, timeout=60)


def rendered(*args: str) -> dict[Key, Obj]:
    return objects(template(*args).stdout)


def kustomize(path: Path) -> dict[Key, Obj]:
    return objects(subprocess.run([release_kubectl(), "kustomize", str(path)], capture_output=True, text=True,
                                  check=True, timeout=60).stdout)


def container(objs: dict[Key, Obj], workload: str, name: str, kind: str = "Deployment") -> Obj:
    spec = objs[(kind, "gpu-tailor", workload)]["spec"]["template"]["spec"]
    found: Obj = next(c for c in spec["containers"] if c["name"] == name)
    return found


def test_the_chart_lints_clean() -> None:
    out = subprocess.run([helm(), "lint", "--strict", str(CHART)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize(("values", "base"), [
    ((), "manifests"), (("--set", "certificates=cert-manager"), "manifests/overlays/cert-manager")])
def test_the_chart_renders_what_the_kustomize_base_does(values: tuple[str, ...], base: str) -> None:
    chart, kust = rendered("--include-crds", *values), kustomize(REPO / base)
    assert sorted(chart) == sorted(kust)
    # The CRD is in the chart's crds/: no release's, so none of a release's labels (manifests/agent labels all it holds)
    crd = ("CustomResourceDefinition", "", "nodegpureports.gpu-tailor.io")
    for label in ("app.kubernetes.io/instance", "app.kubernetes.io/version"):
        assert label not in chart[crd]["metadata"]["labels"]
        kust[crd]["metadata"]["labels"].pop(label)
    for key in kust:
        assert chart[key] == kust[key], key


def test_the_values_people_change_reach_their_objects() -> None:
    objs = rendered("--set", "image.repository=registry.example/gpu-tailor", "--set", "image.tag=0.2.0",
                    "--set", "webhook.replicas=3", "--set", "scheduler.replicas=1",
                    "--set", "scheduler.image.tag=v1.36.3", "--set", "webhook.failurePolicy=Ignore",
                    "--set", "webhook.timeoutSeconds=10", "--set", "optInLabel=example.com/gpus",
                    "--set", "scheduler.extender.weight=5", "--set", "webhook.nodeSelector.pool=system",
                    "--set", "scheduler.tolerations[0].key=dedicated",
                    "--set", "scheduler.tolerations[0].operator=Exists",
                    "--set", "webhook.priorityClassName=", "--set", "excludedNamespaces={kube-system,monitoring}",
                    "--set", "podDisruptionBudget.enabled=false", "--set", "criticalPodsQuota.enabled=false",
                    "--set", "agent.intervalSeconds=30")
    webhook = objs[("Deployment", "gpu-tailor", "gpu-tailor-webhook")]
    assert webhook["spec"]["replicas"] == 3
    pod = webhook["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "system"} and "priorityClassName" not in pod
    assert container(objs, "gpu-tailor-webhook", "webhook")["image"] == "registry.example/gpu-tailor:0.2.0"
    assert container(objs, "gpu-tailor-scheduler", "extender")["image"] == "registry.example/gpu-tailor:0.2.0"
    kube_scheduler = container(objs, "gpu-tailor-scheduler", "kube-scheduler")
    assert kube_scheduler["image"] == "registry.k8s.io/kube-scheduler:v1.36.3"
    sched = objs[("Deployment", "gpu-tailor", "gpu-tailor-scheduler")]
    assert sched["spec"]["replicas"] == 1
    assert sched["spec"]["template"]["spec"]["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    gpu, cpu, reports = objs[("MutatingWebhookConfiguration", "", "gpu-tailor")]["webhooks"]
    assert (gpu["failurePolicy"], gpu["timeoutSeconds"], cpu["failurePolicy"]) == ("Ignore", 10, "Ignore")
    assert reports["failurePolicy"] == "Fail"  # only the agents' own writes of their reports wait on it
    agent = container(objs, "gpu-tailor-agent", "agent", kind="DaemonSet")
    assert agent["image"] == "registry.example/gpu-tailor:0.2.0"
    assert agent["args"] == ["agent", "--in-cluster", "--interval", "30"]
    for entry in (gpu, cpu):
        selector = entry["namespaceSelector"]["matchExpressions"]
        assert selector[0]["key"] == "example.com/gpus"
        assert selector[1]["values"] == ["gpu-tailor", "kube-system", "monitoring"]  # the release's, then the list
        assert entry["objectSelector"]["matchExpressions"][0]["key"] == labels.POD_OPT_OUT_LABEL
    config = objs[("ConfigMap", "gpu-tailor", "gpu-tailor-scheduler")]["data"]["config.yaml"]
    assert config["extenders"][0]["weight"] == 5
    assert "bindVerb" not in config["extenders"][0]  # kube-scheduler binds by default
    binding = rendered("--set", "scheduler.extender.bind=true")[("ConfigMap", "gpu-tailor", "gpu-tailor-scheduler")]
    assert binding["data"]["config.yaml"]["extenders"][0]["bindVerb"] == "bind"
    assert not [k for k in objs if k[0] in ("PodDisruptionBudget", "ResourceQuota")]
    without = rendered("--set", "agent.enabled=false")
    assert not [k for k in without if "agent" in k[2] and k[2] != "gpu-tailor-webhook-agents"]


def test_the_services_configs_become_configmaps_and_flags() -> None:
    objs = rendered("--set", "webhook.config.cpuOnlyPods=false", "--set", "scheduler.extender.config.ties=rank",
                    "--set", "scheduler.extender.config.prior.weight=10")
    assert objs[("ConfigMap", "gpu-tailor", "gpu-tailor-webhook")]["data"] == {"webhook.yaml": {"cpuOnlyPods": False}}
    assert objs[("ConfigMap", "gpu-tailor", "gpu-tailor-extender")]["data"] == {
        "extender.yaml": {"ties": "rank", "prior": {"weight": 10}}}
    webhook = container(objs, "gpu-tailor-webhook", "webhook")
    assert webhook["args"][-2:] == ["--config", "/etc/gpu-tailor/webhook.yaml"]
    assert {"name": "config", "mountPath": "/etc/gpu-tailor", "readOnly": True} in webhook["volumeMounts"]
    extender = container(objs, "gpu-tailor-scheduler", "extender")
    assert extender["args"][-2:] == ["--config", "/etc/gpu-tailor-extender/extender.yaml"]


def test_the_extender_config_the_chart_writes_is_one_the_extender_reads(tmp_path: Path) -> None:
    from gpu_tailor.extender.__main__ import load_settings

    objs = objects(template("--set", "scheduler.extender.config.ties=whole",
                            "--set", "scheduler.extender.config.prior.floor=0.002").stdout)
    path = tmp_path / "extender.yaml"
    path.write_text(yaml.safe_dump(objs[("ConfigMap", "gpu-tailor", "gpu-tailor-extender")]["data"]["extender.yaml"]))
    settings = load_settings(str(path))
    assert (settings.ties, settings.prior.floor) == ("whole", 0.002)


@pytest.mark.parametrize("certificates", ["self", "cert-manager"])
def test_with_dra_off_both_services_are_told_and_granted_nothing_of_resource_k8s_io(certificates: str) -> None:
    """``dra: off``: ``--dra off`` on the webhook and the extender, and no RBAC rule on ``resource.k8s.io``; the default
    (``auto``) grants what the DRA watches and the claim templates need."""
    def dra_rules(objs: dict[Key, Obj]) -> list[Obj]:
        return [r for (kind, _, _), o in objs.items() if kind in ("ClusterRole", "Role")
                for r in o.get("rules") or [] if "resource.k8s.io" in r.get("apiGroups", [])]

    auto = rendered("--set", f"certificates={certificates}")
    off = rendered("--set", f"certificates={certificates}", "--set", "dra=off")
    webhook = container(off, "gpu-tailor-webhook", "webhook")
    extender = container(off, "gpu-tailor-scheduler", "extender")
    assert webhook["args"][-2:] == extender["args"][-2:] == ["--dra", "off"]
    assert "--dra" not in container(auto, "gpu-tailor-webhook", "webhook")["args"]
    assert not dra_rules(off) and len(dra_rules(auto)) == 3
    assert set(auto) == set(off)  # the same objects otherwise


def test_a_webhook_run_outside_the_cluster_is_called_at_its_url_on_each_entrys_path() -> None:
    """``webhook.url``: what the end-to-end helm test installs (its webhook runs beside a control plane)."""
    hooks = rendered("--set", "webhook.url=https://127.0.0.1:9443")[
        ("MutatingWebhookConfiguration", "", "gpu-tailor")]["webhooks"]
    assert [h["clientConfig"] for h in hooks] == [{"url": "https://127.0.0.1:9443/mutate"},
                                                  {"url": "https://127.0.0.1:9443/mutate"},
                                                  {"url": "https://127.0.0.1:9443/reports"}]


@pytest.mark.parametrize(("setting", "says"), [("webhook.failurePolicy=Maybe", "/webhook/failurePolicy"),
                                               ("certificates=letsencrypt", "/certificates"),
                                               ("dra=false", "/dra"),
                                               ("scheduler.image.tag=latest", "/scheduler/image/tag"),
                                               ("scheduler.image.tag=v1.37.0", "/scheduler/image/tag"),
                                               ("nameOverride=GPU", "/nameOverride"),
                                               ("webhok.replicas=3", "webhok"),
                                               ("webhook.timeoutSeconds=60", "/webhook/timeoutSeconds"),
                                               ("webhook.url=http://127.0.0.1:9443", "/webhook/url"),
                                               ("webhook.url=https://127.0.0.1:9443/mutate", "/webhook/url"),
                                               ("webhook.config.cpuOnlyPod=false", "cpuOnlyPod"),
                                               ("webhook.config.onMismatch=ignore", "/webhook/config/onMismatch"),
                                               ("scheduler.extender.config.ties=random",
                                                "/scheduler/extender/config/ties"),
                                               ("scheduler.extender.config.prior.weigth=3", "weigth")])
def test_the_values_schema_refuses_what_would_break_the_install(setting: str, says: str) -> None:
    out = template("--set", setting, check=False)
    assert out.returncode != 0 and says in out.stderr, out.stderr


def test_the_config_schemas_in_the_chart_are_the_models_that_read_the_configs() -> None:
    """``values.schema.json`` holds the webhook's and the extender's ``--config`` schemas as their models give them
    (``scripts/chart-schema.py`` writes them): a key the services would refuse is refused before anything renders."""
    proc = subprocess.run([sys.executable, str(CHART.parents[1] / "scripts" / "chart-schema.py"), "--check"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ok = template("--set", "webhook.config.cpuOnlyPods=false", "--set", "scheduler.extender.config.ties=whole",
                  "--set", "webhook.config.offerings[0].backing=mig", "--set",
                  "webhook.config.offerings[0].product=NVIDIA-H100-80GB-HBM3", "--set",
                  "webhook.config.offerings[0].migProfile=1g.10gb", check=False)
    assert ok.returncode == 0, ok.stderr


def test_the_readmes_values_table_is_values_yaml() -> None:
    """``charts/gpu-tailor/README.md``'s table is what ``scripts/chart-readme.py`` makes of values.yaml's ``# --``
    comments: a value added, changed or described anew without rerunning it fails here."""
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "chart-readme.py"), "--check"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_value_nobody_described_is_refused_by_the_readme_generator() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("chart_readme", REPO / "scripts" / "chart-readme.py")
    assert spec is not None and spec.loader is not None
    readme = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = readme  # dataclasses look their module up there
    spec.loader.exec_module(readme)
    described = "# -- The image.\nimage:\n  repository: x\n  tag: y\nwebhook:\n  # -- How many.\n  replicas: 2\n"
    assert [(r.key, r.default) for r in readme.rows(described)] == [("image", {"repository": "x", "tag": "y"}),
                                                                     ("webhook.replicas", 2)]
    with pytest.raises(readme.Undescribed, match=r"webhook\.timeoutSeconds"):
        readme.rows(described + "  timeoutSeconds: 5\n")
