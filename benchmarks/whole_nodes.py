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
from gpu_tailor.simulate.trace import load_nodes, load_pods, replay
from tests.conftest import openb_dir


def one(job: tuple[str, int, bool]) -> tuple[str, int, bool, float, float, int, int, int]:
    workload, seed, keep = job
    trace = openb_dir()
    r = replay(load_nodes(trace / OPENB_NODES), load_pods(trace / openb_pods(workload)), "tailor", seed,
               workload=workload, keep_whole_nodes=keep)
    whole = r.extra["whole_nodes"]
    return (workload, seed, keep, r.alloc["90"], r.alloc["100"], whole.get("90", 0), whole.get("100", 0),
            r.extra["eight_gpu_nodes"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="default,multigpu20,gpuspec10,gpushare20")
    ap.add_argument("--seeds", default="42-51")
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    jobs = [(w, s, k) for w in a.workloads.split(",") for s in parse_seeds(a.seeds) for k in (False, True)]
    with ProcessPoolExecutor(a.workers) as pool:
        results = list(pool.map(one, jobs))
    print(f"tailor on openb, seeds {a.seeds}: mean alloc% and whole free 8-GPU nodes, ties as before -> as now")
    print(f"{'workload':<12} {'alloc@90':>22} {'alloc@100':>22} {'whole@90':>16} {'whole@100':>16}")
    for w in a.workloads.split(","):
        rows = {k: [r for r in results if r[0] == w and r[2] is k] for k in (False, True)}

        def mean(k: bool, i: int, rows: dict[bool, list[tuple[str, int, bool, float, float, int, int, int]]] = rows
                 ) -> float:
            return statistics.fmean(r[i] for r in rows[k])

        cells = []
        for i, digits in ((3, 2), (4, 2), (5, 1), (6, 1)):
            before, after = mean(False, i), mean(True, i)
            cells.append(f"{before:.{digits}f} -> {after:.{digits}f} ({after - before:+.{digits}f})")
        eight = rows[True][0][7]
        print(f"{w:<12} {cells[0]:>22} {cells[1]:>22} {cells[2]:>16} {cells[3]:>16}  (of {eight})")


if __name__ == "__main__":
    main()
