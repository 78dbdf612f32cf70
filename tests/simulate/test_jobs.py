"""Multi-pod jobs on NVLink-domain fleets (``simulate.jobs``) and ``gpu-tailor simulate --jobs``: gpu-tailor places
gangs whole and in one domain, kube-scheduler without gangs holds GPUs for jobs not whole, single pods keep cliques
whole, openb's pods grouped into jobs, and the command line."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from gpu_tailor.cli import main
from gpu_tailor.gpumodel.fleet import MILLI, Shape
from gpu_tailor.gpumodel.gangs import ANYWHERE, REQUIRED, Gang
from gpu_tailor.simulate import jobfleets, jobs
from gpu_tailor.simulate.jobs_cli import PLAIN, fill_pods
from gpu_tailor.simulate.trace import TraceError, TraceNode

RACKS = 2  # small fleets: 36 trays, or 18 HGX nodes
GB200 = jobfleets.FLEETS["nvl72-gb200"]


def small(kind: str) -> list[jobfleets.FleetNode]:
    return jobfleets.fleet_nodes(kind, RACKS if jobfleets.FLEETS[kind].rack else 9 * RACKS)


def gpus(nodes: list[jobfleets.FleetNode]) -> int:
    return sum(n.node.gpus for n in nodes)


@pytest.mark.parametrize("durations", [False, True], ids=["arrivals", "queue"])
@pytest.mark.parametrize("kind", list(jobfleets.FLEETS))
def test_gpu_tailor_splits_no_gang_and_holds_no_gpu_for_one_not_whole(kind: str, durations: bool) -> None:
    nodes = small(kind)
    load = jobfleets.training_jobs(kind, 42, 120 if durations else 300, capacity_gpus=gpus(nodes) if durations else 0)
    run = jobs.replay(nodes, load, "gpu-tailor", 42, inflate=1.3, durations=durations)
    assert run.gangs_whole > 0
    assert run.split == 0
    assert run.held == 0
    assert 0 < run.useful == run.alloc <= 1


def test_the_gangs_counted_at_the_100_percent_mark_are_those_that_arrived_by_then() -> None:
    # jobs of two half trays on two trays (8 GPUs): two fit and bring the GPUs' worth; a third arrives past the mark
    # and finds the trays full
    nodes = jobfleets.fleet_nodes("nvl72-gb200", 1)[:2]
    pair = Gang(2, Shape(1000, 1024, 2, MILLI), REQUIRED)
    load = [jobfleets.Job(f"j{i}", pair) for i in range(4)]
    run = jobs.replay(nodes, load, "gpu-tailor", 42, inflate=1.5)
    assert (run.gangs_whole, run.gangs) == (2, 3)
    assert run.gangs_by_capacity == (2, 2)
    run = jobs.replay(nodes, load, "gpu-tailor", 42, inflate=1.0)  # the run ends at the mark
    assert run.gangs_by_capacity == (run.gangs_whole, run.gangs) == (2, 2)


def test_kube_scheduler_without_gangs_holds_gpus_for_jobs_not_whole() -> None:
    nodes = small("nvl72-gb200")
    held = [jobs.replay(nodes, jobfleets.training_jobs("nvl72-gb200", s, 300), "kube-scheduler", s, inflate=1.3).held
            for s in (42, 43, 44)]
    assert max(held) > 0


@pytest.mark.parametrize("scheduler", ["kube-gangs", "first-fit-domain"])
def test_kube_scheduler_with_gangs_holds_nothing_and_splits_no_required_gang(scheduler: str) -> None:
    nodes = small("nvl72-gb200")
    run = jobs.replay(nodes, jobfleets.training_jobs("nvl72-gb200", 42, 300), scheduler, 42, inflate=1.3)
    assert run.held == 0 and run.split == 0 and run.gangs_whole > 0


@pytest.mark.parametrize("kind", list(jobfleets.FLEETS))
def test_generated_arrivals_keep_the_load_asked_for(kind: str) -> None:
    # the Poisson rate is worked out from the mix's own mean GPUs and duration (one that took three nodes' GPUs a
    # job offered 0.8 of the GPUs on NVL72 and 0.5 on HGX)
    capacity = 576
    load = jobfleets.training_jobs(kind, 42, 10_000, load=0.9, capacity_gpus=capacity)
    offered = sum(j.gpus * j.duration for j in load) / (capacity * load[-1].arrival)
    assert offered == pytest.approx(0.9, abs=0.05)


def test_a_job_waiting_when_the_last_one_leaves_starts_then() -> None:
    # one rack of two trays: the second job of two whole trays arrives while the first runs, and starts once it
    # has left, after the last arrival
    nodes = [jobfleets.FleetNode(TraceNode(f"tray{i}", GB200.cpu, GB200.mem, 4, GB200.model), "rack-a")
             for i in range(2)]
    tray = Shape(GB200.cpu // 2, GB200.mem // 2, 4, MILLI)
    load = [jobfleets.Job("first", Gang(2, tray), 0.0, 100.0), jobfleets.Job("second", Gang(2, tray), 10.0, 50.0)]
    for scheduler in jobs.SCHEDULERS:
        run = jobs.replay(nodes, load, scheduler, 42, durations=True)
        assert run.never == 0, scheduler
        assert run.waits == [0.0, 90.0], scheduler


@pytest.mark.parametrize("seed", [42, 43, 44])
def test_single_pods_leave_a_clique_whole_under_gpu_tailor(seed: int) -> None:
    nodes = jobfleets.fleet_nodes("nvl72-gb200", 3)
    pods = fill_pods("nvl72-gb200", seed, gpus(nodes))
    marks = jobs.fill(nodes, pods, "gpu-tailor", seed)
    for mark in (0.5, 0.6):
        whole, placed = marks[mark]
        assert whole >= 16, mark
        assert placed == 1.0
    # the same policy without the domain rule spreads them over the three racks
    before = jobs.fill(nodes, pods, "tailor-no-domain-rule", seed, policy=PLAIN["tailor-no-domain-rule"])
    assert before[0.6][0] < 16


OPENB_COLUMNS = ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase",
                 "creation_time", "deletion_time", "scheduled_time"]


def openb_csv(folder: Path) -> Path:
    rows = [  # name, cpu, memory, GPUs, milli, created, deleted
        ("big-0", 64000, 262144, 8, 1000, 0, 5000),
        ("big-1", 64000, 262144, 8, 1000, 300, 9000),  # within 600 s of big-0, same shape: one job
        ("pair-0", 16000, 65536, 2, 1000, 2000, 3000),
        ("pair-1", 16000, 65536, 2, 1000, 2500, 4000),
        ("pair-late", 16000, 65536, 2, 1000, 3200, 4000),  # 700 s after pair-1: a job of its own
        ("share", 4000, 8192, 1, 500, 4000, 4100),
        ("one-a", 8000, 16384, 1, 1000, 5000, 6000),
        ("one-b", 8000, 16384, 1, 1000, 5010, 6000),  # one-GPU pods stay single
        ("cpu-only", 2000, 4096, 0, 0, 6000, 7000),
    ]
    path = folder / "openb_pod_list_default.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(OPENB_COLUMNS)
        for name, cpu, mem, n, milli, born, gone in rows:
            w.writerow([name, cpu, mem, n, milli, "", "LS", "Running", born, gone, born])
    return path


@pytest.mark.parametrize(("kind", "big"), [
    pytest.param("nvl72-gb200", (4, 4, REQUIRED), id="nvl72-two-8-gpu-pods-as-4-trays"),
    pytest.param("hgx-h100", (2, 8, ANYWHERE), id="hgx-two-nodes-anywhere"),
])
def test_openb_pods_grouped_into_jobs(tmp_path: Path, kind: str, big: tuple[int, int, str]) -> None:
    load = jobfleets.openb_jobs(openb_csv(tmp_path), kind, 42)
    got = sorted((j.gang.size, j.gang.member.gpus, j.gang.member.milli, j.gang.domain, j.duration) for j in load)
    size, per, ask = big
    # a job runs as long as its longest pod
    want = sorted([(size, per, MILLI, ask, 8700.0), (2, 2, MILLI, REQUIRED, 1500.0), (1, 2, MILLI, ANYWHERE, 800.0),
                   (1, 1, 500, ANYWHERE, 100.0), (1, 1, MILLI, ANYWHERE, 1000.0), (1, 1, MILLI, ANYWHERE, 990.0)])
    assert got == want
    big_job = next(j for j in load if (j.gang.size, j.gang.member.gpus) == (size, per))
    assert big_job.gang.member.cpu == 64000 * per // 8  # a share of the pod's CPU per member
    share = next(j for j in load if j.gang.member.milli == 500)
    assert share.gpus == 0.5  # a share of one GPU counts as its share
    assert [j.arrival for j in load] == sorted(j.arrival for j in load)


def test_openb_needs_its_columns(tmp_path: Path) -> None:
    path = tmp_path / "openb_pod_list_default.csv"
    path.write_text("name,num_gpu\np,1\n")
    with pytest.raises(TraceError, match="expected openb's columns"):
        jobfleets.openb_jobs(path, "nvl72-gb200", 42)


@pytest.mark.parametrize(("extra", "fleets"), [
    pytest.param([], list(jobfleets.FLEETS), id="arrivals-every-fleet"),
    pytest.param(["--durations", "--fleet", "hgx-h100", "--fleet", "nvl72-gb200"], ["hgx-h100", "nvl72-gb200"],
                 id="queue-two-fleets"),
])
def test_simulate_jobs_prints_one_row_per_fleet_and_scheduler(
        extra: list[str], fleets: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_json = tmp_path / "runs.json"
    assert main(["simulate", "--jobs", "training", "--racks", "1", "--seeds", "42", "--json", str(out_json),
                 *extra]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.split() and line.split()[0] in jobfleets.FLEETS]
    assert [(r[0], r[1]) for r in rows] == [(f, s) for f in fleets for s in jobs.SCHEDULERS]
    assert ("wait p90 min" in out) == ("--durations" in extra)
    assert ("whole/arrived @100%" in out) != ("--durations" in extra)  # the mark is the arrivals'
    runs = json.loads(out_json.read_text())["runs"]
    assert len(runs) == len(rows)
    assert all((r["gangs_by_capacity"] is None) == ("--durations" in extra) for r in runs)
    assert all(r["split"] == 0 and r["held"] == 0 for r in runs if r["scheduler"] == "gpu-tailor")


def test_simulate_jobs_cliques(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--jobs", "cliques", "--seeds", "42"]) == 0  # three racks
    rows = {line.split()[1]: line.split() for line in capsys.readouterr().out.splitlines()
            if line.startswith("nvl72-gb200 ")}
    assert list(rows) == [*jobs.SCHEDULERS, *PLAIN]
    assert all(int(cell) >= 16 for cell in rows["gpu-tailor"][3:5])  # trays of one rack left whole @50% and @60%
    assert rows["gpu-tailor"][5:] == ["100.0%", "100.0%"]


@pytest.mark.parametrize(("args", "message"), [
    pytest.param(["--jobs", "training", "--fleet", "nvl36"], "unknown fleet nvl36; choose from nvl72-gb200",
                 id="bad-fleet"),
    pytest.param(["--jobs", "inference"], "--jobs 'inference': choose from training, openb, cliques", id="bad-jobs"),
    pytest.param(["--jobs", "openb"], "--jobs openb reads openb_pod_list_default.csv", id="openb-without-trace"),
    pytest.param(["--durations"], "go with --jobs", id="durations-without-jobs"),
    pytest.param(["--jobs", "training", "--racks", "0"], "--racks: between 1 and 1000", id="no-racks"),
    pytest.param(["--jobs", "cliques", "--fleet", "hgx-h100"], "fills NVL72 racks", id="cliques-on-hgx"),
    pytest.param(["--jobs", "training", "--policy", "fgd"], "no --policy", id="a-policy"),
])
def test_simulate_jobs_says_what_is_wrong(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpu-tailor simulate: ") and message in err
