"""Replay a GPU cluster trace (Alibaba openb) with the protocol of the FGD paper (USENIX ATC'23).

The simulator only turns CSV rows into fleet nodes and pod shapes and replays arrivals; every
decision is made by ``gpumodel.policies`` over a ``gpumodel.fleet``, the engine the extender runs.

Protocol: sort pods by name and shuffle with the seed; inflate to ``inflate`` x GPU capacity by
drawing extra pods (with replacement, from the name-sorted originals) after the shuffled ones; rank
nodes by a random permutation (score ties go to the lowest rank); pods arrive one by one and never
leave; a pod that fits nowhere is dropped. After every arrival, arrived% = round(arrived GPU milli /
capacity) and alloc% = used GPU milli / capacity; the curve at k% is the mean alloc% of the events
whose arrived% is k.
"""

from __future__ import annotations

import csv
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpu_tailor.gpumodel.fleet import MILLI, Fleet, Shape
from gpu_tailor.gpumodel.policies import POLICIES, FgdPolicy, Mix, Policy, Prior, configure
from gpu_tailor.gpumodel.topology import GpuTopology, nvlink_pairs, nvswitch

TOPOLOGIES = ("none", "hgx", "pairs")


class TraceError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class TraceNode:
    name: str
    cpu: int
    mem: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    shape: Shape


def _rows(path: Path, required: tuple[str, ...]) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in required if c not in (reader.fieldnames or [])]
            if missing:
                raise TraceError(f"{path}: missing column(s) {', '.join(missing)}")
            return list(reader)
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror or exc}") from exc


def _int(row: dict[str, str], col: str, path: Path, line: int) -> int:
    try:
        return int(row[col] or 0)
    except ValueError as exc:
        raise TraceError(f"{path}:{line}: {col}={row[col]!r} is not an integer") from exc


