"""Peak memory and time to ready of the webhook and the extender, as processes, at 10,000, 50,000 and
100,000 active pods (issue 31).

A fake API server runs in a second process and serves ``GET /api/v1/nodes`` and ``GET /api/v1/pods``
the way kube-apiserver does: pages of the ``limit`` the client asks for, linked by ``continue``
tokens, every page built once before the server opens (so that the server is never what a service
waits for); ``watch=true`` is answered with a stream that stays open and idle (a BOOKMARK every 20 s
when the client allows them, as the API server sends them, so no watch is dropped for being quiet).
The ``fieldSelector`` both services send (``status.phase!=Succeeded,status.phase!=Failed``) is
ignored: every pod served is Running. Nodes are the nine fixture nodes renamed in turn
(``fixture_cluster``, 2,000 by default). Pods are realistic: the pod the real API server sent in
``tests/fixtures/watch`` (managedFields and all), bound and Running, made a Deployment's pod --
``app``/``pod-template-hash`` labels and two more, a ReplicaSet ``ownerReference`` (controller),
``status`` with five conditions, IPs and a running ``containerStatuses`` entry -- some 3.7 KB of JSON
each (the mean is in the table's header). The pods are spread evenly over the nodes; on each node as
many one-unit GPU pods as its first GPU offering has units (as ``extender_state.py`` does), CPU-only
pods for the rest. The table says how many hold a GPU: the webhook keeps only those (a node and what
it holds), the extender a record of every pod.

Each service is then started as its own process with the project's CLI, pointed at the fake server by
a kubeconfig (server ``http://127.0.0.1:PORT``, a dummy token), the webhook with a serving
certificate made by ``gpu-tailor certs``::

    gpu-tailor webhook  --listen 127.0.0.1:P --tls-cert tls.crt --tls-key tls.key --kubeconfig KCFG
    gpu-tailor extender --listen 127.0.0.1:P --kubeconfig KCFG

    python benchmarks/service_memory.py [--pods 10000,50000,100000] [--nodes 2000] [--services webhook,extender]

Measured, per service and pod count (one fake server per pod count, its counters reset per service):
- ready: seconds from the process's start until ``GET /readyz`` answers 200 (over HTTPS, unverified,
  for the webhook): the node and pod lists are done;
- peak RSS after start: ``VmHWM`` of ``/proc/PID/status`` once ready and ``--settle`` seconds more
  (a late peak: the high-water mark only grows);
- relist: the first pod watch the service opens is held until then and now answered with a 410 Gone
  ERROR event and closed, as the API server tells a watch whose resourceVersion fell out of its
  window; the service lists every pod again into its full state. Seconds from the 410 until the
  service opens its next pod watch (which it does once the relist is done; that watch idles), and
  ``VmHWM`` after that (a short settle later);
- RSS at end: ``VmRSS`` then (what the process holds, once the relist's garbage is freed).

The numbers are the processes' own, on this machine; CPU contention from other processes slows
``ready`` and ``relist`` but leaves the memory alone. Notes under the table flag anything the fake
server saw that was not planned (a service listing more often than the one relist, a path it does
not serve).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.fixture_cluster import fixture_nodes
from gpu_tailor.gpumodel.inventory import from_node

ROOT = Path(__file__).resolve().parents[1]
CLI = ROOT / ".venv" / "bin" / "gpu-tailor"
POD_FIXTURE = ROOT / "tests/fixtures/watch/pods-watch-create-bind-delete.ndjson"
RESOURCE_VERSION = "1000"
REPLICAS = 10  # pods per ReplicaSet
BOOKMARK_EVERY = 20.0  # seconds between two bookmarks on an idle watch (the API server: about a minute)
EXPIRED = orjson.dumps({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                                     "status": "Failure", "code": 410, "reason": "Expired",
                                                     "message": "too old resource version: 1000 (1001)"}}) + b"\n"
TRUE = {"1", "t", "T", "true", "True", "TRUE"}  # what the API server's strconv.ParseBool takes as true
PROXY_VARS = {"http_proxy", "https_proxy", "all_proxy", "no_proxy"}


# ----- the pods -----
def pod_template() -> bytes:
    """The real pod as a Running Deployment pod, with ``@MARKERS@`` where each pod differs (``@RES@``,
    the container's resources, stands for a JSON object)."""
    pod: dict[str, Any] = json.loads(POD_FIXTURE.read_bytes().splitlines()[1])["object"]
    meta = pod["metadata"]
    meta.update(name="@NAME@", generateName="@APP@-@HASH@-", namespace="bench", uid="@UID@",
                resourceVersion="@RV@", creationTimestamp="2026-11-21T05:36:09Z",
                labels={"app": "@APP@", "pod-template-hash": "@HASH@", "app.kubernetes.io/name": "@APP@",
                        "app.kubernetes.io/part-of": "training"},
                ownerReferences=[{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "@APP@-@HASH@",
                                  "uid": "@OWNER@", "controller": True, "blockOwnerDeletion": True}])
    container = pod["spec"]["containers"][0]
    container["resources"] = "@RES@"
    pod["spec"]["nodeName"] = "@NODE@"
    pod["status"] = {
        "phase": "Running", "hostIP": "@HOSTIP@", "hostIPs": [{"ip": "@HOSTIP@"}], "podIP": "@PODIP@",
        "podIPs": [{"ip": "@PODIP@"}], "startTime": "2026-11-21T05:36:10Z", "qosClass": "Burstable",
        "conditions": [{"type": t, "status": "True", "lastProbeTime": None,
                        "lastTransitionTime": "2026-11-21T05:36:12Z"}
                       for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                                 "PodScheduled")],
        "containerStatuses": [{
            "name": container["name"], "state": {"running": {"startedAt": "2026-11-21T05:36:11Z"}},
            "lastState": {}, "ready": True, "restartCount": 0, "image": container["image"],
            "imageID": "nvcr.io/nvidia/cuda@sha256:" + "4f3c" * 16, "containerID": "containerd://@CID@",
            "started": True}]}
    return orjson.dumps(pod).replace(b'"@RES@"', b"@RES@")


