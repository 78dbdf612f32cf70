"""``gpu-tailor simulate``: replay the generated workload, the openb trace or given CSVs through the policies;
``gpu-tailor trace``: fetch the openb trace, write the generated workload."""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from importlib import resources
from pathlib import Path
from statistics import mean
from typing import Any

from gpu_tailor.gpumodel.fleet import MILLI
from gpu_tailor.gpumodel.inventory import NodeInventory, from_node
from gpu_tailor.gpumodel.occupancy import ReplicaPolicy
from gpu_tailor.gpumodel.policies import POLICIES
from gpu_tailor.simulate import synthetic
from gpu_tailor.simulate.cluster import from_dump
from gpu_tailor.simulate.headroom import headroom
from gpu_tailor.simulate.kube import DEFAULT_EXTENDER_WEIGHT, SCHEDULERS, Meter, SimNode, sim_pod
from gpu_tailor.simulate.kube import run as run_kube
from gpu_tailor.simulate.output import aligned, check_plot_available, inventory_table, plot, scheduled_table, table
from gpu_tailor.simulate.trace import (
    RunResult,
    TraceError,
    TraceNode,
    TracePod,
    arrivals,
    load_nodes,
    load_pods,
    parse_prior,
    replay,
)

DEFAULT_POLICIES = ("tailor", "fgd", "bestfit")
OPENB_NODES = "openb_node_list_gpu_node.csv"
GENERATED = ""  # a job's source when it replays the generated cluster or workload


def openb_pods(workload: str) -> str:
    return f"openb_pod_list_{workload}.csv"


def sources(args: argparse.Namespace) -> tuple[str, str]:
    """The node and pod lists a run replays: paths, or GENERATED."""
    if args.trace:
        folder = Path(args.trace)
        if not (folder / OPENB_NODES).is_file():
            raise TraceError(f"--trace {folder}: no {OPENB_NODES} there (gpu-tailor trace fetch {folder} gets it)")
        return args.nodes or str(folder / OPENB_NODES), args.pods or str(folder / openb_pods(args.workload))
    if args.workload != "default":
        raise TraceError("--workload picks a pod list of the openb trace: it needs --trace DIR")
    return args.nodes or GENERATED, args.pods or GENERATED


def nodes_of(source: str) -> list[TraceNode]:
    return load_nodes(Path(source)) if source else synthetic.cluster()


def pods_of(source: str) -> tuple[list[TracePod], str]:
    """The pods and the workload's name for the table."""
    if not source:
        return synthetic.workload(), synthetic.WORKLOAD
    return load_pods(Path(source)), Path(source).stem


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    try:
        for part in text.split(","):
            lo, sep, hi = part.strip().partition("-")
            seeds.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    except ValueError as exc:
        raise TraceError(f"--seeds {text!r}: expected '42-51' or '42,43'") from exc
    if not seeds:
        raise TraceError("--seeds: no seed given")
    return seeds


def _one(job: tuple[str, str, str, int, float, str, str | None, str]) -> RunResult:
    nodes_src, pods_src, policy, seed, inflate, topology, ties, prior = job
    pods, workload = pods_of(pods_src)
    return replay(nodes_of(nodes_src), pods, policy, seed, workload=workload, inflate=inflate, topology=topology,
                  ties=ties, prior=parse_prior(prior) if prior else None)


def progress_bar(total: int) -> Any:
    """A tqdm bar over the runs on stderr; disabled when stdout is not a terminal (a pipe, a file, CI), so a
    table written to a file has no carriage-return litter beside it."""
    from tqdm import tqdm  # type: ignore[import-untyped]

    return tqdm(total=total, unit="run", desc="replaying", file=sys.stderr, disable=not sys.stdout.isatty(),
                dynamic_ncols=True)


def checked(args: argparse.Namespace, default_policies: list[str]) -> tuple[list[str], list[int]]:
    """The policies (``--policy``, else ``default_policies``) and seeds a run replays; ``--inflate`` in range."""
    policies = args.policy or default_policies
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise TraceError(f"unknown policy {', '.join(unknown)}; choose from {', '.join(POLICIES)}")
    if not 0.1 <= args.inflate <= 5:
        raise TraceError("--inflate: expected a factor between 0.1 and 5")
    return policies, parse_seeds(args.seeds)


