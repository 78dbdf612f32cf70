"""Extender latency per verb for 500 candidate nodes in a 5,000-node, 100,000-pod cluster.

Builds the cluster from the bundled fixture nodes (copies of all nine kinds, renamed), binds pods
across them (whole GPUs, MIG slices, replicas, CPU-only), then schedules a Job's replicas one after
another, as kube-scheduler does: each round a new pending pod with the real ExtenderArgs pod's ask
(4 whole GPUs) is filtered, prioritized and preempted on 500 random candidates (nodeCacheCapable:
names only), then bound to a node that fits. Before each round ``--churn`` pods elsewhere are deleted
and created again (the watch's events), so their nodes change too (a status update that changes
nothing the extender reads would leave a node as it was). Prints p50/p99 per verb in milliseconds
from this one run.

Every verb reads a snapshot of the cache taken as the server takes it (once per request, copying the
nodes that changed since the last one), and that is timed with it. Filter keeps its verdicts per ask
and re-checks only nodes that changed since; "filter, new ask" times the same request with nothing
kept (the first pod of a kind). The candidates are consecutive windows of the node list, as
kube-scheduler's are (each search starts where the last one stopped), so a node
comes back every ``nodes / candidates`` rounds. Prioritize is sent all 500 candidates
(kube-scheduler sends only those that passed). Preempt is offered 50 nodes with every pod bound there
as a victim (about 20 each, 6 of them GPU pods), so it tries one release per GPU victim. The policy
has learnt its pod mix from the bound GPU pods, as a running extender has.

    python benchmarks/extender_latency.py [--nodes 5000] [--pods 100000] [--candidates 500] [--rounds 200]
                                          [--churn 10]
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import resource
import statistics
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fixture_cluster import fixture_nodes

from gpu_tailor.extender import verbs
from gpu_tailor.extender.cache import Cache
from gpu_tailor.extender.records import PodRecord
from gpu_tailor.extender.snapshot import Snapshot

FIX = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "extender"


def pods(node_objs: list[dict[str, Any]], n: int, rng: random.Random) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        node = node_objs[rng.randrange(len(node_objs))]
        alloc = node["status"].get("allocatable", {})
        gpu_res = [k for k, v in alloc.items() if k.startswith("nvidia.com/") and str(v) not in ("0", "")]
        pod = {"metadata": {"name": f"p{i}", "namespace": "bench", "uid": f"u{i}"},
               "spec": {"nodeName": node["metadata"]["name"],
                        "containers": [{"name": "c", "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]},
               "status": {"phase": "Running"}}
        if gpu_res and rng.random() < 0.3:
            res = rng.choice(gpu_res)
            pod["spec"]["containers"][0]["resources"]["limits"] = {res: "1"}
            pod["spec"]["containers"][0]["resources"]["requests"][res] = "1"
        out.append(pod)
    return out


def pct(xs: list[float], q: int) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--candidates", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--churn", type=int, default=10, help="pods replaced elsewhere before each round")
    args = parser.parse_args()
    rng = random.Random(7)
    filt = json.loads((FIX / "filter-nodecache-true-pod-gpu4.json").read_text())
    prio = json.loads((FIX / "prioritize-nodecache-true-pod-gpu4.json").read_text())
    node_objs = fixture_nodes(args.nodes)
    t0 = time.perf_counter()
    state = Cache()
    bound = pods(node_objs, args.pods, rng)
    state.reset_pods(bound)
    state.reset_nodes(node_objs)
    state.snapshot()  # the first one copies every node
    build = time.perf_counter() - t0
    names = list(state.nodes)
    on_node: dict[str, list[str]] = {n: [] for n in names}  # preempt is offered every pod on the node
    for rec in state.pods.values():
        on_node[rec.node].append(rec.uid)
    times: dict[str, list[float]] = {"filter, new ask": [], "filter": [], "prioritize": [], "preempt": [], "bind": []}

    def timed(verb: str, call: Callable[..., Any], *call_args: Any) -> Any:
        t = time.perf_counter()
        out = call(*call_args)
        times[verb].append(time.perf_counter() - t)
        return out

    def on_snapshot(verb: Callable[[Snapshot, Any], Any]) -> Callable[[Any], Any]:
        return lambda body: verb(state.snapshot(), body)  # as the server calls it: one snapshot per request

    def bind(rec: PodRecord, node: str) -> None:
        state.assume(rec, node, verbs.plan_bind(state.snapshot(), rec, node).placement)

    for i in range(args.rounds):
        for obj in rng.sample(bound, args.churn):
            state.apply_pod("DELETED", obj)
            state.apply_pod("ADDED", obj)
        replica = copy.deepcopy(filt["Pod"])
        replica["metadata"].update(name=f"replica-{i}", uid=f"replica-{i}")
        state.apply_pod("ADDED", replica)
        start = i * args.candidates % len(names)  # kube-scheduler's window moves on from where the last ended
        cands = (names[start:] + names[:start])[: args.candidates]
        body = {"Pod": replica, "NodeNames": cands}
        passed = timed("filter", on_snapshot(verbs.filter_nodes), body)["NodeNames"]
        timed("prioritize", on_snapshot(verbs.prioritize), {**prio, "Pod": replica, "NodeNames": cands})
        victims: dict[str, Any] = {n: {"Pods": [{"UID": u} for u in on_node[n]], "NumPDBViolations": 0}
                                   for n in cands[:50]}
        timed("preempt", on_snapshot(verbs.preempt), {"Pod": replica, "NodeNameToMetaVictims": victims})
        if passed:
            key, node = f"{replica['metadata']['namespace']}/replica-{i}", passed[0]
            timed("bind", bind, state.pods[key], node)
        kept, state.verdicts.asks = state.verdicts.asks, OrderedDict()  # as for the first pod of its kind
        timed("filter, new ask", on_snapshot(verbs.filter_nodes), body)
        state.verdicts.asks = kept
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"cluster: {args.nodes} nodes, {args.pods} pods, built in {build:.1f} s; peak RSS {rss:.0f} MiB")
    print(f"{args.candidates} candidates per request, {args.rounds} rounds, {args.churn} pods replaced elsewhere "
          "per round (bind = choosing the GPUs and assuming the pod, no API call)")
    print(f"{'verb':<17}{'p50 ms':>10}{'p99 ms':>10}{'goal p99':>10}")
    for verb in ("filter, new ask", "filter", "prioritize", "preempt", "bind"):
        xs = times[verb]
        if xs:
            print(f"{verb:<17}{pct(xs, 50) * 1e3:>10.2f}{pct(xs, 99) * 1e3:>10.2f}{2.0:>10.1f}")


if __name__ == "__main__":
    main()
