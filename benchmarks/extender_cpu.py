"""CPU per pod of the extender's HTTP path against a no-op extender's, in one process, as schedbench loads it.

schedbench (``../shared/schedbench/run.sh``) measures what the extender costs a real kube-scheduler
on 2 cores, where every millisecond of the extender's CPU is taken from the API server and the
scheduler, but its pods/s vary by 10% between runs. This replays its load without them, so that a
change of a few hundred microseconds per pod shows: 1,000 nodes like schedbench's fake 8xH100 ones,
then per pod what the extender sees of it -- the watch's ADDED event, filter on 420 candidates (a
sliding window, as kube-scheduler's search is), prioritize on those that passed, bind to the best,
the watch's MODIFIED event with the pod bound -- over real HTTP (aiohttp's test server and client,
the same event loop). The same requests go to a no-op app (schedbench's B: echo the names, score 0).
Prints the process CPU per pod of each, and the difference: what the extender adds per pod over
doing nothing (the client's share is in both).

    python benchmarks/extender_cpu.py [--nodes 1000] [--pods 2000] [--candidates 420] [--rounds 3] [--profile 15]
                                      [--dra 100]

``--dra N`` also replays with N of the nodes publishing their GPUs through NVIDIA's DRA driver (no GPU allocatable,
the driver's DeviceClasses, ``nvidia.com/gpu`` served by DRA there): what DRA's state and scoring add per pod. A pod
bound to one of them has its claim allocated (the watch's event of it applied), as kube-scheduler would.

``--profile N`` runs gpu-tailor's replay under cProfile (which slows it, so the CPU figures above come from a run
without it) and prints the N functions that spend the most CPU of their own, per pod: where the extender's time goes
beyond parsing and answering.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import statistics
import time
import uuid
from typing import Any

from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from gpu_tailor.extender.cache import Cache
from gpu_tailor.extender.recorder import Recorder
from gpu_tailor.extender.server import make_app
from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.dra_state import DraState


def node(name: str) -> dict[str, Any]:
    res = {"cpu": "96", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": "8"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name, "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8",
                "nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.family": "hopper"}},
            "status": {"capacity": res, "allocatable": res,
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def pod(i: int, rv: int, node_name: str = "", gpus: str | None = None) -> dict[str, Any]:
    res = {"nvidia.com/gpu": "1", "cpu": "100m"}
    meta: dict[str, Any] = {"name": f"p{i}", "namespace": "bench", "uid": str(uuid.UUID(int=i + 1)),
                            "resourceVersion": str(rv), "labels": {"app": "schedbench"}}
    if gpus is not None:
        meta["annotations"] = {"gpu-tailor.io/gpus": gpus}
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "registry.invalid/none:latest",
                                            "resources": {"requests": res, "limits": res}}],
                            "schedulerName": "default-scheduler"}
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
            "status": {"phase": "Pending"}}


def claim(i: int, node_name: str, device: int) -> dict[str, Any]:
    """Pod ``i``'s claim as kube-scheduler allocates it for ``nvidia.com/gpu`` served by DRA (KEP-5004)."""
    return {"metadata": {"name": f"p{i}-gpu", "namespace": "bench", "uid": str(uuid.UUID(int=10**9 + i))},
            "status": {"allocation": {"devices": {"results": [
                {"request": "container-0-request-0", "driver": "gpu.nvidia.com", "pool": node_name,
                 "device": f"gpu-{device}"}]}}}}


class Binder:
    """Takes every Binding, remembers the GPUs (what the API server would write on the pod)."""

    def __init__(self) -> None:
        self.gpus: dict[str, str | None] = {}

    async def bind(self, namespace: str, name: str, uid: str, node: str, gpus: str | None,
                   among: str | None = None) -> None:
        self.gpus[name] = gpus

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None


def noop_app() -> web.Application:
    async def filter_(request: web.Request) -> web.Response:
        args = json.loads(await request.read())
        return web.json_response({"NodeNames": args["NodeNames"], "FailedNodes": {}, "Error": ""})

    async def prioritize(request: web.Request) -> web.Response:
        args = json.loads(await request.read())
        return web.json_response([{"Host": n, "Score": 0} for n in args["NodeNames"]])

    app = web.Application()
    app.router.add_post("/filter", filter_)
    app.router.add_post("/prioritize", prioritize)
    return app


