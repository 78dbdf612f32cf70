"""Replicas go where the node's device plugin puts them (``ReplicaPolicy``), in the occupancy model and in
the placement fleet the scores come from; a degraded node whose unsold GPUs are unknown promises none."""

from __future__ import annotations

import numpy as np

from gpu_tailor.gpumodel.devices.whole import WholeGpus, whole_offering
from gpu_tailor.gpumodel.fleet import PICK_ANY, PICK_LEAST_FREE, PICK_MOST_FREE, Fleet, Shape, candidates
from gpu_tailor.gpumodel.occupancy import NodeGpus, Placement, ReplicaPolicy
from gpu_tailor.gpumodel.topology import infer


def holding(counts: list[int], policy: ReplicaPolicy, replicas: int = 4) -> NodeGpus:
    """A node of ``len(counts)`` GPUs shared ``replicas`` ways, GPU i holding ``counts[i]`` replicas."""
    node = NodeGpus(len(counts), 16000, policy=policy)
    step = 1000 // replicas
    for g, n in enumerate(counts):
        for k in range(n):
            node.place(f"p{g}-{k}", Placement((g,), step, whole=False, replicas=1))
    return node


def test_each_policy_on_gpus_holding_2_1_0_0() -> None:
    assert holding([2, 1, 0, 0], ReplicaPolicy.DISTRIBUTED).predict_replicas(1, 250) == ((2,), (2, 3))
    assert holding([2, 1, 0, 0], ReplicaPolicy.PACKED).predict_replicas(1, 250) == ((0,), ())
    # two replicas: distributed hands out GPUs 2 and 3 (either first), spread the same, packed fills GPU 0
    assert holding([2, 1, 0, 0], ReplicaPolicy.DISTRIBUTED).predict_replicas(2, 250) == ((2, 3), (2, 3))
    assert holding([2, 1, 0, 0], ReplicaPolicy.PACKED).predict_replicas(2, 250) == ((0, 0), ())
    # three: after 2 and 3 the GPUs hold 2, 1, 1, 1; distributed may take any of 1, 2, 3 again, spread
    # takes the one the pod has none on (GPU 1); the set is every GPU the pod may end up on
    assert holding([2, 1, 0, 0], ReplicaPolicy.DISTRIBUTED).predict_replicas(3, 250) == ((2, 3, 1), (1, 2, 3))
    assert holding([2, 1, 0, 0], ReplicaPolicy.SPREAD).predict_replicas(3, 250) == ((2, 3, 1), (1, 2, 3))
    assert holding([2, 2, 0, 0], ReplicaPolicy.SPREAD).predict_replicas(2, 250) == ((2, 3), (2, 3))


def test_packed_skips_a_full_gpu_and_no_room_is_fewer_units() -> None:
    node = holding([4, 3, 0, 0], ReplicaPolicy.PACKED)
    # GPU 0 is full: GPU 1's last replica, then 2 or 3 alike, then the one begun
    assert node.predict_replicas(3, 250) == ((1, 2, 2), (1, 2, 3))
    assert len(holding([4, 4, 4, 3], ReplicaPolicy.DISTRIBUTED).predict_units(2, 250)) == 1


def test_the_fleet_scores_only_the_gpu_the_device_plugin_would_pick() -> None:
    fleet = Fleet()
    free = [500, 750, 1000, 1000]  # 2, 1, 0 and 0 replicas of 250
    rows = [fleet.upsert(name, 32000, 65536, free, "T4", pick=pick, step=250)
            for name, pick in (("any", PICK_ANY), ("most", PICK_MOST_FREE), ("least", PICK_LEAST_FREE))]

    def where(milli: int) -> dict[int, list[int]]:
        c = candidates(fleet, Shape(1000, 1024, 1, milli), np.asarray(rows))
        return {int(n): sorted(int(g) for g, m in zip(c.gpu, c.node, strict=True) if m == n) for n in set(c.node)}

    # GPUs with the same free share are one candidate (the lowest index): 2 stands for 2 and 3
    assert where(250) == {rows[0]: [0, 1, 2], rows[1]: [2], rows[2]: [0]}
    # two replicas go out one at a time, over GPUs: scored on the GPU that gets the most of them -- distributed, the
    # most free (one of the two), packed, the fullest with room (both)
    assert where(500) == {rows[0]: [0, 1, 2], rows[1]: [2], rows[2]: [0]}
    c = candidates(fleet, Shape(1000, 1024, 1, 500), np.asarray(rows[1:]))
    assert (c.before - c.after).tolist() == [250, 500]
    # the count decides: three replicas fit where no GPU has 750 free, but for the policy's own sharing
    half = Fleet()
    rows = [half.upsert(name, 32000, 65536, [500] * 4, "T4", pick=pick, step=250)
            for name, pick in (("any", PICK_ANY), ("most", PICK_MOST_FREE), ("least", PICK_LEAST_FREE))]
    assert half.feasible(Shape(1000, 1024, 1, 750), np.asarray(rows)).tolist() == [False, True, True]


def test_a_degraded_node_promises_no_gpu_until_its_unsold_gpus_are_known() -> None:
    topo = infer("H100", "NVIDIA-H100-80GB-HBM3", 8, {})
    node = NodeGpus(8, 81920, topo, usable=5)  # allocatable says 5 of 8: which 3 are missing is not said
    sold, whole = whole_offering(5, 81920), WholeGpus()
    one = whole.fit(sold, node, 0, 1)
    assert one.ok and one.placement is not None and one.placement.counted
    pair = whole.fit(sold, node, 0, 2, nvlink=True)
    assert not pair.ok and "which ones is not known" in pair.reason
    node.set_unhealthy([1, 4, 6])  # a node agent's report
    assert node.per_gpu_known and node.free_whole() == [0, 2, 3, 5, 7]
    one = whole.fit(sold, node, 0, 1)
    assert one.ok and one.placement is not None and not one.placement.counted and one.placement.gpus[0] != 1
    assert whole.fit(sold, node, 0, 2, nvlink=True).ok  # NVSwitch: any two of the sold five
    node.set_unhealthy(None)
    assert not node.per_gpu_known and node.free_whole() == [0, 1, 2, 3, 4]
