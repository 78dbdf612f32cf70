"""tailor's memory rule: idle GPUs left without the memory to feed them are charged to the placement."""

from __future__ import annotations

from gpu_tailor.gpumodel.fleet import Fleet, Shape, candidates
from gpu_tailor.gpumodel.policies import FgdPolicy, Mix, TailorPolicy, configure

GIB = 1024
ONE = Shape(11000, 48 * GIB, 1, 1000)  # a 1-GPU pod of the openb trace's typical memory
FAT = Shape(60000, 313 * GIB, 4, 1000)  # the trace's 4-GPU pod that asks 313 GiB


def _two_memories() -> Fleet:
    # "g2" ranks first; both have 96 cores and 8 GPUs, "m32" twice the memory
    f = Fleet()
    f.upsert("g2", 96000, 384 * GIB, [1000] * 8, "G2")
    f.upsert("m32", 96000, 768 * GIB, [1000] * 8, "V100M32")
    return f


def _seen(policy: FgdPolicy, shapes: list[Shape]) -> None:
    for shape in shapes:
        policy.observe(shape)
        policy.mix.observe(shape)  # FGD's mix here is the one tailor learns


def test_fed_memory_is_the_lower_quartile_of_memory_per_gpu_of_whole_gpu_pods() -> None:
    tailor = TailorPolicy(_two_memories())
    assert tailor.fed_memory() == 0  # nothing seen: no charge
    for gib in (8, 48, 48, 96):
        tailor.observe(Shape(4000, gib * GIB, 1, 1000))
    tailor.observe(Shape(8000, 64 * GIB, 2, 1000))  # 32 GiB per GPU
    tailor.observe(Shape(4000, 1 * GIB, 1, 500))  # sharing pods leave it alone
    assert tailor.fed_memory() == 32 * GIB


def test_tailor_keeps_a_memory_hungry_multi_gpu_pod_off_the_node_it_would_leave_unfed() -> None:
    shapes = [FAT] + [ONE] * 8
    fgd, tailor = FgdPolicy(_two_memories(), mix=Mix()), TailorPolicy(_two_memories(), mix=Mix(coverage=1.0))
    _seen(fgd, shapes)
    for shape in shapes:
        tailor.observe(shape)
    # by hand: on "g2" the pod leaves 4 idle GPUs and 71 GiB, which feeds one 48-GiB GPU: 3 unfed;
    # on "m32" 455 GiB feed all 4
    c = candidates(tailor.fleet, FAT, tailor.fleet.rows())
    assert tailor.memory_cost(FAT, c).tolist() == [3000.0, 0.0]
    plain = FgdPolicy.delta(tailor, FAT, c)
    assert plain[0] == plain[1]  # fragmentation alone sees no difference
    for engine in (fgd, tailor):  # the scores alone, with ties by the node rank: the tie keys (issue 28) count
        configure(engine, "rank")   # stranded GPUs too, and would send FGD to "m32" as well
    fgd_choice, tailor_choice = fgd.choose(FAT), tailor.choose(FAT)
    assert fgd_choice is not None and fgd.fleet.names[fgd_choice.node] == "g2"
    assert tailor_choice is not None and tailor.fleet.names[tailor_choice.node] == "m32"
    configure(fgd, "multi-blocks")
    fgd_choice = fgd.choose(FAT)
    assert fgd_choice is not None and fgd.fleet.names[fgd_choice.node] == "m32"


def test_no_memory_charge_while_the_memory_left_feeds_every_idle_gpu() -> None:
    tailor = TailorPolicy(_two_memories())
    for shape in [FAT] + [Shape(11000, 8 * GIB, 1, 1000)] * 8:
        tailor.observe(shape)
    # 71 GiB left on "g2" feed the 4 idle GPUs at 8 GiB each
    c = candidates(tailor.fleet, FAT, tailor.fleet.rows())
    assert (tailor.memory_cost(FAT, c) == 0).all()
