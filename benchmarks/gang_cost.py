"""What a group placed whole costs the extender per member pod, against the same pods placed one by one and against a
no-op extender, over the HTTP path schedbench loads (``extender_cpu.py``'s replay, with groups).

NVL72-like clusters of 1,000 and 5,000 GB200 compute trays (4 GPUs each, 18 trays per ``nvidia.com/gpu.clique``), a
share of them (``--busy``) holding a 1-GPU pod already, so that most cliques are in use and a plan compares several.
Pods of 4 GPUs arrive as kube-scheduler hands them to the extender: the watch's ADDED event (every member of a group
before its first is scheduled, as a Job creates them), filter on the window kube-scheduler sends (its round-robin
search over the nodes its own NodeResourcesFit passes, ``--percentage`` of them, adaptive by default as in schedbench),
prioritize on those that passed, kube-scheduler's bind to the node ranked first, the watch's MODIFIED event with the
pod bound, then the record's (the GPUs written on it, ``extender.recorder``). A group's first member also has its plan
written on it (``gpu-tailor.io/group-plan``), whose watch event is replayed. A member whose planned node is not in the
window passes no node there, and kube-scheduler tries it again later with the next window: each try is counted.

Kinds, each on a fresh cache of the same cluster, interleaved round by round: the no-op extender (schedbench's B: echo
the names, score 0; the same 4-GPU pods), the pods without group annotations through gpu-tailor, and the pods as
members of groups of each ``--sizes`` (``gpu-tailor.io/group``, ``group-size``, ``nvlink-domain: required``).
The CPU counted is this process's around the HTTP calls (client and server, as in ``extender_cpu.py``) and the
watch events' decoding and application; kube-scheduler's part (the window) is not counted. A second table gives the
first member's filter, where ``gangs.plan`` runs, against the other members' filters.

    python benchmarks/gang_cost.py [--nodes 1000,5000] [--rounds 3] [--pods 256] [--sizes 4,8,16] [--busy 0.1]
                                   [--percentage 0] [--profile 20]

``--profile N``: at the largest node count, where the first members' filters take over 50 ms at their median, they
are run again under cProfile (the biggest groups), and the N functions with the most CPU (cumulative and own) shown.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import random
import statistics
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer
from extender_cpu import Binder, no_patch, node, noop_app, pod

from gpu_tailor.extender.cache import Cache
from gpu_tailor.extender.recorder import Recorder
from gpu_tailor.extender.server import RECORDER, make_app
from gpu_tailor.gpumodel import labels
from gpu_tailor.simulate.kube import nodes_to_score

TRAY_GPUS = 4
CLIQUE_TRAYS = 18  # an NVL72 rack: 18 compute trays of 4 GPUs on one NVLink fabric
PLAN_WORTH_PROFILING = 0.050  # seconds of a first member's filter, at the median


def tray(i: int) -> dict[str, Any]:
    """A GB200 compute tray as GFD labels one: 4 GPUs, its clique ``<fabric cluster uuid>.<clique id>``."""
    obj = node(f"gb-{i:05d}")
    clique = i // CLIQUE_TRAYS
    obj["metadata"]["labels"].update({
        labels.GPU_PRODUCT: "NVIDIA-GB200", labels.GPU_COUNT: str(TRAY_GPUS), "nvidia.com/gpu.memory": "189471",
        "nvidia.com/gpu.family": "blackwell", labels.GPU_CLIQUE: f"{uuid.UUID(int=0xB200 << 64 | clique)}.{clique}"})
    for part in ("capacity", "allocatable"):
        obj["status"][part].update({"cpu": "144", "memory": "1800Gi", labels.GPU_RESOURCE: str(TRAY_GPUS)})
    return obj


def member(i: int, rv: int, group: tuple[str, int] | None, node_name: str = "",
           annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """Pod ``i`` asking for a whole tray, a member of ``group`` (name, size) where one is given."""
    obj = pod(i, rv, node_name)
    res = {labels.GPU_RESOURCE: str(TRAY_GPUS), "cpu": "100m"}
    obj["spec"]["containers"][0]["resources"] = {"requests": res, "limits": res}
    notes = dict(annotations or {})
    if group is not None:
        notes.update({labels.ANN_GROUP: group[0], labels.ANN_GROUP_SIZE: str(group[1]),
                      labels.ANN_GROUP_DOMAIN: "required"})
    if notes:
        obj["metadata"]["annotations"] = notes
    if node_name:
        obj["status"] = {"phase": "Running"}
    return obj


def background(names: list[str], busy: float, seed: int = 7) -> dict[str, dict[str, Any]]:
    """A 1-GPU pod bound on ``busy`` of the trays, chosen at random (the same for every kind): node -> pod."""
    chosen = random.Random(seed).sample(names, int(len(names) * busy))
    out = {}
    for k, n in enumerate(sorted(chosen)):
        p = pod(10**8 + k, 1, n, "0")
        p["metadata"]["name"] = f"busy-{k}"
        p["status"] = {"phase": "Running"}
        out[n] = p
    return out


class KubeScheduler:
    """kube-scheduler's side: the GPUs it counts free per node (the pods bound; the extender's holds are not its to
    see) and its round-robin search for ``to_find`` feasible nodes (``findNodesThatPassFilters``), which the
    extender's filter gets."""

    def __init__(self, names: list[str], busy: dict[str, dict[str, Any]], percentage: int) -> None:
        self.names = names
        self.free = np.array([TRAY_GPUS - (1 if n in busy else 0) for n in names], np.int64)
        self.index = {n: k for k, n in enumerate(names)}
        self.to_find = nodes_to_score(len(names)) if percentage <= 0 else max(len(names) * percentage // 100, 1)
        self.start = 0

    def window(self, gpus: int) -> list[str]:
        feasible = np.flatnonzero(self.free >= gpus)
        if not len(feasible):
            return []
        cut = int(np.searchsorted(feasible, self.start))
        order = np.concatenate([feasible[cut:], feasible[:cut]])[:self.to_find]
        n = len(self.names)
        processed = n if len(order) < self.to_find else (int(order[-1]) - self.start) % n + 1
        self.start = (self.start + processed) % n
        return [self.names[k] for k in order]

    def bound(self, name: str, gpus: int) -> None:
        self.free[self.index[name]] -= gpus


@dataclass
class Run:
    """One replay's figures: CPU per pod, filter calls per pod, and per group the first member's filter CPU and the
    other members' filter CPU."""

    cpu: float = 0.0
    pods: int = 0
    filters: int = 0
    unplaced: int = 0
    split: int = 0  # groups whose members were bound in more than one clique (none should be: domain required)
    first: list[float] = field(default_factory=list)
    others: list[float] = field(default_factory=list)


class Patches:
    """The plans the extender writes on a group's first pod (``gpu-tailor.io/group-plan``), for the replay to show
    back as the watch would."""

    def __init__(self) -> None:
        self.written: list[tuple[str, str, dict[str, Any]]] = []

    async def patch(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self.written.append((namespace, name, patch))


async def replay(app: web.Application, cache: Cache | None, names: list[str], busy: dict[str, dict[str, Any]],
                 args: argparse.Namespace, size: int, profiler: cProfile.Profile | None = None) -> Run:
    """``args.pods`` pods of 4 GPUs (members of groups of ``size``; 0: single pods) against ``app``."""
    run = Run()
    sched = KubeScheduler(names, busy, args.percentage)
    recorder = Recorder(cache, no_patch) if cache is not None else None
    patches = Patches()
    if cache is not None:
        app[RECORDER].patch = patches.patch
    rv = 10
    annotations: dict[int, dict[str, str]] = {}  # what the API has written on each pod

    def event(kind: str, i: int, group: tuple[str, int] | None, node_name: str = "") -> None:
        nonlocal rv
        rv += 1
        raw = json.dumps(member(i, rv, group, node_name, annotations.get(i)))
        t = time.process_time()
        if cache is not None:
            cache.apply_pod(kind, json.loads(raw))
        run.cpu += time.process_time() - t

    server = TestServer(app)
    await server.start_server()
    try:
        async with ClientSession() as http:
            url = str(server.make_url("")).rstrip("/")

            async def call(verb: str, body: str) -> Any:
                t = time.process_time()
                async with http.post(f"{url}/{verb}", data=body,
                                     headers={"Content-Type": "application/json"}) as r:
                    out = await r.json()
                spent = time.process_time() - t
                run.cpu += spent
                return out, spent

            groups = [list(range(k, min(k + size, args.pods))) for k in range(0, args.pods, size)] if size \
                else [[k] for k in range(args.pods)]
            for g, pods in enumerate(groups):
                group = (f"g{size}-{g}", size) if size else None
                cliques: set[int] = set()
                for i in pods:  # the Job creates every member at once
                    event("ADDED", i, group)
                for n, i in enumerate(pods):
                    passed: list[str] = []
                    for attempt in range(len(names) // sched.to_find + 3):  # tried again, the window moved on
                        window = sched.window(TRAY_GPUS)
                        body = {"Pod": member(i, rv, group, "", annotations.get(i)), "NodeNames": window}
                        planning = group is not None and n == 0 and attempt == 0
                        if profiler is not None and planning:
                            profiler.enable()
                        out, spent = await call("filter", json.dumps(body))
                        if profiler is not None:
                            profiler.disable()
                        run.filters += 1
                        if group is not None:
                            (run.first if planning else run.others).append(spent)
                        passed = out["NodeNames"]
                        for ns, name, patch in patches.written:  # the plan's write, as the watch shows it
                            assert (ns, name) == ("bench", f"p{i}"), (ns, name, i)
                            annotations[i] = {**annotations.get(i, {}), **patch["metadata"]["annotations"]}
                            event("MODIFIED", i, group)
                        patches.written.clear()
                        if passed or not window:
                            break
                    if not passed:
                        run.unplaced += 1
                        continue
                    body["NodeNames"] = passed
                    scores, _ = await call("prioritize", json.dumps(body))
                    best = max(scores, key=lambda s: s["Score"])["Host"]  # kube-scheduler binds it there
                    sched.bound(best, TRAY_GPUS)
                    cliques.add(sched.index[best] // CLIQUE_TRAYS)
                    event("MODIFIED", i, group, best)
                    run.pods += 1
                    if recorder is None:
                        continue
                    t = time.process_time()
                    taken = recorder.take()
                    run.cpu += time.process_time() - t
                    if taken is not None:  # the record's write, as the watch shows it
                        assert taken[0] == f"bench/p{i}", taken
                        annotations[i] = {**annotations.get(i, {}), **taken[2]["metadata"]["annotations"]}
                        event("MODIFIED", i, group, best)
                run.split += group is not None and len(cliques) > 1
        return run
    finally:
        await server.close()


def fresh(names: list[str], busy: dict[str, dict[str, Any]]) -> Cache:
    cache = Cache()
    cache.reset_nodes([tray(k) for k in range(len(names))])
    cache.reset_pods([json.loads(json.dumps(p)) for p in busy.values()])
    return cache


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


async def main(args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    kinds = ["no-op", "single pods", *[f"groups of {s}" for s in sizes]]
    rows: list[tuple[int, str, float, float, int]] = []
    plans: list[tuple[int, int, Run]] = []
    slow: tuple[list[str], dict[str, dict[str, Any]]] | None = None  # the cluster to profile plans on
    for nodes in [int(n) for n in args.nodes.split(",")]:
        names = [f"gb-{k:05d}" for k in range(nodes)]
        busy = background(names, args.busy)
        runs: dict[str, list[Run]] = {k: [] for k in kinds}
        for _ in range(args.rounds):  # interleaved, the median of each: this machine's speed drifts between runs
            runs["no-op"].append(await replay(noop_app(), None, names, busy, args, 0))
            cache = fresh(names, busy)
            runs["single pods"].append(await replay(make_app(cache, Binder()), cache, names, busy, args, 0))
            for s in sizes:
                cache = fresh(names, busy)
                runs[f"groups of {s}"].append(await replay(make_app(cache, Binder()), cache, names, busy, args, s))
        for kind in kinds:
            per_pod = statistics.median(r.cpu / max(r.pods, 1) for r in runs[kind])
            filters = statistics.median(r.filters / max(r.pods, 1) for r in runs[kind])
            rows.append((nodes, kind, per_pod, filters, sum(r.unplaced for r in runs[kind])))
            split = sum(r.split for r in runs[kind])
            if split:
                print(f"WARNING: {nodes} nodes, {kind}: {split} groups were bound over several cliques")
        for s in sizes:
            plans.append((nodes, s, merge(runs[f"groups of {s}"])))
        if args.profile and nodes == max(int(n) for n in args.nodes.split(",")):
            worst = next(r for n, s, r in reversed(plans) if n == nodes)
            if pct(worst.first, 50) > PLAN_WORTH_PROFILING:
                slow = (names, busy)
    noop = {n: cpu for n, kind, cpu, *_ in rows if kind == "no-op"}
    window = "adaptive percentageOfNodesToScore" if args.percentage <= 0 \
        else f"percentageOfNodesToScore {args.percentage}"
    print(f"{args.pods} pods of {TRAY_GPUS} GPUs per kind, {args.busy:.0%} of the trays holding a 1-GPU pod before; "
          f"{window}; CPU per pod placed, this process (median of {args.rounds} interleaved rounds):")
    print(f"  {'nodes':>5}  {'kind':<15} {'ms/pod':>7} {'x no-op':>8} {'filters/pod':>12} {'unplaced':>9}")
    for nodes, kind, cpu, filters, unplaced in rows:
        print(f"  {nodes:>5}  {kind:<15} {cpu * 1e3:7.2f} {cpu / noop[nodes]:8.2f} {filters:12.2f} {unplaced:>9}")
    print("a group's first member's filter (its plan made: gangs.plan) and its other members' filters, CPU ms "
          f"(all {args.rounds} rounds):")
    print(f"  {'nodes':>5}  {'size':>4} {'groups':>6}  {'first p50':>9} {'p90':>7} {'max':>7}   {'others p50':>10} "
          f"{'p90':>6}")
    for nodes, s, run in plans:
        print(f"  {nodes:>5}  {s:>4} {len(run.first):>6}  {pct(run.first, 50) * 1e3:9.2f} "
              f"{pct(run.first, 90) * 1e3:7.2f} {max(run.first, default=float('nan')) * 1e3:7.2f}   "
              f"{pct(run.others, 50) * 1e3:10.2f} {pct(run.others, 90) * 1e3:6.2f}")
    if slow is not None:
        await profile(args, *slow, max(sizes))


def merge(runs: list[Run]) -> Run:
    out = Run()
    for r in runs:
        out.first += r.first
        out.others += r.others
    return out


async def profile(args: argparse.Namespace, names: list[str], busy: dict[str, dict[str, Any]], size: int) -> None:
    """The groups of ``size`` again, their first members' filters under cProfile: where a plan's time goes."""
    cache = fresh(names, busy)
    profiler = cProfile.Profile()
    run = await replay(make_app(cache, Binder()), cache, names, busy, args, size, profiler)
    stats = pstats.Stats(profiler)
    raw = stats.stats  # type: ignore[attr-defined]
    groups = max(len(run.first), 1)
    total = sum(tt for _, _, tt, _, _ in raw.values())
    print(f"{len(names)} nodes, groups of {size}, the first members' filters under cProfile: "
          f"{total / groups * 1e3:.1f} ms per group; the {args.profile} functions of gpu-tailor with the most CPU "
          "(cumulative), then the ones with the most of their own:")
    print(f"  {'cum ms':>7} {'own ms':>7} {'calls':>8}  function (per group)")
    for key in ("cumulative", "own"):
        ranked = sorted(((k, v) for k, v in raw.items() if key == "own" or "gpu_tailor" in k[0]),
                        key=lambda kv: kv[1][3 if key == "cumulative" else 2], reverse=True)
        for (path, line, func), (_, calls, tt, ct, _) in ranked[:args.profile]:
            where = path.split("site-packages/")[-1].split("gpu_tailor/")[-1] if path != "~" else "builtin"
            print(f"  {ct / groups * 1e3:>7.2f} {tt / groups * 1e3:>7.2f} {calls / groups:>8.1f}  {func} "
                  f"({where}:{line})")
        print("  --")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", default="1000,5000", help="node counts, comma-separated")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pods", type=int, default=256, help="pods per kind and round")
    p.add_argument("--sizes", default="4,8,16", help="group sizes, comma-separated")
    p.add_argument("--busy", type=float, default=0.1, help="share of the trays holding a 1-GPU pod before")
    p.add_argument("--percentage", type=int, default=0,
                   help="kube-scheduler's percentageOfNodesToScore (0: adaptive, as schedbench; gpu-tailor's "
                        "shipped profile: 100)")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="profile the first members' filters where they are slow, printing the top N functions")
    asyncio.run(main(p.parse_args()))
