"""The extender's cluster state at 5,000 nodes and 100,000 pods: memory per pod, relist time, event-loop
lag during a relist, and what a node event costs as the pod count grows (the issue-18 goals).

A fake API server runs in a second process and serves the node and pod lists the way kube-apiserver
does (``limit``/``continue`` pages of real-shaped objects: the pod is the one the real API server sent
in ``tests/fixtures/watch``, managedFields and all, some 2.5 KB). The extender lists through exactly
its own path -- kubernetes-asyncio, ``kube.watch.list_all`` with the cache's ``Relist`` and the pod
projection -- while a probe task measures how late the event loop wakes it (the lag any request
would see). Nodes are the nine fixture nodes renamed in turn; each node gets ``pods/nodes`` pods, as
many one-unit GPU pods as its first GPU offering has units and CPU pods for the rest.

    python benchmarks/extender_state.py [--nodes 5000] [--pods 100000]

Measured:
- cold list: an empty cache listing every node, then every pod, until both are synced;
- relist: the same lists again into the full cache (what a dropped watch or a 410 costs);
- loop lag: p99 and max of the probe's lateness during both (it asks to wake every 2 ms);
- memory per pod: Python memory the cache holds (tracemalloc, after a collection) with the pods,
  less with none, over the pod count -- records, indexes, placements, strings;
- node event: ``apply_node`` (a changed label: the node is rebuilt and its pods re-placed) plus the
  next ``snapshot()``, p50 at a tenth of the pods and at all of them.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import socket
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import simdjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.fixture_cluster import fixture_nodes
from gpu_tailor.extender.cache import Cache
from gpu_tailor.extender.records import PodProjector
from gpu_tailor.gpumodel.inventory import from_node, node_fields

ROOT = Path(__file__).resolve().parents[1]
POD = json.loads((ROOT / "tests/fixtures/watch/pods-watch-create-bind-delete.ndjson").read_bytes().splitlines()[1])
PAGE = 500


def pod_template() -> bytes:
    """The real pod, bound and running, with markers where each pod differs."""
    pod = POD["object"]
    pod["metadata"].update(name="@NAME@", namespace="bench", uid="@UID@", resourceVersion="@RV@")
    pod["spec"]["nodeName"] = "@NODE@"
    pod["spec"]["containers"][0]["resources"] = "@RES@"
    pod["status"] = {"phase": "Running", "qosClass": "Burstable", "hostIP": "10.0.0.1", "podIP": "10.1.0.1",
                     "startTime": "2026-11-21T05:36:10Z",
                     "conditions": [{"type": t, "status": "True", "lastProbeTime": None,
                                     "lastTransitionTime": "2026-11-21T05:36:10Z"}
                                    for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")]}
    return orjson.dumps(pod)


def cluster(n_nodes: int, n_pods: int) -> tuple[list[dict[str, Any]], list[bytes]]:
    """The nodes, and the pods as JSON (built by substitution: 100,000 deep copies take seconds)."""
    nodes = fixture_nodes(n_nodes)
    template = pod_template()
    per = max(1, n_pods // n_nodes)
    cpu = orjson.dumps({"requests": {"cpu": "100m", "memory": "128Mi"}})
    pods: list[bytes] = []
    for _i, node in enumerate(nodes):
        inv = from_node(node)
        offer = inv.offerings[0] if inv.offerings else None
        gpu = (orjson.dumps({"requests": {str(offer.resource): "1", "cpu": "1", "memory": "4Gi"},
                             "limits": {str(offer.resource): "1"}}) if offer else cpu)
        units = min(offer.allocatable, per) if offer else 0
        name = node["metadata"]["name"].encode()
        for j in range(per):
            if len(pods) == n_pods:
                break
            k = str(len(pods)).encode()
            pods.append(template.replace(b'"@RES@"', gpu if j < units else cpu)
                        .replace(b"@NAME@", b"p-" + k).replace(b"@UID@", b"uid-" + k)
                        .replace(b"@RV@", k).replace(b"@NODE@", name))
    return nodes, pods


def pages(items: list[bytes], kind: str) -> list[bytes]:
    out = []
    for start in range(0, len(items), PAGE):
        meta = {"resourceVersion": "1000"}
        if start + PAGE < len(items):
            meta["continue"] = str(len(out) + 1)
        head = orjson.dumps({"kind": kind, "apiVersion": "v1", "metadata": meta})[:-1]
        out.append(head + b',"items":[' + b",".join(items[start:start + PAGE]) + b"]}")
    return out


# ----- the fake API server (second process) -----
def serve(port: int, n_nodes: int, n_pods: int) -> None:
    from aiohttp import web

    nodes, pods = cluster(n_nodes, n_pods)
    served = {"nodes": pages([orjson.dumps(n) for n in nodes], "NodeList"), "pods": pages(pods, "PodList")}
    del nodes, pods

    async def get(request: web.Request) -> web.StreamResponse:
        kind = request.match_info["kind"]
        if request.query.get("watch") == "true":
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            await resp.prepare(request)
            await asyncio.Event().wait()  # an idle watch
        token = request.query.get("continue")
        return web.Response(body=served[kind][int(token) if token else 0], content_type="application/json")

    app = web.Application()
    app.router.add_get("/api/v1/{kind}", get)
    print("ready", flush=True)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ----- the measurements -----
class LagProbe:
    """Asks the loop to wake it every ``period`` seconds and records how late it was."""

    def __init__(self, period: float = 0.002) -> None:
        self.period = period
        self.lags: list[float] = []

    async def run(self) -> None:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(self.period)
            self.lags.append(time.perf_counter() - start - self.period)


async def timed_list(cache: Cache, host: str) -> tuple[float, float, list[float]]:
    """Nodes then pods listed into ``cache`` through the extender's own path: seconds for each, and
    the loop's lag meanwhile."""
    from kubernetes_asyncio import client

    from gpu_tailor.extender.api import NODE_PAGE
    from gpu_tailor.kube.watch import _run, list_all

    probe = LagProbe()
    async with client.ApiClient(client.Configuration(host=host)) as api:
        core = client.CoreV1Api(api)
        task = asyncio.create_task(probe.run())  # the relist's lag, not the client's setup
        await asyncio.sleep(0)
        start = time.perf_counter()
        relist = cache.relist_nodes()
        await list_all(core.list_node, NODE_PAGE, relist, node_fields, freeze_gc=True)
        await _run(relist.done(), freeze_gc=True)
        middle = time.perf_counter()
        pod_relist = cache.relist_pods()
        await list_all(core.list_pod_for_all_namespaces, PAGE, pod_relist, PodProjector(cache.holds_version),
                       freeze_gc=True)
        await _run(pod_relist.done(), freeze_gc=True)
        cache.snapshot()  # the first request after the relist pays for the nodes it changed
        end = time.perf_counter()
    task.cancel()
    return middle - start, end - middle, probe.lags