async def replay(app: web.Application, cache: Cache | None, binder: Binder | None, args: argparse.Namespace,
                 names: list[str], recorder: Recorder | None = None) -> float:
    """CPU seconds per pod for the whole replay against ``app``; with ``recorder``, kube-scheduler binds (no bind
    verb) and the record is taken from ``recorder`` as its writer would, its write's watch event applied."""
    server = TestServer(app)
    await server.start_server()
    try:
        dra_nodes = dict.fromkeys(cache.dra.inventory().nodes(), 0) if cache is not None and cache.dra.enabled \
            else {}  # node -> the claims allocated there so far
        async with ClientSession() as http:
            url = str(server.make_url("")).rstrip("/")
            start = time.process_time()
            for i in range(args.pods):
                first = (i * args.candidates) % len(names)
                window = (names + names)[first:first + args.candidates]
                if cache is not None:
                    cache.apply_pod("ADDED", json.loads(json.dumps(pod(i, 2 * i))))
                body = {"Pod": pod(i, 2 * i), "NodeNames": window}
                async with http.post(f"{url}/filter", json=body) as r:
                    passed = (await r.json())["NodeNames"]
                body["NodeNames"] = passed
                async with http.post(f"{url}/prioritize", json=body) as r:
                    scores = await r.json()
                if binder is None or cache is None:
                    continue
                best = max(scores, key=lambda s: s["Score"])["Host"]
                if best in dra_nodes:  # kube-scheduler allocates the pod's claim (the allocator's first free GPU)
                    cache.dra.apply_claim("ADDED", claim(i, best, dra_nodes[best]))  # and binds: nothing to record
                    dra_nodes[best] += 1
                    cache.apply_pod("MODIFIED", json.loads(json.dumps(pod(i, 2 * i + 1, best))))
                    continue
                if recorder is not None:  # kube-scheduler binds; the record is written after, and the watch shows both
                    cache.apply_pod("MODIFIED", json.loads(json.dumps(pod(i, 2 * i + 1, best))))
                    taken = recorder.take()
                    assert taken is not None and taken[0] == f"bench/p{i}", taken
                    gpus = taken[2]["metadata"]["annotations"][labels.ANN_GPUS]
                    cache.apply_pod("MODIFIED", json.loads(json.dumps(pod(i, 2 * i + 2, best, gpus))))
                    continue
                bind = {"PodName": f"p{i}", "PodNamespace": "bench", "PodUID": str(uuid.UUID(int=i + 1)),
                        "Node": best}
                async with http.post(f"{url}/bind", json=bind) as r:
                    assert (await r.json())["Error"] == ""
                bound = pod(i, 2 * i + 1, best, binder.gpus[f"p{i}"])
                cache.apply_pod("MODIFIED", json.loads(json.dumps(bound)))
            return (time.process_time() - start) / int(args.pods)
    finally:
        await server.close()


