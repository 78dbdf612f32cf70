"""The trace protocol and the baselines on tiny hand-made cases, and a reduced replay."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gpu_tailor.cli import main
from gpu_tailor.gpumodel.fleet import Fleet, Shape, candidates
from gpu_tailor.gpumodel.policies import (
    MODEL_RESERVE_FROM,
    BestFitPolicy,
    FgdPolicy,
    GpuPackingPolicy,
    Mix,
    TailorPolicy,
)
from gpu_tailor.simulate import synthetic
from gpu_tailor.simulate.cli import parse_seeds
from gpu_tailor.simulate.trace import TraceError, TracePod, _curve, arrivals, load_nodes, load_pods, replay


def pods(*millis: int) -> list[TracePod]:
    return [TracePod(f"p{i:02d}", Shape(1000, 1024, 1 if m else 0, m)) for i, m in enumerate(millis)]


def test_inflation_appends_draws_after_the_shuffled_originals_and_stops_before_the_target() -> None:
    original = pods(1000, 500, 0, 250)
    seq = arrivals(original, seed=42, capacity_milli=2000, inflate=1.3)
    assert sorted(p.name for p in seq[:4]) == [p.name for p in original]
    extra = seq[4:]
    assert extra and all(p.name.split("-tuned-")[0] in {"p00", "p01", "p02", "p03"} for p in extra)
    assert [int(p.name.rsplit("-", 1)[1]) for p in extra] == list(range(len(extra)))
    total = sum(p.shape.gpu_milli for p in seq)
    assert total <= 2600 and total + 1000 > 2600 - 1000  # stopped at the first draw that overflowed


def test_a_workload_above_the_target_is_thinned_keeping_order() -> None:
    original = pods(*([1000] * 10))
    seq = arrivals(original, seed=1, capacity_milli=5000, inflate=1.0)
    assert sum(p.shape.gpu_milli for p in seq) == 5000 and len(seq) == 5
    everything = [p.name for p in arrivals(original, seed=1, capacity_milli=10_000, inflate=1.0)]
    assert [p.name for p in seq] == [n for n in everything if n in {p.name for p in seq}]  # order kept


def test_the_curve_averages_events_per_whole_percent() -> None:
    assert _curve({0: 0.0, 1: 3.0, 3: 9.0}, {0: 1, 1: 2, 3: 3}, 4) == {"0": 0.0, "1": 1.5, "2": 1.5, "3": 3.0,
                                                                        "4": 3.0}


def two_nodes() -> Fleet:
    fleet = Fleet()
    fleet.upsert("a", 32000, 65536, [1000, 300], "T4")
    fleet.upsert("b", 32000, 65536, [1000, 1000], "T4")
    return fleet


def test_bestfit_and_packing_put_a_share_on_the_fullest_fitting_gpu() -> None:
    share = Shape(1000, 1024, 1, 250)
    for policy in (BestFitPolicy(two_nodes()), GpuPackingPolicy(two_nodes())):
        choice = policy.choose(share)
        assert choice is not None and (choice.node, choice.gpus) == (0, (1,)), policy.name


def test_fgd_scores_by_hand() -> None:
    fleet = two_nodes()
    mix = Mix()
    mix.observe(Shape(1000, 1024, 1, 1000))  # one pod type: a whole GPU
    fgd = FgdPolicy(fleet, mix=mix)
    share = Shape(1000, 1024, 1, 250)
    c = candidates(fleet, share, fleet.rows())
    got = {(int(n), int(g)): int(s) for n, g, s in zip(c.node, c.gpu, fgd.score(share, c), strict=True)}
    # a: GPU1 300 -> 50 removes 250 of fragment; a: GPU0 and b: GPU0 each turn 750 into fragment
    assert got == {(0, 0): math.floor(100 / (1 + math.exp(0.75))), (0, 1): math.floor(100 / (1 + math.exp(-0.25))),
                   (1, 0): math.floor(100 / (1 + math.exp(0.75)))}
    choice = fgd.choose(share)
    assert choice is not None and (choice.node, choice.gpus) == (0, (1,))
    assert fgd.fragmentation() == 300  # only a's 300 milli is unusable by a whole-GPU pod


def test_a_multi_gpu_pod_needs_whole_free_gpus_and_cpu_and_model() -> None:
    fleet = two_nodes()
    assert list(fleet.feasible(Shape(1000, 1024, 2, 1000), fleet.rows())) == [False, True]
    assert list(fleet.feasible(Shape(64000, 1024, 1, 100), fleet.rows())) == [False, False]
    assert not fleet.feasible(Shape(1000, 1024, 1, 100, frozenset({"V100M32"})), fleet.rows()).any()


def test_tailor_learns_the_mix_online_only_from_what_it_has_seen() -> None:
    tailor = TailorPolicy(two_nodes())
    assert tailor.mix.total == 0
    tailor.observe(Shape(1000, 2048, 1, 500))
    tailor.observe(Shape(1000, 2048, 1, 500))
    assert tailor.mix.typical() == [((1000, 500, 1, frozenset()), 1.0)]


def test_tailor_keeps_cpu_for_gpus_that_need_it_where_fgd_sees_no_difference() -> None:
    # a GPU-rich node "lean" (96 cores: only 6 sharing pods of 16 cores for its 8 GPUs) and a
    # CPU-rich "rich" (160 cores); a CPU-only pod of 32 cores leaves one 16-core pod fitting on
    # either, so FGD scores both the same and the node rank picks "lean", stranding two more GPUs
    def fleet() -> Fleet:
        f = Fleet()
        f.upsert("lean", 96000, 393216, [1000] * 8, "G2")
        f.upsert("rich", 160000, 393216, [1000] * 8, "G2")
        return f

    mix = Mix()
    gpu_pod, cpu_pod = Shape(16000, 1024, 1, 500), Shape(32000, 1024)
    mix.observe(gpu_pod)
    fgd_choice = FgdPolicy(fleet(), mix=mix).choose(cpu_pod)
    tailor = TailorPolicy(fleet())
    tailor.observe(gpu_pod)
    tailor_choice = tailor.choose(cpu_pod)
    assert fgd_choice is not None and fgd_choice.node == 0
    assert tailor_choice is not None and tailor_choice.node == 1
    # by hand: on "lean" 6 -> 4 pods of CPU for 8 GPUs strands 2000 more milli; "rich" 10 -> 8 strands none
    c = candidates(tailor.fleet, cpu_pod, tailor.fleet.rows())
    assert list(tailor.delta(cpu_pod, c)) == [-2000.0, 0.0]


def test_tailor_leaves_whole_gpu_types_to_fgds_rule() -> None:
    # one 16-core whole-GPU type: "lean" feeds 6 of them for 8 GPUs, but an idle GPU there still
    # takes other pods, so it is not counted lost; only "nothing fits" is (FGD's rule)
    fleet = Fleet()
    fleet.upsert("lean", 96000, 393216, [1000] * 8, "G2")
    tailor = TailorPolicy(fleet)
    tailor.observe(Shape(16000, 1024, 1, 1000))
    assert tailor.fragmentation() == 0
    fleet.take(0, Shape(90000, 1024), ())
    assert tailor.fragmentation() == 8000


def test_tailor_counts_all_free_gpu_as_fragment_when_no_cpu_is_left_as_fgd_does() -> None:
    fleet = Fleet()
    fleet.upsert("n", 8000, 65536, [1000, 600], "T4")
    tailor = TailorPolicy(fleet)
    tailor.observe(Shape(4000, 1024, 1, 500))
    assert tailor.fragmentation() == 0  # 8 cores feed both GPUs: nothing stranded
    fleet.take(0, Shape(6000, 1024), ())
    assert tailor.fragmentation() == 1600  # 2 cores feed no pod: all 1600 milli is fragment
    fleet.release(0, Shape(6000, 1024), ())
    fleet.take(0, Shape(3000, 1024), ())
    # one pod fed of two the GPUs could take: one fitting GPU's worth (their mean, 800) is stranded
    assert tailor.fragmentation() == 800


def test_a_gpu_of_a_model_a_type_may_never_use_is_no_fragment_for_it() -> None:
    fleet = Fleet()
    fleet.upsert("g2", 96000, 393216, [1000] * 8, "G2")
    fleet.upsert("g3", 128000, 786432, [1000] * 8, "G3")
    g2_only = Shape(8000, 1024, 1, 1000, frozenset({"G2"}))
    mix = Mix()
    mix.observe(g2_only)
    assert FgdPolicy(fleet, mix=mix).fragmentation() == 8000  # FGD: all of g3 is lost to the type
    tailor = TailorPolicy(fleet)
    tailor.observe(g2_only)
    assert tailor.fragmentation() == 0


def test_other_pods_leave_the_only_hosts_of_a_kind_alone_though_named_models_exclude_them() -> None:
    # g3 (ranked first) is the only host of a 120-core 8-GPU kind; 12 of 53 pods name G2, so to FGD
    # every GPU taken on g3 is 1000 x 12/53 milli of their fragmentation gone, more than the 120-core
    # kind loses (7000 x 1/53); by hand, FGD scores g3 52 and a G2 node 50
    fleet = Fleet()
    fleet.upsert("g3", 128000, 786432, [1000] * 8, "G3")
    for i in range(4):
        fleet.upsert(f"g2-{i}", 96000, 393216, [1000] * 8, "G2")
    whole = Shape(8000, 1024, 1, 1000)
    seen = [whole] * 40 + [Shape(8000, 1024, 1, 1000, frozenset({"G2"}))] * 12 + [Shape(120000, 1024, 8, 1000)]
    mix, tailor = Mix(coverage=1.0), TailorPolicy(fleet, mix=Mix(coverage=1.0))
    for shape in seen:
        mix.observe(shape)
        tailor.observe(shape)
    fgd = FgdPolicy(fleet, mix=mix).choose(whole)
    assert fgd is not None and fleet.names[fgd.node] == "g3"
    # neither reservation is on (model pressure 0.25, host pressure 0.67): fragmentation alone decides
    assert tailor.model_pressure().max() < MODEL_RESERVE_FROM
    ours = tailor.choose(whole)
    assert ours is not None and fleet.names[ours.node] == "g2-0"


def _two_models() -> Fleet:
    # "p100" ranks first, so on equal scores every pod goes there; "g2a" and "g2b" are the big pool.
    # The tests give tailor a mix of the most common kind only (coverage 0.5), so fragmentation
    # scores all three nodes the same and only the reservation can tell them apart.
    f = Fleet()
    f.upsert("p100", 64000, 262144, [1000, 1000], "P100")
    f.upsert("g2a", 64000, 262144, [1000, 1000], "G2")
    f.upsert("g2b", 64000, 262144, [1000, 1000], "G2")
    return f


def test_tailor_keeps_a_model_for_the_pods_restricted_to_it_once_they_need_most_of_it() -> None:
    whole, p100_only = Shape(8000, 1024, 1, 1000), Shape(8000, 1024, 1, 1000, frozenset({"P100"}))
    tailor = TailorPolicy(_two_models(), mix=Mix(coverage=0.5))
    for shape in (whole, whole, p100_only):
        tailor.observe(shape)
    # by hand: P100-only pods brought 1000 of 3000 milli; filling the 6000 free brings 2000 more of
    # theirs, on P100's 2000 free: pressure 1.0, so a placement there is charged all it takes
    assert tailor.model_pressure().tolist() == [1.0, 0.0]
    c = candidates(tailor.fleet, whole, tailor.fleet.rows())
    plain = FgdPolicy.delta(tailor, whole, c)
    assert (plain[1:] == plain[0]).all()  # fragmentation alone sees no difference
    assert list(tailor.delta(whole, c) - plain) == [-1000.0, 0.0, 0.0]
    choice = tailor.choose(whole)
    assert choice is not None and tailor.fleet.names[choice.node] == "g2a"
    restricted = tailor.choose(p100_only)  # the pods it is kept for still go there
    assert restricted is not None and tailor.fleet.names[restricted.node] == "p100"


def test_tailor_lets_other_pods_use_a_model_while_restricted_pods_need_little_of_it() -> None:
    whole, p100_only = Shape(8000, 1024, 1, 1000), Shape(8000, 1024, 1, 1000, frozenset({"P100"}))
    tailor = TailorPolicy(_two_models(), mix=Mix(coverage=0.5))
    for shape in [whole] * 9 + [p100_only]:
        tailor.observe(shape)
    # 1000 of 10000 milli: 600 more expected on P100's 2000 free, 0.3, under MODEL_RESERVE_FROM
    assert tailor.model_pressure()[0] == pytest.approx(0.3)
    c = candidates(tailor.fleet, whole, tailor.fleet.rows())
    assert (tailor.delta(whole, c) == FgdPolicy.delta(tailor, whole, c)).all()
    choice = tailor.choose(whole)
    assert choice is not None and tailor.fleet.names[choice.node] == "p100"


def test_the_model_charge_ramps_up_from_model_reserve_from_to_all_at_pressure_one() -> None:
    whole, p100_only = Shape(8000, 1024, 1, 1000), Shape(8000, 1024, 1, 1000, frozenset({"P100"}))
    tailor = TailorPolicy(_two_models(), mix=Mix(coverage=0.5))
    for shape in [whole] * 7 + [p100_only] * 3:
        tailor.observe(shape)
    # 3000 of 10000 milli: 1800 more expected on P100's 2000 free, 0.9; from 0.4 to 1.0 the charge
    # goes from nothing to all, so at 0.9 five sixths of the 1000 milli taken there
    assert MODEL_RESERVE_FROM == 0.4 and tailor.model_pressure()[0] == pytest.approx(0.9)
    c = candidates(tailor.fleet, whole, tailor.fleet.rows())
    extra = tailor.delta(whole, c) - FgdPolicy.delta(tailor, whole, c)
    assert extra.tolist() == pytest.approx([-1000 * 5 / 6, 0.0, 0.0])


def test_the_model_charge_is_what_cpu_lets_the_restricted_pods_use_of_the_node() -> None:
    whole, p100_only = Shape(8000, 1024, 1, 1000), Shape(8000, 1024, 1, 1000, frozenset({"P100"}))
    fleet = _two_models()
    fleet.upsert("p100", 4000, 262144, [1000, 1000], "P100")  # CPU for half a restricted pod is left
    tailor = TailorPolicy(fleet, mix=Mix(coverage=0.5))
    for shape in (whole, whole, p100_only):
        tailor.observe(shape)
    assert tailor.model_pressure()[0] == 1.0  # all it takes there is charged
    # restricted pods bring 1000 GPU milli per 8000 CPU milli: 4000 CPU milli feed 500 of the 2000
    # free GPU milli. A 2-core 1-GPU pod leaves 2000 CPU milli, which feed 250: charged 500 - 250,
    # not the 1000 milli it takes
    light = Shape(2000, 1024, 1, 1000)
    c = candidates(fleet, light, fleet.rows())
    extra = tailor.delta(light, c) - FgdPolicy.delta(tailor, light, c)
    assert extra.tolist() == pytest.approx([-250.0, 0.0, 0.0])
    # with 16 cores free all 2000 milli are theirs; a 12-core pod on a tenth of a GPU leaves 4 cores,
    # which feed 500 milli: charged 2000 - 500, not the 100 milli of GPU it takes
    fleet.upsert("p100", 16000, 262144, [1000, 1000], "P100")
    hungry = Shape(12000, 1024, 1, 100)
    c = candidates(fleet, hungry, fleet.rows())
    extra = tailor.delta(hungry, c) - FgdPolicy.delta(tailor, hungry, c)
    assert [fleet.names[n] for n in c.node] == ["p100", "g2a", "g2b"]
    assert extra.tolist() == pytest.approx([-1500.0, 0.0, 0.0])


def test_model_pressure_spreads_a_multi_model_restriction_over_its_models_free_share() -> None:
    tailor = TailorPolicy(_two_models())
    tailor.fleet.take(1, Shape(0, 0, 1, 1000), (0,))  # g2a: one GPU taken; 5000 free in all
    tailor.observe(Shape(8000, 1024, 1, 1000, frozenset({"P100", "G2"})))
    tailor.observe(Shape(8000, 1024, 1, 1000))
    # half of the demand allows P100 or G2, which hold all 5000 free: 2500 / 5000 on each
    assert tailor.model_pressure().tolist() == [0.5, 0.5]


def _one_big_node() -> Fleet:
    # "big" ranks first and is the only node whose CPU can feed a 120-core 8-GPU pod
    f = Fleet()
    f.upsert("big", 128000, 786432, [1000] * 8, "G3")
    f.upsert("a", 96000, 393216, [1000] * 8, "G2")
    f.upsert("b", 96000, 393216, [1000] * 8, "G2")
    return f


def test_tailor_keeps_the_only_hosts_of_a_multi_gpu_kind_once_it_needs_most_of_them() -> None:
    one, big_pod = Shape(8000, 1024, 1, 1000), Shape(120000, 1024, 8, 1000)
    tailor = TailorPolicy(_one_big_node(), mix=Mix(coverage=0.5))
    for shape in [big_pod] + [one] * 8:
        tailor.observe(shape)
    # by hand: the 120-core pods brought half of 16000 milli; filling the 24000 free brings 12000
    # more of theirs, on one host of 8000: pressure 1.5, so spoiling that host costs all 8000
    (k, _, able, share), = [g for g in tailor.host_groups() if g[1] == 120000]
    assert (k, able.tolist(), share) == (8, [True, False, False], 0.5)
    c = candidates(tailor.fleet, one, tailor.fleet.rows())
    plain = FgdPolicy.delta(tailor, one, c)
    assert (plain == plain[0]).all()  # fragmentation alone sees no difference
    assert list(tailor.delta(one, c) - plain) == [-8000.0, 0.0, 0.0]
    choice = tailor.choose(one)
    assert choice is not None and tailor.fleet.names[choice.node] == "a"
    # an 8-GPU pod any node can host is also kept off it; the 120-core one still gets it
    wide = Shape(64000, 1024, 8, 1000)
    choice = tailor.choose(wide)
    assert choice is not None and tailor.fleet.names[choice.node] == "a"
    choice = tailor.choose(big_pod)
    assert choice is not None and tailor.fleet.names[choice.node] == "big"


def test_tailor_charges_a_host_spoilt_by_cpu_alone() -> None:
    tailor = TailorPolicy(_one_big_node(), mix=Mix(coverage=0.5))
    for shape in [Shape(120000, 1024, 8, 1000)] + [Shape(8000, 1024, 1, 1000)] * 8:
        tailor.observe(shape)
    # a sharing pod takes no idle GPU from "big" but 16 of its cores: 112 left, the host is gone
    hungry = Shape(16000, 1024, 1, 500)
    c = candidates(tailor.fleet, hungry, tailor.fleet.rows())
    cost, on_big = tailor.host_cost(hungry, c), c.node == tailor.fleet.index["big"]
    assert cost[on_big].tolist() == [8000.0] and (cost[~on_big] == 0).all()


def test_tailor_lets_other_pods_use_the_hosts_while_the_kind_needs_few_of_them() -> None:
    one = Shape(8000, 1024, 1, 1000)
    tailor = TailorPolicy(_one_big_node(), mix=Mix(coverage=0.5))
    for shape in [Shape(120000, 1024, 8, 1000)] + [one] * 40:
        tailor.observe(shape)
    # 8000 of 48000 milli: 4000 more expected on a host of 8000, 0.5, under HOST_RESERVE_FROM
    c = candidates(tailor.fleet, one, tailor.fleet.rows())
    assert (tailor.host_cost(one, c) == 0).all()
    choice = tailor.choose(one)
    assert choice is not None and tailor.fleet.names[choice.node] == "big"


def test_tailor_puts_multi_gpu_pods_on_an_nvlinked_set_when_one_exists() -> None:
    from gpu_tailor.gpumodel.topology import nvlink_pairs

    fleet = Fleet()
    fleet.upsert("pairs", 64000, 262144, [1000, 0, 1000, 1000, 0, 0, 0, 0], "G2", nvlink_pairs(8))
    fleet.upsert("other", 64000, 262144, [1000, 1000, 0, 0, 0, 0, 0, 0], "G2", nvlink_pairs(8))
    choice = TailorPolicy(fleet).choose(Shape(1000, 1024, 2, 1000))
    assert choice is not None and (choice.node, choice.gpus) in {(0, (2, 3)), (1, (0, 1))}


def small_trace(tmp_path: Path, n_nodes: int = 40, n_pods: int = 500) -> tuple[Path, Path]:
    """A small cut of the generated cluster (every ``step``-th node, so all its kinds) and workload, as CSVs."""
    everything = synthetic.cluster()
    nodes = everything[:: len(everything) // n_nodes][:n_nodes]
    nodes_csv, pods_csv = synthetic.write_csv(tmp_path, nodes, synthetic.workload(pods=n_pods))
    small = pods_csv.with_name("small_pods.csv")
    pods_csv.rename(small)
    return nodes_csv, small


@pytest.mark.parametrize("policy", ["random", "dotprod", "gpupacking", "gpuclustering", "bestfit", "fgd", "tailor"])
def test_reduced_replay(tmp_path: Path, policy: str) -> None:
    nodes_csv, pods_csv = small_trace(tmp_path)
    nodes, trace = load_nodes(nodes_csv), load_pods(pods_csv)
    r = replay(nodes, trace, policy, seed=42, workload="small")
    values = [r.alloc[str(k)] for k in range(131)]
    assert all(0 <= v <= 100 for v in values)
    assert r.alloc["100"] > 50 and r.failed_pods > 0  # 130% arrived cannot all fit
    assert values == sorted(values)  # pods never leave: allocation only grows
    capacity = sum(n.gpus for n in nodes) * 1000
    assert r.frag["100"] >= 0 and capacity > 0


def test_cli_writes_the_json_schema_and_the_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes_csv, pods_csv = small_trace(tmp_path)
    out, png = tmp_path / "runs.json", tmp_path / "alloc.png"
    assert main(["simulate", "--nodes", str(nodes_csv), "--pods", str(pods_csv), "--policy", "fgd", "--policy",
                 "tailor", "--seeds", "42,43", "--json", str(out), "--plot", str(png)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [(r["policy"], r["seed"]) for r in runs] == [("fgd", 42), ("fgd", 43), ("tailor", 42), ("tailor", 43)]
    for r in runs:
        assert set(r) == {"policy", "workload", "seed", "alloc", "frag", "failed_pods", "seconds"}
        assert r["workload"] == "small_pods" and list(r["alloc"]) == [str(k) for k in range(131)]
        assert list(r["frag"]) == ["100"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out
    assert "alloc@100%" in table and "tailor" in table and str(png.resolve()) in table
    assert "online best-fit" in table and "offline best-fit-decreasing" in table


def test_bad_input_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("sn,cpu_milli\nx,1\n")
    assert main(["simulate", "--nodes", str(bad)]) == 2
    assert "missing column" in capsys.readouterr().err
    assert main(["simulate", "--policy", "nope"]) == 2
    assert "unknown policy nope" in capsys.readouterr().err
    with pytest.raises(TraceError):
        parse_seeds("4x")
    assert parse_seeds("42-44,50") == [42, 43, 44, 50]
