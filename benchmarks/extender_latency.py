"""Extender latency per verb for 500 candidate nodes in a 5,000-node, 100,000-pod cluster.

Builds the cluster from the bundled fixture nodes (copies of all nine kinds, renamed), binds pods
across them (whole GPUs, MIG slices, replicas, CPU-only), then times filter, prioritize and preempt
on the real ExtenderArgs payload (nodeCacheCapable: names only) with 500 random candidates, and bind
followed by the assumption's removal. Prints p50/p99 per verb in milliseconds from this one run.

Each round asks filter, then prioritize, about the same pod and candidates, in kube-scheduler's order:
prioritize reuses filter's verdicts on nodes that have not changed, and it is sent all 500 candidates
(kube-scheduler sends only those that passed). The policy has learnt its pod mix from the bound GPU
pods, as a running extender has.

    python benchmarks/extender_latency.py [--nodes 5000] [--pods 100000] [--candidates 500] [--rounds 200]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import time
from pathlib import Path
from typing import Any

from fixture_cluster import fixture_nodes

from gpu_tailor.extender import verbs
from gpu_tailor.extender.state import ClusterState
from gpu_tailor.gpumodel.schedule import fit

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
    args = parser.parse_args()
    rng = random.Random(7)
    filt = json.loads((FIX / "filter-nodecache-true-pod-gpu4.json").read_text())
    prio = json.loads((FIX / "prioritize-nodecache-true-pod-gpu4.json").read_text())
    node_objs = fixture_nodes(args.nodes)
    t0 = time.perf_counter()
    state = ClusterState()
    state.reset_pods([*pods(node_objs, args.pods, rng), filt["Pod"]])
    state.reset_nodes(node_objs)
    build = time.perf_counter() - t0
    names = list(state.nodes)
    times: dict[str, list[float]] = {"filter": [], "prioritize": [], "preempt": [], "bind+forget": []}
    key = "gpu-jobs/train-gpu4"
    demand = state.pods[key].demand
    for _ in range(args.rounds):
        cands = rng.sample(names, args.candidates)
        filt["NodeNames"] = prio["NodeNames"] = cands
        t = time.perf_counter()
        verbs.filter_nodes(state, filt)
        times["filter"].append(time.perf_counter() - t)
        t = time.perf_counter()
        verbs.prioritize(state, prio)
        times["prioritize"].append(time.perf_counter() - t)
        victims: dict[str, Any] = {n: {"Pods": [], "NumPDBViolations": 0} for n in cands[:50]}
        t = time.perf_counter()
        verbs.preempt(state, {"Pod": filt["Pod"], "NodeNameToMetaVictims": victims})
        times["preempt"].append(time.perf_counter() - t)
        chosen = next(((n, f) for n in cands if (f := fit(state.nodes[n], demand)).ok), None)
        if chosen is not None:
            target, placed = chosen
            t = time.perf_counter()
            state.assume(key, target, placed.placement)
            state.forget(key)
            times["bind+forget"].append(time.perf_counter() - t)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"cluster: {args.nodes} nodes, {args.pods} pods, built in {build:.1f} s; peak RSS {rss:.0f} MiB")
    print(f"{args.candidates} candidates per request, {args.rounds} rounds (bind = in-memory assume + forget)")
    print(f"{'verb':<14}{'p50 ms':>10}{'p99 ms':>10}{'goal p99':>10}")
    for verb, xs in times.items():
        if xs:
            print(f"{verb:<14}{pct(xs, 50) * 1e3:>10.2f}{pct(xs, 99) * 1e3:>10.2f}{2.0:>10.1f}")


if __name__ == "__main__":
    main()
