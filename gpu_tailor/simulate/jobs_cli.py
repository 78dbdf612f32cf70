"""``gpu-tailor simulate --jobs``: multi-pod jobs on NVLink-domain fleets (``simulate.jobs``), one table.

``--jobs training`` (generated) or ``--jobs openb`` (the trace's pods grouped into jobs) replays every scheduler of
``jobs.SCHEDULERS`` on each ``--fleet``, over ``--seeds``, and prints per fleet and scheduler the means over seeds;
``--durations`` switches from the arrival protocol (``--inflate`` x the GPUs arrive, nothing leaves) to the queue.
``--jobs cliques`` fills NVL72 racks with single pods and asks how large a job of whole nodes still fits in one
clique, for each scheduler and for the packing policies alone (``jobs.fill``), so the table shows what tailor's
domain rule (``Policy.keep_whole_domains``) changes.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from statistics import mean
from typing import Any

from gpu_tailor.gpumodel.fleet import MILLI, Fleet, Shape
from gpu_tailor.gpumodel.policies import BestFitPolicy, FgdPolicy, Policy, TailorPolicy
from gpu_tailor.simulate import jobfleets, jobs
from gpu_tailor.simulate.cli import parse_seeds, progress_bar
from gpu_tailor.simulate.output import aligned
from gpu_tailor.simulate.trace import TraceError

CLIQUES = "cliques"
DEFAULT_RACKS = 8  # NVL72 racks; an HGX fleet of as many GPUs has 9 nodes a rack
CLIQUE_RACKS = 3
HGX_PER_RACK = 9
QUEUED_PER_RACK = 125  # --durations: generated jobs per rack (about 30 hours of arrivals at the default load)
OPENB_PODS = "openb_pod_list_default.csv"
FILL_MARKS = (0.5, 0.6)


def _tailor_without_domains(fleet: Fleet, seed: int) -> Policy:
    policy = TailorPolicy(fleet, seed)
    policy.keep_whole_domains = False
    return policy


# the packing policies alone, one pod at a time (``Policy.choose``): before the domain rule, and the paper's two
PLAIN: dict[str, Callable[[Fleet, int], Policy]] = {
    "tailor-no-domain-rule": _tailor_without_domains,
    "fgd": FgdPolicy,
    "bestfit": BestFitPolicy,
}


def wanted(args: argparse.Namespace) -> bool:
    """Whether the command line asks for this replay (any of its own flags)."""
    return bool(args.jobs or args.durations or args.fleet or args.racks is not None)


def fleet_size(kind: str, racks: int) -> int:
    """Racks of an NVL72 fleet, or nodes of an HGX one (``HGX_PER_RACK`` a rack: as many GPUs)."""
    return racks if jobfleets.FLEETS[kind].rack else HGX_PER_RACK * racks


def _checked(args: argparse.Namespace) -> tuple[str, list[str], int, list[int]]:
    """The workload, fleets, racks and seeds of a run, or a ``TraceError`` that says what is wrong."""
    workloads = (*jobfleets.WORKLOADS, CLIQUES)
    if not args.jobs:
        raise TraceError("--durations, --fleet and --racks go with --jobs " + "|".join(workloads))
    if args.jobs not in workloads:
        raise TraceError(f"--jobs {args.jobs!r}: choose from {', '.join(workloads)}")
    clash = [flag for flag, given in (("--policy", args.policy), ("--scheduler", args.scheduler),
                                       ("--cluster-file", args.cluster_file), ("--mig", args.mig),
                                       ("--nodes", args.nodes), ("--pods", args.pods), ("--plot", args.plot)) if given]
    if clash:
        raise TraceError(f"--jobs replays its own fleets under every scheduler: no {', '.join(clash)}")
    fleets = args.fleet or ([] if args.jobs == CLIQUES else list(jobfleets.FLEETS))
    unknown = [f for f in fleets if f not in jobfleets.FLEETS]
    if unknown:
        raise TraceError(f"unknown fleet {', '.join(unknown)}; choose from {', '.join(jobfleets.FLEETS)}")
    racks = args.racks if args.racks is not None else CLIQUE_RACKS if args.jobs == CLIQUES else DEFAULT_RACKS
    if not 1 <= racks <= 1000:
        raise TraceError("--racks: between 1 and 1000")
    if not 0.1 <= args.inflate <= 5:
        raise TraceError("--inflate: expected a factor between 0.1 and 5")
    if args.jobs == CLIQUES:
        fleets = fleets or ["nvl72-gb200"]
        if any(not jobfleets.FLEETS[f].rack for f in fleets) or args.durations:
            raise TraceError("--jobs cliques fills NVL72 racks (an HGX node is a domain of its own), without "
                             "--durations")
    if args.jobs == "openb":
        if not args.trace:
            raise TraceError(f"--jobs openb reads {OPENB_PODS} from the openb trace: it needs --trace DIR "
                             "(gpu-tailor trace fetch DIR gets it)")
        if not (Path(args.trace) / OPENB_PODS).is_file():
            raise TraceError(f"--trace {args.trace}: no {OPENB_PODS} there (gpu-tailor trace fetch {args.trace} gets "
                             "it)")
    return args.jobs, fleets, racks, parse_seeds(args.seeds)


def workload(name: str, kind: str, seed: int, capacity: int, *, durations: bool, inflate: float,
             trace: str | None, racks: int) -> list[jobfleets.Job]:
    """The jobs of one run: enough to pass ``inflate`` x the GPUs (each job takes one at least), or with durations
    ``QUEUED_PER_RACK`` a rack arriving at the generator's load; openb's as the trace has them."""
    if name == "openb":
        return jobfleets.openb_jobs(Path(trace or ".") / OPENB_PODS, kind, seed)
    if durations:
        return jobfleets.training_jobs(kind, seed, QUEUED_PER_RACK * racks, capacity_gpus=capacity)
    return jobfleets.training_jobs(kind, seed, math.ceil(inflate * capacity) + 1)


# workload, fleet, racks, scheduler, durations, inflate, trace folder, seed
Task = tuple[str, str, int, str, bool, float, str | None, int]


def _replay(task: Task) -> tuple[str, jobs.JobRun]:
    name, kind, racks, scheduler, durations, inflate, trace, seed = task
    nodes = jobfleets.fleet_nodes(kind, fleet_size(kind, racks))
    capacity = sum(n.node.gpus for n in nodes)
    load = workload(name, kind, seed, capacity, durations=durations, inflate=inflate, trace=trace, racks=racks)
    return kind, jobs.replay(nodes, load, scheduler, seed, inflate=inflate, durations=durations)


def fill_pods(kind: str, seed: int, count: int) -> list[Shape]:
    """Single pods of 1, 2 or a tray's 4 GPUs, drawn with ``seed``, each with half its GPUs' share of the tray's
    CPU and memory (as ``jobfleets.training_jobs`` gives them)."""
    k = jobfleets.FLEETS[kind]
    rng = random.Random(seed)
    cpu, mem = k.cpu // k.gpus // 2, k.mem // k.gpus // 2
    return [Shape(cpu * g, mem * g, g, MILLI) for g in (rng.choice((1, 2, k.gpus)) for _ in range(count))]


def _fill(task: tuple[str, int, str, int]) -> tuple[str, dict[float, tuple[int, float]]]:
    kind, racks, who, seed = task
    nodes = jobfleets.fleet_nodes(kind, racks)
    pods = fill_pods(kind, seed, sum(n.node.gpus for n in nodes) + 1)
    return kind, jobs.fill(nodes, pods, who, seed, FILL_MARKS, PLAIN.get(who))


def _map(fn: Callable[[Any], Any], tasks: list[Any], workers: int) -> list[Any]:
    """``fn`` over ``tasks``, in their order, on ``workers`` processes, with a progress bar."""
    out: list[Any] = [None] * len(tasks)
    with progress_bar(len(tasks)) as bar:
        if workers > 1 and len(tasks) > 1:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                futures: list[Future[Any]] = [pool.submit(fn, t) for t in tasks]
                for i, f in enumerate(futures):
                    out[i] = f.result()
                    bar.update(1)
        else:
            for i, t in enumerate(tasks):
                out[i] = fn(t)
                bar.update(1)
    return out


def _wait(minutes: float) -> str:
    return f"{minutes:.0f}" if minutes >= 10 else f"{minutes:.1f}"


def table(runs: list[tuple[str, jobs.JobRun]], durations: bool) -> str:
    groups: dict[tuple[str, str], list[jobs.JobRun]] = defaultdict(list)
    for kind, r in runs:
        groups[(kind, r.scheduler)].append(r)
    header = ["fleet", "scheduler", "seeds", "alloc%", "useful%", "held%", "gangs whole/arrived", "split", "spread"]
    if not durations:
        header += ["whole/arrived @100%"]
    else:
        header += ["wait p50 min", "wait p90 min", "never started"]
    rows = [header]
    for (kind, scheduler), rs in groups.items():
        row = [kind, scheduler, str(len(rs)), f"{100 * mean(r.alloc for r in rs):.1f}",
               f"{100 * mean(r.useful for r in rs):.1f}", f"{100 * mean(r.held for r in rs):.1f}",
               f"{mean(r.gangs_whole for r in rs):.1f} / {mean(r.gangs for r in rs):.1f}",
               f"{mean(r.split for r in rs):.1f}", f"{mean(r.spread for r in rs):.1f}"]
        if not durations:
            row += [f"{mean(r.gangs_by_capacity[0] for r in rs):.1f} / {mean(r.gangs_by_capacity[1] for r in rs):.1f}"]
        else:
            row += [_wait(mean(r.wait(50) for r in rs) / 60), _wait(mean(r.wait(90) for r in rs) / 60),
                    f"{mean(r.never for r in rs):.1f}"]
        rows.append(row)
    return "\n".join(aligned(rows, lambda i: i > 1))


def fill_table(results: list[tuple[str, str, dict[float, tuple[int, float]]]]) -> str:
    groups: dict[tuple[str, str], list[dict[float, tuple[int, float]]]] = defaultdict(list)
    for kind, who, marks in results:
        groups[(kind, who)].append(marks)
    pct = [f"{round(100 * m)}%" for m in FILL_MARKS]
    header = ["fleet", "scheduler", "seeds", *(f"whole trays in one clique @{p}" for p in pct),
              *(f"placed @{p}" for p in pct)]
    rows = [header]
    for (kind, who), ms in groups.items():
        spans = []
        for m in FILL_MARKS:
            lo, hi = min(r[m][0] for r in ms), max(r[m][0] for r in ms)
            spans.append(f"{lo}" if lo == hi else f"{lo}-{hi}")
        placed = [f"{100 * mean(r[m][1] for r in ms):.1f}%" for m in FILL_MARKS]
        rows.append([kind, who, str(len(ms)), *spans, *placed])
    return "\n".join(aligned(rows, lambda i: i > 1))


def offered(name: str, kinds: list[str], racks: int, trace: str | None, seed: int) -> str:
    """With durations on openb: how busy the trace's own times keep this fleet (they were not drawn for it)."""
    load = jobfleets.openb_jobs(Path(trace or ".") / OPENB_PODS, kinds[0], seed)
    span = max(j.arrival for j in load) - min(j.arrival for j in load)
    busy = sum(j.gpus * j.duration for j in load) / max(span, 1.0)
    capacity = sum(n.node.gpus for n in jobfleets.fleet_nodes(kinds[0], fleet_size(kinds[0], racks)))
    return (f"openb's own times: {len(load)} jobs over {span / 86400:.0f} days keep {busy:.0f} GPUs busy on average, "
            f"{100 * busy / capacity:.1f}% of {capacity} GPUs")


