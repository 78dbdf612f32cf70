"""JobSet's controller (kubernetes-sigs/jobset), run beside a test control plane so that ``examples/jobset-group.yaml``
is applied as a user would: the controller makes the child Job, the Job controller its pods.

The binary is not part of this project: the tests look for a folder holding ``bin/jobset-controller`` and the JobSet
CRD (``crd/jobset.x-k8s.io_jobsets.yaml``) in ``$GPU_TAILOR_JOBSET``, else in
``${XDG_CACHE_HOME:-~/.cache}/gpu-tailor-jobset/*/``, and skip with the reason where there is none. It runs out of
cluster under the admin kubeconfig, configured by a ``Configuration`` file: no leader election, no certificate
rotation of its own (that needs its in-cluster Secret and webhook objects), the webhook server on loopback with a
serving certificate made here. Its webhooks are registered by URL: the JobSet ones fill in the defaults a JobSet
relies on, the pod ones only see pods JobSet labelled.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from gpu_tailor.certs.authority import Names, make_ca, make_serving
from tests.conftest import free_port
from tests.e2e.kube import ApiError, Obj, api_path, wait_for
from tests.e2e.services import Service, Stack

CRD_NAME = "jobsets.jobset.x-k8s.io"
CRD_FILE = "jobset.x-k8s.io_jobsets.yaml"  # as controller-gen names it: <group>_<plural>.yaml
API = "jobset.x-k8s.io/v1alpha2"
NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REGISTRATION = "gpu-tailor-e2e-jobset"


def jobset_home() -> tuple[Path | None, str]:
    """The folder with JobSet's controller and CRD, or None and why there is none."""
    explicit = os.environ.get("GPU_TAILOR_JOBSET")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpu-tailor-jobset"
    folders = [Path(explicit)] if explicit else sorted(cache.glob("*/"))
    for folder in folders:
        if (folder / "bin" / "jobset-controller").is_file() and (folder / "crd" / CRD_FILE).is_file():
            return folder, ""
    where = f"GPU_TAILOR_JOBSET={explicit}" if explicit else f"{cache}/VERSION"
    return None, (f"no JobSet controller here ({where} holds no bin/jobset-controller and crd/{CRD_FILE}; "
                  "build one from kubernetes-sigs/jobset to run this example)")


def _webhook(name: str, url: str, ca: str, group: str, version: str, resource: str, pods_of_jobsets: bool) -> Obj:
    hook: Obj = {"name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail",
                 "clientConfig": {"url": url, "caBundle": ca},
                 "rules": [{"apiGroups": [group], "apiVersions": [version], "resources": [resource],
                            "operations": ["CREATE"] if pods_of_jobsets else ["CREATE", "UPDATE"]}]}
    if pods_of_jobsets:
        hook["objectSelector"] = {"matchExpressions": [{"key": NAME_LABEL, "operator": "Exists"}]}
    return hook


def _registrations(port: int, ca_pem: bytes) -> list[tuple[str, Obj]]:
    """The controller's four webhooks, registered by URL (the paths its webhook server serves)."""
    url, ca = f"https://127.0.0.1:{port}", base64.b64encode(ca_pem).decode()
    group, version = API.split("/")
    out = []
    for kind, prefix, short in (("mutatingwebhookconfigurations", "mutate", "m"),
                                ("validatingwebhookconfigurations", "validate", "v")):
        hooks = [_webhook(f"{short}jobset.kb.io", f"{url}/{prefix}-jobset-x-k8s-io-v1alpha2-jobset", ca, group,
                          version, "jobsets", False),
                 _webhook(f"{short}pod.kb.io", f"{url}/{prefix}--v1-pod", ca, "", "v1", "pods", True)]
        out.append((kind, {"apiVersion": "admissionregistration.k8s.io/v1",
                           "kind": "MutatingWebhookConfiguration" if short == "m" else "ValidatingWebhookConfiguration",
                           "metadata": {"name": REGISTRATION}, "webhooks": hooks}))
    return out


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def _served(stack: Stack) -> bool:
    try:
        found = stack.kube.get(f"/apis/{API}")
    except ApiError as exc:
        if exc.status == 404:
            return False
        raise
    return any(r.get("name") == "jobsets" for r in found.get("resources") or [])


@contextmanager
def jobset_controller(stack: Stack, home: Path, workdir: Path) -> Iterator[Service]:
    """The CRD installed, the controller running with its webhooks registered; all undone after."""
    kube = stack.kube
    workdir.mkdir(parents=True, exist_ok=True)
    certs = workdir / "certs"
    certs.mkdir(exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_cert, ca_key = make_ca(now, "gpu-tailor-e2e-jobset-ca")
    cert, key = make_serving(ca_cert, ca_key, Names("jobset-webhook", "local", ("localhost",), ("127.0.0.1",)), 7, now)
    (certs / "tls.crt").write_bytes(cert)
    (certs / "tls.key").write_bytes(key)
    port, health = free_port(), free_port()
    config = workdir / "config.yaml"
    config.write_text(f"""apiVersion: config.jobset.x-k8s.io/v1alpha1
kind: Configuration
leaderElection: {{leaderElect: false}}
internalCertManagement: {{enable: false}}
webhook: {{host: 127.0.0.1, port: {port}, certDir: "{certs}"}}
metrics: {{bindAddress: "0"}}
health: {{healthProbeBindAddress: "127.0.0.1:{health}"}}
""")
    controller = Service("jobset-controller", [str(home / "bin" / "jobset-controller"), f"--config={config}",
                                               f"--kubeconfig={stack.cp.kubeconfig}", "--zap-log-level=info"],
                         workdir / "controller.log", f"http://127.0.0.1:{health}/healthz")
    registered: list[str] = []
    stack.cp.kubectl("apply", "--server-side", "-f", str(home / "crd" / CRD_FILE))
    try:
        wait_for(lambda: _served(stack), 60, f"{API} jobsets served")
        controller.start()
        wait_for(partial(_listening, port), 30, f"JobSet's webhook server on 127.0.0.1:{port}",
                 context=controller.tail)
        for kind, doc in _registrations(port, ca_cert):
            kube.create(api_path(kind, group="admissionregistration.k8s.io/v1"), doc)
            registered.append(api_path(kind, name=REGISTRATION, group="admissionregistration.k8s.io/v1"))
        yield controller
    finally:
        for path in registered:
            kube.delete(path)
        controller.stop()
        kube.delete(api_path("customresourcedefinitions", name=CRD_NAME, group="apiextensions.k8s.io/v1"))
