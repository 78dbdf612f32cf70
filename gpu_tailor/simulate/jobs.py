"""Multi-pod jobs on NVLink-domain fleets: gangs placed whole by gpu-tailor, against kube-scheduler and a
first-fit-domain placer (``gpu-tailor simulate --jobs``).

A job is a ``gangs.Gang``: its pods are useless until all of them run, and most ask for one NVLink domain. The fleets
are NVL72 racks (18 compute trays of 4 GPUs sharing one NVLink fabric, each rack one ``nvidia.com/gpu.clique``) and HGX
nodes (8 GPUs on one NVSwitch: the domain is the node). The schedulers:

- ``gpu-tailor``: the extender's own plan (``gangs.plan`` with tailor): the domain the packing policy prefers, the
  members placed by the policy inside it, nothing bound unless all are; single pods keep whole domains whole;
- ``kube-scheduler``: kube-scheduler alone, without gangs: every pod on its own, by the default profile
  (``simulate.kube.KubeModel``: LeastAllocated and BalancedAllocation), so a job's pods scatter over domains and bind
  as they fit, holding their GPUs while the rest wait;
- ``kube-gangs``: kube-scheduler with 1.36's gang scheduling (KEP-4671, KEP-5732): all or nothing; a job asking for a
  domain gets a topology constraint, each domain is one candidate placement where the pods are placed one after the
  other by the default profile, and of the feasible placements the tightest wins (NodeResourcesFit's placement score:
  the most GPUs allocated after it); a job that only prefers one domain has no constraint there (there is no
  preferred one), only the gang;
- ``first-fit-domain``: what Kueue's topology-aware scheduling does: the first domain (in name order) that holds the
  job, its pods placed there by the default profile; a job that prefers one domain goes anywhere where none holds it.

Two protocols. Without durations, as the FGD paper replays openb: jobs arrive until ``inflate`` x the GPUs have
arrived, each is placed when it arrives or dropped, and nothing leaves. With durations jobs arrive over time, wait
in a queue (first come first served, later jobs placed past one that does not fit), run, and leave; kube-scheduler's
pods wait one by one.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from gpu_tailor.gpumodel.fleet import MILLI, Fleet, Shape
from gpu_tailor.gpumodel.gangs import ANYWHERE, PREFERRED, REQUIRED, Gang, GangMix, domain_slots, plan
from gpu_tailor.gpumodel.policies import Policy, TailorPolicy
from gpu_tailor.gpumodel.policies.base import NodeChoice
from gpu_tailor.simulate.jobfleets import FleetNode, Job, build, gpus
from gpu_tailor.simulate.kube import KubeModel, SimNode, SimPod
from gpu_tailor.simulate.trace import TraceError

SCHEDULERS = ("gpu-tailor", "kube-gangs", "first-fit-domain", "kube-scheduler")
Placed = list[NodeChoice]


class Scheduler:
    """One of ``SCHEDULERS`` over one fleet: ``job`` places a whole job or nothing; ``pod`` one pod of a job that
    is placed pod by pod (kube-scheduler without gangs)."""

    def __init__(self, name: str, fleet: Fleet, nodes: list[FleetNode], seed: int) -> None:
        if name not in SCHEDULERS:
            raise TraceError(f"unknown scheduler {name!r}; choose from {', '.join(SCHEDULERS)}")
        self.name, self.fleet = name, fleet
        self.rows = fleet.rows()
        self.kube = KubeModel(fleet, self.rows, [SimNode(n.node) for n in nodes], seed)
        self.policy: Policy = TailorPolicy(fleet, seed)
        self.mix = GangMix()
        self.order = sorted(set(int(d) for d in fleet.domain[self.rows]), key=lambda d: fleet.domain_names[d])
        self.within = {d: fleet.domain[self.rows] == d for d in self.order}  # each domain's rows, as a mask
        self.holds: dict[Shape, tuple[int, np.ndarray]] = {}  # ``could``'s bound per shape, and the fleet it saw

    @property
    def gangs(self) -> bool:
        return self.name != "kube-scheduler"

    def observe(self, job: Job) -> None:
        if self.name == "gpu-tailor":
            for _ in range(job.gang.size):
                self.policy.observe(job.gang.member)
            self.mix.observe(job.gang)

    def job(self, job: Job) -> Placed | None:
        gang = job.gang
        if self.name == "gpu-tailor":
            chosen = plan(self.policy, gang, self.mix, self.rows)
            return list(chosen.members) if chosen is not None else None
        if gang.domain == ANYWHERE or gang.size == 1 or (gang.domain == PREFERRED and self.name == "kube-gangs"):
            return self._kube_all(gang)
        tried: list[tuple[float, int, Placed]] = []
        # a domain where not one member fits is passed over unasked (kube-scheduler would draw no tie there; a
        # pod restricted to GPU models is asked everywhere, as ``slots`` counts models and the model does not)
        hold = domain_slots(self.fleet, gang.member, self.rows)
        for d in self.order:
            if not hold[d] and not gang.member.models:
                continue
            placed = self._kube_all(gang, self.within[d])
            if placed is None:
                continue
            if self.name == "first-fit-domain":
                return placed
            tried.append((self._allocated(d, placed), -len(tried), placed))
        if tried:
            return max(tried, key=lambda t: t[:2])[2]
        return self._kube_all(gang) if gang.domain == PREFERRED else None

    def could(self, gang: Gang, members: int) -> bool:
        """Whether ``members`` more of ``gang`` may fit, by ``gangs.domain_slots``'s bound (a cheap no)."""
        if not members:
            return True
        seen = int(self.fleet.gen[self.rows].sum())  # rises with every take and release
        at, hold = self.holds.get(gang.member, (-1, None))
        if at != seen or hold is None:
            hold = domain_slots(self.fleet, gang.member, self.rows)
            self.holds[gang.member] = (seen, hold)
        if self.gangs and gang.domain == REQUIRED and gang.size > 1:
            return bool(hold.max() >= members)
        return bool(hold.sum() >= (members if self.gangs else 1))

    def _allocated(self, domain: int, placed: Placed) -> float:
        rows = self.rows[self.within[domain]]
        gpus = int(self.fleet.ngpu[rows].sum())
        idle = int((self.fleet.gpu[rows] == MILLI).sum()) - sum(len(c.gpus) for c in placed)
        return 1 - idle / max(gpus, 1)

    def pod(self, shape: Shape, among: np.ndarray | None = None) -> NodeChoice | None:
        """kube-scheduler's choice for one pod (the default profile), among the rows ``among`` marks (all by
        default)."""
        km = self.kube
        ok = km.fits(SimPod("", shape))
        if among is not None:
            ok &= among
        if not ok.any():
            return None
        at = int(self.rows[km.pick(ok, km.default_profile(SimPod("", shape)))])
        gpus = tuple(self.fleet.free_gpus(at)[: shape.gpus])
        return NodeChoice(at, gpus, 0.0)

    def _kube_all(self, gang: Gang, among: np.ndarray | None = None) -> Placed | None:
        taken = self.pods(gang, gang.size, among)
        return taken if len(taken) == gang.size else None

    def pods(self, gang: Gang, n: int, among: np.ndarray | None = None) -> Placed:
        """Up to ``n`` pods of ``gang``, one by one among ``among`` (all rows by default), as kube-scheduler places
        them without gangs: those that fit (nothing is left taken on the fleet: the caller takes them)."""
        placed: Placed = []
        for _ in range(n):
            c = self.pod(gang.member, among)
            if c is None:
                break
            self.fleet.take(c.node, gang.member, c.gpus)
            placed.append(c)
        for c in reversed(placed):
            self.fleet.release(c.node, gang.member, c.gpus)
        return placed