def feed(cache: Cache, pods: list[bytes]) -> None:
    """The pods into the cache as the watch would: page by page, lazily parsed and projected."""
    relist = cache.relist_pods()
    project = PodProjector()
    for page in pages(pods, "PodList"):
        doc: Any = simdjson.Parser().parse(page)
        items = [project(item) for item in doc["items"]]
        del doc
        for _ in relist.page(items):
            pass
    for _ in relist.done():
        pass


def memory_per_pod(nodes: list[dict[str, Any]], pods: list[bytes]) -> float:
    gc.collect()
    tracemalloc.start()
    cache = Cache()
    cache.reset_nodes(nodes)
    cache.reset_pods([])
    cache.snapshot()
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    feed(cache, pods)
    cache.snapshot()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / len(pods)


def node_event_p50(nodes: list[dict[str, Any]], pods: list[bytes], events: int = 400) -> float:
    cache = Cache()
    cache.reset_nodes(nodes)
    feed(cache, pods)
    cache.snapshot()
    busy = [n for n in nodes if n["metadata"]["name"] in cache.on_node][:events]
    took = []
    for i, node in enumerate(busy):
        changed = {**node, "metadata": {**node["metadata"], "labels": {**node["metadata"]["labels"],
                                                                       "example.com/rack": f"r{i}"}}}
        start = time.perf_counter()
        cache.apply_node("MODIFIED", changed)
        cache.snapshot()
        took.append(time.perf_counter() - start)
    return statistics.median(took)


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] if values else 0.0


def rows(args: argparse.Namespace) -> Iterator[tuple[str, str, str]]:
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--nodes", str(args.nodes),
                               "--pods", str(args.pods)], stdout=subprocess.PIPE, text=True)
    try:
        nodes, pods = cluster(args.nodes, args.pods)
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        for _ in range(200):  # the server's socket opens right after it says so
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        host = f"http://127.0.0.1:{port}"
        gc.collect()
        gc.freeze()  # the benchmark's own data, as the extender freezes what it made to start
        cache = Cache()
        n_cold, p_cold, lag_cold = asyncio.run(timed_list(cache, host))
        assert len(cache.pods) == args.pods and len(cache.nodes) == args.nodes, (len(cache.pods), len(cache.nodes))
        n_warm, p_warm, lag_warm = asyncio.run(timed_list(cache, host))
    finally:
        server.terminate()
        server.wait()
    lags = lag_cold + lag_warm
    yield ("cold list: nodes, then pods (s)", f"{n_cold:.2f} + {p_cold:.2f}", "pods <= 2")
    yield ("relist into the full cache: nodes, then pods (s)", f"{n_warm:.2f} + {p_warm:.2f}", "pods <= 2")
    yield ("event-loop lag during both, p99 / max (ms)", f"{pct(lags, 0.99) * 1e3:.1f} / {max(lags) * 1e3:.1f}",
           "max <= 20")
    del cache
    gc.collect()
    yield ("memory per tracked pod (KiB)", f"{memory_per_pod(nodes, pods) / 1024:.2f}", "<= 2")
    small = node_event_p50(nodes, pods[:len(pods) // 10])
    full = node_event_p50(nodes, pods)
    yield (f"node event + snapshot p50 at {len(pods) // 10:,} / {len(pods):,} pods (us)",
           f"{small * 1e6:.0f} / {full * 1e6:.0f} (x{full / small:.2f})", "independent of pods")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.nodes, args.pods)
        return
    print(f"extender state: {args.nodes:,} nodes, {args.pods:,} pods (fake API server in a second process)\n")
    print(f"| {'measure':<58} | {'value':<22} | goal |")
    print(f"|{'-' * 60}|{'-' * 24}|------|")
    for name, value, goal in rows(args):
        print(f"| {name:<58} | {value:<22} | {goal} |", flush=True)


if __name__ == "__main__":
    main()
