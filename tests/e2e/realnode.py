"""Real GPU nodes without GPUs: a kubelet of the control plane's release on containerd and runc, NVIDIA's device
plugin and gpu-feature-discovery on NVIDIA's mock NVML, and gpu-tailor's node agent, registered with a test's
control plane.

What runs, and where it is looked up (a test that needs a piece that is absent skips, naming it):

* ``kubelet``: beside the control plane's binaries (the release folder of ``cluster.find_releases``);
* ``containerd``, ``runc``, ``ctr`` and the CNI ``loopback`` plugin: Debian's packages (``containerd``, ``runc``,
  ``containernetworking-plugins``); ``busybox``, ``umoci``, ``skopeo`` for the images (``tests/e2e/images.py``);
* NVIDIA's pieces: ``$GPU_TAILOR_NVIDIA`` (default ``${XDG_CACHE_HOME:-~/.cache}/gpu-tailor-nvidia``), holding
  ``bin/nvidia-device-plugin``, ``bin/gpu-feature-discovery`` and ``bin/libnvidia-ml.so.1`` (the mock NVML),
  and the mock's GPU profiles under ``profiles/``.

Every node runs in a mount namespace of its own, because the device plugins' socket folder is fixed at
``/var/lib/kubelet/device-plugins``: a private folder is bound over ``/var/lib/kubelet`` (and ``/var/log/pods``)
there, so several kubelets run side by side. Each has its own cgroup root (``/gpu-tailor/NODE-APIPORT``; the kubelet
removes pod cgroups it does not know under its own root), its own ports, and a containerd of its own.

What mattered on this kind of machine: runc cannot lower ``oom_score_adj`` without ``CAP_SYS_RESOURCE``
(containerd's ``restrict_oom_score_adj``); cgroup v1 with the ``cgroupfs`` driver, swap on (``failSwapOn:
false``) and, from 1.35 on, ``failCgroupV1: false``; containerd's network is reported ready by a loopback-only
CNI configuration, and every pod of a real node runs with host networking (nothing is routed to a pod).
The node keeps the machine's address: nothing here calls a kubelet from the API server.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.occupancy import parse_gpu_annotation
from gpu_tailor.gpumodel.report import parse_time
from tests.conftest import free_port
from tests.e2e import images
from tests.e2e.cluster import ControlPlane, Release, log_tail
from tests.e2e.kube import Kube, Obj, api_path, wait_for

HOST_TOOLS = ("containerd", "ctr", "runc", "unshare", "nsenter")
AGENT = [sys.executable, "-m", "gpu_tailor", "agent"]
# the node's mock NVML (library, profile, runtime overrides), in the node's own /var/lib/kubelet: the agent's pods
# mount it from there, each node's its own
MOCK_NVML = "/var/lib/kubelet/mock-nvml"
AGENT_LABEL = "gpu-tailor.io/e2e-agent"  # the agent DaemonSet runs on the nodes a test labels so


def held_by_pod(report: Obj) -> dict[str, tuple[int, ...]]:
    """A NodeGPUReport's GPUs per pod (``namespace/name``), its containers' added up, sorted."""
    held: dict[str, list[int]] = {}
    for c in report["spec"].get("pods") or []:
        held.setdefault(f"{c['namespace']}/{c['name']}", []).extend(c["gpus"])
    return {k: tuple(sorted(v)) for k, v in held.items()}


def agent_patch(cp: ControlPlane) -> Obj:
    """The agent DaemonSet as on a GPU node, but for what this machine lacks: the pod reaches the API server on the
    host's loopback (host networking; no Service routing, no pod network here), NVML is the node's mock (NVIDIA's
    container toolkit would mount the driver's), and it runs on the nodes a test labels ``AGENT_LABEL``."""
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(cp.api_port),
           "LD_LIBRARY_PATH": MOCK_NVML, "MOCK_NVML_CONFIG": f"{MOCK_NVML}/config.yaml",
           "MOCK_NVML_OVERRIDES": f"{MOCK_NVML}/overrides.json"}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "gpu-tailor-agent", "namespace": "gpu-tailor"},
            "spec": {"template": {"spec": {
                "hostNetwork": True, "nodeSelector": {AGENT_LABEL: "on"},
                "containers": [{"name": "agent", "args": ["agent", "--in-cluster", "--interval", "1"],
                                "env": [{"name": k, "value": v} for k, v in env.items()],
                                "volumeMounts": [{"name": "mock-nvml", "mountPath": MOCK_NVML, "readOnly": True}]}],
                "volumes": [{"name": "mock-nvml", "hostPath": {"path": MOCK_NVML, "type": "Directory"}}]}}}}