@dataclass
class JobRun:
    """One run's figures; fractions are of the fleet's GPUs (or of GPU-time, with durations)."""

    scheduler: str
    seed: int
    jobs: int = 0
    gangs: int = 0  # jobs of several pods
    gangs_whole: int = 0  # ... that ran with every pod
    gangs_by_capacity: tuple[int, int] = (0, 0)  # arrivals: (whole, arrived) once the GPUs' worth had arrived
    split: int = 0  # ... of those that asked for one domain, placed over several
    spread: int = 0  # ... of those that preferred one, placed over several
    alloc: float = 0.0  # GPUs bound
    useful: float = 0.0  # GPUs of jobs running whole
    held: float = 0.0  # GPUs bound to jobs not yet whole
    waits: list[float] = field(default_factory=list)  # seconds, per job that started
    never: int = 0  # jobs still waiting at the end

    def wait(self, q: float) -> float:
        return float(np.percentile(self.waits, q)) if self.waits else 0.0


def _count(run: JobRun, fleet: Fleet, job: Job, placed: Placed) -> None:
    if job.gang.size > 1:
        run.gangs_whole += 1
        if len({int(fleet.domain[c.node]) for c in placed}) > 1:
            run.split += job.gang.domain == REQUIRED
            run.spread += job.gang.domain == PREFERRED


