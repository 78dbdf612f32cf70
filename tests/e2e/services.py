"""gpu-tailor's webhook and extender, and a second kube-scheduler, run as processes against the control plane
with the arguments and configuration that ``manifests/`` gives their containers.

Only what differs between a pod and a process on the test machine is changed: the in-cluster identity
becomes a kubeconfig holding a token of the same ServiceAccount, listen addresses become free loopback
ports, and the webhook's certificate also names 127.0.0.1 (``webhook_tls_args``). Each service can be
killed and started again.
"""

from __future__ import annotations

import re
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

from tests.conftest import free_port
from tests.e2e.cluster import (
    OPTED_IN,
    PLAIN,
    REPO,
    ControlPlane,
    Release,
    Rendered,
    create_namespace,
    fixture_nodes,
    install_node,
    log_tail,
    render,
    scheduler_config,
    service_account_kubeconfig,
    write_overlay,
)
from tests.e2e.kube import ApiError, Kube, Obj, api_path, load_kubeconfig, wait_for

GPU_TAILOR = [sys.executable, "-m", "gpu_tailor"]
SCHEDULER_NAME = "gpu-tailor-scheduler"


def probe(url: str, timeout: float = 3) -> int:
    """What a kubelet's httpGet probe of ``url`` gets: the HTTP status (TLS not verified, as the kubelet does
    not), 0 when nothing answers (refused, reset, timed out)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=ctx) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        exc.close()  # an HTTPError is the response: its socket too
        return int(exc.code)
    except OSError:
        return 0


class Service:
    """One process, its log file (kept across restarts) and the URL that says it is ready."""

    def __init__(self, name: str, argv: list[str], log: Path, ready_url: str, ready_timeout: float = 60) -> None:
        self.name, self.argv, self.log, self.ready_url, self.ready_timeout = name, argv, log, ready_url, ready_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self._out: IO[bytes] | None = None
        self.starts = 0

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        assert not self.alive, f"{self.name} is already running"
        if self._out is not None:  # it exited by itself (e.g. after SIGTERM): close the last run's log
            self._out.close()
        self.starts += 1
        self._out = self.log.open("ab")
        self._out.write(f"\n===== start #{self.starts}: {' '.join(self.argv)}\n".encode())
        self._out.flush()
        self.proc = subprocess.Popen(self.argv, stdout=self._out, stderr=subprocess.STDOUT, cwd=REPO,
                                     start_new_session=True)
        wait_for(self._ready, self.ready_timeout, f"{self.name} ready at {self.ready_url}", interval=0.2,
                 context=self.tail)

    def _ready(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            code = self.proc.returncode if self.proc else None
            raise AssertionError(f"{self.name} exited with code {code} before it was ready\n{self.tail()}")
        return probe(self.ready_url, timeout=2) == 200  # refused while starting, or 503 until synced

    def ready(self) -> bool:
        """Running and answering its ready URL with 200."""
        return self.alive and self._ready()

    def kill(self) -> None:
        """SIGKILL: a crash, no chance to clean up."""
        self._end(signal.SIGKILL)

    def stop(self) -> None:
        self._end(signal.SIGTERM)

    def restart(self) -> None:
        self.kill()
        self.start()

    def send(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def _end(self, sig: signal.Signals) -> None:
        self.send(sig)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if self._out is not None:
            self._out.close()
            self._out = None

    def tail(self, lines: int = 30) -> str:
        return log_tail(self.name, self.log, lines)


def extender_metric(extender: Service, name: str, **labels: str) -> float | None:
    """The extender's ``/metrics`` sample of ``name`` with these labels (others may be there too), None when absent."""
    url = extender.ready_url.rsplit("/", 1)[0] + "/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        metric, _, rest = series.partition("{")
        if metric == name and labels.items() <= dict(re.findall(r'(\w+)="([^"]*)"', rest)).items():
            return float(value)
    return None


def records_pending(extender: Service) -> float:
    """Pods kube-scheduler bound whose records the extender has not written yet."""
    value = extender_metric(extender, "gpu_tailor_extender_records_pending")
    assert value is not None, "the extender exports no gpu_tailor_extender_records_pending"
    return value


@dataclass
class Stack:
    """The control plane with gpu-tailor installed from manifests/ and its three processes running."""

    cp: ControlPlane
    kube: Kube
    rendered: Rendered
    webhook: Service
    extender: Service
    scheduler: Service
    overlay: Path
    workdir: Path
    extender_probes: str = ""  # http://POD_IP:PORT of the extender's --metrics-listen (POD_IP: 127.0.0.2 here)
    opted_in: str = OPTED_IN
    plain: str = PLAIN

    @property
    def services(self) -> list[Service]:
        return [self.webhook, self.extender, self.scheduler]

    def context(self) -> str:
        """What a person needs when a test fails: the service logs and where the control plane's are."""
        tails = "\n".join(s.tail() for s in self.services)
        return f"{tails}\ncontrol plane logs (etcd, kube-apiserver, kube-scheduler, kcm): {self.cp.logs}"

    def stop(self) -> None:
        for s in self.services:  # all drain at once
            s.send(signal.SIGTERM)
        for s in self.services:
            s.stop()

    def wait_admission_works(self, timeout: float = 30) -> None:
        """Until the API server calls the webhook and uses its answer: a dry-run create in the opted-in
        namespace comes back with the portable ask rewritten."""
        probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "admission-probe"},
                 "spec": {"containers": [{"name": "main", "image": "busybox", "resources": {
                     "limits": {"gpu-tailor.io/gpu-milli": "250"}}}]}}

        def rewritten() -> bool:
            try:
                pod = self.kube.create(api_path("pods", self.opted_in), probe, dry_run=True)
            except ApiError:
                return False
            return "gpu-tailor.io/gpu-milli" not in pod["spec"]["containers"][0]["resources"]["limits"]

        wait_for(rewritten, timeout, "the API server to call the webhook (dry-run create rewritten)",
                 interval=0.2, context=self.context)

    def wait_records(self, timeout: float = 60) -> bool:
        """Until the stack's extender has written the GPUs of every pod it scored (kube-scheduler binds; the records
        follow the bind); False, at once, where its extender is not running."""
        extender = self.extender
        if not extender.alive:
            return False
        wait_for(lambda: records_pending(extender) == 0, timeout, "the extender to write the records", interval=0.1,
                 context=extender.tail)
        return True

    def lease_holder(self) -> str:
        """Who holds the Lease that manifests/scheduler's leaderElection names."""
        config = yaml.safe_load(self.rendered.get("ConfigMap", "gpu-tailor-scheduler")["data"]["config.yaml"])
        election = config["leaderElection"]
        lease = self.kube.get(api_path("leases", election["resourceNamespace"], election["resourceName"],
                                       group="coordination.k8s.io/v1"))
        holder: str = lease["spec"].get("holderIdentity") or ""
        return holder


