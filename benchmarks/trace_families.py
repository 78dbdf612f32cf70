"""Does tailor beat FGD on workloads of the trace's families that are not published?

The FGD paper builds its workload families from the default openb workload: in multigpuX, multi-GPU
pods bring X% of the GPU demand; in gpuspecX, X% of the GPU pods name the GPU models they accept; in
gpushareX, GPU-sharing pods bring X% of the GPU demand. Only one of each is published. This derives
stronger members the same way, with a fixed seed:

- multigpuX: copies of the default's multi-GPU pods are appended until they bring X%;
- gpuspecX: starting from gpuspec10, more GPU pods get a model list, drawn from gpuspec10's lists
  for pods of the same kind (whole GPUs or a share), until X% of GPU pods have one;
- gpushareX: random whole 1-GPU pods become copies of sharing pods until those bring X%.

Then it replays `fgd` (given the whole workload's mix, as in the paper) and `tailor` on each, and
prints the allocation at 90% and 100% arrived, with the room FGD leaves under the simulator's GPU-only
online best-fit reference. These are not the paper's files, so the FGD column is ours, not the
paper's.

    python benchmarks/trace_families.py [--seeds 42,43,44] [--workers 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.conftest, for where the trace is

from gpu_tailor.gpumodel.fleet import MILLI
from gpu_tailor.simulate.cli import OPENB_NODES, openb_pods, parse_seeds
from gpu_tailor.simulate.headroom import headroom
from gpu_tailor.simulate.trace import TracePod, arrivals, load_nodes, load_pods, replay
from tests.conftest import openb_dir

TRACE_DIR = openb_dir()  # the real trace: $GPU_TAILOR_TRACE_DIR or ../shared/data

FAMILIES = ("multigpu30", "multigpu40", "multigpu50", "gpuspec20", "gpuspec25", "gpuspec33",
            "gpushare40", "gpushare60", "gpushare80")


def _demand(pod: TracePod) -> int:
    return pod.shape.gpu_milli


def _sharing(pod: TracePod) -> bool:
    return pod.shape.sharing


def derive(name: str, seed: int = 7) -> list[TracePod]:
    """The workload ``name`` (one of FAMILIES), derived from openb's."""
    rng = random.Random(seed)
    pods = load_pods(TRACE_DIR / openb_pods("default"))
    share = int(name[-2:]) / 100
    total = sum(map(_demand, pods))
    if name.startswith("multigpu"):
        multi = [p for p in pods if p.shape.gpus > 1]
        have = sum(_demand(p) for p in multi)
        out = list(pods)
        while have < share * total:
            p = rng.choice(multi)
            out.append(TracePod(f"{p.name}-copy-{len(out)}", p.shape))
            have, total = have + _demand(p), total + _demand(p)
        return out
    if name.startswith("gpuspec"):
        spec10 = load_pods(TRACE_DIR / openb_pods("gpuspec10"))
        lists: dict[bool, list[frozenset[str]]] = defaultdict(list)
        for p in spec10:
            if p.shape.models and p.shape.gpus:
                lists[_sharing(p)].append(p.shape.models)
        gpu = [p for p in spec10 if p.shape.gpus]
        free = [i for i, p in enumerate(spec10) if p.shape.gpus and not p.shape.models]
        rng.shuffle(free)
        out = list(spec10)
        for i in free[: max(0, int(share * len(gpu)) - (len(gpu) - len(free)))]:
            p = out[i]
            out[i] = TracePod(p.name, dataclasses.replace(p.shape, models=rng.choice(lists[_sharing(p)])))
        return out
    if name.startswith("gpushare"):
        sharing = [p.shape for p in pods if _sharing(p)]
        have = sum(_demand(p) for p in pods if _sharing(p))
        whole = [i for i, p in enumerate(pods) if p.shape.gpus == 1 and p.shape.milli == MILLI]
        rng.shuffle(whole)
        out = list(pods)
        while have < share * total and whole:
            i = whole.pop()
            shape = rng.choice(sharing)
            out[i] = TracePod(out[i].name, shape)
            have, total = have + shape.gpu_milli, total - MILLI + shape.gpu_milli
        return out
    raise ValueError(f"unknown family {name!r}")


def _run(job: tuple[str, str, int]) -> tuple[str, str, int, float, float]:
    workload, policy, seed = job
    nodes = load_nodes(TRACE_DIR / OPENB_NODES)
    if policy == "reference":  # the simulator's GPU-only online best-fit (no 90% point)
        gpus = sum(n.gpus for n in nodes)
        ref = headroom((p.shape for p in arrivals(derive(workload), seed, gpus * MILLI, 1.3)), nodes)
        return workload, policy, seed, float("nan"), ref.online
    result = replay(nodes, derive(workload), policy, seed, workload=workload)
    return workload, policy, seed, result.alloc["90"], result.alloc["100"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="42,43,44")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--workloads", default=",".join(FAMILIES))
    args = ap.parse_args()
    seeds = parse_seeds(args.seeds)
    jobs = [(w, p, s) for w in args.workloads.split(",") for p in ("fgd", "tailor", "reference") for s in seeds]
    at: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    with ProcessPoolExecutor(args.workers) as pool:
        for workload, policy, _seed, a90, a100 in pool.map(_run, jobs):
            at[workload, policy].append((a90, a100))

    def mean(workload: str, policy: str, k: int) -> float:
        runs = at[workload, policy]
        return sum(r[k] for r in runs) / len(runs)

    print(f"allocation % (mean of {len(seeds)} seeds; fgd is ours, given the whole workload's mix; room is\n"
          "the GPU-only online best-fit reference at 100% (CPU, memory, models, nodes ignored; asks no node\n"
          "could hold, even empty, left out) less fgd)")
    print(f"{'workload':<12} {'fgd@90':>7} {'tailor@90':>9} {'fgd@100':>8} {'tailor@100':>10} {'tailor-fgd':>10}"
          f" {'room':>6}")
    for w in args.workloads.split(","):
        f90, t90, f100, t100 = mean(w, "fgd", 0), mean(w, "tailor", 0), mean(w, "fgd", 1), mean(w, "tailor", 1)
        room = mean(w, "reference", 1) - f100
        print(f"{w:<12} {f90:>7.2f} {t90:>9.2f} {f100:>8.2f} {t100:>10.2f} {t100 - f100:>+10.2f} {room:>+6.2f}")


if __name__ == "__main__":
    main()