def replay(nodes: list[FleetNode], jobs: list[Job], scheduler: str, seed: int, *, inflate: float = 1.0,
           durations: bool = False, progress: Callable[[int], None] | None = None) -> JobRun:
    """One run: without ``durations`` the arrival protocol (jobs in order until ``inflate`` x the GPUs arrived,
    placed or dropped, never leaving), with them the queue."""
    fleet = build(nodes, seed)
    sched = Scheduler(scheduler, fleet, nodes, seed)
    capacity = int(fleet.ngpu[: fleet.n].sum())
    run = JobRun(scheduler, seed)
    if durations:
        _queue(run, sched, jobs, capacity, progress)
        return run
    arrived = held = 0.0
    for i, job in enumerate(jobs):
        if arrived + job.gpus > inflate * capacity:
            break
        if arrived <= capacity < arrived + job.gpus:  # the fleet's GPUs have arrived: FGD's 100% mark
            run.gangs_by_capacity = (run.gangs_whole, run.gangs)
        arrived += job.gpus
        run.jobs += 1
        run.gangs += job.gang.size > 1
        sched.observe(job)
        placed = sched.job(job) if sched.gangs else sched.pods(job.gang, job.gang.size)
        if placed:
            for c in placed:
                fleet.take(c.node, job.gang.member, c.gpus)
            if len(placed) == job.gang.size:
                _count(run, fleet, job, placed)
                run.useful += job.gpus
            else:
                held += gpus(job.gang.member, len(placed))
        if progress is not None:
            progress(i + 1)
    if arrived <= capacity:
        run.gangs_by_capacity = (run.gangs_whole, run.gangs)
    run.alloc = (run.useful + held) / capacity
    run.useful /= capacity
    run.held = held / capacity
    return run