def load_nodes(path: Path) -> list[TraceNode]:
    out = []
    for i, r in enumerate(_rows(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model")), start=2):
        out.append(TraceNode(r["sn"], _int(r, "cpu_milli", path, i), _int(r, "memory_mib", path, i),
                             _int(r, "gpu", path, i), r["model"].strip()))
    if not out:
        raise TraceError(f"{path}: no nodes")
    return out


def load_pods(path: Path) -> list[TracePod]:
    out = []
    for i, r in enumerate(_rows(path, ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")), start=2):
        gpus = _int(r, "num_gpu", path, i)
        milli = min(_int(r, "gpu_milli", path, i), MILLI) if gpus else 0
        if gpus < 0 or milli < 0:
            raise TraceError(f"{path}:{i}: negative GPU request")
        models = frozenset(m.strip() for m in (r.get("gpu_spec") or "").split("|") if m.strip())
        out.append(TracePod(r["name"], Shape(_int(r, "cpu_milli", path, i), _int(r, "memory_mib", path, i),
                                             gpus, milli, models)))
    if not out:
        raise TraceError(f"{path}: no pods")
    return out


def arrivals(pods: list[TracePod], seed: int, capacity_milli: int, inflate: float) -> list[TracePod]:
    """The arrival sequence: shuffled originals, then inflation draws (or random deletions)."""
    rng = random.Random(seed)
    ordered = sorted(pods, key=lambda p: p.name)
    seq = list(ordered)
    rng.shuffle(seq)
    target = inflate * capacity_milli
    total = sum(p.shape.gpu_milli for p in seq)
    if total > target:
        while total > target:
            victim = seq.pop(rng.randrange(len(seq)))
            total -= victim.shape.gpu_milli
        return seq
    i = 0
    while True:
        pick = ordered[rng.randrange(len(ordered))]
        if total + pick.shape.gpu_milli > target:
            return seq
        seq.append(TracePod(f"{pick.name}-tuned-{i}", pick.shape))
        total += pick.shape.gpu_milli
        i += 1


def topology_for(kind: str, gpus: int) -> GpuTopology | None:
    if gpus != 8 or kind == "none":
        return None
    return nvswitch(8) if kind == "hgx" else nvlink_pairs(8)


def build_fleet(nodes: list[TraceNode], topology: str, seed: int) -> Fleet:
    fleet = Fleet(width=max(n.gpus for n in nodes))
    for n in nodes:
        fleet.upsert(n.name, n.cpu, n.mem, [MILLI] * n.gpus, n.model, topology_for(topology, n.gpus))
    fleet.rank[: fleet.n] = np.random.default_rng(seed).permutation(fleet.n)
    return fleet


@dataclass
class RunResult:
    policy: str
    workload: str
    seed: int
    alloc: dict[str, float]
    frag: dict[str, float]
    failed_pods: int
    seconds: float
    multi_gpu_pods: int = 0
    multi_gpu_nvlinked: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def wire(self) -> dict[str, Any]:
        return {"policy": self.policy, "workload": self.workload, "seed": self.seed, "alloc": self.alloc,
                "frag": self.frag, "failed_pods": self.failed_pods, "seconds": round(self.seconds, 3)}


def parse_prior(text: str) -> Prior:
    """``WEIGHT[:FLOOR]`` (``--prior 10:0.002``) as a ``Prior``; a clear error for anything else."""
    weight, _, floor = text.partition(":")
    try:
        prior = Prior(float(weight), float(floor or 0))
    except ValueError as exc:
        raise TraceError(f"--prior {text!r}: expected WEIGHT[:FLOOR], e.g. 10 or 0:0.002") from exc
    if not (0 <= prior.weight <= 1e6 and 0 <= prior.floor < 1):
        raise TraceError(f"--prior {text!r}: the weight is a count of pods (0 or more), the floor a share below 1")
    return prior


def replay(nodes: list[TraceNode], pods: list[TracePod], policy: str, seed: int, *, workload: str = "",
           inflate: float = 1.3, topology: str = "none", ties: str | None = None, prior: Prior | None = None,
           progress: Callable[[int, int], None] | None = None) -> RunResult:
    """One run of one policy on one seed. ``extra["whole_nodes"]``: the 8-GPU nodes left whole and free (every
    GPU idle) when 90% and 100% of the capacity has arrived; ``ties``, ``prior``: as ``configure`` sets them
    (None: the policy's own; ``ties="rank"`` replays tailor's ties as before issue 28)."""
    if policy not in POLICIES:
        raise TraceError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    start = time.perf_counter()
    fleet = build_fleet(nodes, topology, seed)
    capacity = fleet.capacity_milli()
    seq = arrivals(pods, seed, capacity, inflate)
    trace_mix = Mix()
    for p in pods:
        trace_mix.observe(p.shape)
    engine: Policy = (FgdPolicy(fleet, seed, mix=trace_mix) if policy == "fgd"
                      else POLICIES[policy](fleet, seed))
    configure(engine, ties, prior if policy != "fgd" else None)
    eight = np.flatnonzero(fleet.ngpu[: fleet.n] == 8)
    whole: dict[str, int] = {}
    meter = FgdPolicy(fleet, seed, mix=trace_mix)  # fragmentation as the paper measures it
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    frag_sum, frag_n = 0.0, 0
    arrived = used = failed = multi = linked = 0
    rows = fleet.rows()
    for t, pod in enumerate(seq):
        shape = pod.shape
        engine.observe(shape)
        arrived += shape.gpu_milli
        choice = engine.choose(shape, rows)
        if choice is None:
            failed += 1
        else:
            fleet.take(choice.node, shape, choice.gpus)
            engine.placed(choice.node, shape)
            used += shape.gpu_milli
            if shape.gpus > 1:
                multi += 1
                topo = fleet.topologies[choice.node]
                linked += bool(topo is not None and topo.all_nvlinked(choice.gpus))
        pct = math.floor(arrived * 100 / capacity + 0.5)
        for mark in ("90", "100"):
            if pct >= int(mark) and mark not in whole:
                whole[mark] = int(fleet.untouched(eight).sum())
        sums[pct] = sums.get(pct, 0.0) + used * 100 / capacity
        counts[pct] = counts.get(pct, 0) + 1
        if pct == 100:
            frag_sum += meter.fragmentation() * 100 / capacity
            frag_n += 1
        if progress is not None:
            progress(t + 1, len(seq))
    alloc = _curve(sums, counts, math.floor(inflate * 100 + 0.5))
    frag = {"100": round(frag_sum / frag_n, 4)} if frag_n else {}
    return RunResult(policy, workload, seed, alloc, frag, failed, time.perf_counter() - start, multi, linked,
                     {"whole_nodes": whole, "eight_gpu_nodes": len(eight)})


def _curve(sums: dict[int, float], counts: dict[int, int], top: int) -> dict[str, float]:
    """Mean alloc% per whole arrived%; a percent no event landed on repeats the one below."""
    out: dict[str, float] = {}
    last = 0.0
    for k in range(top + 1):
        if counts.get(k):
            last = sums[k] / counts[k]
        out[str(k)] = round(last, 4)
    return out
