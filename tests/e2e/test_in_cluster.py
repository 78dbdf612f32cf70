"""gpu-tailor installed as a platform team installs it, every part a pod of a real node: the webhook,
gpu-tailor-scheduler (the release's own kube-scheduler beside the extender) and the node agent, from their images,
started, probed and restarted by a real kubelet (``tests/e2e/realnode.py``). Their GPU pods then run on the same
node's time-sliced T4s, and each gets the GPU its record names.

A control plane of its own, and one real node that sells four T4s four ways each. Only what this machine lacks is
changed in what ``manifests/`` renders: every gpu-tailor pod uses the host's network (no pod network or Service
routing here), reaches the API server on the host's loopback, and listens on free ports; the API server calls the
webhook at the node's address (``clientConfig.url``, the serving certificate naming that address); one replica each
(two pods on one host network would want the same ports)."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import yaml

from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.occupancy import parse_gpu_annotation
from tests.conftest import free_port
from tests.e2e import images, realnode
from tests.e2e.cluster import OPTED_IN, ControlPlane, Release, create_namespace, render, write_overlay
from tests.e2e.kube import ApiError, Kube, Obj, api_path, load_kubeconfig, wait_for
from tests.e2e.pods import unique
from tests.e2e.realnode import MockGpus, RealNode, mock_profile, real_node, real_pod
from tests.e2e.services import SCHEDULER_NAME, replace_flag

pytestmark = pytest.mark.e2e

NODE = "gpu-0"
NAMESPACE = "gpu-tailor"
WEBHOOK, SCHEDULER, AGENT = "gpu-tailor-webhook", "gpu-tailor-scheduler", "gpu-tailor-agent"


@dataclass
class Ports:
    webhook: int
    extender: int
    metrics: int
    scheduler: int


@dataclass
class InCluster:
    cp: ControlPlane
    kube: Kube
    node: RealNode
    ip: str
    ports: Ports

    def context(self) -> str:
        return self.node.context() + "\n" + "\n".join(
            f"{p['metadata']['name']}: {p.get('status', {}).get('phase')} "
            f"{[(c['name'], c.get('ready'), c.get('restartCount'), c.get('state')) for c in statuses(p)]}"
            for p in self.kube.list(api_path("pods", NAMESPACE)))

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://{self.ip}:{self.ports.metrics}/metrics", timeout=10) as resp:
            return str(resp.read().decode())


def statuses(pod: Obj) -> list[Obj]:
    return list((pod.get("status") or {}).get("containerStatuses") or [])


def _container(deployment: Obj, name: str) -> Obj:
    found: Obj = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name)
    return found


def _on_host_network(deployment: Obj, api_port: int) -> None:
    """One replica on the host's network, reaching the API server where this machine serves it."""
    deployment["spec"]["replicas"] = 1
    spec = deployment["spec"]["template"]["spec"]
    spec["hostNetwork"] = True
    for c in spec["containers"]:
        c["env"] = [*(c.get("env") or []), {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                    {"name": "KUBERNETES_SERVICE_PORT", "value": str(api_port)}]


def _set_port(container: Obj, name: str, port: int) -> None:
    for p in container.get("ports") or []:
        if p["name"] == name:
            p["containerPort"] = port


def in_cluster_objects(docs: list[Obj], cp: ControlPlane, ip: str, ports: Ports, scheduler_image: str) -> list[Obj]:
    """What ``manifests/`` renders (through ``write_overlay``: the webhook's URL and the agent's patch), changed for a
    single host network as the module says."""
    out = []
    for doc in docs:
        kind, name = doc["kind"], doc["metadata"]["name"]
        if kind == "Deployment" and name == WEBHOOK:
            _on_host_network(doc, cp.api_port)
            hook = _container(doc, "webhook")
            hook["args"] = [*replace_flag(hook["args"], "--listen", f"0.0.0.0:{ports.webhook}"), "--ip", ip]
            _set_port(hook, "https", ports.webhook)
        elif kind == "Deployment" and name == SCHEDULER:
            _on_host_network(doc, cp.api_port)
            sched = _container(doc, "kube-scheduler")
            sched["image"] = scheduler_image
            sched["command"] = [*sched["command"], f"--secure-port={ports.scheduler}"]
            sched["readinessProbe"]["httpGet"]["port"] = ports.scheduler
            sched["livenessProbe"]["httpGet"]["port"] = ports.metrics
            ext = _container(doc, "extender")
            args = replace_flag(ext["args"], "--listen", f"127.0.0.1:{ports.extender}")
            args = replace_flag(args, "--metrics-listen", f"0.0.0.0:{ports.metrics}")
            ext["args"] = replace_flag(args, "--scheduler-healthz", f"https://127.0.0.1:{ports.scheduler}/healthz")
            _set_port(ext, "metrics", ports.metrics)
        elif kind == "ConfigMap" and name == SCHEDULER:
            config = yaml.safe_load(doc["data"]["config.yaml"])
            for ext in config["extenders"]:
                ext["urlPrefix"] = f"http://127.0.0.1:{ports.extender}"
            doc["data"]["config.yaml"] = yaml.safe_dump(config, sort_keys=False)
        out.append(doc)
    return out


def node_ip(kube: Kube, name: str) -> str:
    addresses = kube.get(api_path("nodes", name=name))["status"].get("addresses") or []
    found = [a["address"] for a in addresses if a["type"] == "InternalIP"]
    assert found, f"node {name} reports no InternalIP: {addresses}"
    return str(found[0])


def ready_pods(kube: Kube, app: str) -> list[Obj]:
    component = app.removeprefix("gpu-tailor-")
    pods = kube.list(api_path("pods", NAMESPACE),
                     label_selector=f"app.kubernetes.io/name=gpu-tailor,app.kubernetes.io/component={component}")
    return [p for p in pods if not p["metadata"].get("deletionTimestamp") and statuses(p)
            and all(c.get("ready") for c in statuses(p))]


@pytest.fixture(scope="module")
def cluster(release: Release, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InCluster]:
    lacking = realnode.missing(release)
    if lacking:
        pytest.skip(f"no real GPU node on this machine: it lacks {'; '.join(lacking)}")
    work = tmp_path_factory.mktemp(f"in-cluster-{release.version}")
    scheduler_image, scheduler_archive = images.kube_scheduler(release.bin / "kube-scheduler", release.version)
    cp = ControlPlane(release, work / "k8s")
    try:
        cp.up()
        kube = Kube(load_kubeconfig(cp.kubeconfig), work / "admin")
        with real_node(NODE, cp, kube, release, work / "nodes", labels={realnode.AGENT_LABEL: "on"}) as node:
            node.ctr("images", "import", str(scheduler_archive))
            node.start_nvidia(MockGpus(mock_profile("t4"), replicas=4))
            ip = node_ip(kube, NODE)
            ports = Ports(free_port(), free_port(), free_port(), free_port())
            overlay = work / "overlay"
            write_overlay(overlay, f"https://{ip}:{ports.webhook}/mutate", realnode.agent_patch(cp))
            objects = in_cluster_objects(render(cp, overlay).docs, cp, ip, ports, scheduler_image)
            (work / "installed.yaml").write_text(yaml.safe_dump_all(objects, sort_keys=False))
            cp.kubectl("apply", "-f", str(work / "installed.yaml"))
            create_namespace(kube, OPTED_IN, {"gpu-tailor.io/enabled": "true"})
            yield InCluster(cp, kube, node, ip, ports)
    finally:
        cp.down()


def wait_installed(c: InCluster) -> dict[str, Obj]:
    """Each component's pod Ready (the kubelet's readiness probes pass); returned by app."""
    def ready() -> dict[str, Obj] | None:
        found = {app: ready_pods(c.kube, app) for app in (WEBHOOK, SCHEDULER, AGENT)}
        return {app: pods[0] for app, pods in found.items()} if all(len(p) == 1 for p in found.values()) else None

    pods = wait_for(ready, 180, "gpu-tailor's pods Ready on the real node", interval=0.5, context=c.context)
    assert pods is not None
    return pods


def place_quarters(c: InCluster, count: int) -> list[Obj]:
    """``count`` quarter-GPU pods, created at once; each admitted, bound by gpu-tailor-scheduler and Running."""
    names = [unique("quarter") for _ in range(count)]
    for n in names:
        c.kube.create(api_path("pods", OPTED_IN), real_pod(n, {labels.GPU_MILLI: "250"}, "T4"))

    placed = []
    for n in names:
        pod = realnode.running(c.kube, OPTED_IN, n, timeout=120, context=c.context)
        assert pod["spec"]["schedulerName"] == SCHEDULER_NAME and pod["spec"]["nodeName"] == NODE
        assert pod["metadata"]["annotations"][labels.ANN_BACKING] == "shared:time-slicing:4", pod["metadata"]
        placed.append(pod)
    return placed


def check_records(c: InCluster, pods: list[Obj]) -> None:
    """The GPU each pod's record names (or the set it names) holds what the kubelet gave it; the agent's report says
    the same, and the extender counts no contradicted prediction."""
    pods = realnode.recorded(c.kube, pods, c.metrics, context=c.context)
    given = c.node.allocated()
    for pod in pods:
        key = f"{OPTED_IN}/{pod['metadata']['name']}"
        notes = pod["metadata"]["annotations"]
        recorded = parse_gpu_annotation(str(notes.get(labels.ANN_GPUS, "")))
        among = parse_gpu_annotation(str(notes.get(labels.ANN_GPUS_AMONG, ""))) or recorded
        assert recorded and given.get(key), f"{key}: recorded {recorded}, given {given.get(key)}"
        assert set(given[key]) <= set(among or ()), f"{key}: the kubelet gave {given[key]}, recorded {notes}"
    report = api_path("nodegpureports", name=NODE, group="gpu-tailor.io/v1alpha1")
    wait_for(lambda: c.kube.exists(report) and realnode.held_by_pod(c.kube.get(report)) == given, 60,
             "the agent's report naming what each pod holds", interval=0.5, context=c.context)
    realnode.wait_report_held(c.kube, NODE, c.metrics, context=c.context)
    found = realnode.sample(c.metrics(), "gpu_tailor_agent_contradictions_total")
    assert found is not None and found == 0, found


def delete_pods(c: InCluster, pods: list[Obj]) -> None:
    names = [p["metadata"]["name"] for p in pods]
    for n in names:
        c.kube.delete(api_path("pods", OPTED_IN, n), grace_seconds=2)
    wait_for(lambda: not any(c.kube.exists(api_path("pods", OPTED_IN, n)) for n in names), 90,
             f"pods {names} gone", interval=0.2, context=c.context)


def restarts(c: InCluster) -> dict[str, int]:
    return {f"{p['metadata']['name']}/{s['name']}": int(s.get("restartCount") or 0)
            for p in c.kube.list(api_path("pods", NAMESPACE)) for s in statuses(p)}


def test_gpu_tailor_runs_as_pods_of_a_real_node_and_places_their_gpus(cluster: InCluster) -> None:
    c = cluster
    pods = wait_installed(c)
    # the webhook made its own serving certificate (naming the node's address) and put its CA in every entry
    config = c.kube.get(api_path("mutatingwebhookconfigurations", name="gpu-tailor",
                                 group="admissionregistration.k8s.io/v1"))
    assert all(h["clientConfig"].get("caBundle") for h in config["webhooks"]), config["webhooks"]
    lease = wait_for(lambda: c.kube.get(api_path("leases", NAMESPACE, SCHEDULER, group="coordination.k8s.io/v1"))
                     ["spec"].get("holderIdentity"), 60, "gpu-tailor-scheduler to hold its Lease", interval=0.5,
                     context=c.context)
    assert lease

    # a burst of quarter GPUs, admitted by the webhook pod, placed by the gpu-tailor-scheduler pod, run by the kubelet
    first = place_quarters(c, 8)
    check_records(c, first)
    # a pod of an opted-in namespace that asks for no GPU goes to gpu-tailor-scheduler too, and runs
    cpu = unique("cpu-only")
    c.kube.create(api_path("pods", OPTED_IN), {**real_pod(cpu, {}, "T4"), "metadata": {"name": cpu}})
    placed = wait_for(lambda: (c.kube.get(api_path("pods", OPTED_IN, cpu)).get("status") or {}).get("phase")
                      == "Running", 90, f"{cpu} Running", interval=0.2, context=c.context)
    assert placed and c.kube.get(api_path("pods", OPTED_IN, cpu))["spec"]["schedulerName"] == SCHEDULER_NAME

    # the PodDisruptionBudget holds: the one webhook pod cannot be evicted
    webhook = pods[WEBHOOK]["metadata"]["name"]
    pdb = api_path("poddisruptionbudgets", NAMESPACE, WEBHOOK, group="policy/v1")
    wait_for(lambda: (c.kube.get(pdb).get("status") or {}).get("currentHealthy") == 1, 60,
             "the disruption controller counting the webhook pod healthy", interval=0.5)
    with pytest.raises(ApiError) as refused:
        c.kube.create(api_path("pods", NAMESPACE, webhook, subresource="eviction"), {
            "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": webhook, "namespace": NAMESPACE}})
    assert refused.value.status == 429, refused.value

    # gpu-tailor-scheduler's pod deleted: its Deployment's next pod rebuilds the picture from the API, and the next
    # pods' records hold what the kubelet gives them beside the first eight
    old = pods[SCHEDULER]["metadata"]["name"]
    c.kube.delete(api_path("pods", NAMESPACE, old))
    wait_for(lambda: [p for p in ready_pods(c.kube, SCHEDULER) if p["metadata"]["name"] != old], 180,
             "a new gpu-tailor-scheduler pod Ready", interval=0.5, context=c.context)
    second = place_quarters(c, 4)
    check_records(c, [*first, *second])

    # no probe failed along the way: nothing was restarted by the kubelet
    assert not {k: v for k, v in restarts(c).items() if v}, restarts(c)
    delete_pods(c, [*first, *second, c.kube.get(api_path("pods", OPTED_IN, cpu))])