def uuid_like(kind: int, n: int) -> bytes:
    return f"{n:08x}-{kind:04x}-4{n % 4096:03x}-8{n % 4096:03x}-{n * 2654435761 % 16**12:012x}".encode()


def cluster(n_nodes: int, n_pods: int) -> tuple[list[bytes], list[bytes], int]:
    """The nodes and the pods, as JSON, and how many of the pods hold a GPU; the pods spread evenly over
    the nodes (built by substitution into the template's parts: 100,000 deep copies would take a minute)."""
    nodes = fixture_nodes(n_nodes)
    parts = re.split(rb"@([A-Z]+)@", pod_template())  # literal, marker, literal, ...
    cpu = orjson.dumps({"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}})
    pods: list[bytes] = []
    gpu_pods = 0
    for i, node in enumerate(nodes):
        here = n_pods // n_nodes + (1 if i < n_pods % n_nodes else 0)
        offer = next(iter(from_node(node).offerings), None)
        gpu = (orjson.dumps({"requests": {str(offer.resource): "1", "cpu": "1", "memory": "4Gi"},
                             "limits": {str(offer.resource): "1", "memory": "4Gi"}}) if offer else cpu)
        units = min(offer.allocatable, here) if offer else 0
        gpu_pods += units
        values = {b"NODE": node["metadata"]["name"].encode(), b"HOSTIP": f"10.{i // 256}.{i % 256}.1".encode()}
        for j in range(here):
            k = len(pods)
            rs = k // REPLICAS
            values.update({b"APP": b"train-%d" % (rs // 4), b"HASH": b"%010x" % (rs * 2654435761 % 16**10),
                           b"UID": uuid_like(1, k), b"OWNER": uuid_like(2, rs), b"RV": b"%d" % (k + 1),
                           b"CID": b"%064x" % (k * 0x9E3779B97F4A7C15 % 16**64),
                           b"PODIP": f"10.{128 + k // 65536}.{k // 256 % 256}.{k % 256}".encode(),
                           b"RES": gpu if j < units else cpu})
            values[b"NAME"] = b"%s-%s-%05x" % (values[b"APP"], values[b"HASH"], k)
            pods.append(b"".join(values[p] if n % 2 else p for n, p in enumerate(parts)))
    return [orjson.dumps(n) for n in nodes], pods, gpu_pods


# ----- the fake API server (second process) -----
@dataclass
class Served:
    """The prebuilt pages, and what the server saw since the last reset."""

    items: dict[str, list[bytes]]
    pages: dict[tuple[str, int], dict[int, bytes]] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    expire: asyncio.Event = field(default_factory=asyncio.Event)

    def reset(self) -> None:
        self.expire = asyncio.Event()
        self.stats = {"nodes_lists": 0, "pods_lists": 0, "nodes_last_pages": 0, "pods_last_pages": 0,
                      "nodes_watches": 0, "pods_watches": 0, "limits": [], "late_pages": 0, "unknown": []}

    def one_page(self, kind: str, limit: int, start: int) -> bytes:
        items = self.items[kind]
        meta = {"resourceVersion": RESOURCE_VERSION}
        if start + limit < len(items):
            meta["continue"] = str(start + limit)  # opaque to the client, which sends it back
            meta["remainingItemCount"] = str(len(items) - start - limit)
        list_kind = {"nodes": "NodeList", "pods": "PodList"}[kind]
        head = orjson.dumps({"kind": list_kind, "apiVersion": "v1", "metadata": meta})[:-1]
        return head + b',"items":[' + b",".join(items[start:start + limit]) + b"]}"

    def build(self, kind: str, limit: int) -> dict[int, bytes]:
        return {start: self.one_page(kind, limit, start)
                for start in range(0, max(len(self.items[kind]), 1), limit)}

    def page(self, kind: str, limit: int, start: int) -> bytes:
        """One page, as built before the server opened (a limit or start never seen before is built now,
        and kept)."""
        built = self.pages.setdefault((kind, limit), {})
        if start not in built:
            self.stats["late_pages"] += 1
            built[start] = self.one_page(kind, limit, start)
        return built[start]


def serve(port: int, n_nodes: int, n_pods: int, limits: list[int]) -> None:
    from aiohttp import web

    nodes, pods, gpu_pods = cluster(n_nodes, n_pods)
    served = Served({"nodes": nodes, "pods": pods})
    served.reset()
    for limit in limits:
        for kind in ("nodes", "pods"):
            served.pages[kind, limit] = served.build(kind, limit)
    mean = sum(map(len, pods)) / max(len(pods), 1)
    del nodes, pods

    async def idle(request: web.Request, resp: web.StreamResponse) -> None:
        bookmark = orjson.dumps({"type": "BOOKMARK", "object": {
            "kind": request.match_info["kind"].title()[:-1], "apiVersion": "v1",
            "metadata": {"resourceVersion": RESOURCE_VERSION}}}) + b"\n"
        while request.transport is not None and not request.transport.is_closing():  # until the client goes
            await asyncio.sleep(BOOKMARK_EVERY)
            if request.query.get("allowWatchBookmarks") in TRUE:
                try:
                    await resp.write(bookmark)
                except ConnectionError:  # gone meanwhile
                    return

    async def get(request: web.Request) -> web.StreamResponse:
        kind = request.match_info["kind"]
        if kind not in served.items:
            served.stats["unknown"].append(request.path_qs)
            return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404,
                                      "reason": "NotFound"}, status=404)
        stats = served.stats
        if request.query.get("watch") in TRUE:  # kubernetes-asyncio sends watch=True
            stats[f"{kind}_watches"] += 1
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            await resp.prepare(request)
            if kind == "pods" and stats["pods_watches"] == 1:  # held until the benchmark asks for the 410
                expire = served.expire
                await expire.wait()
                await resp.write(EXPIRED)
                await resp.write_eof()
                return resp
            await idle(request, resp)
            return resp
        token = request.query.get("continue")
        start = int(token) if token else 0
        limit = int(request.query.get("limit") or 0)
        limit = limit if limit > 0 else max(len(served.items[kind]), 1)
        if start == 0:
            stats[f"{kind}_lists"] += 1
            stats["limits"].append(f"{kind}:{limit}")
        body = served.page(kind, limit, start)
        if start + limit >= len(served.items[kind]):
            stats[f"{kind}_last_pages"] += 1
        return web.Response(body=body, content_type="application/json")

    async def expire(request: web.Request) -> web.Response:
        served.expire.set()
        return web.json_response({})

    async def reset(request: web.Request) -> web.Response:
        served.reset()
        return web.json_response({})

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(served.stats)

    app = web.Application()
    app.router.add_get("/api/v1/{kind}", get)
    app.router.add_post("/bench/expire", expire)
    app.router.add_post("/bench/reset", reset)
    app.router.add_get("/bench/stats", stats)
    print(f"ready {mean:.1f} {gpu_pods}", flush=True)
    # SIGTERM: the idle watches are not waited for
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, shutdown_timeout=0.5)


