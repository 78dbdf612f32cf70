"""What keeping whole nodes whole costs (issue 28): the openb replay with ties broken as before (the node rank
alone) and as now (a node in use before a whole free one, then the rank).

For each published openb workload and seed, `tailor` is replayed both ways; the table gives the mean allocation
at 90% and 100% arrived and the 8-GPU nodes left whole and free at those points (of the cluster's 8-GPU nodes),
with the difference. The real trace is read from $GPU_TAILOR_TRACE_DIR or ../shared/data.

    python benchmarks/whole_nodes.py [--workloads default,multigpu20,gpuspec10,gpushare20] [--seeds 42-51]
                                     [--workers 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.conftest, for where the trace is

from gpu_tailor.simulate.cli import OPENB_NODES, openb_pods, parse_seeds
from gpu_tailor.simulate.trace import load_nodes, load_pods, parse_prior, replay
from tests.conftest import openb_dir

Row = tuple[str, int, str, float, float, int, int, int]


def one(job: tuple[str, int, str]) -> Row:
    workload, seed, ties = job
    trace = openb_dir()
    name, _, prior = ties.partition("@")  # whole@100:0.002: a prior of weight 100 and floor 0.2%
    r = replay(load_nodes(trace / OPENB_NODES), load_pods(trace / openb_pods(workload)), "tailor", seed,
               workload=workload, ties=name, prior=parse_prior(prior) if prior else None)
    whole = r.extra["whole_nodes"]
    return (workload, seed, ties, r.alloc["90"], r.alloc["100"], whole.get("90", 0), whole.get("100", 0),
            r.extra["eight_gpu_nodes"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="default,multigpu20,gpuspec10,gpushare20")
    ap.add_argument("--seeds", default="42-51")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ties", default="rank,whole,multi-blocks", help="rank: the node rank alone (before issue 28); "
                    "whole: a used node before a whole free one; blocks: then the largest free block and the GPUs "
                    "stranded; multi-blocks: those for multi-GPU pods only; NAME@W:F adds a prior of weight W, floor "
                    "F (gpumodel.policies.fgd.Prior)")
    a = ap.parse_args()
    variants = a.ties.split(",")
    jobs = [(w, s, t) for w in a.workloads.split(",") for s in parse_seeds(a.seeds) for t in variants]
    with ProcessPoolExecutor(a.workers) as pool:
        results = list(pool.map(one, jobs))
    print(f"tailor on openb, seeds {a.seeds}: mean alloc% and whole free 8-GPU nodes, ties {' / '.join(variants)}")
    print(f"{'workload':<12} {'alloc@90':>24} {'alloc@100':>24} {'whole@90':>20} {'whole@100':>20}")
    for w in a.workloads.split(","):
        cells = []
        for i, digits in ((3, 2), (4, 2), (5, 1), (6, 1)):
            means = [statistics.fmean(r[i] for r in results if r[0] == w and r[2] == t) for t in variants]
            cells.append(" / ".join(f"{m:.{digits}f}" for m in means))
        eight = next(r[7] for r in results if r[0] == w)
        print(f"{w:<12} {cells[0]:>24} {cells[1]:>24} {cells[2]:>20} {cells[3]:>20}  (of {eight})")


if __name__ == "__main__":
    main()