def _queue(run: JobRun, sched: Scheduler, jobs: list[Job], capacity: int,
           progress: Callable[[int], None] | None) -> None:
    fleet = sched.fleet
    horizon = max(j.arrival for j in jobs)
    ends: list[tuple[float, int]] = []  # (time, job index) of running jobs
    waiting: list[int] = []
    bound: dict[int, Placed] = {}  # what each job holds, whole or not
    busy = held = 0.0  # GPUs bound, and of those to jobs not whole
    last, area, held_area = 0.0, 0.0, 0.0
    nxt = 0
    for j in jobs:
        run.jobs += 1
        run.gangs += j.gang.size > 1

    def advance(now: float) -> None:
        nonlocal last, area, held_area
        span = max(min(now, horizon) - last, 0.0)
        area += busy * span
        held_area += held * span
        last = max(last, min(now, horizon))

    def start(i: int, now: float) -> None:
        nonlocal busy, held
        job = jobs[i]
        have = bound.setdefault(i, [])
        want = job.gang.size - len(have)
        placed = (sched.job(job) or []) if sched.gangs else sched.pods(job.gang, want)
        for c in placed:
            fleet.take(c.node, job.gang.member, c.gpus)
        have.extend(placed)
        busy += gpus(job.gang.member, len(placed))
        if len(have) == job.gang.size:
            held -= gpus(job.gang.member, len(have) - len(placed))
            waiting.remove(i)
            run.waits.append(now - job.arrival)
            _count(run, fleet, job, have)
            heapq.heappush(ends, (now + job.duration, i))
        else:
            held += gpus(job.gang.member, len(placed))

    while nxt < len(jobs) or ends:
        arrival = jobs[nxt].arrival if nxt < len(jobs) else math.inf
        freed = bool(ends) and ends[0][0] <= arrival
        if freed:
            now, i = heapq.heappop(ends)
            advance(now)
            for c in bound.pop(i):
                fleet.release(c.node, jobs[i].gang.member, c.gpus)
            busy -= jobs[i].gpus
        else:
            now = arrival
            advance(now)
            waiting.append(nxt)
            sched.observe(jobs[nxt])
            nxt += 1
            if progress is not None:
                progress(nxt)
        # an arrival changes nothing for the jobs already waiting: only the new one is tried; a departure, all of them
        for i in list(waiting) if freed else waiting[-1:]:
            if sched.could(jobs[i].gang, jobs[i].gang.size - len(bound.get(i, ()))):
                start(i, now)
    run.never = len(waiting)
    run.alloc = area / (capacity * horizon) if horizon else 0.0
    run.held = held_area / (capacity * horizon) if horizon else 0.0
    run.useful = run.alloc - run.held


def largest_whole_gang(fleet: Fleet) -> int:
    """The most whole free nodes in one labelled domain: the largest job of whole nodes that still fits in one."""
    rows = fleet.rows()
    whole = fleet.untouched(rows)
    counts = np.bincount(fleet.domain[rows], weights=whole, minlength=len(fleet.domain_names))
    labelled = np.asarray(fleet.labelled, bool)
    return int(counts[labelled].max()) if labelled.any() else 0


def fill(nodes: list[FleetNode], singles: Iterable[Shape], scheduler: str, seed: int,
         marks: tuple[float, ...] = (0.5, 0.6), policy: Callable[[Fleet, int], Policy] | None = None,
         ) -> dict[float, tuple[int, float]]:
    """Single pods placed one by one until each fraction of ``marks`` of the GPUs has arrived: at each, the largest
    job of whole nodes that still fits in one domain, and the GPUs placed over those arrived (nothing leaves).
    With ``policy`` (a factory) that policy alone places them (``Policy.choose``), and ``scheduler`` is a name."""
    fleet = build(nodes, seed)
    if policy is not None:
        alone = policy(fleet, seed)

        def place(shape: Shape) -> Placed | None:
            alone.observe(shape)
            choice = alone.choose(shape)
            return [choice] if choice is not None else None
    else:
        sched = Scheduler(scheduler, fleet, nodes, seed)

        def place(shape: Shape) -> Placed | None:
            job = Job("", Gang(1, shape, ANYWHERE))
            sched.observe(job)
            return sched.job(job) if sched.name == "gpu-tailor" else sched.pods(job.gang, 1)
    capacity = int(fleet.ngpu[: fleet.n].sum())
    out: dict[float, tuple[int, float]] = {}
    arrived = used = 0
    for shape in singles:
        if len(out) == len(marks):
            break
        placed = place(shape)
        arrived += shape.gpus
        if placed:
            fleet.take(placed[0].node, shape, placed[0].gpus)
            used += shape.gpus
        for m in marks:
            if m not in out and arrived >= m * capacity:
                out[m] = (largest_whole_gang(fleet), used / arrived)
    return out
