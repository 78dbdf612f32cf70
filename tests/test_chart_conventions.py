"""The chart by Helm's conventions, with the real ``helm template``: every object named after the release and carrying
the standard labels; the flags, references and selectors that name other objects follow those names (the webhook
finds its configuration, Service and Secret, RBAC grants what exists); kube-scheduler's image follows the cluster's
version. One release per cluster is enforced with ``lookup``, which ``helm template`` cannot exercise:
``tests/e2e/test_helm.py`` installs a second release on a real control plane."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import helm
from tests.test_chart_monitoring import selects

CHART = Path(__file__).resolve().parents[1] / "charts" / "gpu-tailor"
Obj = dict[str, Any]
NS = "gpu-system"
STANDARD = ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
            "app.kubernetes.io/managed-by", "helm.sh/chart", "app.kubernetes.io/component")
SELECTOR = ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component")
EVERYTHING = ("--set", "monitoring.dashboard.enabled=true", "--set", "monitoring.serviceMonitor.enabled=true",
              "--set", "monitoring.prometheusRule.enabled=true", "--set", "webhook.config.cpuOnlyPods=false",
              "--set", "scheduler.extender.config.ties=rank")


def template(release: str, *args: str, chart: Path = CHART, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm(), "template", release, str(chart), "-n", NS, *args],
                          capture_output=True, text=True, check=check, timeout=60)


def rendered(release: str, *args: str) -> list[Obj]:
    return [d for d in yaml.safe_load_all(template(release, *args).stdout) if d]


def one(objs: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [o for o in objs if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, (kind, name, [o["metadata"]["name"] for o in found])
    return found[0]


def names(objs: list[Obj], kind: str) -> set[str]:
    return {o["metadata"]["name"] for o in objs if o["kind"] == kind}


def arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def pod_spec(obj: Obj) -> Obj:
    spec: Obj = obj["spec"]["template"]["spec"]
    return spec


@pytest.mark.parametrize("values", [(), ("--set", "certificates=cert-manager", *EVERYTHING)],
                         ids=["defaults", "cert-manager-and-monitoring"])
@pytest.mark.parametrize("release", ["gpu-tailor", "gpus"])
def test_every_rendered_object_carries_the_standard_labels(release: str, values: tuple[str, ...]) -> None:
    objs = rendered(release, *values)
    for o in objs:
        labels = o["metadata"].get("labels") or {}
        where = f"{o['kind']} {o['metadata']['name']}"
        assert [k for k in STANDARD if k not in labels] == [], where
        assert (labels["app.kubernetes.io/name"], labels["app.kubernetes.io/instance"],
                labels["app.kubernetes.io/managed-by"]) == ("gpu-tailor", release, "Helm"), where
        assert labels["helm.sh/chart"].startswith("gpu-tailor-"), where
        template_labels = ((o.get("spec") or {}).get("template") or {}).get("metadata", {}).get("labels")
        if template_labels is not None:  # a workload's pods carry them too
            assert {k: template_labels.get(k) for k in STANDARD} == {k: labels[k] for k in STANDARD}, where


@pytest.mark.parametrize("release", ["gpu-tailor", "gpus"])
def test_selectors_are_name_instance_and_component_and_pick_their_own_pods(release: str) -> None:
    """Selectors hold the three labels that never change in a release's life (a Deployment's cannot change), and each
    picks the pods of its component and of no other."""
    objs = rendered(release, *EVERYTHING)
    pods = {o["metadata"]["labels"]["app.kubernetes.io/component"]: o["spec"]["template"]["metadata"]["labels"]
            for o in objs if o["kind"] in ("Deployment", "DaemonSet")}
    assert sorted(pods) == ["agent", "scheduler", "webhook"]
    selectors: list[tuple[str, Obj, str]] = []
    for o in objs:
        component = o["metadata"]["labels"]["app.kubernetes.io/component"]
        if o["kind"] in ("Deployment", "DaemonSet", "PodDisruptionBudget"):
            selectors.append((f"{o['kind']} {o['metadata']['name']}", o["spec"]["selector"], component))
        if o["kind"] == "Service":
            selectors.append((f"Service {o['metadata']['name']}", {"matchLabels": o["spec"]["selector"]}, component))
        for i, spread in enumerate(((o.get("spec") or {}).get("template") or {}).get("spec", {}).get(
                "topologySpreadConstraints", [])):
            selectors.append((f"{o['metadata']['name']} spread {i}", spread["labelSelector"], component))
    assert len(selectors) == 9
    for where, selector, component in selectors:
        assert sorted(selector) == ["matchLabels"] and sorted(selector["matchLabels"]) == sorted(SELECTOR), where
        assert [c for c, labels in pods.items() if selects(selector, labels)] == [component], where


@pytest.mark.parametrize(("release", "values", "prefix", "name"), [
    ("gpu-tailor", (), "gpu-tailor", "gpu-tailor"),            # the default install: manifests/' names
    ("gpu-tailor-prod", (), "gpu-tailor-prod", "gpu-tailor"),  # holds the chart's name: the release's alone
    ("gpus", (), "gpus-gpu-tailor", "gpu-tailor"),
    ("gpus", ("--set", "fullnameOverride=tailor"), "tailor", "gpu-tailor"),
    ("gpus", ("--set", "nameOverride=tailor"), "gpus-tailor", "tailor"),
], ids=["default", "contains-chart-name", "other-release", "fullnameOverride", "nameOverride"])
def test_every_name_comes_from_the_release(release: str, values: tuple[str, ...], prefix: str, name: str) -> None:
    objs = rendered(release, "--set", "certificates=cert-manager", *EVERYTHING, *values)
    for o in objs:
        assert o["metadata"]["name"] == prefix or o["metadata"]["name"].startswith(f"{prefix}-"), o["metadata"]
        assert o["metadata"]["labels"]["app.kubernetes.io/name"] == name
    assert one(objs, "Deployment", f"{prefix}-webhook") and one(objs, "MutatingWebhookConfiguration", prefix)


def test_a_long_release_name_still_makes_valid_service_names() -> None:
    release = "a-release-name-of-fifty-three-characters-gpu-tailor-x"
    assert len(release) == 53  # Helm's longest
    objs = rendered(release, *EVERYTHING)
    assert all(len(n) <= 63 for n in names(objs, "Service"))


@pytest.mark.parametrize("certificates", ["self", "cert-manager"])
def test_what_names_another_object_follows_its_name(certificates: str) -> None:
    """A release not called gpu-tailor: the webhook's flags, the webhook configuration, RBAC's references and
    resourceNames, the Lease, the mounted ConfigMaps and Secrets, cert-manager's chain all name this release's
    objects."""
    objs = rendered("gpus", "--set", f"certificates={certificates}", *EVERYTHING)
    full = "gpus-gpu-tailor"
    config = one(objs, "MutatingWebhookConfiguration")
    service = one(objs, "Service", f"{full}-webhook")
    webhook = one(objs, "Deployment", f"{full}-webhook")
    agents = one(objs, "DaemonSet")
    argv = pod_spec(webhook)["containers"][0]["args"]
    hooks = config["webhooks"]
    assert {h["clientConfig"]["service"]["name"] for h in hooks} == {service["metadata"]["name"]}
    assert {h["clientConfig"]["service"]["namespace"] for h in hooks} == {NS}
    agent_account = pod_spec(agents)["serviceAccountName"]
    assert agent_account in names(objs, "ServiceAccount") and arg(argv, "--agent-service-account") == agent_account
    assert arg(argv, "--agent-namespace") == NS
    assert hooks[2]["matchConditions"][0]["expression"] == (
        f"request.userInfo.username == 'system:serviceaccount:{NS}:{agent_account}'")
    for workload in (webhook, agents, one(objs, "Deployment", f"{full}-scheduler")):
        assert pod_spec(workload)["serviceAccountName"] in names(objs, "ServiceAccount")
        for volume in pod_spec(workload).get("volumes", []):
            if "configMap" in volume:
                assert volume["configMap"]["name"] in names(objs, "ConfigMap"), volume
    volumes = {v["name"]: v for v in pod_spec(webhook)["volumes"]}
    secret = volumes["tls"]["secret"]["secretName"] if "tls" in volumes else None  # cert-manager's, mounted
    if certificates == "self":
        assert (arg(argv, "--webhook-config"), arg(argv, "--service")) == (config["metadata"]["name"],
                                                                           service["metadata"]["name"])
        namespace, secret = arg(argv, "--certs-secret").split("/")
        assert namespace == NS
        roles = {o["metadata"]["name"]: o for o in objs if o["kind"] in ("Role", "ClusterRole")}
        assert roles[f"{full}-webhook-certs"]["rules"][1]["resourceNames"] == [secret]
        assert roles[f"{full}-webhook-cabundle"]["rules"][0]["resourceNames"] == [config["metadata"]["name"]]
    else:
        ns, name = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].split("/")
        certificate = one(objs, "Certificate", name)
        assert ns == NS and certificate["spec"]["secretName"] == secret
        assert f"{service['metadata']['name']}.{NS}.svc" in certificate["spec"]["dnsNames"]
        assert {o["spec"]["issuerRef"]["name"] for o in objs if o["kind"] == "Certificate"} <= names(objs, "Issuer")
        assert one(objs, "Issuer", f"{full}-ca")["spec"]["ca"]["secretName"] == one(objs, "Certificate",
                                                                                      f"{full}-ca")["spec"]["secretName"]
    monitor = one(objs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][1]["tlsConfig"]["ca"]["secret"]["name"] == secret
    assert monitor["spec"]["endpoints"][1]["tlsConfig"]["serverName"] == f"{service['metadata']['name']}.{NS}.svc"
    # RBAC: every binding's role exists here (or is one the API server bootstraps), every subject is ours
    roles_here = {(o["kind"], o["metadata"]["name"]) for o in objs if o["kind"] in ("Role", "ClusterRole")}
    for binding in (o for o in objs if o["kind"].endswith("Binding")):
        ref = binding["roleRef"]
        assert (ref["kind"], ref["name"]) in roles_here or ref["name"].startswith("system:") or \
            ref["name"] == "extension-apiserver-authentication-reader", binding["metadata"]["name"]
        assert {s["name"] for s in binding["subjects"]} <= names(objs, "ServiceAccount")
    profile = yaml.safe_load(one(objs, "ConfigMap", f"{full}-scheduler")["data"]["config.yaml"])
    assert profile["leaderElection"]["resourceName"] == f"{full}-scheduler"
    assert profile["leaderElection"]["resourceNamespace"] == NS


def test_the_scheduler_profile_is_named_as_the_webhook_writes_pods() -> None:
    """The scheduler name is the cluster's, not the release's: the webhook writes it on pods, and the nodes' taint
    is tolerated by the pods it sends there."""
    for values, want in [((), "gpu-tailor-scheduler"), (("--set", "webhook.config.schedulerName=gpus"), "gpus")]:
        objs = rendered("gpus", *values)
        profile = yaml.safe_load(one(objs, "ConfigMap", "gpus-gpu-tailor-scheduler")["data"]["config.yaml"])
        assert profile["profiles"][0]["schedulerName"] == want


def kube_scheduler_image(*args: str) -> str:
    objs = rendered("gpu-tailor", *args)
    (c,) = [c for c in pod_spec(one(objs, "Deployment", "gpu-tailor-scheduler"))["containers"]
            if c["name"] == "kube-scheduler"]
    image: str = c["image"]
    return image


@pytest.mark.parametrize(("cluster", "tag"), [
    ("v1.28.7", "v1.28.7"),
    ("v1.36.3", "v1.36.3"),
    ("v1.30.2-eks-abc", "v1.30.2"),          # EKS
    ("v1.31.4-gke.1372000", "v1.31.4"),      # GKE
    ("v1.28.7+k3s1", "v1.28.7"),             # k3s
    ("v1.32.1+rke2r1", "v1.32.1"),           # RKE2
    ("v1.36.0-rc.1", "v1.36.0-rc.1"),        # Kubernetes' own pre-release: registry.k8s.io tags it so
])
def test_kube_scheduler_follows_the_clusters_version(cluster: str, tag: str) -> None:
    assert kube_scheduler_image("--kube-version", cluster) == f"registry.k8s.io/kube-scheduler:{tag}"


def test_an_explicit_kube_scheduler_tag_wins() -> None:
    assert kube_scheduler_image("--kube-version", "v1.30.2-eks-abc", "--set", "scheduler.image.tag=v1.30.9",
                                "--set", "scheduler.image.repository=mirror.example/kube-scheduler") == \
        "mirror.example/kube-scheduler:v1.30.9"


@pytest.mark.parametrize("cluster", ["v1.27.16", "v1.37.0", "v1.37.0-alpha.1"])
def test_a_cluster_outside_the_supported_range_is_refused(cluster: str, tmp_path: Path) -> None:
    chart_range = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    assert chart_range == ">=1.28.0-0 <1.37.0-0"
    # installed itself: Helm checks Chart.yaml's kubeVersion before anything renders
    out = template("gpu-tailor", "--kube-version", cluster, check=False)
    assert out.returncode != 0 and chart_range in out.stderr and cluster in out.stderr, out.stderr
    # as a subchart, where Helm checks no kubeVersion: the kube-scheduler image's tag refuses it, naming the range
    umbrella = tmp_path / "platform"
    (umbrella / "charts").mkdir(parents=True)
    (umbrella / "Chart.yaml").write_text(yaml.safe_dump({"apiVersion": "v2", "name": "platform", "version": "1.0.0"}))
    shutil.copytree(CHART, umbrella / "charts" / "gpu-tailor")
    out = template("gpu-tailor", "--kube-version", cluster, chart=umbrella, check=False)
    assert out.returncode != 0, out.stdout
    assert f"gpu-tailor supports Kubernetes {chart_range} and this cluster is {cluster}" in out.stderr, out.stderr
    assert "scheduler.image.tag" in out.stderr
    ok = template("gpu-tailor", "--kube-version", cluster, "--set", "gpu-tailor.scheduler.image.tag=v1.36.3",
                  chart=umbrella, check=False)
    assert ok.returncode == 0, ok.stderr


def test_the_crd_is_installed_before_the_templates_and_carries_gpu_tailors_labels() -> None:
    """In crds/: Helm applies it first (the webhook configuration's reports entry and the extender's watch name it),
    on every install, agent or not."""
    without_agent = [d for d in yaml.safe_load_all(template("gpus", "--include-crds", "--set", "agent.enabled=false")
                                                   .stdout) if d]
    crd = one(without_agent, "CustomResourceDefinition")
    assert crd["metadata"]["labels"] == {"app.kubernetes.io/name": "gpu-tailor", "app.kubernetes.io/component": "agent"}
    assert not [o for o in rendered("gpus") if o["kind"] == "CustomResourceDefinition"]  # not among the templates
