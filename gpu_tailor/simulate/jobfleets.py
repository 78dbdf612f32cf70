"""The fleets and the workloads of ``simulate --jobs``: NVL72 racks and HGX nodes as fleet rows with their NVLink
domains, and jobs (``gangs.Gang``s with an arrival and a duration) generated as a training mix or grouped from
openb's pods. ``simulate.jobs`` places them.
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpu_tailor.gpumodel.fleet import MILLI, Fleet, Shape
from gpu_tailor.gpumodel.gangs import ANYWHERE, PREFERRED, REQUIRED, Gang
from gpu_tailor.gpumodel.topology import nvswitch
from gpu_tailor.simulate.trace import TraceError, TraceNode

WORKLOADS = ("training", "openb")


@dataclass(frozen=True, slots=True)
class FleetKind:
    """A fleet of identical nodes: per node CPU (milli), memory (MiB), GPUs and model; ``rack`` nodes share one
    NVLink domain (0: each node is its own, an HGX NVSwitch)."""

    model: str
    cpu: int
    mem: int
    gpus: int
    rack: int


# GB200 and GB300 compute trays: two Grace CPUs (72 Arm cores and 480 GB LPDDR5X each) and four GPUs; NVL72: 18 trays
# a rack on one NVLink switch fabric. HGX H100: two 56-core Xeons, 2 TiB, eight GPUs on NVSwitch (NVIDIA's DGX H100).
FLEETS = {
    "nvl72-gb200": FleetKind("NVIDIA-GB200", 144_000, 2 * 480 * 1024, 4, 18),
    "nvl72-gb300": FleetKind("NVIDIA-GB300", 144_000, 2 * 480 * 1024, 4, 18),
    "hgx-h100": FleetKind("NVIDIA-H100-80GB-HBM3", 112_000, 2048 * 1024, 8, 0),
}


@dataclass(frozen=True, slots=True)
class FleetNode:
    node: TraceNode
    domain: str  # "" where the node is a domain of its own


def fleet_nodes(kind: str, count: int) -> list[FleetNode]:
    """``count`` racks of ``kind`` (``FLEETS``), or ``count`` nodes where a node is its own domain."""
    if kind not in FLEETS:
        raise TraceError(f"unknown fleet {kind!r}; choose from {', '.join(FLEETS)}")
    k = FLEETS[kind]
    if count < 1:
        raise TraceError(f"a fleet of {count} racks or nodes")
    if not k.rack:
        return [FleetNode(TraceNode(f"hgx-{i:03d}", k.cpu, k.mem, k.gpus, k.model), "") for i in range(count)]
    # GFD's clique label: <fabric cluster UUID>.<clique id>
    return [FleetNode(TraceNode(f"rack{r}-tray{t:02d}", k.cpu, k.mem, k.gpus, k.model), f"rack-{r:02d}-uuid.{r}")
            for r in range(count) for t in range(k.rack)]


@dataclass(frozen=True, slots=True)
class Job:
    name: str
    gang: Gang
    arrival: float = 0.0  # seconds
    duration: float = math.inf

    @property
    def gpus(self) -> float:
        """GPUs asked, a share of one counted as its share (as the openb replay counts allocation)."""
        return gpus(self.gang.member, self.gang.size)


def gpus(shape: Shape, pods: int) -> float:
    """The GPUs ``pods`` pods of ``shape`` take, a share of one GPU counted as its share."""
    return pods * shape.gpu_milli / MILLI


def training_jobs(kind: str, seed: int, count: int, load: float = 0.9, capacity_gpus: int = 0) -> list[Job]:
    """A generated training mix for ``kind``'s nodes: 55% of the jobs single pods of 1, 2 or a node's GPUs, 20% jobs
    of half nodes (2 to 4 members, preferring one domain), 25% jobs of whole nodes (2 to 16 members on NVL72 racks,
    asking for one domain; 2 to 8 on HGX, asking for none, since there a domain is one node); by GPUs about a tenth
    single pods, a tenth to a fifth half nodes, the rest whole nodes. Durations are log-normal around an hour; with
    ``capacity_gpus`` arrivals are Poisson at ``load`` of it."""
    k = FLEETS[kind]
    rng = random.Random(seed)
    sizes = (2, 4, 8, 12, 16) if k.rack else (2, 4, 8)
    singles = (1, 1, 2, k.gpus)
    # the mix's mean GPUs per job and mean duration (log-normal: e^(mu + sigma^2 / 2))
    mean_gpus = 0.55 * sum(singles) / len(singles) + 0.20 * 3 * (k.gpus // 2) + 0.25 * k.gpus * sum(sizes) / len(sizes)
    mean_dur = 3600 * math.exp(0.8**2 / 2)
    big = REQUIRED if k.rack else ANYWHERE
    per_gpu = (k.cpu // k.gpus // 2, k.mem // k.gpus // 2)
    jobs: list[Job] = []
    t = 0.0
    for i in range(count):
        draw = rng.random()
        if draw < 0.55:
            g = rng.choice(singles)
            gang = Gang(1, Shape(per_gpu[0] * g, per_gpu[1] * g, g, MILLI), ANYWHERE)
        elif draw < 0.75:
            g = k.gpus // 2
            gang = Gang(rng.choice((2, 3, 4)), Shape(per_gpu[0] * g, per_gpu[1] * g, g, MILLI), PREFERRED)
        else:
            g = k.gpus
            gang = Gang(rng.choice(sizes), Shape(per_gpu[0] * g, per_gpu[1] * g, g, MILLI, nvlink=True), big)
        duration = rng.lognormvariate(math.log(3600), 0.8)
        job = Job(f"job-{i:05d}", gang, t, duration)
        jobs.append(job)
        if capacity_gpus:  # Poisson arrivals keeping ``load`` of the GPUs busy on average
            t += rng.expovariate(load * capacity_gpus / (mean_gpus * mean_dur))
    return jobs


OPENB_WINDOW = 600.0  # seconds: multi-GPU pods of one shape created this close together are one job


def openb_jobs(path: Path, kind: str, seed: int) -> list[Job]:
    """openb's pods as jobs (openb_pod_list_default.csv: creation and deletion times): multi-GPU pods of one shape
    created within ``OPENB_WINDOW`` of the previous one are one job (a pod larger than a node becomes node-sized
    members), asking for one domain where one holds them (anywhere on HGX where they need several nodes); GPU-sharing
    and one-GPU pods stay single. Times are the trace's, shifted by the seed's rotation so that each seed starts
    somewhere else."""
    k = FLEETS[kind]
    try:
        with path.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror or exc}") from exc
    need = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "creation_time", "deletion_time")
    if not rows or any(c not in rows[0] for c in need):
        raise TraceError(f"{path}: expected openb's columns {', '.join(need)}")
    pods = []
    for r in rows:
        gpus, milli = int(r["num_gpu"] or 0), int(r["gpu_milli"] or 0)
        if not gpus:
            continue
        born, gone = float(r["creation_time"] or 0), float(r["deletion_time"] or 0)
        pods.append((born, max(gone - born, 1.0), int(r["cpu_milli"] or 0), int(r["memory_mib"] or 0), gpus, milli))
    pods.sort()
    jobs: list[Job] = []
    group: list[tuple[float, float, int, int, int, int]] = []

    def close() -> None:
        born, _, cpu, mem, gpus, milli = group[0]
        members = len(group) * max(1, -(-gpus // k.gpus))
        per = min(gpus, k.gpus)
        scale = per / gpus
        shape = Shape(int(cpu * scale), int(mem * scale), per, milli if gpus == 1 else MILLI)
        # one domain where one can hold them all: on HGX a job of several whole nodes goes anywhere (as in
        # ``training_jobs``), else it would never start
        domain = REQUIRED if 1 < members <= max(k.rack, 1) * (k.gpus // per) else ANYWHERE
        jobs.append(Job(f"openb-{len(jobs):05d}", Gang(members, shape, domain), born,
                        max(d for _, d, *_ in group)))
        group.clear()

    for p in pods:
        if group and not (p[4] > 1 and p[2:] == group[-1][2:] and p[0] - group[-1][0] <= OPENB_WINDOW):
            close()
        group.append(p)
    if group:
        close()
    shift = random.Random(seed).random() * (jobs[-1].arrival - jobs[0].arrival)
    span = jobs[-1].arrival - jobs[0].arrival + 1
    out = [Job(j.name, j.gang, (j.arrival - jobs[0].arrival + shift) % span, j.duration) for j in jobs]
    return sorted(out, key=lambda j: j.arrival)


def build(nodes: list[FleetNode], seed: int) -> Fleet:
    fleet = Fleet(width=max(n.node.gpus for n in nodes))
    for n in nodes:
        t = n.node
        fleet.upsert(t.name, t.cpu, t.mem, [MILLI] * t.gpus, t.model, nvswitch(t.gpus), domain=n.domain)
    fleet.rank[: fleet.n] = np.random.default_rng(seed).permutation(fleet.n)
    return fleet