CNI_DIRS = (Path("/usr/lib/cni"), Path("/opt/cni/bin"))
NVIDIA_BINARIES = ("nvidia-device-plugin", "gpu-feature-discovery", "libnvidia-ml.so.1")
DRA_DRIVER = "gpu-kubelet-plugin"  # NVIDIA's DRA driver's kubelet plugin: only the DRA tests need it


def nvidia_home() -> Path:
    env = os.environ.get("GPU_TAILOR_NVIDIA")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpu-tailor-nvidia"


def cni_dir() -> Path | None:
    return next((d for d in CNI_DIRS if (d / "loopback").is_file()), None)


def missing(release: Release, nvidia: bool = True) -> list[str]:
    """What a real node of ``release`` lacks on this machine, each with where it is looked for; empty when
    everything is there."""
    out = []
    if os.geteuid() != 0:
        out.append("root (a kubelet, containerd and mount namespaces need it)")
    if not os.access(release.bin / "kubelet", os.X_OK):
        out.append(f"kubelet in {release.bin}")
    out += [f"{t} on PATH" for t in (*HOST_TOOLS, *images.TOOLS) if shutil.which(t) is None]
    if cni_dir() is None:
        out.append(f"the CNI loopback plugin in {' or '.join(map(str, CNI_DIRS))}")
    if not Path("/sys/fs/cgroup/memory").is_dir() and not Path("/sys/fs/cgroup/cgroup.controllers").is_file():
        out.append("a cgroup filesystem at /sys/fs/cgroup")
    if nvidia:
        home = nvidia_home()
        out += [f"{b} in {home / 'bin'}" for b in NVIDIA_BINARIES if not (home / "bin" / b).exists()]
        out += [f"the mock NVML profile {p}" for p in (mock_profile("h100"), mock_profile("t4")) if not p.is_file()]
    if not out:  # built last: the one slow look-up (about a minute, once per test session)
        built = images.gpu_tailor()
        if isinstance(built, str):
            out.append(f"gpu-tailor's image ({built})")
    return out


def _cgroup_v1_roots() -> list[Path]:
    base = Path("/sys/fs/cgroup")
    if (base / "cgroup.controllers").is_file():  # v2: one hierarchy
        return [base]
    return sorted(p for p in base.iterdir() if p.is_dir() and not p.is_symlink() and p.name != "unified")


def node_certificate(cp: ControlPlane, node: str, out: Path) -> tuple[Path, Path]:
    """A client certificate for ``system:node:NODE`` (group ``system:nodes``), signed by the control plane's CA:
    the identity a kubelet gets from TLS bootstrapping."""
    ca_cert = x509.load_pem_x509_certificate((cp.pki / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((cp.pki / "ca.key").read_bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
                         x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node}")])
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]
    crt, pem = out / "kubelet-client.crt", out / "kubelet-client.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                      serialization.NoEncryption()))
    return crt, pem


def grant_nodes(kube: Kube) -> None:
    """The control plane authorizes by RBAC alone (no Node authorizer): bind the ``system:node`` role to the
    ``system:nodes`` group, as clusters without the Node authorizer do."""
    if kube.exists(api_path("clusterrolebindings", name="gpu-tailor-e2e-nodes", group="rbac.authorization.k8s.io/v1")):
        return
    kube.create(api_path("clusterrolebindings", group="rbac.authorization.k8s.io/v1"), {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "gpu-tailor-e2e-nodes"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}]})


@dataclass(frozen=True)
class MockGpus:
    """The GPUs of a node: a mock NVML profile and how NVIDIA's device plugin sells them."""

    profile: Path
    replicas: int = 1  # time-slicing replicas per GPU (1: whole GPUs)
    mig_strategy: str = "none"
    policy: str = "distributed"  # the plugin's --shared-devices-allocation-policy
    labels: dict[str, str] = field(default_factory=dict)  # what an admin adds (gpu-tailor.io/replica-policy ...)
    overrides: dict[int, Obj] = field(default_factory=dict)  # mock NVML fields per GPU from the start (``inject``)


def mock_profile(name: str) -> Path:
    """One of the mock NVML's GPU profiles (``h100``, ``t4`` ...), as NVIDIA's k8s-test-infra ships them."""
    return nvidia_home() / "profiles" / f"mock-nvml-config-{name}.yaml"


@dataclass
class Process:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    out: IO[bytes]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 25) -> str:
        return log_tail(self.name, self.log, lines)