def run(args: argparse.Namespace) -> int:
    if args.inventory:
        print(inventory_table(bundled_nodes()))
        return 0
    from gpu_tailor.simulate import jobs_cli  # it imports this module's helpers

    if jobs_cli.wanted(args):
        return jobs_cli.run_jobs(args)
    if args.mig:
        return run_mig(args)
    if args.scheduler or args.cluster_file:
        return run_scheduled(args)
    try:
        if args.plot:
            check_plot_available()
        policies, seeds = checked(args, list(DEFAULT_POLICIES))
        nodes_src, pods_src = sources(args)
        nodes, (pods, _) = nodes_of(nodes_src), pods_of(pods_src)  # fail fast on bad input
        gpus = sum(n.gpus for n in nodes)
        refs = [headroom((p.shape for p in arrivals(pods, s, gpus * MILLI, args.inflate)), nodes) for s in seeds]
        if args.prior:
            parse_prior(args.prior)  # a bad --prior says so before any replay
        jobs = [(nodes_src, pods_src, p, s, args.inflate, args.topology, args.ties, args.prior or "")
                for p in policies for s in seeds]
        results: list[RunResult] = []
        with progress_bar(len(jobs)) as bar:
            if args.workers > 1 and len(jobs) > 1:
                with ProcessPoolExecutor(max_workers=args.workers) as pool:
                    for r in pool.map(_one, jobs):
                        results.append(r)
                        bar.update(1)
            else:
                for job in jobs:
                    results.append(_one(job))
                    bar.update(1)
    except TraceError as exc:
        print(f"gpu-tailor simulate: {exc}", file=sys.stderr)
        return 2
    print(table(results, args.topology, refs))
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": [r.wire() for r in results]}, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.plot:
        plot(results, args.plot)
        print(f"plot: {Path(args.plot).resolve()}")
    return 0


def run_trace(args: argparse.Namespace) -> int:
    """``gpu-tailor trace fetch|generate``."""
    from gpu_tailor.simulate.fetch import TRACE_URL, fetch

    folder = Path(args.dir)
    if args.trace_command == "generate":
        if args.pods is not None and args.pods < 1:
            print("gpu-tailor trace generate: --pods must be at least 1", file=sys.stderr)
            return 2
        nodes_csv, pods_csv = synthetic.write_csv(folder, synthetic.cluster(),
                                                  synthetic.workload(seed=args.seed, pods=args.pods))
        print(f"wrote {nodes_csv} and {pods_csv}; replay them with "
              f"gpu-tailor simulate --nodes {nodes_csv} --pods {pods_csv}")
        return 0
    try:
        fetch(folder, args.base_url or TRACE_URL, timeout=args.timeout)
    except TraceError as exc:
        print(f"gpu-tailor trace fetch: {exc}; nothing new was left in {folder}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"gpu-tailor trace fetch: {folder}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"the openb trace is in {folder} (CC BY 4.0, see {folder / 'README.md'}); "
          f"replay it with gpu-tailor simulate --trace {folder}")
    return 0


def bundled_nodes() -> list[NodeInventory]:
    folder = resources.files("gpu_tailor") / "data" / "nodes"
    return [from_node(json.loads(f.read_text())) for f in sorted(folder.iterdir(), key=lambda f: f.name)
            if f.name.endswith(".json")]


def time_sliced(nodes: list[TraceNode], share: float, replicas: int, seed: int) -> list[SimNode]:
    """``share`` of each GPU model's nodes (rounded, picked with ``seed``) time-sliced with ``replicas`` per GPU;
    the device plugin sells a node's GPUs either whole or as replicas, never both."""
    by_model: dict[str, list[int]] = defaultdict(list)
    for i, n in enumerate(nodes):
        if n.gpus:
            by_model[n.model].append(i)
    rng = random.Random(seed)
    shared: set[int] = set()
    for model in sorted(by_model):
        picked = list(by_model[model])
        rng.shuffle(picked)
        shared.update(picked[: round(len(picked) * share)])
    return [SimNode(n, replicas if i in shared else 0) for i, n in enumerate(nodes)]


