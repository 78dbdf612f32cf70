"""The webhook's own certificate on a real API server: the caBundle it writes is what the API server
trusts, a re-apply of manifests/ leaves admission working, and rotations (of the serving certificate,
of the CA, with a second replica sharing the Secret) happen while pods are created, refusing none."""

from __future__ import annotations

import base64
import datetime as dt
import socket
import ssl
from collections.abc import Callable
from typing import Any

import pytest
from cryptography import x509

from gpu_tailor.certs.authority import Names, make_ca, make_serving, split_pem
from tests.conftest import free_port
from tests.e2e.kube import Kube, api_path, wait_for
from tests.e2e.load import Creates
from tests.e2e.pods import Pods, gpu_pod, limits_of, unique
from tests.e2e.services import Service, Stack

pytestmark = pytest.mark.e2e

CONFIG = api_path("mutatingwebhookconfigurations", name="gpu-tailor", group="admissionregistration.k8s.io/v1")


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def secret_path(stack: Stack) -> str:
    namespace, name = flag(stack.webhook.argv, "--certs-secret").split("/")
    return api_path("secrets", namespace, name)


def secret_data(stack: Stack) -> tuple[dict[str, bytes], str]:
    obj = stack.kube.get(secret_path(stack))
    return {k: base64.b64decode(v) for k, v in obj["data"].items()}, obj["metadata"]["resourceVersion"]


def ca_bundles(kube: Kube) -> list[bytes]:
    return [base64.b64decode(h["clientConfig"].get("caBundle", "")) for h in kube.get(CONFIG)["webhooks"]]


def port_of(service: Service) -> int:
    return int(service.ready_url.split(":")[2].split("/")[0])


def served(port: int, bundle: bytes) -> x509.Certificate:
    """The certificate a fresh TLS connection gets, verified as the API server verifies it: against
    the caBundle and for the host of the webhook's URL (127.0.0.1)."""
    ctx = ssl.create_default_context(cadata=bundle.decode())
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def serves(port: int, bundle: bytes, cert: x509.Certificate) -> Callable[[], bool]:
    return lambda: served(port, bundle) == cert


def names(stack: Stack) -> Names:
    namespace = flag(stack.webhook.argv, "--certs-secret").split("/")[0]
    return Names(flag(stack.webhook.argv, "--service"), namespace, ips=("127.0.0.1",))


def test_the_webhook_writes_the_ca_the_api_server_trusts(cluster: Stack) -> None:
    data, _ = secret_data(cluster)
    assert {"ca.crt", "ca.key", "tls.crt", "tls.key"} <= set(data)
    bundles = ca_bundles(cluster.kube)
    assert bundles and all(split_pem(b)[0] == data["ca.crt"] for b in bundles)
    cert = served(port_of(cluster.webhook), bundles[0])
    assert cert == x509.load_pem_x509_certificate(data["tls.crt"])
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    n = names(cluster)
    assert set(n.dns()) <= set(san.get_values_for_type(x509.DNSName))
    # the applied configuration never held a caBundle: the webhook patched it in
    applied = cluster.rendered.get("MutatingWebhookConfiguration", "gpu-tailor")
    assert all("caBundle" not in h["clientConfig"] for h in applied["webhooks"])


def test_applying_the_manifests_twice_leaves_admission_working(cluster: Stack, pods: Pods) -> None:
    before = ca_bundles(cluster.kube)
    cluster.cp.kubectl("apply", "-k", str(cluster.overlay))
    cluster.cp.kubectl("apply", "-k", str(cluster.overlay))
    assert ca_bundles(cluster.kube) == before
    # straight away, not after the webhook's next check
    created = pods.create(cluster.opted_in, gpu_pod(unique("after-reapply"), {"gpu-tailor.io/gpu-milli": "250"}))
    assert "gpu-tailor.io/gpu-milli" not in limits_of(pods.get(created), "main")
    # server-side apply (kubectl apply --server-side) leaves a field another manager owns alone too
    cluster.cp.kubectl("apply", "--server-side", "--force-conflicts", "-k", str(cluster.overlay))
    assert ca_bundles(cluster.kube) == before
    pods.create(cluster.opted_in, gpu_pod(unique("after-ssa"), {"gpu-tailor.io/gpu-milli": "250"}))