def fresh(names: list[str], dra: int = 0) -> tuple[Cache, Binder, Recorder]:
    """A synced cache of ``names``; with ``dra``, every ``len(names) // dra``-th node's 8 H100s are published through
    NVIDIA's DRA driver instead (no GPU allocatable), with the driver's DeviceClasses (``nvidia.com/gpu`` served by
    DRA there, KEP-5004): DRA's watches and scoring on."""
    cache = Cache()
    through = set(names[:: max(1, len(names) // dra)][:dra]) if dra else set()
    objs = []
    for n in names:
        obj = node(n)
        if n in through:
            for key in ("capacity", "allocatable"):
                obj["status"][key] = {k: v for k, v in obj["status"][key].items() if k != "nvidia.com/gpu"}
            obj["metadata"]["labels"] = {"kubernetes.io/hostname": n}
        objs.append(obj)
    cache.reset_nodes(objs)
    cache.reset_pods([])
    if dra:
        state = DraState()
        state.reset_slices([{"metadata": {"name": f"{n}-gpu.nvidia.com"}, "spec": {
            "driver": "gpu.nvidia.com", "nodeName": n, "pool": {"name": n, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"},
                                                            "productName": {"string": "NVIDIA H100 80GB HBM3"}},
                         "capacity": {"memory": {"value": "80Gi"}}} for i in range(8)]}} for n in sorted(through)])
        state.reset_claims([])
        serving = {"extendedResourceName": "nvidia.com/gpu"}
        state.reset_classes([{"metadata": {"name": "gpu.nvidia.com"}, "spec": serving},
                             {"metadata": {"name": "mig.nvidia.com"}, "spec": {}}])
        cache.dra = state
    return cache, Binder(), Recorder(cache, no_patch)


async def no_patch(namespace: str, name: str, patch: dict[str, Any]) -> None:
    raise AssertionError("the replay takes records from the queue itself")


async def main(args: argparse.Namespace) -> None:
    names = [f"node-{i:04d}" for i in range(args.nodes)]
    runs: dict[str, list[float]] = {"noop": [], "bound": [], "recorded": [], "dra": []}
    for _ in range(args.rounds):  # interleaved, the median of each: this machine's speed drifts between runs
        runs["noop"].append(await replay(noop_app(), None, None, args, names))
        cache, binder, _ = fresh(names)
        runs["bound"].append(await replay(make_app(cache, binder), cache, binder, args, names))
        cache, binder, recorder = fresh(names)
        runs["recorded"].append(await replay(make_app(cache, binder), cache, binder, args, names, recorder))
        if args.dra:
            cache, binder, recorder = fresh(names, args.dra)
            runs["dra"].append(await replay(make_app(cache, binder), cache, binder, args, names, recorder))
    noop, bound, recorded = (statistics.median(runs[k]) for k in ("noop", "bound", "recorded"))
    print(f"{args.nodes} nodes, {args.pods} pods, {args.candidates} candidates; CPU per pod, this process "
          f"(median of {args.rounds} interleaved rounds):")
    print(f"  {'':52} {'ms':>6} {'- no-op':>8}")
    print(f"  {'no-op extender (filter+prioritize)':52} {noop * 1e3:6.2f}")
    series = [("gpu-tailor with the bind verb (watch+filter+prioritize+bind)", bound),
              ("gpu-tailor, kube-scheduler binds (+ the record's event)", recorded)]
    if args.dra:
        series.append((f"the same, {args.dra} of the nodes DRA pools", statistics.median(runs["dra"])))
    for what, cpu in series:
        print(f"  {what:52} {cpu * 1e3:6.2f} {(cpu - noop) * 1e3:8.2f}")
    if args.profile:
        await profile(args, names)


async def profile(args: argparse.Namespace, names: list[str]) -> None:
    """gpu-tailor's replay again (kube-scheduler binding), on a fresh cache, under cProfile: the functions with the
    most CPU of their own."""
    cache, binder, recorder = fresh(names, args.dra)
    profiler = cProfile.Profile()
    profiler.enable()
    await replay(make_app(cache, binder), cache, binder, args, names, recorder)
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    total = sum(tt for _, _, tt, _, _ in stats.values())
    print(f"under cProfile, {total / args.pods * 1e3:.2f} ms per pod; the {args.profile} functions with the most "
          "CPU of their own:")
    print(f"  {'ms/pod':>7} {'share':>6} {'calls/pod':>10}  function")
    ranked = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:args.profile]
    for (path, line, func), (_, calls, tt, _, _) in ranked:
        where = path.split("site-packages/")[-1].split("gpu_tailor/")[-1] if path != "~" else "builtin"
        print(f"  {tt / args.pods * 1e3:>7.3f} {tt / total:>6.1%} {calls / args.pods:>10.1f}  {func} ({where}:{line})")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--pods", type=int, default=2000)
    p.add_argument("--candidates", type=int, default=420)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--profile", type=int, default=0, metavar="N", help="then profile, printing the top N functions")
    p.add_argument("--dra", type=int, default=0, metavar="N",
                   help="also replay with N of the nodes' GPUs published through DRA (its watches and scoring on)")
    asyncio.run(main(p.parse_args()))