def _replace(argv: list[str], flag: str, new: list[str], takes_value: bool = True) -> list[str]:
    """``flag VALUE``, ``flag=VALUE`` or a bare ``flag`` replaced by ``new``; it must be there."""
    for i, arg in enumerate(argv):
        if arg.startswith(flag + "="):
            return [*argv[:i], *new, *argv[i + 1:]]
        if arg == flag:
            return [*argv[:i], *new, *argv[i + 2 if takes_value else i + 1:]]
    raise AssertionError(f"{flag} not in the rendered arguments {argv}")


def replace_flag(argv: list[str], flag: str, value: str) -> list[str]:
    """``argv`` with ``flag VALUE`` (or ``flag=VALUE``) given another value; the flag must be there."""
    return _replace(argv, flag, [flag, value])


def webhook_tls_args(argv: list[str]) -> list[str]:
    """The one place that knows how the webhook gets a certificate the API server trusts here. The API server
    dials https://127.0.0.1:<port>/mutate (the overlay in cluster.py), so the certificate must name that
    IP. The webhook keeps its CA and certificate in a Secret (``--certs-secret``) and writes the CA into
    the caBundle itself; the test only asks for the extra IP SAN."""
    if not any(a == "--certs-secret" or a.startswith("--certs-secret=") for a in argv):
        raise AssertionError(f"the webhook Deployment's args have no --certs-secret; teach webhook_tls_args how "
                             f"this webhook gets its certificate: {argv}")
    # The one flag not in the manifests: the Secret and the caBundle are checked every second instead of
    # every minute, so a certificate renewed by another replica is adopted within a test's patience.
    return [*argv, "--ip", "127.0.0.1", "--certs-sync-interval", "1"]


