"""Admission through a real kube-apiserver: the captured pods (fixtures a..l) created for real in the opted-in
namespace, read back as the API server stored them; opt-in and opt-out; server-side dry run.

Expected values are written out by hand from what a person asks for on the fixture nodes, never computed
with gpu-tailor's own code.
"""

from __future__ import annotations

import base64
import datetime as dt
import http.server
import json
import re
import ssl
import threading
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpu_tailor.certs.authority import Names, make_ca, make_serving
from tests.e2e.kube import ApiError, api_path, wait_for
from tests.e2e.pods import Pods, gpu_pod, limits_of, pod_from_review, requests_of, unique
from tests.e2e.services import SCHEDULER_NAME, Stack, event_sources, pod_events

pytestmark = pytest.mark.e2e

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
H100, A100_40, T4_SHARED = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB", "Tesla-T4-SHARED"


@dataclass(frozen=True)
class Admitted:
    """What the stored pod must hold: per container its limits (requests must equal them), the backing
    annotation, required node-affinity values by key, and a warning the API server passed on."""

    limits: dict[str, dict[str, str]]
    backing: str | None = None
    affinity: dict[str, list[str]] = field(default_factory=dict)
    warning: str = ""
    scheduler: str = SCHEDULER_NAME
    gpu: bool = True


ADMITTED = {
    "a": Admitted({"main": {"nvidia.com/gpu": "2"}}, "native"),
    # requests only: the webhook adds the limit the API server would otherwise refuse the pod for
    "b": Admitted({"main": {"nvidia.com/gpu": "1"}}, "native"),
    "d": Admitted({"main": {"nvidia.com/gpu": "1"}}, "shared:time-slicing:4", {
        "nvidia.com/gpu.product": [T4_SHARED], "nvidia.com/gpu.sharing-strategy": ["time-slicing"],
        "nvidia.com/gpu.replicas": ["4"]}),
    "e": Admitted({"main": {"nvidia.com/mig-2g.10gb": "1"}}, "mig-2g.10gb", {
        "nvidia.com/gpu.product": [A100_40], "nvidia.com/mig.strategy": ["mixed"]}),
    "f": Admitted({"main": {"nvidia.com/mig-2g.10gb": "1"}}, "mig-2g.10gb", {
        "nvidia.com/gpu.product": [A100_40], "nvidia.com/mig.strategy": ["mixed"]}),
    "g": Admitted({"main": {"nvidia.com/gpu.shared": "2"}}, "native", warning="not combined into more GPU"),
    "h": Admitted({"main": {"nvidia.com/mig-1g.5gb": "1"}}, "native"),
    "i": Admitted({"main": {"nvidia.com/gpu": "1"}}, "whole", {"nvidia.com/gpu.product": [H100]}),
    "k": Admitted({"init-gpu": {"nvidia.com/gpu": "1"}, "trainer": {"nvidia.com/gpu": "1"}, "sidecar": {}}, "whole",
                  {"nvidia.com/gpu.product": [H100]}),
    # no GPU ask: only the scheduler changes (the webhook's cpuOnlyPods), no GPU toleration
    "l": Admitted({"main": {}}, gpu=False),
}


