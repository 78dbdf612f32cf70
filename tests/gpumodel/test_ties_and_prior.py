"""Keep whole nodes whole (issue 28): the keys that tell apart placements the policy scores alike (``Fleet.ties``),
and the prior a learnt pod mix starts from (``Prior``)."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_tailor.gpumodel.fleet import MILLI, Fleet, Shape
from gpu_tailor.gpumodel.policies import TIES, FgdPolicy, Mix, Prior, TailorPolicy, configure
from gpu_tailor.gpumodel.policies.fgd import whole_node_kinds
from gpu_tailor.gpumodel.topology import nvlink_pairs


def fleet_of(*idle: int, gpus: int = 8, cpu: int = 96_000, mem: int = 1_000_000) -> Fleet:
    """Nodes n0, n1, ... of ``gpus`` GPUs each, with the first GPUs of each idle as given (the rest busy)."""
    fleet = Fleet(width=gpus)
    for i, k in enumerate(idle):
        fleet.upsert(f"n{i}", cpu, mem, [MILLI] * k + [0] * (gpus - k))
    return fleet


def order(fleet: Fleet, shape: Shape, keys: str) -> list[int]:
    rows = fleet.rows()
    return [int(r) for r in rows[np.argsort(fleet.ties(rows, shape, keys), kind="stable")]]


def test_a_whole_free_node_comes_last_for_every_pod_of_whole_gpus() -> None:
    fleet = fleet_of(8, 3, 8, 5)
    for keys in ("whole", "blocks", "multi-blocks"):
        for gpus in (1, 2, 4):
            assert order(fleet, Shape(1000, 1000, gpus, MILLI), keys)[-2:] == [0, 2], (keys, gpus)


def test_the_smallest_free_block_that_fits_is_filled_first_for_multi_gpu_pods() -> None:
    fleet = fleet_of(6, 2, 4)
    two = Shape(1000, 1000, 2, MILLI)
    assert order(fleet, two, "multi-blocks") == [1, 2, 0]
    assert order(fleet, two, "whole") == [0, 1, 2]  # all in use: the keys leave them tied (the rank decides)
    one = Shape(1000, 1000, 1, MILLI)
    assert order(fleet, one, "multi-blocks") == [0, 1, 2]  # one-GPU pods keep the first key alone
    assert order(fleet, one, "blocks") == [1, 2, 0]


def test_nvlink_domains_count_not_idle_gpus() -> None:
    fleet = Fleet(width=8)
    pairs = nvlink_pairs(8)
    fleet.upsert("scattered", 96_000, 1_000_000, [MILLI, 0, MILLI, 0, MILLI, 0, MILLI, 0], topology=pairs)
    fleet.upsert("paired", 96_000, 1_000_000, [MILLI, MILLI, MILLI, MILLI, 0, 0, 0, 0], topology=pairs)
    # four idle GPUs each, but only "paired" has a free NVLink pair (its block is 2, the other's 1): among
    # placements the policy scores alike, a pair goes where it breaks no free NVLink pair
    assert order(fleet, Shape(0, 0, 2, MILLI), "blocks") == [0, 1]


def test_fewer_gpus_left_stranded_go_first() -> None:
    fleet = Fleet(width=8)
    fleet.upsert("starved", 9_000, 1_000_000, [MILLI] * 4 + [0] * 4)  # 1 core left after the pod: feeds no GPU
    fleet.upsert("fed", 96_000, 1_000_000, [MILLI] * 4 + [0] * 4)
    shape = Shape(8_000, 1000, 2, MILLI)  # 4 cores a GPU: 2 GPUs left idle, "starved" can feed none of them
    assert order(fleet, shape, "blocks") == [1, 0]


def test_unknown_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="tie keys 'nearest'"):
        fleet_of(8).ties(np.array([0]), Shape(0, 0, 1, MILLI), "nearest")
    engine = TailorPolicy(fleet_of(8))
    with pytest.raises(ValueError, match="ties 'nearest'"):
        configure(engine, "nearest")


def test_choose_follows_the_keys_and_rank_restores_the_old_order() -> None:
    fleet = fleet_of(8, 8, 1)
    fleet.rank[:3] = [0, 1, 2]  # the whole free nodes come first in the fixed order
    engine = TailorPolicy(fleet)
    one = Shape(1000, 1000, 1, MILLI)
    engine.observe(one)
    choice = engine.choose(one)
    assert choice is not None and choice.node == 2  # the used node, though last in the order
    configure(engine, "rank")
    choice = engine.choose(one)
    assert choice is not None and choice.node == 0
    assert TIES == ("rank", "whole", "blocks", "multi-blocks")


def test_the_prior_counts_as_pods_at_first_and_keeps_its_floor() -> None:
    job = (0, MILLI, 8, frozenset[str]())
    mix = Mix(prior=Prior(weight=10))
    assert dict(mix.typical([job])) == {job: 1.0}  # nothing seen yet: the prior is the whole mix
    one = Shape(4000, 8000, 1, MILLI)
    for _ in range(90):
        mix.observe(one)
    assert dict(mix.typical([job]))[job] == pytest.approx(10 / 100)
    assert dict(mix.typical())[one.kind] == 1.0  # no expected kinds, no prior
    floored = Mix(prior=Prior(weight=10, floor=0.2))
    for _ in range(400):
        floored.observe(one)
    assert dict(floored.typical([job]))[job] == pytest.approx(0.2)  # 400 pods: the floor, not 10 of 410


def test_the_prior_has_a_whole_node_job_for_each_large_node_size() -> None:
    fleet = fleet_of(8, 8)
    fleet.upsert("four", 48_000, 500_000, [MILLI] * 4)
    assert whole_node_kinds(fleet, Prior()) == ()  # off
    assert whole_node_kinds(fleet, Prior(weight=1)) == ((0, MILLI, 8, frozenset()),)
    assert [k[2] for k in whole_node_kinds(fleet, Prior(weight=1, min_gpus=4))] == [4, 8]


def test_with_the_prior_breaking_a_whole_node_is_never_free_of_cost() -> None:
    # Only one-GPU pods seen so far: FGD finds taking one GPU of the whole node and of the used node alike.
    # With a prior of whole-node jobs, the whole node costs what the next such job loses there.
    one = Shape(1000, 1000, 1, MILLI)
    scores = {}
    for prior in (Prior(), Prior(weight=5)):
        fleet = fleet_of(8, 5)
        engine = FgdPolicy(fleet, mix=Mix(prior=prior))
        for _ in range(20):
            engine.mix.observe(one)
        raw, _ = engine.node_scores(one, fleet.rows())
        scores[prior.weight] = raw.tolist()
    assert scores[0][0] == scores[0][1]
    assert scores[5][0] < scores[5][1]



def test_tailor_keeps_whole_nodes_and_the_papers_policies_keep_the_paper_order() -> None:
    from gpu_tailor.gpumodel.policies import POLICIES

    for name, cls in POLICIES.items():
        engine = cls(fleet_of(8))
        assert (engine.keep_whole_nodes, engine.tie_keys) == ((True, "multi-blocks") if name == "tailor"
                                                              else (False, "whole")), name
        configure(engine, None)  # None leaves the policy's own
        assert engine.keep_whole_nodes == (name == "tailor")


def test_on_pcie_boards_the_block_is_the_idle_gpus() -> None:
    from gpu_tailor.gpumodel.topology import pcie

    fleet = Fleet(width=8)
    fleet.upsert("seven-idle", 96_000, 1_000_000, [MILLI] * 7 + [0], topology=pcie(8))
    fleet.upsert("two-idle", 96_000, 1_000_000, [MILLI] * 2 + [0] * 6, topology=pcie(8))
    # no NVLink at all: any idle GPUs make the block a multi-GPU pod takes, so the smaller one is filled first
    assert order(fleet, Shape(0, 0, 2, MILLI), "multi-blocks") == [1, 0]