@dataclass
class RealNode:
    """One node: its mount namespace (held by a sleeping process), containerd, the kubelet, and the daemons a
    test adds (``spawn``)."""

    name: str
    cp: ControlPlane
    kube: Kube
    home: Path
    labels: dict[str, str] = field(default_factory=dict)
    holder: subprocess.Popen[bytes] | None = None
    procs: dict[str, Process] = field(default_factory=dict)
    cgroup: str = ""
    healthz: str = ""
    gpus: MockGpus | None = None
    gfd_labels: dict[str, str] = field(default_factory=dict)
    sockets: Path | None = None  # containerd's sockets (``containerd_socket``)

    # -- paths -------------------------------------------------------------------------------------------------
    @property
    def root(self) -> Path:
        """The node's view of the file system, from outside its mount namespace."""
        assert self.holder is not None
        return Path(f"/proc/{self.holder.pid}/root")

    @property
    def containerd_socket(self) -> Path:
        """In a short folder of its own: a unix socket's path may not pass 104 bytes (containerd's ttrpc socket adds
        ``.ttrpc``), and pytest's folders under two worker processes come close to it."""
        if self.sockets is None:
            self.sockets = Path(tempfile.mkdtemp(prefix="gt-", dir="/tmp"))
        return self.sockets / "containerd.sock"

    @property
    def pod_resources_socket(self) -> Path:
        """The kubelet's PodResources socket, reachable from outside the node's mount namespace."""
        return self.root / "var/lib/kubelet/pod-resources/kubelet.sock"

    # -- processes ---------------------------------------------------------------------------------------------
    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Process:
        """Start ``argv`` inside the node's mount namespace, logging to ``logs/NAME.log``."""
        assert self.holder is not None
        if name in self.procs and self.procs[name].alive():
            raise AssertionError(f"{name} already runs on {self.name}")
        log = self.home / "logs" / f"{name}.log"
        out = log.open("ab")
        full_env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"} | (env or {})
        proc = subprocess.Popen(["nsenter", f"--target={self.holder.pid}", "--mount", "--", *argv], stdout=out,
                                stderr=subprocess.STDOUT, env=full_env, start_new_session=True)
        self.procs[name] = Process(name, proc, log, out)
        return self.procs[name]

    def stop(self, name: str, sig: signal.Signals = signal.SIGTERM, timeout: float = 30) -> None:
        p = self.procs.pop(name, None)
        if p is None:
            return
        if p.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.proc.pid, sig)
            try:
                p.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.proc.pid, signal.SIGKILL)
                p.proc.wait(timeout=30)
        p.out.close()

    def ctr(self, *args: str, timeout: float = 120) -> str:
        proc = subprocess.run(["ctr", "--address", str(self.containerd_socket), "--namespace", "k8s.io", *args],
                              capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)} failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
        return proc.stdout

    def context(self) -> str:
        return "\n".join(p.tail() for p in self.procs.values())

    # -- bring up ----------------------------------------------------------------------------------------------
    def start_namespace(self) -> None:
        for sub in ("kubelet", "pod-logs", "logs", "containerd", "cni"):
            (self.home / sub).mkdir(parents=True, exist_ok=True)
        for target in ("/var/lib/kubelet", "/var/log/pods"):
            Path(target).mkdir(parents=True, exist_ok=True)
        script = (f"mount --bind {self.home / 'kubelet'} /var/lib/kubelet && "
                  f"mount --bind {self.home / 'pod-logs'} /var/log/pods && exec sleep 2147483647")
        self.holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                                       start_new_session=True)
        kubelet_dir = self.home / "kubelet"

        def bound() -> bool:
            if self.holder is None or self.holder.poll() is not None:
                code = self.holder.returncode if self.holder else None
                raise AssertionError(f"the mount namespace of {self.name} ended ({code})")
            try:
                return os.stat(self.root / "var/lib/kubelet").st_ino == os.stat(kubelet_dir).st_ino
            except OSError:
                return False

        wait_for(bound, 30, f"{self.name}'s private /var/lib/kubelet")

    def make_cgroup_root(self) -> None:
        self.cgroup = f"/gpu-tailor/{self.name}-{self.cp.api_port}"  # two control planes may each have an hgx-0
        for hierarchy in _cgroup_v1_roots():
            # parents too: another process's last node may remove the shared parent between two mkdirs
            (hierarchy / self.cgroup.lstrip("/")).mkdir(parents=True, exist_ok=True)
            for depth in (hierarchy / "gpu-tailor", hierarchy / self.cgroup.lstrip("/")):
                if hierarchy.name.startswith("cpuset"):  # a cpuset cgroup takes no task until it has cpus and mems
                    for f in ("cpuset.cpus", "cpuset.mems"):
                        if not (depth / f).read_text().strip():
                            (depth / f).write_text((depth.parent / f).read_text())

    def remove_cgroup_root(self) -> None:
        if not self.cgroup:
            return
        for hierarchy in _cgroup_v1_roots():
            top = hierarchy / self.cgroup.lstrip("/")
            if not top.is_dir():
                continue
            for folder, _, _ in os.walk(top, topdown=False):  # deepest first; a folder gone meanwhile is skipped
                with contextlib.suppress(OSError):
                    os.rmdir(folder)
            with contextlib.suppress(OSError):
                top.rmdir()
            with contextlib.suppress(OSError):  # the parent too, once no other node's is in it
                top.parent.rmdir()

    def start_containerd(self) -> None:
        cni = cni_dir()
        assert cni is not None
        (self.home / "cni" / "10-loopback.conflist").write_text(
            '{"cniVersion": "0.4.0", "name": "loopback-only", "plugins": [{"type": "loopback"}]}\n')
        state = self.home / "containerd"
        config = f"""version = 2
root = "{state / 'root'}"
state = "{state / 'state'}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{self.containerd_socket}"
[ttrpc]
  address = "{self.containerd_socket}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{state / 'opt'}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{images.PAUSE}"
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni}"
    conf_dir = "{self.home / 'cni'}"
"""
        (state / "config.toml").write_text(config)
        p = self.spawn("containerd", ["containerd", "--config", str(state / "config.toml")])

        def up() -> bool:
            if not p.alive():
                raise AssertionError(f"containerd of {self.name} exited\n{p.tail()}")
            try:
                self.ctr("version", timeout=10)
            except (RuntimeError, subprocess.TimeoutExpired):
                return False
            return True

        wait_for(up, 60, f"containerd of {self.name}", interval=0.2)
        for archive in images.archives().values():
            self.ctr("images", "import", str(archive))
        built = images.gpu_tailor()
        if isinstance(built, tuple):  # gpu-tailor's own image, as the manifests name it
            self.ctr("images", "import", str(built[1]))

    def start_kubelet(self, release: Release, taints: list[Obj] | None = None) -> None:
        home = self.home
        crt, key = node_certificate(self.cp, self.name, home)
        kubeconfig = home / "kubelet.kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "e2e", "cluster": {"server": f"https://127.0.0.1:{self.cp.api_port}",
                                                      "certificate-authority": str(self.cp.pki / "ca.crt")}}],
            "users": [{"name": "kubelet", "user": {"client-certificate": str(crt), "client-key": str(key)}}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "kubelet"}}],
            "current-context": "e2e"}))
        config: Obj = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "cgroupDriver": "cgroupfs", "cgroupRoot": self.cgroup, "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "address": "127.0.0.1", "port": free_port(), "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(), "readOnlyPort": 0,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                               "x509": {"clientCAFile": str(self.cp.pki / "ca.crt")}},
            "authorization": {"mode": "AlwaysAllow"},
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False, "resolvConf": "", "maxPods": 110,
            "registerWithTaints": taints or [],
            "fileCheckFrequency": "1s", "nodeStatusUpdateFrequency": "2s", "syncFrequency": "5s",
        }
        if release.minor >= 35:
            config["failCgroupV1"] = False
        (home / "kubelet.yaml").write_text(yaml.safe_dump(config))
        self.healthz = f"http://127.0.0.1:{config['healthzPort']}/healthz"
        argv = [str(release.bin / "kubelet"), f"--config={home / 'kubelet.yaml'}", f"--kubeconfig={kubeconfig}",
                f"--hostname-override={self.name}", "--root-dir=/var/lib/kubelet", "-v=2"]
        if self.labels:
            argv.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(self.labels.items())))
        p = self.spawn("kubelet", argv)

        def ready() -> bool:
            if not p.alive():
                raise AssertionError(f"the kubelet of {self.name} exited\n{p.tail()}")
            if not self.kube.exists(api_path("nodes", name=self.name)):
                return False
            node = self.kube.get(api_path("nodes", name=self.name))
            return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))

        wait_for(ready, 120, f"node {self.name} registered Ready", interval=0.5, context=self.context)
        # The API server taints a new node not-ready; no node lifecycle controller runs here to lift it.
        node = self.kube.get(api_path("nodes", name=self.name))
        kept = [t for t in (node["spec"].get("taints") or []) if not t["key"].startswith("node.kubernetes.io/")]
        self.kube.patch(api_path("nodes", name=self.name), {"spec": {"taints": kept or None}})

    # -- NVIDIA's pieces on the mock NVML ----------------------------------------------------------------------
    @property
    def mock_nvml(self) -> Path:
        """The node's ``MOCK_NVML`` as seen from outside its mount namespace."""
        return self.home / "kubelet" / MOCK_NVML.removeprefix("/var/lib/kubelet/")

    def nvml_env(self) -> dict[str, str]:
        """What loads the mock NVML with this node's GPUs (NVIDIA's binaries and nvidia-ml-py alike)."""
        return {"LD_LIBRARY_PATH": str(self.mock_nvml), "MOCK_NVML_CONFIG": str(self.mock_nvml / "config.yaml"),
                "MOCK_NVML_OVERRIDES": str(self.overrides)}

    def install_mock_nvml(self, gpus: MockGpus) -> None:
        self.gpus = gpus
        self.mock_nvml.mkdir(parents=True, exist_ok=True)
        shutil.copy2(nvidia_home() / "bin" / "libnvidia-ml.so.1", self.mock_nvml / "libnvidia-ml.so.1")
        shutil.copy2(gpus.profile, self.mock_nvml / "config.yaml")
        self.inject(gpus.overrides)

    @property
    def overrides(self) -> Path:
        """The mock NVML's runtime overrides (re-read every second by every process that loaded it): where a test
        injects a failure."""
        return self.mock_nvml / "overrides.json"

    def inject(self, devices: dict[int, Obj]) -> None:
        """Override mock NVML fields per GPU index from now on (``{7: {"failure": {"mode": "lost"}}}``); ``{}``
        takes every override back."""
        self.overrides.write_text(json.dumps({"version": 1, "devices": {str(i): d for i, d in devices.items()}}))

    def restart_device_plugin(self) -> None:
        """NVIDIA's device plugin stopped and started again, as a pod restart would; it re-reads NVML."""
        self.stop("nvidia-device-plugin")
        self.spawn("nvidia-device-plugin", [str(nvidia_home() / "bin" / "nvidia-device-plugin"),
                                            f"--config-file={self.home / 'nvidia-plugin.yaml'}"], env=self.nvml_env())

    def plugin_config(self) -> Path:
        """The device plugin's (and GFD's) config file, as NVIDIA documents it (``version: v1``)."""
        assert self.gpus is not None
        config: Obj = {"version": "v1", "flags": {
            "migStrategy": self.gpus.mig_strategy, "failOnInitError": True,
            "plugin": {"deviceListStrategy": ["envvar"], "deviceIDStrategy": "uuid",
                       "sharedDevicesAllocationPolicy": self.gpus.policy}}}
        if self.gpus.replicas > 1:
            config["sharing"] = {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu",
                                                                "replicas": self.gpus.replicas}]}}
        path = self.home / "nvidia-plugin.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def start_nvidia(self, gpus: MockGpus) -> None:
        """NVIDIA's device plugin (registered with the kubelet) and gpu-feature-discovery's labels, as NFD would
        apply them, plus ``nvidia.com/gpu.present``, which the GPU operator sets from NFD's PCI labels."""
        self.install_mock_nvml(gpus)
        config = self.plugin_config()
        bin_dir = nvidia_home() / "bin"
        labels_file = self.home / "gfd-labels.txt"
        proc = subprocess.run([str(bin_dir / "gpu-feature-discovery"), "--oneshot", "--use-node-feature-api=false",
                               "--no-timestamp", f"--config-file={config}", f"--output-file={labels_file}"],
                              env={**os.environ, **self.nvml_env()}, capture_output=True, text=True, timeout=120,
                              check=False)
        if proc.returncode != 0:
            raise AssertionError(f"gpu-feature-discovery failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
        found = dict(line.split("=", 1) for line in labels_file.read_text().splitlines() if "=" in line)
        self.gfd_labels = found
        self.kube.patch(api_path("nodes", name=self.name),
                        {"metadata": {"labels": {**found, "nvidia.com/gpu.present": "true", **gpus.labels}}})
        plugin = self.spawn("nvidia-device-plugin", [str(bin_dir / "nvidia-device-plugin"), f"--config-file={config}"],
                            env=self.nvml_env())

        def sold() -> bool:
            if not plugin.alive():
                raise AssertionError(f"NVIDIA's device plugin on {self.name} exited\n{plugin.tail()}")
            alloc = self.kube.get(api_path("nodes", name=self.name))["status"].get("allocatable") or {}
            return any(k.startswith("nvidia.com/") and int(v) > 0 for k, v in alloc.items())

        wait_for(sold, 60, f"node {self.name} to sell NVIDIA devices", interval=0.5, context=self.context)

    # -- NVIDIA's DRA driver on the mock NVML -----------------------------------------------------------------
    def driver_root(self) -> Path:
        """A driver root as NVIDIA's DRA driver expects one: the mock NVML as ``libnvidia-ml.so.<version>``, an empty
        ``libcuda.so.<version>`` (CDI spec generation looks for it), ``nvidia-smi`` (checked for) and device nodes."""
        assert self.gpus is not None
        root = self.home / "driver-root"
        profile = yaml.safe_load(self.gpus.profile.read_text())
        version = str(profile["system"]["driver_version"])
        for sub in ("usr/lib64", "usr/bin", "dev"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        lib = root / "usr/lib64"
        shutil.copy2(nvidia_home() / "bin" / "libnvidia-ml.so.1", lib / f"libnvidia-ml.so.{version}")
        (lib / f"libcuda.so.{version}").write_bytes(b"")
        for link, to in (("libnvidia-ml.so.1", f"libnvidia-ml.so.{version}"), ("libnvidia-ml.so", "libnvidia-ml.so.1"),
                         ("libcuda.so.1", f"libcuda.so.{version}")):
            if not (lib / link).is_symlink():
                (lib / link).symlink_to(to)
        smi = root / "usr/bin/nvidia-smi"
        smi.write_text("#!/bin/sh\nexit 0\n")
        smi.chmod(0o755)
        count = len(profile.get("devices") or [])
        for name, minor in [*((f"nvidia{i}", i) for i in range(count)), ("nvidiactl", 255)]:
            if not (root / "dev" / name).exists():
                os.mknod(root / "dev" / name, 0o666 | stat.S_IFCHR, os.makedev(195, minor))
        return root

    def start_dra_driver(self, gpus: MockGpus, kubeconfig: Path) -> Process:
        """NVIDIA's DRA driver's kubelet plugin (``gpu-kubelet-plugin``) on the mock NVML instead of the device plugin:
        it registers with the kubelet and publishes the node's ``gpu.nvidia.com`` ResourceSlices."""
        self.install_mock_nvml(gpus)
        root = self.driver_root()
        hook = self.home / "nvidia-cdi-hook"  # named in the CDI specs it writes; nothing here runs them
        hook.write_text("#!/bin/sh\nexit 0\n")
        hook.chmod(0o755)
        (self.home / "cdi").mkdir(exist_ok=True)
        plugin = self.spawn("gpu-kubelet-plugin", [
            str(nvidia_home() / "bin" / "gpu-kubelet-plugin"), f"--node-name={self.name}", f"--kubeconfig={kubeconfig}",
            f"--nvidia-driver-root={root}", f"--container-driver-root={root}", f"--cdi-root={self.home / 'cdi'}",
            f"--nvidia-cdi-hook-path={hook}", f"--image-name={images.BUSYBOX}"], env=self.nvml_env())

        def published() -> bool:
            if not plugin.alive():
                raise AssertionError(f"NVIDIA's DRA driver on {self.name} exited\n{plugin.tail()}")
            return any(s["spec"].get("nodeName") == self.name
                       for s in self.kube.list(api_path("resourceslices", group="resource.k8s.io/v1")))

        wait_for(published, 60, f"NVIDIA's DRA driver to publish {self.name}'s ResourceSlices", interval=0.5,
                 context=self.context)
        return plugin

    # -- gpu-tailor's node agent ------------------------------------------------------------------------------
    def _agent_env(self) -> dict[str, str]:
        return {**self.nvml_env(), "NODE_NAME": self.name}

    def allocated(self) -> dict[str, tuple[int, ...]]:
        """What the kubelet allocated, per pod (``namespace/name``): the GPU of every device its containers hold,
        read from the kubelet's PodResources socket and the mock NVML by ``gpu-tailor agent --once`` (nothing is
        written to the API)."""
        proc = subprocess.run([*AGENT, "--once", "--pod-resources-socket", str(self.pod_resources_socket)],
                              env={**os.environ, **self._agent_env()}, capture_output=True, text=True, timeout=60,
                              check=False)
        if proc.returncode != 0:
            raise AssertionError(f"gpu-tailor agent --once on {self.name} failed ({proc.returncode}): {proc.stderr}")
        report = json.loads(proc.stdout)
        assert not report["spec"].get("unmapped"), report["spec"]["unmapped"]
        return held_by_pod(report)

    def start_agent(self) -> Obj:
        """gpu-tailor's node agent on this node, as its DaemonSet runs it: from gpu-tailor's image, with the identity
        the kubelet projects into its pod, reading the kubelet's real PodResources socket and the mock NVML; once it
        has written its first report (returned)."""
        self.kube.patch(api_path("nodes", name=self.name), {"metadata": {"labels": {AGENT_LABEL: "on"}}})

        def agent_pod() -> Obj | None:
            running = [p for p in self._agent_pods() if (p.get("status") or {}).get("phase") == "Running"]
            return running[0] if running else None

        wait_for(agent_pod, 90, f"the agent DaemonSet's pod Running on {self.name}", interval=0.5,
                 context=self.context)
        report = api_path("nodegpureports", name=self.name, group="gpu-tailor.io/v1alpha1")
        found = wait_for(lambda: self.kube.get(report) if self.kube.exists(report) else None, 60,
                         f"the agent on {self.name} to write its report", interval=0.5, context=self.context)
        assert found is not None
        return found

    def _agent_pods(self) -> list[Obj]:
        return self.kube.list(api_path("pods", "gpu-tailor"),
                              label_selector="app.kubernetes.io/name=gpu-tailor,app.kubernetes.io/component=agent",
                              field_selector=f"spec.nodeName={self.name}")

    # -- tear down ---------------------------------------------------------------------------------------------
    def _namespace_pids(self) -> list[int]:
        """Every process in this node's mount namespace (containerd's shims); none once its holder has ended (its
        pid may be another process's by then)."""
        if self.holder is None or self.holder.poll() is not None:
            return []
        try:
            mine = os.readlink(f"/proc/{self.holder.pid}/ns/mnt")
        except OSError:
            return []
        if mine == os.readlink("/proc/self/ns/mnt"):
            return []  # never the host's own namespace
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.readlink(entry / "ns" / "mnt") == mine:
                        pids.append(int(entry.name))
                except OSError:
                    continue
        return pids

    def _cgroup_pids(self) -> list[int]:
        """Every process in the node's cgroup root: its pods' containers, which runc gives mount namespaces of their
        own."""
        pids: set[int] = set()
        for hierarchy in _cgroup_v1_roots() if self.cgroup else ():
            # the kubelet and runc remove cgroups while this walks them: a folder gone is skipped, not an error
            for folder, _, files in os.walk(hierarchy / self.cgroup.lstrip("/")):
                if "cgroup.procs" in files:
                    with contextlib.suppress(OSError):
                        pids.update(int(p) for p in (Path(folder) / "cgroup.procs").read_text().split())
        return sorted(pids)

    def down(self) -> None:
        for name in [n for n in self.procs if n not in ("kubelet", "containerd")]:
            self.stop(name)
        self.stop("kubelet")
        for pid in self._cgroup_pids():  # the containers the kubelet left running
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self._cgroup_pids():
            time.sleep(0.1)
        self.stop("containerd")
        # containerd leaves its shims and the containers running: end everything in the namespace, holder last
        holder = self.holder.pid if self.holder else None
        for pid in self._namespace_pids():
            if pid != holder:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and [p for p in self._namespace_pids() if p != holder]:
            time.sleep(0.1)
        if self.holder is not None:
            self.holder.kill()
            self.holder.wait(timeout=30)
        self.remove_cgroup_root()
        _unmount_under(self.home)
        if self.sockets is not None:
            shutil.rmtree(self.sockets, ignore_errors=True)
        left = self._cgroup_pids()
        assert not left, f"processes {left} outlived node {self.name}"


def _unmount_under(path: Path) -> None:
    """Mounts containerd made under the node's folder in the host namespace (none are expected: it ran in the
    node's own), lazily detached so that the folder can go."""
    prefix = str(path.resolve())
    for line in reversed(Path("/proc/self/mounts").read_text().splitlines()):
        target = line.split()[1]
        if target.startswith(prefix):
            subprocess.run(["umount", "-l", target], capture_output=True, check=False)


@contextmanager
def real_node(name: str, cp: ControlPlane, kube: Kube, release: Release, workdir: Path,
              labels: dict[str, str] | None = None, taints: list[Obj] | None = None) -> Iterator[RealNode]:
    """A node with containerd and a kubelet registered Ready with ``cp``; everything it started ends on leaving."""
    grant_nodes(kube)
    node = RealNode(name, cp, kube, workdir / name, dict(labels or {}))
    try:
        node.start_namespace()
        node.make_cgroup_root()
        node.start_containerd()
        node.start_kubelet(release, taints)
        yield node
    finally:
        node.down()


def real_pod(name: str, limits: dict[str, str], product: str, topology: str | None = None,
             node: str | None = None) -> Obj:
    """A portable ask for ``product`` that runs on a real node (``node``: pinned there by hostname): busybox, host
    network (no pod network here), ending at once when told to."""
    annotations = {labels.ANN_GPU_PRODUCT: product}
    if topology:
        annotations[labels.ANN_TOPOLOGY] = topology
    pinned = {"nodeSelector": {"kubernetes.io/hostname": node}} if node else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": annotations},
            "spec": {**pinned, "hostNetwork": True, "terminationGracePeriodSeconds": 2, "containers": [{
                "name": "main", "image": images.BUSYBOX,
                "command": ["/bin/sh", "-c", "trap 'exit 0' TERM; sleep 2147483647 & wait"],
                "resources": {"limits": dict(limits)}}]}}


def running(kube: Kube, namespace: str, name: str, timeout: float = 90,
            context: Callable[[], str] | None = None) -> Obj:
    """The pod once Running; fails at once where the kubelet refused it (UnexpectedAdmissionError, OutOf...)."""
    def phase() -> Obj | None:
        pod = kube.get(api_path("pods", namespace, name))
        status = pod.get("status") or {}
        if status.get("phase") == "Failed":
            raise AssertionError(f"the kubelet refused {name}: {status.get('reason')}: {status.get('message')}")
        return pod if status.get("phase") == "Running" else None

    found = wait_for(phase, timeout, f"pod {name} Running", interval=0.2, context=context)
    assert found is not None
    return found


def sample(text: str, series: str) -> float | None:
    """One series' value (``name`` or ``name{label="..."}``) in a Prometheus text page; None when absent."""
    found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else None


def recorded(kube: Kube, pods: list[Obj], metrics: Callable[[], str],
             context: Callable[[], str] | None = None) -> list[Obj]:
    """``pods`` read again once the extender (its ``metrics`` page) has written the GPUs of every pod it scored:
    kube-scheduler binds, and the records follow the bind."""
    wait_for(lambda: sample(metrics(), "gpu_tailor_extender_records_pending") == 0, 60,
             "the extender to write the records of the pods it scored", interval=0.2, context=context)
    return [kube.get(api_path("pods", p["metadata"]["namespace"], p["metadata"]["name"])) for p in pods]


def given_as_recorded(pod: Obj, given: dict[str, tuple[int, ...]], where: str = "") -> str:
    """The GPUs the kubelet gave ``pod`` (``given``: by namespace/name) are those bind recorded on it, or within the
    set it recorded where the device plugin picks (``gpu-tailor.io/gpus-among``); a line saying which, for the log.
    ``where``: more of the pod for the messages (its node)."""
    key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
    notes = pod["metadata"].get("annotations") or {}
    recorded = parse_gpu_annotation(str(notes.get(labels.ANN_GPUS, "")))
    among = parse_gpu_annotation(str(notes.get(labels.ANN_GPUS_AMONG, "")))
    assert recorded is not None, f"{key}{where}: bind recorded no GPUs ({notes})"
    got = given.get(key)
    assert got is not None and len(got) == len(recorded), f"{key}{where}: the kubelet gave {got}, bind recorded " \
                                                          f"{recorded}"
    if among:
        assert set(got) <= set(among), f"{key}{where}: the kubelet gave GPUs {got}, outside the set {among} recorded"
    else:
        assert sorted(got) == sorted(recorded), f"{key}{where}: the kubelet gave GPUs {got}, bind recorded {recorded}"
    return (f"{key}{where}: recorded {recorded} among {among or '-'}, given {got}, "
            f"{'exact' if sorted(got) == sorted(recorded) else 'within the set'}")


def wait_report_held(kube: Kube, node: str, metrics: Callable[[], str],
                     context: Callable[[], str] | None = None) -> None:
    """Until the extender (its ``metrics`` page) holds the node's report as the API has it now: what that report
    contradicts is counted by then."""
    report = kube.get(api_path("nodegpureports", name=node, group="gpu-tailor.io/v1alpha1"))
    at = parse_time(report["spec"]["observedAt"])
    assert at is not None, report["spec"]

    def held() -> bool:
        seen = sample(metrics(), f'gpu_tailor_agent_report_observed_timestamp_seconds{{node="{node}"}}')
        return seen is not None and seen >= at.timestamp()

    wait_for(held, 30, f"the extender to hold {node}'s report", interval=0.2, context=context)


def node_status(kube: Kube, name: str) -> Any:
    return kube.get(api_path("nodes", name=name))["status"]
