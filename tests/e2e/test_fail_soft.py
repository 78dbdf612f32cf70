"""gpu-tailor fails soft on a real control plane (issue 31): the webhook keeps admitting when it loses the API
server after its first sync; the extender's metrics are scraped from the pod IP; a leader whose extender loses the
API server gives the Lease up, so the standby replica binds the pods.

The webhook down altogether (a CPU-only pod created, a GPU pod refused) is
``test_restarts.test_webhook_down_refuses_gpu_asks_lets_cpu_pods_through_and_recovers``.
"""

from __future__ import annotations

import re
import ssl
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import free_port
from tests.e2e.apiproxy import ApiProxy
from tests.e2e.cluster import scheduler_config
from tests.e2e.kube import load_kubeconfig, wait_for
from tests.e2e.pods import Pods, gpu_pod, unique
from tests.e2e.services import POD_IP, Service, Stack, extender_argv, probe, replace_flag

pytestmark = pytest.mark.e2e

HGX = "h100-hgx-0"
UNHEALTHY_AFTER = 30  # --unhealthy-after for the leader's extender
# the kubelet's liveness probe of kube-scheduler, as manifests/scheduler has it but faster: every PERIOD s,
# restarted after THRESHOLD failures in a row (the manifest: 10 s x 3)
PERIOD, THRESHOLD = 1.0, 3


def proxied_kubeconfig(cluster: Stack, service: Service, proxy: ApiProxy, name: str) -> Path:
    """``service``'s kubeconfig, but for the API server behind ``proxy``."""
    own = Path(service.argv[service.argv.index("--kubeconfig") + 1])
    kubeconfig = yaml.safe_load(own.read_text())
    kubeconfig["clusters"][0]["cluster"]["server"] = proxy.server
    path = cluster.workdir / f"{name}.kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))
    path.chmod(0o600)
    return path


def new_proxy(cluster: Stack) -> ApiProxy:
    admin = load_kubeconfig(cluster.cp.kubeconfig)
    proxy = ApiProxy(admin.server, admin.ca_pem, cluster.cp.pki / "apiserver.crt", cluster.cp.pki / "apiserver.key")
    proxy.start()
    return proxy


WINDOW = 10  # the webhook's --watch-window here: stale after 2 x (10 + 15) = 50 s without news (60: 150 s)


def staleness(metrics_url: str) -> float:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # as Prometheus with insecure_skip_verify: no
    with urllib.request.urlopen(metrics_url, timeout=3, context=ctx) as resp:  # client certificate either
        text = resp.read().decode()
    ages = dict(re.findall(r'^gpu_tailor_webhook_watch_staleness_seconds\{resource="(\w+)"\} (\S+)$', text, re.M))
    assert {"nodes", "pods"} <= set(ages), text[-2000:]  # and DRA's three kinds where resource.k8s.io/v1 is served
    return max(float(a) for a in ages.values())


def test_the_webhook_keeps_admitting_after_it_loses_the_api_server(cluster: Stack, pods: Pods) -> None:
    """After its first sync the webhook's API server goes away for longer than the freshness window: it stays
    ready and answers; a CPU-only pod is routed to gpu-tailor-scheduler (so the webhook answered, it did not
    fail open) and a GPU pod is rewritten, with a warning that says how old the webhook's view is."""
    proxy = new_proxy(cluster)
    proxy_up = True
    argv = replace_flag(cluster.webhook.argv, "--kubeconfig",
                        str(proxied_kubeconfig(cluster, cluster.webhook, proxy, "webhook-through-proxy")))
    webhook = Service("gpu-tailor webhook (through apiproxy)", [*argv, "--watch-window", str(WINDOW)],
                      cluster.workdir / "logs" / "webhook-proxied.log", cluster.webhook.ready_url)
    metrics = cluster.webhook.ready_url.replace("/readyz", "/metrics")
    cluster.webhook.kill()
    try:
        webhook.start()  # on the stack's port: the API server calls this one now
        cluster.wait_admission_works()
        proxy.stop()
        proxy_up = False
        wait_for(lambda: staleness(metrics) > 2 * (WINDOW + 15), 2 * (WINDOW + 15) + 60,
                 "the webhook's view to go stale", interval=1, context=webhook.tail)
        assert probe(cluster.webhook.ready_url) == 200

        ns = cluster.opted_in
        cpu = pods.create(ns, gpu_pod(unique("stale-cpu"), {"cpu": "100m"}))
        assert pods.get(cpu)["spec"]["schedulerName"] == "gpu-tailor-scheduler"  # answered, not failed open
        assert not any("API server" in w for w in cluster.kube.warnings), cluster.kube.warnings
        gpu = pods.create(ns, gpu_pod(unique("stale-gpu"), {"gpu-tailor.io/gpu-milli": "250"}))
        warnings = list(cluster.kube.warnings)
        stored = pods.get(gpu)
        assert "gpu-tailor.io/gpu-milli" not in stored["spec"]["containers"][0]["resources"]["limits"]
        assert any("has not heard from the API server for" in w for w in warnings), warnings
        assert "no news from the API server" in webhook.tail(200)
    finally:
        webhook.kill()
        if proxy_up:
            proxy.stop()
        cluster.webhook.start()