def run_mig(args: argparse.Namespace) -> int:
    """``simulate --mig``: every layout of ``simulate.mig`` under both schedulers, for each workload and seed."""
    from gpu_tailor.simulate import mig

    try:
        seeds = parse_seeds(args.seeds)
        if not 0.1 <= args.inflate <= 5:
            raise TraceError("--inflate: expected a factor between 0.1 and 5")
        if not 1 <= args.mig_nodes <= 1000:
            raise TraceError("--mig-nodes: between 1 and 1000")
        if args.cluster_file or args.scheduler or args.dra:
            raise TraceError("--mig replays its own H100 nodes under both schedulers: no --cluster-file, --scheduler "
                             "or --dra with it")
        template, workload = pods_of(sources(args)[1])
    except TraceError as exc:
        print(f"gpu-tailor simulate: {exc}", file=sys.stderr)
        return 2
    top = math.floor(args.inflate * 100 + 0.5)
    print(f"{args.mig_nodes} nodes of 8 x H100 80GB on DRA; the pods of {workload} of one GPU or less, asking for "
          f"their share of a GPU's compute, up to {args.inflate:g} x the GPUs")
    rows = [["workload", "layout", "scheduler", "seeds", "alloc@90%", "alloc@100%", f"alloc@{top}%", "failed pods",
             "partitions carved or taken (mean)"]]
    runs = []
    for kind in mig.WORKLOADS:
        for layout in mig.LAYOUTS:
            for scheduler in mig.SCHEDULERS:
                done = [mig.run(layout, scheduler, template, seed, args.mig_nodes, inflate=args.inflate, workload=kind)
                        for seed in seeds]
                runs += done
                curves = [r.curve(top) for r in done]
                carved: Counter[str] = Counter()
                for r in done:
                    carved.update(r.carved)
                rows.append([kind, layout, scheduler, str(len(done)),
                             f"{mean(c.get('90', math.nan) for c in curves):.2f}",
                             f"{mean(c.get('100', math.nan) for c in curves):.2f}",
                             f"{mean(c[str(top)] for c in curves):.2f}",
                             f"{mean(sum(r.failed.values()) for r in done):.1f}",
                             ", ".join(f"{p} {n / len(done):.0f}" for p, n in carved.most_common(4))])
    print("\n".join(aligned(rows, lambda i: 3 <= i <= 7)))
    print("alloc: the GPU share the placed pods asked for, % of the GPUs, when that much of it has arrived; pods never "
          "leave, and a pod no node can allocate is dropped; single-GPU: every pod of one GPU or less, shares: those "
          "of less than one")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": [
            {"workload": r.workload, "layout": r.layout, "scheduler": r.scheduler, "seed": r.seed,
             "alloc": r.curve(top), "failed": dict(r.failed), "carved": dict(r.carved)} for r in runs]}, indent=1)
            + "\n")
        print(f"wrote {args.json}")
    return 0


def through_dra(nodes: list[SimNode], share: float, seed: int) -> list[SimNode]:
    """``share`` of each GPU model's nodes (rounded, picked with ``seed``) published through DRA instead of the device
    plugin (a node is one or the other), each as it was: whole GPUs, or shared ones."""
    by_model: dict[str, list[int]] = defaultdict(list)
    for i, n in enumerate(nodes):
        if n.node.gpus:
            by_model[n.node.model].append(i)
    rng = random.Random(seed + 1)  # not the draw of the time-sliced nodes
    dra: set[int] = set()
    for model in sorted(by_model):
        picked = list(by_model[model])
        rng.shuffle(picked)
        dra.update(picked[: round(len(picked) * share)])
    return [replace(n, dra=True) if i in dra else n for i, n in enumerate(nodes)]