POD_IP = "127.0.0.2"  # what stands for the pod IP: a loopback address other than the verbs' 127.0.0.1


def extender_argv(rendered: Rendered, listen: str, probes_port: int, scheduler_port: int,
                  kubeconfig: Path) -> list[str]:
    """The extender container's command: verbs on ``listen``, probes and metrics on POD_IP:``probes_port``,
    ``/livez`` asking the kube-scheduler on ``scheduler_port``."""
    argv = _gpu_tailor_argv(rendered, "gpu-tailor-scheduler", "extender", listen, kubeconfig)
    argv = replace_flag(argv, "--metrics-listen", f"{POD_IP}:{probes_port}")
    return replace_flag(argv, "--scheduler-healthz", f"https://127.0.0.1:{scheduler_port}/healthz")


def _gpu_tailor_argv(rendered: Rendered, deployment: str, container: str, listen: str, kubeconfig: Path) -> list[str]:
    argv = rendered.argv(deployment, container)
    if argv and Path(argv[0]).name == "gpu-tailor":  # the image's entrypoint, if the manifest names it
        argv = argv[1:]
    argv = _replace(argv, "--listen", ["--listen", listen])
    argv = _replace(argv, "--in-cluster", ["--kubeconfig", str(kubeconfig)], takes_value=False)
    return [*GPU_TAILOR, *argv]


def install(cp: ControlPlane, kube: Kube, workdir: Path, webhook_port: int, nodes: bool = True,
            agent: Callable[[ControlPlane], Obj] | None = None) -> Rendered:
    """manifests/ applied through the overlay that points the webhook at 127.0.0.1, the two namespaces
    and the fixture nodes (``nodes``): what every run on the control plane starts from. ``agent``: the agent
    DaemonSet's patch for ``cp`` (see ``write_overlay``)."""
    overlay = workdir / "overlay"
    write_overlay(overlay, f"https://127.0.0.1:{webhook_port}/mutate", agent(cp) if agent else None)
    cp.kubectl("apply", "-k", str(overlay))
    rendered = render(cp, overlay)
    create_namespace(kube, OPTED_IN, {"gpu-tailor.io/enabled": "true"})
    create_namespace(kube, PLAIN, {})
    for node in fixture_nodes() if nodes else ():
        install_node(kube, node)
    return rendered


def identity(cp: ControlPlane, kube: Kube, rendered: Rendered, deployment: str, workdir: Path) -> Path:
    """A kubeconfig holding a token of the ServiceAccount ``deployment``'s pods run as."""
    sa = rendered.service_account(deployment)
    return service_account_kubeconfig(kube, cp, "gpu-tailor", sa, workdir / f"{sa}.kubeconfig")


def webhook_argv(rendered: Rendered, port: int, kubeconfig: Path) -> list[str]:
    """The webhook Deployment's command, run on 127.0.0.1:``port`` under ``kubeconfig``."""
    return webhook_tls_args(_gpu_tailor_argv(rendered, "gpu-tailor-webhook", "webhook", f"127.0.0.1:{port}",
                                             kubeconfig))


Installer = Callable[[ControlPlane, Kube, Path, int], Rendered]