# ----- the benchmark (this process) -----
LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy for 127.0.0.1


def call(url: str, method: str = "GET") -> Any:
    with LOCAL.open(urllib.request.Request(url, method=method, data=b"" if method == "POST" else None),
                    timeout=30) as resp:
        return json.loads(resp.read())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, condition: Callable[[], bool], timeout: float, alive: Callable[[], bool],
             every: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if not alive():
            raise RuntimeError(f"{what}: the process exited")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout:g} s")
        time.sleep(every)


def stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def mib(kib: int | None) -> str:
    return "-" if kib is None else f"{kib / 1024:,.0f}"


def secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


class FakeServer:
    """The fake API server in a second process, for one pod count."""

    def __init__(self, nodes: int, pods: int, limits: list[int]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", str(self.port), "--nodes", str(nodes),
                                      "--pods", str(pods), "--limits", ",".join(map(str, limits))],
                                     stdout=subprocess.PIPE, text=True)
        self.mean_pod = 0.0
        self.gpu_pods = 0

    def start(self) -> None:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if not line or line[0] != "ready":
            raise RuntimeError("the fake API server did not start")
        self.mean_pod, self.gpu_pods = float(line[1]), int(line[2])

        def listening() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", self.port)) == 0

        wait_for("fake API server", listening, 30, lambda: self.proc.poll() is None)

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = call(self.url + "/bench/stats")
        return stats


