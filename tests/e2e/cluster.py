"""The real control plane and what the tests put in it: the repo's ``manifests/`` applied with kubectl,
ServiceAccount kubeconfigs, the fixture nodes and two namespaces.

Which Kubernetes. The project ships and builds no Kubernetes: the tests run on the releases they find (``releases``),
each a folder holding kube-apiserver, kube-scheduler, kube-controller-manager, kubectl and etcd:

1. ``$GPU_TAILOR_K8S_BIN``: one folder, or several separated by ``:``, each a release to run the suite on;
2. otherwise ``$KUBEBUILDER_ASSETS`` (the controller-runtime convention) where it holds all five binaries, and
   every ``${XDG_CACHE_HOME:-~/.cache}/gpu-tailor-k8s/v*/bin`` (where ``control-plane.sh`` looks by default).

``control-plane.sh`` (``$GPU_TAILOR_CONTROL_PLANE``, else ``../shared/control-plane/control-plane.sh`` beside the
repository) starts them on loopback. Where either is missing, every e2e test is skipped with the reason.

There is no kubelet, so three things are done by hand that a kubelet would do: node status is written
through the status subresource, the ``not-ready`` taint the API server adds to new nodes is removed,
and pods are deleted with grace 0 (nothing would ever confirm a graceful deletion).
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import signal
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

from tests.conftest import free_port
from tests.e2e.kube import Kube, Obj, api_path, load_kubeconfig, wait_for, write_token_kubeconfig

REPO = Path(__file__).resolve().parents[2]
FIXTURE_NODES = REPO / "tests" / "fixtures" / "nodes"
OPTED_IN = "team-a"  # labelled gpu-tailor.io/enabled=true, as in the captured admission fixtures
PLAIN = "team-b"  # no label: the webhook must never see its pods


BINARIES = ("kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubectl", "etcd")


@dataclass(frozen=True)
class Release:
    """A folder of Kubernetes binaries and the version its kube-apiserver reports (``v1.36.3``)."""

    bin: Path
    version: str

    @property
    def minor(self) -> int:
        return int(self.version.lstrip("v").split(".")[1])


def control_plane_script() -> Path:
    env = os.environ.get("GPU_TAILOR_CONTROL_PLANE")
    return Path(env) if env else REPO.parent / "shared" / "control-plane" / "control-plane.sh"


def _version(folder: Path) -> str | None:
    try:
        out = subprocess.run([str(folder / "kube-apiserver"), "--version"], capture_output=True, text=True,
                             timeout=30, check=False).stdout
    except OSError:
        return None
    match = re.search(r"v\d+\.\d+\.\d+", out)
    return match.group(0) if match else None


def _version_key(release: Release) -> tuple[int, ...]:
    return tuple(int(x) for x in release.version.lstrip("v").split("."))


@functools.cache
def find_releases() -> tuple[list[Release], str]:
    """The releases to run the e2e suite on, oldest first, and why there are none where that is so (looked up
    once per test session: each folder's kube-apiserver is run for its version)."""
    explicit = os.environ.get("GPU_TAILOR_K8S_BIN")
    if explicit:
        folders = [Path(f).expanduser() for f in explicit.split(os.pathsep) if f]
    else:
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpu-tailor-k8s"
        assets = os.environ.get("KUBEBUILDER_ASSETS")
        folders = ([Path(assets)] if assets else []) + sorted(cache.glob("v*/bin"))
    found: list[Release] = []
    why: list[str] = []
    for folder in folders:
        missing = [b for b in BINARIES if not os.access(folder / b, os.X_OK)]
        version = None if missing else _version(folder)
        if missing:
            why.append(f"{folder} lacks {', '.join(missing)}")
        elif version is None:
            why.append(f"{folder}/kube-apiserver --version names no version")
        elif all(r.version != version for r in found):
            found.append(Release(folder, version))
    if not found and not why:
        why.append("no Kubernetes binaries found: set GPU_TAILOR_K8S_BIN to folders (':'-separated) holding "
                   f"{', '.join(BINARIES)}, or put them in ~/.cache/gpu-tailor-k8s/vVERSION/bin")
    script = control_plane_script()
    if found and not script.is_file():
        return [], f"{script} is absent (set GPU_TAILOR_CONTROL_PLANE to control-plane.sh)"
    return sorted(found, key=_version_key), "; ".join(why)


def release_params() -> tuple[list[Release | None], list[str]]:
    """``params`` and ``ids`` for a fixture that takes each release found in turn (``request.param``), or None
    once where there is none (the fixture then skips, saying ``find_releases``' reason)."""
    found, _ = find_releases()
    return [*found] or [None], [r.version for r in found] or ["no-k8s"]


def first_release() -> Release:
    """The oldest release found, for benchmarks and one-off checks; SystemExit with the reason where none is."""
    found, why = find_releases()
    if not found:
        raise SystemExit(f"no Kubernetes control plane: {why}")
    return found[0]


class ControlPlane:
    """etcd, kube-apiserver, kube-controller-manager and the default kube-scheduler of ``release``, on free
    ports."""

    def __init__(self, release: Release, home: Path, script: Path | None = None) -> None:
        self.release, self.home = release, home
        self.script = script or control_plane_script()
        self.env = {**os.environ, "K8S_HOME": str(home), "K8S_API_PORT": str(free_port()),
                    "ETCD_PORT": str(free_port()), "ETCD_PEER_PORT": str(free_port()),
                    "SCHED_PORT": str(free_port()), "KCM_PORT": str(free_port()),
                    "K8S_BIN_DIR": str(release.bin), "K8S_VERSION": release.version.lstrip("v")}
        self.env.pop("KUBECONFIG", None)
        self.logs = home / "run" / "logs"
        self.kubeconfig = home / "kubeconfig"
        self.bin = release.bin
        self.pki = home / "pki"
        self.relaunched: list[tuple[subprocess.Popen[bytes], IO[bytes]]] = []

    def _run(self, *args: str, env: dict[str, str] | None = None, timeout: float = 180) -> str:
        proc = subprocess.run(["bash", str(self.script), *args], env=env or self.env, capture_output=True,
                              text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"control-plane.sh {' '.join(args)} failed ({proc.returncode}):\n"
                               f"{proc.stdout}{proc.stderr}\nlogs: {self.logs}")
        return proc.stdout

    def up(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self._run("up")

    def down(self) -> None:
        try:
            self._run("down", env={**self.env, "WIPE": "1"}, timeout=60)
        finally:
            for proc, log in self.relaunched:  # components a test started again: stopped by `down` above
                if proc.poll() is None:
                    proc.kill()
                proc.wait(timeout=30)
                log.close()
            self.relaunched.clear()

    def _pid_file(self, component: str) -> Path:
        return self.home / "run" / "pids" / f"{component}.pid"

    def crash(self, component: str, port: int | None = None) -> list[str]:
        """SIGKILL one component (``kube-apiserver``, ``etcd`` ...), as a crash or an OOM kill would, and wait
        until it is gone and ``port`` is free again; its command line, to ``relaunch`` it with."""
        pid = int(self._pid_file(component).read_text())
        argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]]
        assert argv and Path(argv[0]).name == component, f"pid {pid} is not {component}: {argv}"
        os.kill(pid, signal.SIGKILL)
        # The thread-group leader shows as a zombie while its other threads still hold the listener.
        wait_for(lambda: not _running(pid) and (port is None or not _listening(port)), 30,
                 f"{component} ({pid}) to exit after SIGKILL and free its port")
        return argv

    def relaunch(self, component: str, argv: list[str]) -> subprocess.Popen[bytes]:
        """Start a component again with ``argv``, logging where ``up`` logged it; ``down`` stops it."""
        log = (self.logs / f"{component}.log").open("ab")
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.relaunched.append((proc, log))
        self._pid_file(component).write_text(f"{proc.pid}\n")
        return proc

    @property
    def api_port(self) -> int:
        return int(self.env["K8S_API_PORT"])

    def tail(self, component: str, lines: int = 20) -> str:
        text = (self.logs / f"{component}.log").read_text(errors="replace").splitlines()[-lines:]
        return f"--- {component}: last {lines} lines\n" + "\n".join(text)

    def kubectl(self, *args: str) -> str:
        proc = subprocess.run([str(self.bin / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
                              capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
        return proc.stdout


def log_tail(name: str, log: Path, lines: int) -> str:
    """The last ``lines`` of a process's log, headed by its name, for a failing test's context."""
    try:
        text = log.read_text(errors="replace").splitlines()[-lines:]
    except OSError as exc:
        text = [f"(no log: {exc})"]
    return f"--- {name}: last {lines} lines of {log}\n" + "\n".join(text)


def _running(pid: int) -> bool:
    """Alive and not a zombie (what control-plane.sh started was reparented: nobody here reaps it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def write_overlay(overlay: Path, webhook_url: str, agent: Obj | None = None) -> None:
    """A kustomize overlay of the repo's manifests that changes only what cannot work without a kubelet:
    the API server calls the webhook at ``webhook_url`` (``https://host:port/mutate``; each entry keeps its own
    path) instead of through its Service, and the node agent's DaemonSet is left out (no kubelet runs its pods;
    bound to the GPU nodes they would take CPU and memory the tests' placements do not count).

    With real nodes, ``agent`` is a strategic-merge patch of the DaemonSet instead, which keeps it
    (``tests/e2e/realnode.py``: ``agent_patch``)."""
    overlay.mkdir(parents=True, exist_ok=True)
    base = webhook_url.rsplit("/", 1)[0]
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(REPO / "manifests", overlay)],
        "patches": [{
            "target": {"group": "admissionregistration.k8s.io", "kind": "MutatingWebhookConfiguration",
                       "name": "gpu-tailor"},
            "patch": yaml.safe_dump([{"op": "replace", "path": f"/webhooks/{i}/clientConfig",
                                      "value": {"url": base + path}} for i, path in enumerate(_webhook_paths())]),
        }, {
            "patch": yaml.safe_dump({"$patch": "delete", "apiVersion": "apps/v1", "kind": "DaemonSet",
                                     "metadata": {"name": "gpu-tailor-agent", "namespace": "gpu-tailor"}}
                                    if agent is None else agent),
        }],
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))


def _webhook_paths() -> list[str]:
    (doc,) = [d for d in yaml.safe_load_all((REPO / "manifests" / "webhook" / "mutatingwebhookconfiguration.yaml")
                                            .read_text()) if d]
    return [str(h["clientConfig"]["service"]["path"]) for h in doc["webhooks"]]


@dataclass(frozen=True)
class Rendered:
    """What ``kubectl kustomize`` renders, looked up by kind and name."""

    docs: list[Obj]

    def get(self, kind: str, name: str) -> Obj:
        for d in self.docs:
            if d.get("kind") == kind and d["metadata"]["name"] == name:
                return d
        raise AssertionError(f"manifests render no {kind} {name}")

    def container(self, deployment: str, container: str) -> Obj:
        spec = self.get("Deployment", deployment)["spec"]["template"]["spec"]
        for c in spec["containers"]:
            if c["name"] == container:
                found: Obj = c
                return found
        raise AssertionError(f"Deployment {deployment} has no container {container}")

    def argv(self, deployment: str, container: str) -> list[str]:
        c = self.container(deployment, container)
        return [*c.get("command", []), *c.get("args", [])]

    def service_account(self, deployment: str) -> str:
        sa: str = self.get("Deployment", deployment)["spec"]["template"]["spec"]["serviceAccountName"]
        return sa


def render(cp: ControlPlane, overlay: Path) -> Rendered:
    return Rendered([d for d in yaml.safe_load_all(cp.kubectl("kustomize", str(overlay))) if d])


def service_account_kubeconfig(kube: Kube, cp: ControlPlane, namespace: str, name: str, out: Path) -> Path:
    """A kubeconfig with a token of the ServiceAccount from the TokenRequest API, so the services run with
    exactly the RBAC the manifests grant it."""
    review = kube.create(api_path("serviceaccounts", namespace, name, subresource="token"), {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 7200}})
    write_token_kubeconfig(out, load_kubeconfig(cp.kubeconfig), f"system:serviceaccount:{namespace}:{name}",
                           review["status"]["token"])
    return out


def fixture_nodes() -> list[Obj]:
    return [json.loads(p.read_text()) for p in sorted(FIXTURE_NODES.glob("*.json"))]


def install_node(kube: Kube, fixture: Obj) -> None:
    """Create the node as the fixture shows it: object, then status, then its own taints back."""
    meta = {k: v for k, v in fixture["metadata"].items()
            if k not in ("resourceVersion", "uid", "creationTimestamp", "managedFields")}
    name = meta["name"]
    kube.create(api_path("nodes"), {"apiVersion": "v1", "kind": "Node", "metadata": meta,
                                    "spec": copy.deepcopy(fixture.get("spec") or {})})
    kube.patch(api_path("nodes", name=name, subresource="status"), {"status": fixture["status"]})
    # The API server taints new nodes node.kubernetes.io/not-ready; no node lifecycle controller clears it.
    kube.patch(api_path("nodes", name=name), {"spec": {"taints": (fixture.get("spec") or {}).get("taints")}})
    wait_for(lambda: node_matches(kube.get(api_path("nodes", name=name)), fixture), 30,
             f"node {name} as in its fixture")


def node_matches(node: Obj, fixture: Obj) -> bool:
    taints = (node.get("spec") or {}).get("taints") or []
    return (taints == ((fixture.get("spec") or {}).get("taints") or [])
            and node["status"].get("allocatable") == fixture["status"]["allocatable"])


def create_namespace(kube: Kube, name: str, labels: dict[str, str]) -> None:
    kube.create(api_path("namespaces"), {"apiVersion": "v1", "kind": "Namespace",
                                         "metadata": {"name": name, "labels": labels}})
    # Pods are refused until the controller-manager made the namespace's default ServiceAccount.
    wait_for(lambda: kube.exists(api_path("serviceaccounts", name, "default")), 60,
             f"ServiceAccount {name}/default")


def scheduler_config(rendered: Rendered, extender_port: int, kubeconfig: Path) -> dict[str, Any]:
    """The KubeSchedulerConfiguration of manifests/scheduler, as rendered, with only the extender's
    address (a loopback sidecar in the pod, a free port here) and the client's kubeconfig changed."""
    config: dict[str, Any] = yaml.safe_load(rendered.get("ConfigMap", "gpu-tailor-scheduler")["data"]["config.yaml"])
    for ext in config.get("extenders") or []:
        url = ext["urlPrefix"]
        scheme, rest = url.split("://", 1)
        hostport, slash, path = rest.partition("/")
        host = hostport.rsplit(":", 1)[0]
        assert host in ("127.0.0.1", "localhost"), f"extender {url}: expected the loopback sidecar"
        ext["urlPrefix"] = f"{scheme}://{host}:{extender_port}{slash}{path}"
    config.setdefault("clientConnection", {})["kubeconfig"] = str(kubeconfig)
    return config