def start_stack(cp: ControlPlane, kube: Kube, workdir: Path, installer: Installer | None = None,
                admission_probe: bool = True, scheduler_flags: Sequence[str] = ()) -> Stack:
    """gpu-tailor on ``cp``: installed by ``installer`` (default ``install``, kustomize; ``tests/e2e/test_helm.py``
    installs the chart), its three processes started from what it rendered, admission working (``admission_probe``:
    checked with a dry-run create of a portable ask, which needs a node that sells GPUs). ``scheduler_flags``: more
    flags for gpu-tailor-scheduler's kube-scheduler (``--feature-gates=...``, as a cluster with alpha gates on passes
    them to every kube-scheduler)."""
    webhook_port, extender_port, scheduler_port, probes_port = free_port(), free_port(), free_port(), free_port()
    overlay = workdir / "overlay"
    rendered = (installer or install)(cp, kube, workdir, webhook_port)
    webhook_kc = identity(cp, kube, rendered, "gpu-tailor-webhook", workdir)
    scheduler_kc = identity(cp, kube, rendered, "gpu-tailor-scheduler", workdir)
    wh_argv = webhook_argv(rendered, webhook_port, webhook_kc)
    ext_argv = extender_argv(rendered, f"127.0.0.1:{extender_port}", probes_port, scheduler_port, scheduler_kc)
    config_path = workdir / "gpu-tailor-scheduler-config.yaml"
    config_path.write_text(yaml.safe_dump(scheduler_config(rendered, extender_port, scheduler_kc), sort_keys=False))
    sched_argv = rendered.argv("gpu-tailor-scheduler", "kube-scheduler")
    sched_argv = [str(cp.bin / "kube-scheduler"), *_replace(sched_argv[1:], "--config", [f"--config={config_path}"]),
                  f"--secure-port={scheduler_port}", "--bind-address=127.0.0.1",
                  f"--authentication-kubeconfig={scheduler_kc}", f"--authorization-kubeconfig={scheduler_kc}",
                  *scheduler_flags]

    logs = workdir / "logs"
    logs.mkdir(exist_ok=True)
    stack = Stack(cp, kube, rendered,
                  webhook=Service("gpu-tailor webhook", wh_argv, logs / "webhook.log",
                                  f"https://127.0.0.1:{webhook_port}/readyz"),
                  extender=Service("gpu-tailor extender", ext_argv, logs / "extender.log",
                                   f"http://127.0.0.1:{extender_port}/readyz"),
                  scheduler=Service("gpu-tailor-scheduler (kube-scheduler)", sched_argv, logs / "kube-scheduler.log",
                                    f"https://127.0.0.1:{scheduler_port}/healthz"),
                  overlay=overlay, workdir=workdir, extender_probes=f"http://{POD_IP}:{probes_port}")
    try:
        for service in stack.services:
            service.start()
        wait_for(stack.lease_holder, 60, "gpu-tailor-scheduler to hold its leader-election Lease",
                 interval=0.2, context=stack.context)
        if admission_probe:
            stack.wait_admission_works()
    except BaseException:
        stack.stop()
        raise
    return stack


def _config_path(scheduler: Service) -> Path:
    return Path(next(a for a in scheduler.argv if a.startswith("--config=")).split("=", 1)[1])


def scheduler_service(stack: Stack, name: str, config: dict[str, Any], port: int) -> Service:
    """Another kube-scheduler of the stack's profile: ``config`` (a KubeSchedulerConfiguration) on ``port``."""
    path = stack.workdir / f"{name}-config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    argv = replace_flag(_replace(stack.scheduler.argv, "--config", [f"--config={path}"]), "--secure-port", str(port))
    return Service(f"gpu-tailor-scheduler ({name})", argv, stack.workdir / "logs" / f"{name}.log",
                   f"https://127.0.0.1:{port}/healthz")


