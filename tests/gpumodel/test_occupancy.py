"""Per-GPU occupancy: placing, releasing, and what the device plugin would hand out."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_tailor.gpumodel.occupancy import (
    NodeGpus,
    Placement,
    ReplicaPolicy,
    format_gpu_annotation,
    parse_gpu_annotation,
)
from gpu_tailor.gpumodel.topology import nvlink_pairs, nvswitch


def test_shares_and_whole_gpus() -> None:
    node = NodeGpus(4, 16384)
    node.place("a/whole", Placement((0,)))
    node.place("a/s1", Placement((1,), milli=600, memory_mib=8000, whole=False))
    assert node.free_whole() == [2, 3]
    assert node.free_milli_total() == 400 + 2000
    assert node.fitting_shares(500) == [2, 3]
    assert node.fitting_shares(400) == [1, 2, 3]
    assert node.fitting_shares(300, memory_mib=9000) == [2, 3]  # GPU 1 has 8384 MiB left
    assert node.predict_share(300) == 1  # best fit: the least free GPU that fits
    node.release("a/s1")
    assert node.free_whole() == [1, 2, 3]
    assert node.release("a/unknown") is None


def test_place_is_idempotent_per_pod() -> None:
    node = NodeGpus(2, 1000)
    node.place("p", Placement((0,), milli=300, whole=False))
    node.place("p", Placement((0,), milli=300, whole=False))
    assert node.slots[0].milli_used == 300
    node.place("p", Placement((1,), milli=300, whole=False))
    assert (node.slots[0].milli_used, node.slots[1].milli_used) == (0, 300)


def test_degraded_node_only_hands_out_usable_gpus() -> None:
    node = NodeGpus(8, 81559, usable=5)
    assert node.free_whole() == [0, 1, 2, 3, 4]
    assert node.predict_whole(6) is None


def test_whole_prediction_follows_topology() -> None:
    node = NodeGpus(8, 1, topology=nvlink_pairs(8))
    node.place("x", Placement((0,)))
    node.place("y", Placement((3,)))
    assert node.predict_whole(2) == (4, 5)  # 1 and 2 are free but not NVLinked


def test_mig_instances_are_kept_per_gpu_and_shares_avoid_them() -> None:
    node = NodeGpus(2, 40960)
    node.place("a", Placement((0, 0), milli=142, whole=False, mig_profile="1g.5gb"))
    assert node.slots[0].mig == ["1g.5gb", "1g.5gb"] and node.slots[0].milli_used == 284
    assert node.fitting_shares(100) == [1]  # a GPU cut into MIG instances takes no replicas
    node.release("a")
    assert node.slots[0].mig == [] and node.fitting_shares(100) == [0, 1]


def test_a_placement_counts_units_it_could_not_put_on_a_gpu() -> None:
    node = NodeGpus(2, 40960)
    counted = Placement((), milli=142, whole=False, mig_profile="1g.5gb", unplaced=2, note="layout unknown")
    node.place("a", counted)
    assert counted.units == 2 and node.placements["a"] == counted and all(s.idle for s in node.slots)
    assert node.release("a") == counted


def test_recorded_gpu_outside_the_node_is_ignored() -> None:
    node = NodeGpus(2, 1)
    node.place("p", Placement((5,)))
    assert node.free_whole() == [0, 1]
    assert node.release("p") == Placement((5,))


def test_gpu_annotation() -> None:
    assert parse_gpu_annotation("0,3") == (0, 3)
    assert parse_gpu_annotation("a,b") is None and parse_gpu_annotation("") is None
    assert parse_gpu_annotation("-1") is None
    assert format_gpu_annotation([3, 0]) == "0,3"


def test_copy_is_independent_of_the_original() -> None:
    gpus = NodeGpus(2, 40960)
    gpus.place("a", Placement((0,), milli=1000 // 7, whole=False, mig_profile="1g.5gb"))
    gpus.place("b", Placement((1,)))
    trial = gpus.copy()
    assert trial.free_whole() == gpus.free_whole() == []
    trial.release("b")
    trial.release("a")
    trial.place("c", Placement((0,), milli=500, whole=False))
    # the original keeps its pods, MIG instance and whole GPU; the copy has only the share
    assert gpus.placements.keys() == {"a", "b"} and gpus.slots[0].mig == ["1g.5gb"]
    assert gpus.slots[1].whole_by == "b" and gpus.slots[0].pods == {"a"}
    assert trial.placements.keys() == {"c"} and trial.slots[0].mig == [] and trial.slots[0].pods == {"c"}
    assert trial.free_whole() == [1] and trial.slots[0].free_milli == 500


def test_several_units_are_predicted_one_at_a_time() -> None:
    node = NodeGpus(2, 16000, policy=ReplicaPolicy.PACKED)
    node.place("a", Placement((0,), milli=750, whole=False, replicas=3))
    assert node.predict_units(2, 250) == (0, 1)  # GPU 0's last replica, then the other
    assert node.predict_units(6, 250) == (0, 1, 1, 1, 1)  # room for 5: fewer units than asked
    assert node.slots[0].milli_used == 750 and node.placements.keys() == {"a"}  # the node is left as it was
    node.policy = ReplicaPolicy.DISTRIBUTED  # the fewest replicas first: GPU 1 until it holds as many as GPU 0
    assert node.predict_replicas(5, 250) == ((1, 1, 1, 0, 1), (0, 1))  # at 3 and 3 either GPU may come next
    node.place("b", Placement((0, 1), milli=250, whole=False, replicas=1))
    assert (node.slots[0].replicas_used, node.slots[1].replicas_used) == (4, 1)


def test_whole_gpus_that_score_alike_are_predicted_as_a_set() -> None:
    """On an NVSwitch board every set of free GPUs scores alike: the device plugin takes the first in the
    kubelet's list of free GPUs, which has no fixed order, so the prediction is every free GPU. Until a node agent
    says which, the next prediction is as unsure, and no GPU can be named free."""
    hgx = NodeGpus(8, 81920, nvswitch(8))
    everything = tuple(range(8))
    assert hgx.predict_whole_among(2) == ((0, 1), everything)
    hgx.place("a", Placement((0, 1), maybe=everything))
    assert hgx.free_whole() == [2, 3, 4, 5, 6, 7]  # six are free...
    assert hgx.surely_free() == []  # ...but which six is not known
    assert hgx.predict_whole_among(4) == ((2, 3, 4, 5), everything)  # "a" may hold 2-5 and leave 0 and 1 free
    hgx.place("a", Placement((4, 5)))  # what the node agent reported
    assert hgx.surely_free() == [0, 1, 2, 3, 6, 7]
    assert hgx.predict_whole_among(6) == ((0, 1, 2, 3, 6, 7), ())  # the one set left


def test_whole_gpus_on_pcie_tie_within_a_socket() -> None:
    node = NodeGpus(4, 16384)  # PCIe, two GPUs a socket
    assert node.predict_whole_among(2) == ((0, 1), (0, 1, 2, 3))  # either socket's pair
    node.place("a", Placement((2, 3)))
    assert node.predict_whole_among(2) == ((0, 1), ())
    assert node.predict_whole_among(3) is None


def test_a_replica_picked_among_equals_leaves_the_next_unsure() -> None:
    """Four idle time-sliced GPUs: the first replica may go to any; the second goes to any but that one, which is
    not known, so to any as well (the plugin's own choice, 'distributed')."""
    t4 = NodeGpus(4, 16384)
    assert t4.predict_replicas(1, 250) == ((0,), (0, 1, 2, 3))
    t4.place("r0", Placement((0,), milli=250, whole=False, replicas=1, maybe=(0, 1, 2, 3)))
    assert t4.predict_replicas(1, 250) == ((1,), (0, 1, 2, 3))
    t4.place("r0", Placement((2,), milli=250, whole=False, replicas=1))  # reported on GPU 2
    assert t4.predict_replicas(1, 250) == ((0,), (0, 1, 3))


def test_an_nvlink_promise_is_not_made_on_gpus_a_pick_among_equals_may_have_taken() -> None:
    """NVLink pairs 0-1 and 2-3; two 1-GPU pods each went to any GPU. The picture's free pair 2-3 may really be 1 and
    3: an NVLink pair of 2 cannot be promised until a report says which are free."""
    from gpu_tailor.gpumodel.devices.whole import WholeGpus, whole_offering

    node = NodeGpus(4, 16384, nvlink_pairs(4))
    for pod in ("a", "b"):
        where, maybe = node.predict_whole_among(1) or ((), ())
        node.place(pod, Placement(where, maybe=maybe))
    assert node.unsure() == {0, 1, 2, 3} and node.free_whole() == [2, 3]
    refused = WholeGpus().fit(whole_offering(4, 16384), node, 2, 2, nvlink=True)
    assert not refused.ok and "a node agent's report would tell" in refused.reason
    node.place("a", Placement((0,)))  # reported
    node.place("b", Placement((1,)))
    placed = WholeGpus().fit(whole_offering(4, 16384), node, 2, 2, nvlink=True)
    assert placed.ok and placed.placement is not None and placed.placement.gpus == (2, 3)


def test_a_lost_gpu_the_device_plugin_still_sells_may_be_handed_out() -> None:
    """The agent reports GPU 7 lost while the node's allocatable still counts 8 (NVIDIA's plugin marks a GPU unhealthy
    only on an Xid): gpu-tailor counts 7 and places on 0-6, but the plugin may hand out GPU 7, so the record names it
    among the GPUs picked from, for whole GPUs and replicas alike. Once allocatable counts 7, the pick is 0-6 again."""
    lost = NodeGpus(8, 81559, topology=nvswitch(8))
    lost.set_unhealthy([7])
    assert lost.sold_but_lost() == {7}
    assert lost.predict_whole_among(7) == ((0, 1, 2, 3, 4, 5, 6), tuple(range(8)))
    assert lost.predict_whole_among(8) is None  # gpu-tailor still counts 7
    t4 = NodeGpus(4, 15360)
    t4.set_unhealthy([3])
    assert t4.predict_replicas(1, 250) == ((0,), (0, 1, 2, 3))
    told = NodeGpus(8, 81559, topology=nvswitch(8), usable=7)  # allocatable 7: the plugin marked it
    told.set_unhealthy([7])
    assert told.sold_but_lost() == frozenset()
    assert told.predict_whole_among(7) == ((0, 1, 2, 3, 4, 5, 6), ())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcde"), st.booleans(),
                          st.lists(st.integers(0, 7), max_size=4, unique=True)), max_size=30))
def test_unsure_is_the_union_of_the_placements_sets_as_they_come_and_go(
        steps: list[tuple[str, bool, list[int]]]) -> None:
    """``unsure`` is kept per GPU as placements are made, replaced and released: always the union of the ``maybe``
    sets of the placements held, and a copy keeps its own."""
    node = NodeGpus(8, 81559, topology=nvswitch(8))
    for pod, place, maybe in steps:
        if place:
            node.place(pod, Placement(tuple(sorted(maybe))[:1], maybe=tuple(sorted(maybe))))
        else:
            node.release(pod)
        held = {g for p in node.placements.values() for g in p.maybe}
        assert node.unsure() == held
        twin = node.copy()
        twin.clear()
        assert twin.unsure() == frozenset() and node.unsure() == held
