"""Pod-create latency and throughput through gpu-tailor's webhook, against a trivial mutating webhook (the anchor:
``benchmarks/trivial_webhook.py``, one annotation added) and against no webhook at all, on a real control plane of
each Kubernetes release ``tests/e2e`` finds (``--release`` picks one), one after the other in the same run.

Starts the control plane on free ports, applies ``manifests/`` through the e2e harness's overlay (the
API server calls the webhook at https://127.0.0.1:PORT/mutate), creates the fixture nodes, one namespace
labelled ``gpu-tailor.io/enabled=true``, one not, and one the trivial webhook takes, and runs ``gpu-tailor webhook``
as the manifests run it (``--certs-secret``, its ServiceAccount's token) beside the trivial one. Only the webhooks
run: creates are
``dryRun=All`` (admission runs exactly as for a real create, nothing is stored and nothing scheduled),
so that 1,600 pods do not pile up between rounds. Each round creates ``--pods`` one-container pods
asking ``gpu-tailor.io/gpu-milli: "250"`` with ``--inflight`` in flight (keep-alive connections),
in each namespace in turn (the order rotates between rounds). Elsewhere the same pod is created, mutated by the
trivial webhook or not at all. Prints p50, p99 and creates/s per namespace, and the ratios of gpu-tailor's to the
trivial webhook's (goal: p50 <= 1.10, creates/s >= 0.90) and to none, per round; the last round is the one to quote
(the first warms up). Then where the difference goes: each process's CPU per create in the last round (etcd,
kube-apiserver, the webhook, this client ...), and the webhook call as the API server timed it against
the review as the webhook's handler timed it. The control plane is stopped and wiped at the end.

    python benchmarks/webhook_create_latency.py [--pods 400] [--inflight 16] [--rounds 2] [--release v1.28.7]
                                                [--store] [--py-spy OUT]

``--store`` makes real creates instead (the pods name a scheduler that does not run, so that none is
scheduled; in the opted-in namespace the webhook then leaves schedulerName alone).

``--py-spy OUT`` records the webhook process during the rounds (``py-spy record --format raw``).

``--anchor-like patch,conditions`` makes the trivial webhook more like gpu-tailor's, to tell where the difference
goes: ``patch`` answers the JSONPatch gpu-tailor's webhook answers for the same pod (asked once, before the
rounds), ``conditions`` registers it with the matchConditions of gpu-tailor's pod entries (the GPU entry's CEL
condition; the other has none).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime as dt
import json
import os
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpu_tailor.certs.authority import Names, make_ca, make_serving  # noqa: E402
from gpu_tailor.webhook import registration  # noqa: E402
from tests.conftest import free_port  # noqa: E402
from tests.e2e.cluster import (  # noqa: E402
    OPTED_IN,
    PLAIN,
    ControlPlane,
    Release,
    create_namespace,
    find_releases,
)
from tests.e2e.kube import Credentials, Kube, api_path, load_kubeconfig  # noqa: E402
from tests.e2e.services import Service, identity, install, webhook_argv  # noqa: E402


def pod(name: str, scheduler: str | None = None) -> dict[str, object]:
    spec: dict[str, object] = {"containers": [{"name": "main", "image": "nvcr.io/nvidia/cuda:12.2.0-base-ubuntu22.04",
                                               "command": ["sleep", "infinity"],
                                               "resources": {"limits": {"gpu-tailor.io/gpu-milli": "250"}}}]}
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def client_ssl(creds: Credentials, workdir: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=creds.ca_pem.decode())
    assert creds.cert_pem and creds.key_pem
    cert, key = workdir / "bench.crt", workdir / "bench.key"
    cert.write_bytes(creds.cert_pem)
    key.touch(mode=0o600)
    key.write_bytes(creds.key_pem)
    ctx.load_cert_chain(str(cert), str(key))
    return ctx


async def creates(session: aiohttp.ClientSession, server: str, namespace: str, n: int, inflight: int,
                  tag: str, store: bool = False, mark: bytes = b"gpu-tailor.io/backing"
                  ) -> tuple[list[float], float, int]:
    """``n`` creates (dry runs unless ``store``), ``inflight`` at a time: latencies (s), wall time (s), how
    many were mutated. Stored pods name a scheduler that does not run, so that none is scheduled."""
    url = f"{server}/api/v1/namespaces/{namespace}/pods" + ("" if store else "?dryRun=All")
    bodies = [json.dumps(pod(f"{tag}-{i}", "nobody" if store else None)).encode() for i in range(n)]
    latencies: list[float] = []
    mutated = 0
    queue = iter(bodies)

    async def worker() -> None:
        nonlocal mutated
        for body in queue:
            t0 = time.perf_counter()
            async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
                out = await resp.read()
                if resp.status != 201:
                    raise RuntimeError(f"create in {namespace}: HTTP {resp.status}: {out[:300]!r}")
            latencies.append(time.perf_counter() - t0)
            mutated += mark in out

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(inflight)))
    return latencies, time.perf_counter() - t0, mutated


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


TRIVIAL = "team-trivial"  # the namespace the trivial webhook takes
NAMESPACES = ((OPTED_IN, "gpu-tailor"), (TRIVIAL, "trivial"), (PLAIN, "none"))
MARKS = {OPTED_IN: b"gpu-tailor.io/backing", TRIVIAL: b"bench.gpu-tailor.io/seen"}  # what each webhook writes


async def measure(creds: Credentials, ctx: ssl.SSLContext, args: argparse.Namespace, webhook_url: str,
                  pids: dict[str, int]) -> dict[str, tuple[float, float]]:
    """The rounds; the last round's ratios of gpu-tailor's webhook to the trivial one (p50, creates/s)."""
    connector = aiohttp.TCPConnector(ssl=ctx, limit=args.inflight)
    ratios: dict[str, tuple[float, float]] = {}
    async with aiohttp.ClientSession(connector=connector) as session:
        await creates(session, creds.server, PLAIN, args.inflight, args.inflight, "warm")  # open the connections
        what = "stored" if args.store else "dry-run"
        print(f"{args.pods} {what} pod creates per namespace and round, {args.inflight} in flight "
              f"(gpu-tailor: {OPTED_IN}; trivial: {TRIVIAL}; none: {PLAIN})")
        print(f"{'round':<7}{'webhook':<12}{'p50 ms':>8}{'p99 ms':>8}{'creates/s':>11}{'mutated':>9}")
        cpu: dict[str, dict[str, float]] = {}
        for r in range(1, args.rounds + 1):
            order = [NAMESPACES[(i + r - 1) % len(NAMESPACES)][0] for i in range(len(NAMESPACES))]
            rows = {}
            for ns in order:
                before = {name: cpu_seconds(pid) for name, pid in pids.items()}
                lat, wall, mutated = await creates(session, creds.server, ns, args.pods, args.inflight, f"r{r}",
                                                   args.store, MARKS.get(ns, b"-"))
                rows[ns] = (pct(lat, 50) * 1e3, pct(lat, 99) * 1e3, len(lat) / wall, mutated)
                cpu[ns] = {name: (cpu_seconds(pid) - before[name]) * 1e3 / args.pods for name, pid in pids.items()}
            for ns, label in NAMESPACES:
                p50, p99, rate, mutated = rows[ns]
                print(f"{r:<7}{label:<12}{p50:>8.1f}{p99:>8.1f}{rate:>11.0f}{mutated:>9}")
            w = rows[OPTED_IN]
            for ns, label in NAMESPACES[1:]:
                o = rows[ns]
                ratios[label] = (w[0] / o[0], w[2] / o[2])
                print(f"{r:<7}{'/ ' + label:<12}{w[0] / o[0]:>8.2f}{w[1] / o[1]:>8.2f}{w[2] / o[2]:>11.2f}"
                      + ("   (goal: p50 <= 1.10, creates/s >= 0.90)" if label == "trivial" else ""))
        print(f"CPU ms per create, last round: {'process':<16}" + "".join(f"{label:>11}" for _, label in NAMESPACES))
        for name in pids:
            print(f"{'':<30}{name:<16}" + "".join(f"{cpu[ns][name]:>11.2f}" for ns, _ in NAMESPACES))
        print(f"{'':<30}{'all':<16}" + "".join(f"{sum(cpu[ns].values()):>11.2f}" for ns, _ in NAMESPACES))
        await call_costs(session, creds.server, webhook_url)
    return ratios


async def call_costs(session: aiohttp.ClientSession, server: str, webhook_url: str) -> None:
    """Where a create's extra time goes, over the whole run: the webhook call as the API server timed it
    (``apiserver_admission_webhook_admission_duration_seconds``) and the review as the webhook timed it."""
    async with session.get(f"{server}/metrics") as resp:
        api = metric_mean(await resp.text(), "apiserver_admission_webhook_admission_duration_seconds",
                          'name="pods.gpu-tailor.io"')
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    async with session.get(f"{webhook_url}/metrics", ssl=ctx) as resp:
        own = metric_mean(await resp.text(), "gpu_tailor_webhook_review_seconds", "")
    print(f"whole run: API server's webhook calls {api[1]:.0f}, mean {api[0] * 1e3:.2f} ms; the webhook's "
          f"reviews {own[1]:.0f}, mean {own[0] * 1e3:.2f} ms in its handler")


def metric_mean(text: str, name: str, having: str) -> tuple[float, float]:
    sums = counts = 0.0
    for line in text.splitlines():
        if having in line and line.startswith(name + "_sum"):
            sums += float(line.rsplit(" ", 1)[1])
        elif having in line and line.startswith(name + "_count"):
            counts += float(line.rsplit(" ", 1)[1])
    return (sums / counts if counts else float("nan")), counts


def trivial_webhook(cp: ControlPlane, kube: Kube, workdir: Path, like: set[str], webhook_port: int) -> Service:
    """The anchor webhook on a free port, registered for the namespace ``TRIVIAL`` alone (``like``: see
    ``--anchor-like``)."""
    now = dt.datetime.now(dt.UTC)
    ca_cert, ca_key = make_ca(now, "trivial-ca")
    cert, key = make_serving(ca_cert, ca_key, Names("trivial", "default", ips=("127.0.0.1",)), 1, now)
    (workdir / "trivial.crt").write_bytes(cert)
    (workdir / "trivial.key").write_bytes(key)
    port = free_port()
    argv = [sys.executable, str(REPO / "benchmarks" / "trivial_webhook.py"), "--listen", f"127.0.0.1:{port}",
            "--tls-cert", str(workdir / "trivial.crt"), "--tls-key", str(workdir / "trivial.key")]
    if "patch" in like:
        (workdir / "patch.json").write_bytes(gpu_tailors_patch(kube, webhook_port))
        argv += ["--patch", str(workdir / "patch.json")]
    service = Service("trivial webhook", argv, workdir / "trivial.log", f"https://127.0.0.1:{port}/readyz")
    service.start()
    create_namespace(kube, TRIVIAL, {"bench.gpu-tailor.io/trivial": "true"})
    kube.create(api_path("mutatingwebhookconfigurations", group="admissionregistration.k8s.io/v1"), {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "bench-trivial"},
        "webhooks": [{"name": "trivial.bench.gpu-tailor.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                      "failurePolicy": "Fail", "timeoutSeconds": 5, "reinvocationPolicy": "Never",
                      "clientConfig": {"url": f"https://127.0.0.1:{port}/mutate",
                                       "caBundle": base64.b64encode(ca_cert).decode()},
                      "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                 "resources": ["pods"], "scope": "Namespaced"}],
                      "namespaceSelector": {"matchLabels": {"bench.gpu-tailor.io/trivial": "true"}}}
                     | ({"matchConditions": [c for h in registration.webhook_configuration("x", "y")["webhooks"]
                                             if h["name"] in (registration.GPU_HOOK, registration.CPU_HOOK)
                                             for c in h.get("matchConditions", [])]} if "conditions" in like else {})]})
    return service


def gpu_tailors_patch(kube: Kube, webhook_port: int) -> bytes:
    """The JSONPatch gpu-tailor's webhook answers for the benchmark's pod, as the API server would send it (the pod
    defaulted: a dry-run create where no webhook acts)."""
    defaulted = kube.create(api_path("pods", PLAIN), pod("patch-probe"), dry_run=True)
    defaulted["metadata"]["namespace"] = OPTED_IN
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "bench", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": OPTED_IN, "operation": "CREATE",
        "userInfo": {"username": "bench"}, "object": defaulted, "dryRun": True}}
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    request = urllib.request.Request(f"https://127.0.0.1:{webhook_port}/mutate", data=json.dumps(review).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, context=ctx, timeout=10) as resp:
        ops = json.loads(base64.b64decode(json.loads(resp.read())["response"]["patch"]))
    # and the trivial webhook's own mark, which the benchmark looks for (the annotations exist by then)
    return json.dumps([*ops, {"op": "add", "path": "/metadata/annotations/bench.gpu-tailor.io~1seen",
                              "value": "true"}]).encode()


def run_release(release: Release, args: argparse.Namespace) -> dict[str, tuple[float, float]]:
    started = time.monotonic()
    like = {p for p in (args.anchor_like or "").split(",") if p}
    print(f"== {release.version}")
    with tempfile.TemporaryDirectory(prefix="gpu-tailor-bench-") as tmp:
        workdir = Path(tmp)
        cp = ControlPlane(release, workdir / "k8s")
        services: list[Service] = []
        try:
            cp.up()
            creds = load_kubeconfig(cp.kubeconfig)
            kube = Kube(creds, workdir / "admin")
            port = free_port()
            rendered = install(cp, kube, workdir, port)
            argv = webhook_argv(rendered, port, identity(cp, kube, rendered, "gpu-tailor-webhook", workdir))
            if args.source:  # the same command from another tree's gpu_tailor package
                code = f"import sys; sys.path.insert(0, {str(Path(args.source).resolve())!r}); " \
                       "from gpu_tailor.cli import main; sys.exit(main(sys.argv[1:]))"
                argv = [sys.executable, "-c", code, *argv[3:]]
            webhook = Service("gpu-tailor webhook", argv, workdir / "webhook.log",
                              f"https://127.0.0.1:{port}/readyz")
            services.append(webhook)
            webhook.start()
            services.append(trivial := trivial_webhook(cp, kube, workdir, like, port))
            ctx = client_ssl(creds, workdir)
            asyncio.run(wait_mutating(creds, ctx, OPTED_IN, b"gpu-tailor.io/backing"))
            asyncio.run(wait_mutating(creds, ctx, TRIVIAL, b"bench.gpu-tailor.io/seen"))
            print(f"(control plane and webhooks up in {time.monotonic() - started:.0f} s)")
            spy = None
            if args.py_spy:
                assert webhook.proc is not None
                spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--pid",
                                        str(webhook.proc.pid), "--format", "raw", "--rate", "500", "--nonblocking",
                                        "-o", args.py_spy], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            try:
                pids = {p.stem: int(p.read_text()) for p in sorted((cp.home / "run" / "pids").glob("*.pid"))}
                pids |= {"webhook": webhook.proc.pid if webhook.proc else 0,
                         "trivial": trivial.proc.pid if trivial.proc else 0, "this client": os.getpid()}
                ratios = asyncio.run(measure(creds, ctx, args, f"https://127.0.0.1:{port}", pids))
            finally:
                if spy is not None:
                    spy.send_signal(signal.SIGINT)
                    spy.wait(timeout=30)
        finally:
            for service in services:
                service.stop()
            cp.down()
    print(f"({release.version}: {time.monotonic() - started:.0f} s)")
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=400)
    parser.add_argument("--inflight", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--release", metavar="VERSION", help="only this release (default: every one found)")
    parser.add_argument("--store", action="store_true", help="real creates (stored, never scheduled), not dry runs")
    parser.add_argument("--source", metavar="DIR", help="run the webhook from DIR/gpu_tailor, e.g. "
                        "`git archive HEAD gpu_tailor | tar -x -C DIR`, to compare two commits")
    parser.add_argument("--py-spy", metavar="OUT", help="record the webhook with py-spy (raw format) into OUT")
    parser.add_argument("--anchor-like", metavar="PARTS", help="patch,conditions: the trivial webhook answers "
                        "gpu-tailor's patch, or is registered with its matchConditions")
    args = parser.parse_args()
    if not {p for p in (args.anchor_like or "").split(",") if p} <= {"patch", "conditions"}:
        parser.error("--anchor-like takes patch and/or conditions")
    releases, why = find_releases()
    releases = [r for r in releases if args.release in (None, r.version, r.version.lstrip("v"))]
    if not releases:
        print(f"no Kubernetes release to run on: {why or args.release}", file=sys.stderr)
        return 2
    summary = {r.version: run_release(r, args) for r in releases}
    print("\nlast round, gpu-tailor's webhook against the trivial one (goal: p50 <= 1.10, creates/s >= 0.90)")
    print(f"{'release':<10}{'p50':>8}{'creates/s':>11}")
    for version, ratios in summary.items():
        p50, rate = ratios["trivial"]
        print(f"{version:<10}{p50:>8.2f}{rate:>11.2f}")
    return 0


async def wait_mutating(creds: Credentials, ctx: ssl.SSLContext, namespace: str, mark: bytes,
                        timeout: float = 30) -> None:
    """Until a dry-run create in ``namespace`` comes back carrying ``mark`` (the webhook is called: caBundle in place,
    configuration seen by the API server)."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:
        while True:
            try:
                _, _, mutated = await creates(session, creds.server, namespace, 1, 1, f"probe-{time.monotonic_ns()}",
                                              mark=mark)
                if mutated:
                    return
            except RuntimeError:  # refused while the webhook's CA is not in the caBundle yet
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the API server never called the webhook")
            await asyncio.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