def run_jobs(args: argparse.Namespace) -> int:
    try:
        name, kinds, racks, seeds = _checked(args)
        if name == CLIQUES:
            return _run_cliques(args, kinds, racks, seeds)
        # the slow ones first, so that two workers finish together
        tasks: list[Task] = [(name, kind, racks, s, args.durations, args.inflate, args.trace, seed)
                             for s in jobs.SCHEDULERS for kind in kinds for seed in seeds]
        note = offered(name, kinds, racks, args.trace, seeds[0]) if name == "openb" and args.durations else ""
        runs: list[tuple[str, jobs.JobRun]] = _map(_replay, tasks, args.workers)
    except TraceError as exc:
        print(f"gpu-tailor simulate: {exc}", file=sys.stderr)
        return 2
    runs.sort(key=lambda kr: (kinds.index(kr[0]), jobs.SCHEDULERS.index(kr[1].scheduler), kr[1].seed))
    gpus = sum(n.node.gpus for n in jobfleets.fleet_nodes(kinds[0], fleet_size(kinds[0], racks)))
    protocol = ("arriving over time, queued first come first served (later jobs start past one that does not fit), "
                "running and leaving" if args.durations else
                f"arriving until {args.inflate:g} x the GPUs have, each placed when it arrives or dropped; nothing "
                "leaves")
    print(f"{name} jobs on {racks} NVL72 racks of 18 trays x 4 GPUs, or {HGX_PER_RACK * racks} HGX nodes of 8 "
          f"({gpus} GPUs either way), {protocol}")
    if note:
        print(note)
    print(table(runs, args.durations))
    print("alloc: GPUs bound, % of the fleet" + (" over the time jobs arrive" if args.durations else "") +
          " (a pod's share of a GPU counted as its share); useful: of jobs running whole; held: of jobs not yet "
          "whole; split: gangs that need one NVLink domain placed over several; spread: gangs that prefer one, over "
          "several" + ("" if args.durations else "; @100%: once the fleet's GPUs' worth of jobs had arrived"))
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": [
            {"fleet": kind, "scheduler": r.scheduler, "seed": r.seed, "jobs": r.jobs, "gangs": r.gangs,
             "gangs_whole": r.gangs_whole,
             "gangs_by_capacity": None if args.durations else list(r.gangs_by_capacity),  # the arrivals' 100% mark
             "split": r.split, "spread": r.spread, "alloc": r.alloc, "useful": r.useful, "held": r.held,
             "never": r.never,
             "wait_p50_s": r.wait(50), "wait_p90_s": r.wait(90)} for kind, r in runs]}, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