@dataclass
class Row:
    service: str
    pods: int
    gpu_pods: int
    ready: float | None = None
    peak_start: int | None = None
    relist: float | None = None
    peak_relist: int | None = None
    rss_end: int | None = None
    notes: list[str] = field(default_factory=list)


def service_argv(service: str, port: int, kubeconfig: Path, certs: Path) -> list[str]:
    argv = [str(CLI), service, "--listen", f"127.0.0.1:{port}", "--kubeconfig", str(kubeconfig)]
    if service == "webhook":
        argv += ["--tls-cert", str(certs / "tls.crt"), "--tls-key", str(certs / "tls.key")]
    return argv


def measure(service: str, n_pods: int, server: FakeServer, work: Path, certs: Path, args: argparse.Namespace,
            row: Row) -> None:
    """One service against ``server``: fills ``row`` as far as it gets."""
    call(server.url + "/bench/reset", "POST")
    kubeconfig = work / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": server.url}}],
        "users": [{"name": "bench", "user": {"token": "dummy-token"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "bench"}}]}))
    port = free_port()
    scheme = "https" if service == "webhook" else "http"
    readyz = f"{scheme}://127.0.0.1:{port}/readyz"
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    probe = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=insecure))

    def ready() -> bool:
        try:
            with probe.open(readyz, timeout=5) as resp:
                return int(resp.status) == 200
        except (urllib.error.URLError, OSError):  # refused before it listens, 503 until synced
            return False

    env = {k: v for k, v in os.environ.items() if k.lower() not in PROXY_VARS}
    stderr_path = work / f"{service}-{n_pods}.stderr"
    with stderr_path.open("wb") as stderr:
        start = time.monotonic()
        proc = subprocess.Popen(service_argv(service, port, kubeconfig, certs), stdout=subprocess.DEVNULL,
                                stderr=stderr, env=env, cwd=work)
    alive: Callable[[], bool] = lambda: proc.poll() is None  # noqa: E731
    try:
        wait_for(f"{service} /readyz", ready, args.ready_timeout, alive)
        row.ready = time.monotonic() - start
        time.sleep(args.settle)  # a late peak; VmHWM only grows
        row.peak_start = status_kib(proc.pid, "VmHWM")
        if not args.relist:
            return
        wait_for("the first pod watch", lambda: server.stats()["pods_watches"] >= 1, 60, alive, every=0.1)
        expired = time.monotonic()
        call(server.url + "/bench/expire", "POST")

        def relisted() -> bool:
            stats = server.stats()
            return bool(stats["pods_last_pages"] >= 2 and stats["pods_watches"] >= 2)

        wait_for(f"{service} relist after the 410", relisted, args.ready_timeout, alive, every=0.05)
        row.relist = time.monotonic() - expired
        time.sleep(0.5)  # the relist is done (the next watch is open); its garbage goes by refcount
        row.peak_relist = status_kib(proc.pid, "VmHWM")
        row.rss_end = status_kib(proc.pid, "VmRSS")
    except (RuntimeError, TimeoutError) as exc:
        row.notes.append(f"{exc}")
        tail = stderr_path.read_text(errors="replace").splitlines()[-15:]
        row.notes += ["  stderr: " + line for line in tail]
    finally:
        stop(proc)
        try:
            stats = server.stats()
        except OSError as exc:
            row.notes.append(f"fake API server stats: {exc}")
        else:
            planned = {"nodes_lists": 1, "pods_lists": 2 if row.relist is not None else 1}
            for key, want in planned.items():
                if row.ready is not None and stats[key] != want:
                    row.notes.append(f"{key}: {stats[key]} (planned {want})")
            if stats["unknown"]:
                row.notes.append(f"paths not served: {sorted(set(stats['unknown']))}")
            if stats["late_pages"]:
                limits = sorted(set(stats["limits"]))
                row.notes.append(f"pages built on demand: {stats['late_pages']} (limits asked {limits})")