def test_the_extenders_metrics_are_scraped_from_the_pod_ip_and_its_verbs_are_not_there(
        cluster: Stack, pods: Pods) -> None:
    pods.wait_bound(pods.create(cluster.opted_in, gpu_pod(unique("scraped"), {"nvidia.com/gpu": "1"}, node=HGX)))
    with urllib.request.urlopen(f"{cluster.extender_probes}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
    served = [line for line in text.splitlines() if line.startswith("gpu_tailor_extender_")]
    assert any('verb="filter"' in line for line in served), served[:20]  # what kube-scheduler just called
    assert 'gpu_tailor_extender_watch_staleness_seconds{resource="pods"}' in text
    assert cluster.extender_probes.startswith(f"http://{POD_IP}:")
    for path in ("/healthz", "/readyz", "/livez"):
        assert probe(f"{cluster.extender_probes}{path}") == 200, path
    request = urllib.request.Request(f"{cluster.extender_probes}/filter", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    refused.value.close()
    assert refused.value.code == 404  # the verbs stay on loopback


class Kubelet:
    """A kubelet's liveness probe of one container: GET ``url`` every PERIOD seconds; after THRESHOLD failures
    in a row, stop the container (SIGTERM, as the kubelet does) and record when."""

    def __init__(self, url: str, container: Service) -> None:
        self.url, self.container = url, container
        self.killed_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kubelet", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        failures = 0
        while not self._stop.wait(PERIOD):
            failures = 0 if probe(self.url) == 200 else failures + 1
            if failures >= THRESHOLD:
                self.container.stop()
                self.killed_at = time.monotonic()
                return


def test_a_leader_whose_extender_loses_the_api_server_hands_the_lease_to_the_standby(
        cluster: Stack, pods: Pods) -> None:
    """The stack's pair is the standby here; the leader is a second pair whose extender reaches the API server
    through a proxy, which is then shut. Its /healthz must fail within a minute; its kube-scheduler's liveness
    probe (the extender's /livez) then fails, the kubelet restarts it, and the standby takes the Lease and binds
    the pods that arrived meanwhile."""
    proxy = new_proxy(cluster)
    proxy_up = True
    sched_kc = Path(cluster.extender.argv[cluster.extender.argv.index("--kubeconfig") + 1])
    proxied_kc = proxied_kubeconfig(cluster, cluster.extender, proxy, "leader-extender-through-proxy")

    ext_port, probes_port, sched_port = free_port(), free_port(), free_port()
    probes = f"http://{POD_IP}:{probes_port}"
    logs = cluster.workdir / "logs"
    extender = Service("leader's extender (through apiproxy)",
                       replace_flag(extender_argv(cluster.rendered, f"127.0.0.1:{ext_port}", probes_port, sched_port,
                                                  proxied_kc), "--unhealthy-after", str(UNHEALTHY_AFTER)),
                       logs / "extender-leader.log", f"{probes}/readyz")
    config = cluster.workdir / "leader-scheduler-config.yaml"
    config.write_text(yaml.safe_dump(scheduler_config(cluster.rendered, ext_port, sched_kc), sort_keys=False))
    argv = replace_flag(replace_flag(cluster.scheduler.argv, "--config", str(config)), "--secure-port", str(sched_port))
    scheduler = Service("leader's kube-scheduler", argv, logs / "kube-scheduler-leader.log",
                        f"https://127.0.0.1:{sched_port}/healthz")
    kubelet = Kubelet(f"{probes}/livez", scheduler)
    context = lambda: f"{extender.tail()}\n{scheduler.tail()}\n{cluster.context()}"  # noqa: E731
    leader = ""
    try:
        before = cluster.lease_holder()
        cluster.scheduler.stop()
        extender.start()
        scheduler.start()
        leader = wait_for(lambda: h if (h := cluster.lease_holder()) != before else "", 60,
                          "the second pair to take the Lease", context=context)
        cluster.scheduler.start()  # the standby, whose extender reaches the API server directly
        assert cluster.lease_holder() == leader
        kubelet.start()

        cut = time.monotonic()
        proxy.stop()  # the leader's extender has lost the API server: every list, watch and Binding refused
        proxy_up = False
        created = [pods.create(cluster.opted_in, gpu_pod(unique(f"failover-{i}"), {"nvidia.com/gpu": "1"}, node=HGX))
                   for i in range(4)]
        unhealthy = wait_for(lambda: time.monotonic() if probe(f"{probes}/healthz") == 503 else 0.0, 90,
                             "the leader's extender to answer /healthz 503", interval=0.5, context=context)
        assert unhealthy - cut <= 60, f"/healthz failed {unhealthy - cut:.0f}s after the API server was lost"
        killed = wait_for(lambda: kubelet.killed_at or 0.0, 60, "the kubelet to restart the leader's kube-scheduler",
                          context=context)
        took_over = wait_for(lambda: time.monotonic() if cluster.lease_holder() not in ("", leader) else 0.0, 60,
                             "the standby to take the Lease", interval=0.2, context=context)
        for pod in created:
            pods.wait_bound(pod, timeout=120)
        bound = time.monotonic()
        timings = (f"API server lost -> /healthz 503 {unhealthy - cut:.1f}s -> kube-scheduler restarted "
                   f"{killed - cut:.1f}s -> standby holds the Lease {took_over - cut:.1f}s -> 4 pods bound "
                   f"{bound - cut:.1f}s")
        print(timings)
        assert bound - cut <= 120, timings
    finally:
        kubelet.stop()
        scheduler.stop()
        extender.kill()
        if proxy_up:
            proxy.stop()
        if not cluster.scheduler.alive:
            cluster.scheduler.start()
        wait_for(lambda: cluster.lease_holder() not in ("", leader), 60, "the stack's scheduler to hold the Lease",
                 context=cluster.context)