def _run_cliques(args: argparse.Namespace, kinds: list[str], racks: int, seeds: list[int]) -> int:
    who = [*jobs.SCHEDULERS, *PLAIN]
    tasks = [(kind, racks, w, seed) for kind in kinds for w in who for seed in seeds]
    done: list[tuple[str, dict[float, tuple[int, float]]]] = _map(_fill, tasks, args.workers)
    results = [(kind, w, marks) for (_, _, w, _), (kind, marks) in zip(tasks, done, strict=True)]
    print(f"single pods of 1, 2 and 4 GPUs on {racks} NVL72 racks ({18 * racks} trays, {72 * racks} GPUs), placed "
          "one by one, nothing leaving; at each mark of the GPUs arrived, the most whole trays left in one clique "
          "(the largest job of whole nodes that still fits in one NVLink domain; min-max over seeds), and the GPUs "
          "placed of those arrived")
    print(fill_table(results))
    print("kube-gangs and first-fit-domain place single pods as kube-scheduler does; tailor-no-domain-rule, fgd and "
          "bestfit are the policies alone, without single pods keeping off untouched cliques")
    if args.json:
        Path(args.json).write_text(json.dumps({"fill": [
            {"fleet": kind, "scheduler": w, "seed": seed,
             "marks": {f"{m:g}": {"whole_nodes": v[0], "placed": v[1]} for m, v in marks.items()}}
            for (kind, _, w, seed), (_, marks) in zip(tasks, done, strict=True)]}, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0