def replica(stack: Stack, name: str) -> tuple[Service, Service]:
    """A second gpu-tailor-scheduler pod: its own kube-scheduler (same profile and Lease) asking its own extender."""
    ext_port, probes_port, sched_port = free_port(), free_port(), free_port()
    argv = stack.extender.argv
    argv = replace_flag(replace_flag(argv, "--listen", f"127.0.0.1:{ext_port}"), "--metrics-listen",
                        f"{POD_IP}:{probes_port}")
    argv = replace_flag(argv, "--scheduler-healthz", f"https://127.0.0.1:{sched_port}/healthz")
    extender = Service(f"gpu-tailor extender ({name})", argv, stack.workdir / "logs" / f"extender-{name}.log",
                       f"http://127.0.0.1:{ext_port}/readyz")
    config = yaml.safe_load(_config_path(stack.scheduler).read_text())
    config["extenders"][0]["urlPrefix"] = f"http://127.0.0.1:{ext_port}"
    return scheduler_service(stack, name, config, sched_port), extender


@contextmanager
def extender_binding(stack: Stack) -> Iterator[None]:
    """The stack's kube-scheduler with the extender's ``bindVerb`` (the chart's ``scheduler.extender.bind``) for
    the length of the block, then as shipped again."""
    config = yaml.safe_load(_config_path(stack.scheduler).read_text())
    config["extenders"][0]["bindVerb"] = "bind"
    shipped, before = stack.scheduler, stack.lease_holder()
    binding = scheduler_service(stack, "extender-binds", config, free_port())
    shipped.stop()
    binding.start()
    stack.scheduler = binding
    try:
        wait_for(lambda: (h := stack.lease_holder()) and h != before, 60, "the binding kube-scheduler to lead",
                 context=binding.tail)
        yield
    finally:
        binding.stop()
        stack.scheduler = shipped
        took = stack.lease_holder()
        shipped.start()
        wait_for(lambda: (h := stack.lease_holder()) and h != took, 60, "the stack's kube-scheduler to lead again",
                 context=shipped.tail)


def pod_events(kube: Kube, pod: Obj) -> list[str]:
    """``reason: message`` of the events about a pod, as ``kubectl describe pod`` shows them."""
    meta = pod["metadata"]
    return [f"{e.get('reason')}: {e.get('message')}" for e in kube.events(meta["namespace"], "Pod", meta["name"])]


def event_sources(kube: Kube, pod: Obj, reason: str) -> list[str]:
    """Who reported the pod's events of ``reason`` (the From column of ``kubectl describe pod``)."""
    meta = pod["metadata"]
    return [str(e.get("reportingComponent") or (e.get("source") or {}).get("component"))
            for e in kube.events(meta["namespace"], "Pod", meta["name"]) if e.get("reason") == reason]



def failed_scheduling(kube: Kube, pod: Obj) -> list[str]:
    return [e for e in pod_events(kube, pod) if e.startswith("FailedScheduling: ")]


@contextmanager
def control_plane_with_gpu_tailor(release: Release, workdir: Path, installer: Installer | None = None,
                                  admission_probe: bool = True, env: dict[str, str] | None = None,
                                  scheduler_flags: Sequence[str] = ()) -> Iterator[Stack]:
    """A control plane of ``release`` in ``workdir`` with gpu-tailor installed by ``installer`` and running; both
    stopped on leaving. ``env``: more of control-plane.sh's settings (``K8S_FEATURE_GATES``, ``K8S_RUNTIME_CONFIG``);
    ``scheduler_flags``: see ``start_stack``."""
    cp = ControlPlane(release, workdir / "k8s")
    cp.env.update(env or {})
    try:
        cp.up()
        kube = Kube(load_kubeconfig(cp.kubeconfig), workdir / "admin")
        try:
            stack = start_stack(cp, kube, workdir, installer, admission_probe, scheduler_flags)
        except Exception as exc:
            exc.add_note(f"logs: control plane {cp.logs}, gpu-tailor {workdir / 'logs'}")
            raise
        try:
            yield stack
        finally:
            stack.stop()
    finally:
        cp.down()