def run_scheduled(args: argparse.Namespace) -> int:
    """``simulate --scheduler``: kube-scheduler alone against kube-scheduler with gpu-tailor (``simulate.kube``),
    on a cluster dump's nodes, or the trace's or generated nodes with a share of them time-sliced."""
    try:
        schedulers = args.scheduler or list(SCHEDULERS)
        unknown = [s for s in schedulers if s not in SCHEDULERS]
        if unknown:
            raise TraceError(f"unknown scheduler {', '.join(unknown)}; choose from {', '.join(SCHEDULERS)}")
        policies, seeds = checked(args, ["tailor"])
        if not 0 <= args.time_sliced <= 1 or args.replicas < 2:
            raise TraceError("--time-sliced: a share between 0 and 1; --replicas: at least 2")
        if not 0 <= args.dra <= 1:
            raise TraceError("--dra: a share between 0 and 1")
        if args.dra and args.cluster_file:
            raise TraceError("--dra publishes trace or generated nodes through DRA; a --cluster-file's DRA pools are "
                             "not simulated yet")
        prior = parse_prior(args.prior) if args.prior else None
        weight = DEFAULT_EXTENDER_WEIGHT if args.extender_weight is None else args.extender_weight
        if weight < 1:
            raise TraceError("--extender-weight: at least 1")
        notes: list[str] = []
        if args.cluster_file:
            dumped = from_dump(args.cluster_file)
            nodes, notes = dumped.nodes, dumped.notes(pods=not (args.trace or args.pods))
            if args.trace or args.pods:
                template, workload = pods_of(sources(args)[1])
            else:
                template, workload = dumped.pods, f"the {len(dumped.pods)} pods of {args.cluster_file}"
        else:
            nodes_src, pods_src = sources(args)
            nodes = through_dra(time_sliced(nodes_of(nodes_src), args.time_sliced, args.replicas, seeds[0]),
                                args.dra, seeds[0])
            template, workload = pods_of(pods_src)
        if args.replica_policy:  # every shared pool's device plugin configured so
            nodes = [replace(n, policy=ReplicaPolicy(args.replica_policy)) if n.shared else n for n in nodes]
        if not any(p.shape.gpus for p in template):
            raise TraceError(f"{workload}: no pod asks for a GPU, nothing to draw a GPU workload from "
                             "(--trace DIR or --pods CSV give one)")
    except TraceError as exc:
        print(f"gpu-tailor simulate: {exc}", file=sys.stderr)
        return 2
    counts = {n.replicas for n in nodes if n.shared}
    per_gpu = counts.pop() if len(counts) == 1 else 0  # one pool size: shares rounded to whole replicas
    capacity = sum(n.node.gpus for n in nodes) * MILLI
    largest = max(n.node.gpus for n in nodes)
    shared = sum(n.shared for n in nodes)
    handed = "/".join(sorted({n.policy.value for n in nodes if n.shared and not n.dra}))
    dra = sum(n.dra for n in nodes)
    published = f"; {dra} published through DRA, {sum(n.dra and n.shared for n in nodes)} of them as shared devices"
    print(f"{len(nodes)} nodes ({sum(1 for n in nodes if n.node.gpus)} with GPUs, {shared} of them time-sliced or "
          f"MPS{f', replicas handed out {handed}' if handed else ''}"
          f"{published if dra else ''}"
          f"), {capacity // MILLI} GPUs; pods drawn from "
          f"{workload} up to {args.inflate:g} x the GPU capacity; gpu-tailor's extender at weight {weight}")
    for note in notes:
        print(f"  {note}")
    mix = [sim_pod(p, per_gpu) for p in template]
    runs: list[tuple[str, str, int, Meter]] = []
    for seed in seeds:
        seq = [sim_pod(p, per_gpu) for p in arrivals(template, seed, capacity, args.inflate)]
        for scheduler in schedulers:
            for policy in policies if scheduler == "gpu-tailor" else [""]:
                meter = run_kube(nodes, seq, scheduler, seed, policy=policy or "tailor", mix=mix,
                                 weight=weight, ties=args.ties, prior=prior)
                runs.append((scheduler, policy, seed, meter))
    top = math.floor(args.inflate * 100 + 0.5)
    print(scheduled_table(runs, top, largest))
    print("alloc: GPUs allocated, % of capacity, when that much of it has arrived; pods never leave, and a pod that "
          "fits nowhere is dropped; kube-scheduler picks among equal scores at random (one draw per seed)")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": [
            {"scheduler": sched, "policy": policy, "seed": seed, "alloc": m.curve(top), "failed": dict(m.failed),
             "whole_nodes": m.whole_nodes, "largest_node_gpus": largest} for sched, policy, seed, m in runs]},
            indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0