def required_affinity(pod: dict[str, Any]) -> dict[str, list[str]]:
    terms = (((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [{}]
    return {e["key"]: e.get("values", []) for e in terms[0].get("matchExpressions") or []}


@pytest.mark.parametrize("letter", sorted(ADMITTED))
def test_fixture_pod_is_stored_as_the_webhook_rewrote_it(letter: str, cluster: Stack, pods: Pods) -> None:
    want = ADMITTED[letter]
    sent = pod_from_review(letter)
    if letter == "a":  # the user sent limits only; the API server defaults requests to them
        sent["spec"]["containers"][0]["resources"].pop("requests")
    created = pods.create(cluster.opted_in, sent)
    warnings = list(cluster.kube.warnings)
    stored = pods.get(created)

    for container, limits in want.limits.items():
        assert limits_of(stored, container) == limits, f"{letter}: container {container} limits"
        assert requests_of(stored, container) == limits, f"{letter}: container {container} requests != limits"
    annotations = stored["metadata"].get("annotations") or {}
    assert annotations.get("gpu-tailor.io/backing") == want.backing
    assert stored["spec"]["schedulerName"] == want.scheduler
    affinity = required_affinity(stored)
    for key, values in want.affinity.items():
        assert affinity.get(key) == values, f"{letter}: required node affinity {key} in {affinity}"
    assert (GPU_TOLERATION in stored["spec"].get("tolerations", [])) == want.gpu
    if want.warning:
        assert any(want.warning in w for w in warnings), f"API server warnings: {warnings}"
    else:
        assert warnings == []


def test_mismatched_requests_and_limits_are_denied_with_a_reason(cluster: Stack, pods: Pods) -> None:
    sent = pod_from_review("c")
    with pytest.raises(ApiError) as denied:
        pods.create(cluster.opted_in, sent)
    message = denied.value.message
    assert 'admission webhook "pods.gpu-tailor.io" denied the request' in message
    assert "container main: nvidia.com/gpu requests (1) must equal limits (2)" in message
    assert denied.value.status == 422
    assert not cluster.kube.exists(api_path("pods", cluster.opted_in, sent["metadata"]["name"]))


def test_dry_run_answers_the_rewritten_pod_and_stores_nothing(cluster: Stack) -> None:
    sent = pod_from_review("j")
    answer = cluster.kube.create(api_path("pods", cluster.opted_in), sent, dry_run=True)
    assert limits_of(answer, "main") == requests_of(answer, "main") == {"nvidia.com/gpu": "1"}
    assert answer["metadata"]["annotations"]["gpu-tailor.io/backing"] == "shared:time-slicing:4"
    assert answer["spec"]["schedulerName"] == SCHEDULER_NAME
    assert not cluster.kube.exists(api_path("pods", cluster.opted_in, sent["metadata"]["name"]))
    names = [p["metadata"]["name"] for p in cluster.kube.list(api_path("pods", cluster.opted_in))]
    assert sent["metadata"]["name"] not in names


def assert_untouched_and_pending(cluster: Stack, pods: Pods, namespace: str, labels: dict[str, str]) -> None:
    """Not mutated: the portable ask reaches the default scheduler, which finds no node offering it."""
    created = pods.create(namespace, gpu_pod(unique("portable"), {"gpu-tailor.io/gpu-milli": "250"}, labels=labels))
    stored = pods.get(created)
    assert limits_of(stored, "main") == requests_of(stored, "main") == {"gpu-tailor.io/gpu-milli": "250"}
    assert stored["spec"]["schedulerName"] == "default-scheduler"
    assert not any(k.startswith("gpu-tailor.io/") for k in stored["metadata"].get("annotations") or {})
    assert GPU_TOLERATION not in stored["spec"].get("tolerations", [])
    events = wait_for(lambda: [e for e in pod_events(cluster.kube, stored) if e.startswith("FailedScheduling")], 30,
                      "the default scheduler's FailedScheduling event", context=cluster.context)
    assert "Insufficient gpu-tailor.io/gpu-milli" in events[0]
    assert set(event_sources(cluster.kube, stored, "FailedScheduling")) == {"default-scheduler"}
    assert not pods.get(created)["spec"].get("nodeName")


def test_namespace_without_the_label_is_left_alone(cluster: Stack, pods: Pods) -> None:
    assert_untouched_and_pending(cluster, pods, cluster.plain, {})


def test_skip_label_opts_a_pod_out_in_an_opted_in_namespace(cluster: Stack, pods: Pods) -> None:
    assert_untouched_and_pending(cluster, pods, cluster.opted_in, {"gpu-tailor.io/skip": "true"})


def test_a_pod_without_containers_gets_the_api_servers_own_reason(cluster: Stack) -> None:
    """The match condition never errs on a pod the API server will refuse anyway: the user reads what is wrong
    with the pod, not a CEL error about a null list."""
    with pytest.raises(ApiError) as refused:
        cluster.kube.create(api_path("pods", cluster.opted_in), {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": unique("no-containers")}, "spec": {}})
    assert refused.value.status == 422, refused.value.message
    assert "spec.containers: Required value" in refused.value.message
    assert "expression" not in refused.value.message



class Injector:
    """Another team's mutating webhook, run here over TLS on loopback: it gives every pod labelled
    ``inject-gpu=true`` a GPU limit, after gpu-tailor's entries ran (its configuration sorts after theirs)."""

    def __init__(self, workdir: Path) -> None:
        now = dt.datetime.now(dt.UTC)
        ca_cert, ca_key = make_ca(now, "injector-ca")
        cert, key = make_serving(ca_cert, ca_key, Names("injector", "default", ips=("127.0.0.1",)), 1, now)
        (workdir / "injector.crt").write_bytes(cert)
        (workdir / "injector.key").write_bytes(key)
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(str(workdir / "injector.crt"), str(workdir / "injector.key"))
        self.ca = base64.b64encode(ca_cert).decode()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.socket = self.ctx.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                patch = [{"op": "add", "path": "/spec/containers/0/resources",
                          "value": {"limits": {"nvidia.com/gpu": "1"}}}]
                body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {
                    "uid": review["request"]["uid"], "allowed": True, "patchType": "JSONPatch",
                    "patch": base64.b64encode(json.dumps(patch).encode()).decode()}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        return Handler

    def configuration(self) -> dict[str, Any]:
        return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                "metadata": {"name": "z-gpu-injector"},
                "webhooks": [{"name": "inject.example.com", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                              "failurePolicy": "Fail", "reinvocationPolicy": "Never",
                              "clientConfig": {"url": f"https://127.0.0.1:{self.server.server_address[1]}/inject",
                                               "caBundle": self.ca},
                              "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                         "resources": ["pods"], "scope": "Namespaced"}],
                              "objectSelector": {"matchLabels": {"inject-gpu": "true"}}}]}


def test_a_gpu_ask_added_by_a_later_webhook_is_handled_too(cluster: Stack, pods: Pods) -> None:
    """A CPU-only pod that another webhook gives a GPU ask after gpu-tailor's entries ran: the API server reinvokes
    only webhooks it has called once, and cpu-pods.gpu-tailor.io (every CREATE) was called, so the native ask is
    checked and given what gpu-tailor gives one (the GPU toleration), not stored unseen."""
    injector = Injector(cluster.workdir)
    injector.thread.start()
    path = api_path("mutatingwebhookconfigurations", name="z-gpu-injector", group="admissionregistration.k8s.io/v1")
    try:
        cluster.kube.create(api_path("mutatingwebhookconfigurations", group="admissionregistration.k8s.io/v1"),
                            injector.configuration())
        pod = gpu_pod(unique("injected"), {"cpu": "100m"}, labels={"inject-gpu": "true"})
        pod["spec"]["containers"][0]["resources"] = {}

        def injected() -> bool:  # until the API server's view of webhook configurations has the injector
            answer = cluster.kube.create(api_path("pods", cluster.opted_in), pod, dry_run=True)
            return bool(limits_of(answer, "main"))

        wait_for(injected, 30, "the API server to call the injector", interval=0.2, context=cluster.context)
        before = reviews(cluster)
        stored = pods.get(pods.create(cluster.opted_in, pod))
        # called as a CPU-only pod (the second entry), then again once the injector gave it a GPU ask
        assert reviews(cluster) - before == 2
        assert limits_of(stored, "main") == requests_of(stored, "main") == {"nvidia.com/gpu": "1"}
        assert GPU_TOLERATION in stored["spec"].get("tolerations", []), stored["spec"].get("tolerations")
    finally:
        if cluster.kube.exists(path):
            cluster.kube.delete(path)
        injector.server.shutdown()
        injector.server.server_close()


def reviews(stack: Stack) -> float:
    """Admission reviews the webhook has answered so far (its ``gpu_tailor_webhook_reviews_total``, every label)."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # a loopback scrape of the test's own webhook
    url = stack.webhook.ready_url.rsplit("/", 1)[0] + "/metrics"
    with urllib.request.urlopen(url, context=context, timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(v) for v in re.findall(r"^gpu_tailor_webhook_reviews_total\{[^}]*\} (\S+)$", text, re.M))


@pytest.mark.parametrize("kind", ["portable", "native", "cpu-only"])
def test_one_webhook_call_per_pod_create(cluster: Stack, pods: Pods, kind: str) -> None:
    """The first entry rewrites a GPU pod and writes its marker, which the second entry's condition skips; a CPU-only
    pod goes to the second entry alone. Pinned to no node, so nothing after the create (a bind) touches it."""
    limits = {"portable": {"gpu-tailor.io/gpu-milli": "250"}, "native": {"nvidia.com/gpu": "1"},
              "cpu-only": {"cpu": "100m"}}[kind]
    before = reviews(cluster)
    stored = pods.create(cluster.opted_in, gpu_pod(unique(f"once-{kind}"), limits, node="nowhere"))
    assert reviews(cluster) - before == 1
    assert stored["spec"]["schedulerName"] == SCHEDULER_NAME
    backing = (stored["metadata"].get("annotations") or {}).get("gpu-tailor.io/backing")
    assert backing == {"portable": "shared:time-slicing:4", "native": "native", "cpu-only": None}[kind], backing
