"""Gangs placed whole: the NVLink domain ``gangs.plan`` picks, its fallbacks, and single pods keeping whole domains
whole (``Fleet.spare_whole_domains``)."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_tailor.gpumodel.fleet import MILLI, Fleet, Shape
from gpu_tailor.gpumodel.gangs import ANYWHERE, PREFERRED, REQUIRED, Gang, GangMix, plan
from gpu_tailor.gpumodel.policies import TailorPolicy
from gpu_tailor.gpumodel.topology import nvswitch

ONE, TWO, TRAY = (Shape(4_000, 16_384, g, MILLI) for g in (1, 2, 4))  # pods of 1, 2 and a tray's 4 GPUs


def trays(*domains: str, alone: int = 0) -> Fleet:
    """Trays of 4 GPUs in labelled domains, in order (the row is the rank): ``"a"`` four of them, ``"a:2"`` two;
    then ``alone`` nodes that are domains of their own."""
    fleet = Fleet(width=4)
    for spec in domains:
        d, _, count = spec.partition(":")
        for i in range(int(count or 4)):
            fleet.upsert(f"{d}-{i}", 144_000, 983_040, [MILLI] * 4, "NVIDIA-GB200", nvswitch(4), domain=d)
    for i in range(alone):
        fleet.upsert(f"solo-{i}", 144_000, 983_040, [MILLI] * 4, "NVIDIA-GB200", nvswitch(4))
    return fleet


def use(fleet: Fleet, node: str, gpus: int) -> None:
    """``gpus`` GPUs of ``node`` taken by a pod already running."""
    fleet.take(fleet.index[node], Shape(0, 0, gpus, MILLI), range(gpus))


def domain(fleet: Fleet, name: str) -> int:
    return fleet.domain_ids[(True, name)]


def snapshot(fleet: Fleet) -> tuple[np.ndarray, ...]:
    return fleet.gpu.copy(), fleet.cpu.copy(), fleet.mem.copy()


@pytest.mark.parametrize(("gang", "where"), [
    pytest.param(Gang(4, TRAY), "a", id="a-whole-domain-of-trays"),
    pytest.param(Gang(3, TWO), "a", id="half-trays-in-one-domain"),
    pytest.param(Gang(5, TRAY), None, id="more-trays-than-a-domain-has"),
    pytest.param(Gang(17, ONE), None, id="more-gpus-than-a-domain-has"),
])
def test_a_gang_goes_whole_into_one_domain_or_nowhere_and_nothing_is_taken(gang: Gang, where: str | None) -> None:
    fleet = trays("a", "b")
    before = snapshot(fleet)
    chosen = plan(TailorPolicy(fleet), gang)
    if where is None:
        assert chosen is None
    else:
        assert chosen is not None
        assert chosen.domain == domain(fleet, where)
        assert len(chosen.members) == gang.size
        assert {int(fleet.domain[n]) for n in chosen.nodes} == {chosen.domain}
        for m in chosen.members:  # each member its own GPUs: no GPU given twice
            assert len(m.gpus) == gang.member.gpus
        assert len({(m.node, g) for m in chosen.members for g in m.gpus}) == gang.size * gang.member.gpus
    for after, was in zip(snapshot(fleet), before, strict=True):
        np.testing.assert_array_equal(after, was)


@pytest.mark.parametrize(("domains", "used", "gang", "want"), [
    # b is in use and holds the gang: b, though a comes first by rank and a left tighter (4 idle GPUs, b 11)
    pytest.param(("a:2", "b"), {"b-0": 1}, Gang(2, TWO), "b", id="in-use-before-untouched"),
    # a and b in use, b with fewer idle GPUs: the tightest
    pytest.param(("a", "b", "c"), {"a-0": 1, "b-0": 2, "b-1": 2}, Gang(2, TWO), "b", id="tightest-of-those-in-use"),
    # a and b in use, and only c holds four whole trays
    pytest.param(("a", "b", "c"), {"a-0": 1, "b-0": 1}, Gang(4, TRAY), "c",
                 id="whole-domain-gang-to-the-untouched-one"),
    # b in use but too full for the gang: an untouched one, the first by rank
    pytest.param(("a", "b", "c"), {"b-0": 4, "b-1": 4, "b-2": 4}, Gang(2, TRAY), "a", id="in-use-but-too-full"),
    # of two untouched ones, the tighter
    pytest.param(("a", "b:3"), {}, Gang(2, TRAY), "b", id="the-smaller-untouched-one"),
])
def test_the_domain_a_gang_goes_to(domains: tuple[str, ...], used: dict[str, int], gang: Gang, want: str) -> None:
    fleet = trays(*domains)
    for node, gpus in used.items():
        use(fleet, node, gpus)
    chosen = plan(TailorPolicy(fleet), gang)
    assert chosen is not None
    assert chosen.domain == domain(fleet, want)


@pytest.mark.parametrize(("ask", "placed", "spread"), [
    pytest.param(REQUIRED, False, False, id="required-waits"),
    pytest.param(PREFERRED, True, True, id="preferred-spreads"),
    pytest.param(ANYWHERE, True, True, id="anywhere-spreads"),
])
def test_where_no_domain_holds_the_gang(ask: str, placed: bool, spread: bool) -> None:
    # two trays idle in each of a and b: three trays fit in the fleet, in no one domain
    fleet = trays("a", "b")
    for node in ("a-0", "a-1", "b-0", "b-1"):
        use(fleet, node, 4)
    chosen = plan(TailorPolicy(fleet), Gang(3, TRAY, ask))
    assert (chosen is not None) == placed
    if chosen is not None:
        assert len(chosen.members) == 3
        assert (chosen.domain == -1) == spread
        assert len({int(fleet.domain[n]) for n in chosen.nodes}) == 2


@pytest.mark.parametrize("ask", [REQUIRED, PREFERRED], ids=str)
def test_a_domain_ask_keeps_the_gang_in_one_where_one_holds_it(ask: str) -> None:
    fleet = trays("a", "b", alone=4)
    use(fleet, "a-0", 1)
    use(fleet, "b-0", 1)
    chosen = plan(TailorPolicy(fleet), Gang(3, TRAY, ask))
    assert chosen is not None
    assert chosen.domain in (domain(fleet, "a"), domain(fleet, "b"))


def test_a_gang_of_one_domain_of_its_own_holds_on_a_node_alone() -> None:
    # no labelled domain: each node is one, and a gang of two half trays fits on one node
    fleet = trays(alone=3)
    use(fleet, "solo-1", 2)
    chosen = plan(TailorPolicy(fleet), Gang(2, TWO, REQUIRED))
    assert chosen is not None
    assert len(set(chosen.nodes)) == 1 and chosen.domain == int(fleet.domain[chosen.nodes[0]])


def test_the_gang_mix_steers_off_the_domain_whose_whole_trays_the_gangs_seen_need() -> None:
    # a: two trays full and two idle (8 idle GPUs); b: two trays half used and two idle (12 idle GPUs). A gang of
    # two half trays is tightest in a, where it breaks one of a's two whole trays; in b it fills the halves
    fleet = trays("a", "b")
    for node, gpus in (("a-0", 4), ("a-1", 4), ("b-0", 2), ("b-1", 2)):
        use(fleet, node, gpus)
    gang = Gang(2, TWO)
    assert (chosen := plan(TailorPolicy(fleet), gang)) is not None
    assert chosen.domain == domain(fleet, "a")
    mix = GangMix()
    mix.observe(Gang(2, TRAY))  # jobs of two whole trays have been seen
    assert (chosen := plan(TailorPolicy(fleet), gang, mix)) is not None
    assert chosen.domain == domain(fleet, "b")
    assert sorted(fleet.names[n] for n in chosen.nodes) == ["b-0", "b-1"]


def test_the_gang_mix_counts_gangs_of_gpus_only() -> None:
    mix = GangMix()
    mix.observe(Gang(1, TRAY))  # a single pod
    mix.observe(Gang(4, Shape(1_000, 1_024)))  # no GPU
    assert mix.weights() == []
    mix.observe(Gang(2, TRAY))
    mix.observe(Gang(4, ONE))
    weights = mix.weights()  # by the GPUs each type brought: 2 x 4 and 4 x 1
    assert [(size, shape) for size, shape, _ in weights] == [(2, TRAY), (4, ONE)]
    assert [w for _, _, w in weights] == pytest.approx([8 / 12, 4 / 12])


@pytest.mark.parametrize(("size", "ask", "message"), [
    pytest.param(0, REQUIRED, "at least one member", id="no-member"),
    pytest.param(-2, REQUIRED, "at least one member", id="negative"),
    pytest.param(2, "Required", "expected one of required, preferred, anywhere", id="ask-in-capitals"),
    pytest.param(2, "rack", "expected one of", id="unknown-ask"),
])
def test_a_bad_gang_says_why(size: int, ask: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Gang(size, TRAY, ask)


@pytest.mark.parametrize(("used", "shape", "spared"), [
    pytest.param({"a-0": 1}, ONE, True, id="one-in-use-holds-the-pod"),
    pytest.param({"a-0": 1}, TRAY, True, id="a-whole-tray-in-the-one-in-use"),
    pytest.param({"a-0": 4, "a-1": 4, "a-2": 4, "a-3": 4}, ONE, False, id="the-one-in-use-is-full"),
    pytest.param({"a-0": 1, "a-1": 1, "a-2": 1, "a-3": 1}, TRAY, False, id="no-whole-tray-in-the-one-in-use"),
    pytest.param({}, ONE, False, id="all-untouched"),
    pytest.param({"a-0": 1, "b-0": 1, "c-0": 1}, ONE, False, id="none-untouched"),
    pytest.param({"a-0": 1}, Shape(1_000, 1_024), False, id="a-pod-without-gpus"),
])
def test_single_pods_keep_off_untouched_domains_while_one_in_use_holds_them(
        used: dict[str, int], shape: Shape, spared: bool) -> None:
    fleet = trays("a", "b", "c")
    for node, gpus in used.items():
        use(fleet, node, gpus)
    rows = fleet.rows()
    left = fleet.spare_whole_domains(shape, rows)
    if spared:
        assert {fleet.names[r] for r in left} == {f"a-{i}" for i in range(4)}
    else:
        np.testing.assert_array_equal(left, rows)


def test_nodes_alone_are_never_spared() -> None:
    # a node that is its own domain is no clique a gang needs whole
    fleet = trays("a", alone=2)
    use(fleet, "a-0", 1)
    left = fleet.spare_whole_domains(ONE, fleet.rows())
    assert sorted(fleet.names[r] for r in left) == [*(f"a-{i}" for i in range(4)), "solo-0", "solo-1"]