def table(rows: list[Row], header: str) -> None:
    cols = ["service", "pods", "of which GPU", "ready (s)", "peak RSS MiB, after start", "relist (s)",
            "peak RSS MiB, after a 410 relist", "RSS MiB at end"]
    cells = [[r.service, f"{r.pods:,}", f"{r.gpu_pods:,}", secs(r.ready), mib(r.peak_start), secs(r.relist),
              mib(r.peak_relist), mib(r.rss_end)] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print(header)
    print("| " + " | ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells:
        print("| " + " | ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in
                                enumerate(zip(row, widths, strict=True))) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--pods", default="10000,50000,100000", help="active pod counts, comma-separated")
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--services", default="webhook,extender")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds after ready before VmHWM is read")
    parser.add_argument("--ready-timeout", type=float, default=600.0)
    parser.add_argument("--no-relist", dest="relist", action="store_false", help="skip the 410 relist")
    parser.add_argument("--limits", default="100,500", help="page sizes prebuilt by the fake server")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(p) for p in args.pods.split(",")]
    limits = [int(x) for x in args.limits.split(",")]
    if args.serve:
        serve(args.serve, args.nodes, sizes[0], limits)
        return
    services = [s for s in args.services.split(",") if s]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally clauses stop what was started
    rows: list[Row] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="service-memory-") as tmp:
        work = Path(tmp)
        subprocess.run([str(CLI), "certs", "--service", "gpu-tailor-bench", "--namespace", "bench",
                        "--out", str(work / "certs"), "--ip", "127.0.0.1"], check=True, capture_output=True)
        means: list[float] = []
        for n_pods in sizes:
            server = FakeServer(args.nodes, n_pods, limits)
            try:
                server.start()
                means.append(server.mean_pod)
                print(f"{n_pods:,} pods ({server.gpu_pods:,} with a GPU): fake API server up (mean pod "
                      f"{server.mean_pod:,.0f} B)", file=sys.stderr, flush=True)
                for service in services:
                    row = Row(service, n_pods, server.gpu_pods)
                    rows.append(row)
                    measure(service, n_pods, server, work, work / "certs", args, row)
                    print(f"  {service}: ready {secs(row.ready)} s, peak {mib(row.peak_start)} MiB, "
                          f"after relist {mib(row.peak_relist)} MiB", file=sys.stderr, flush=True)
            finally:
                stop(server.proc)
    mean = sum(means) / len(means) if means else 0.0
    print()
    table(rows, f"gpu-tailor services as processes: {args.nodes:,} nodes, active pods of {mean:,.0f} B of JSON "
                f"on average (fake API server in a second process; RSS = /proc/PID/status)\n")
    notes = [(r, n) for r in rows for n in r.notes]
    if notes:
        print("\nnotes:")
        for r, note in notes:
            print(f"- {r.service} at {r.pods:,} pods: {note}")
    print(f"\nwall time {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