def put_secret(stack: Stack, data: dict[str, bytes], resource_version: str) -> None:
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": secret_path(stack).rsplit("/", 1)[1],
                     "namespace": flag(stack.webhook.argv, "--certs-secret").split("/")[0],
                     "resourceVersion": resource_version},
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}
    stack.kube.request("PUT", secret_path(stack), body)


def test_rotations_while_pods_are_created_refuse_none(cluster: Stack) -> None:
    port = port_of(cluster.webhook)
    second = Service("gpu-tailor webhook replica 2",
                     [*cluster.webhook.argv[:cluster.webhook.argv.index("--listen")], "--listen",
                      f"127.0.0.1:{(p2 := free_port())}",
                      *cluster.webhook.argv[cluster.webhook.argv.index("--listen") + 2:]],
                     cluster.workdir / "logs" / "webhook-2.log", f"https://127.0.0.1:{p2}/readyz")
    load = Creates(cluster)
    try:
        with load.running():
            load.more(5, "before any rotation")

            # 1. a second replica starts on the same Secret: it serves the same certificate
            second.start()
            bundle = ca_bundles(cluster.kube)[0]
            assert served(p2, bundle) == served(port, bundle)

            # 2. the serving certificate is renewed (as another replica renewing it would): both
            # replicas adopt it, the API server keeps trusting it
            data, rv = secret_data(cluster)
            now = dt.datetime.now(dt.UTC)
            cert, key = make_serving(data["ca.crt"], data["ca.key"], names(cluster), 90, now)  # not due for renewal
            put_secret(cluster, {**data, "tls.crt": cert, "tls.key": key}, rv)
            new = x509.load_pem_x509_certificate(cert)
            for p in (port, p2):
                wait_for(serves(p, bundle, new), 15, f"the replica on {p} to serve the renewed pair")
            load.more(10, "after the serving certificate was renewed")

            # 3. the CA nears its end: a replica makes a new CA, the bundle trusts both while the
            # replicas move to a certificate from the new one
            old_ca, old_key = make_ca(now - dt.timedelta(days=3650 - 10))  # 10 days left
            cert, key = make_serving(old_ca, old_key, names(cluster), 5, now)
            data, rv = secret_data(cluster)
            # first make the API server trust the old CA, as it would after the previous rotation
            cluster.kube.patch(CONFIG, [{"op": "replace", "path": f"/webhooks/{i}/clientConfig/caBundle",
                                         "value": base64.b64encode(old_ca + data["ca.crt"]).decode()}
                                        for i in range(len(ca_bundles(cluster.kube)))], "json")
            put_secret(cluster, {"ca.crt": old_ca, "ca.key": old_key, "tls.crt": cert, "tls.key": key}, rv)

            def moved() -> bool:
                stored, _ = secret_data(cluster)
                return stored["ca.crt"] != old_ca and stored.get("ca-previous.crt") == old_ca

            wait_for(moved, 15, "a replica to replace the CA near its end")
            data, _ = secret_data(cluster)

            def trusted() -> bytes:  # replicas racing to rotate may leave a loser's CA in it too
                bundle = ca_bundles(cluster.kube)[0]
                return bundle if {data["ca.crt"], old_ca} <= set(split_pem(bundle)) else b""

            bundle = wait_for(trusted, 15, "the caBundle to trust the new CA and the old one")
            new = x509.load_pem_x509_certificate(data["tls.crt"])
            assert new.issuer == x509.load_pem_x509_certificate(data["ca.crt"]).subject
            for p in (port, p2):
                wait_for(serves(p, bundle, new), 15, f"the replica on {p} to serve the new CA's pair")
            load.more(10, "after the CA was rotated")
    finally:
        second.stop()
    assert load.failures == [], f"{len(load.failures)} creates refused during rotation: {load.failures[:5]}"
    assert load.ok >= 25
    # The API server keeps its connections to the webhook open; a restart makes it open new ones,
    # which must trust what the webhook now serves (from the new CA).
    cluster.webhook.restart()
    cluster.wait_admission_works(timeout=10)
