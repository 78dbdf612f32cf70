"""The device interface, backing by backing, on the real fixture nodes (and edits of them).

What each device reads from a node, whether an ask fits given what is used, where its units go, and
what it writes on a pod. MIG follows the device plugin: the per-profile count is the fit, and each
instance goes to a GPU of the layout mig-manager cut (when the node's counts give it away).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpu_tailor.gpumodel import devices, labels, mig
from gpu_tailor.gpumodel.ask import ContainerAsk, Isolation
from gpu_tailor.gpumodel.devices.base import GPU_TOLERATION, Offering, Sharing, UnitsRefusal
from gpu_tailor.gpumodel.devices.mig import NOT_INFERRED
from gpu_tailor.gpumodel.inventory import NodeInventory, from_node
from gpu_tailor.gpumodel.occupancy import NodeGpus, Placement
from gpu_tailor.gpumodel.schedule import NodeState, demand_of, fit, node_state, recorded_placement
from tests.conftest import node_fixture

MIXED = "a100-mig-mixed-0"


def inventory(name: str, labels_set: dict[str, str] | None = None,
              alloc: dict[str, str] | None = None) -> NodeInventory:
    node = copy.deepcopy(node_fixture(name))
    node["metadata"]["labels"].update(labels_set or {})
    node["status"]["allocatable"].update(alloc or {})
    return from_node(node)


def offering(name: str, resource: str, **edits: Any) -> Offering:
    o = inventory(name, **edits).offering(resource)
    assert o is not None
    return o


def one_gpu_pod(resource: str, units: int) -> dict[str, Any]:
    asked = {resource: str(units)}
    return {"metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": asked, "requests": asked}}]}}


# ----- which device sells what -----------------------------------------------------------------------

@pytest.mark.parametrize(("node", "resource", "device"), [
    ("h100-hgx-0", "nvidia.com/gpu", "whole"),
    (MIXED, "nvidia.com/mig-1g.5gb", "mig"),
    ("a100-mig-single-0", "nvidia.com/gpu", "mig"),
    ("t4-timeslice-0", "nvidia.com/gpu", "time-slicing"),
    ("t4-timeslice-renamed-0", "nvidia.com/gpu.shared", "time-slicing"),
    ("v100-mps-0", "nvidia.com/gpu", "mps"),
], ids=lambda v: str(v))
def test_each_offering_has_the_device_of_its_backing(node: str, resource: str, device: str) -> None:
    assert devices.device_for(offering(node, resource)) is devices.DEVICES[device]


def test_the_registry_names_the_config_backings() -> None:
    assert list(devices.DEVICES) == ["whole", "mig", "time-slicing", "mps"]
    assert all(name == d.name for name, d in devices.DEVICES.items())


# ----- MIG: the layout mig-manager cut --------------------------------------------------------------

def test_all_balanced_layout_is_read_from_the_counts() -> None:
    inv = inventory(MIXED)
    assert {o.label: o.per_gpu for o in inv.offerings} == {"mig-1g.5gb": 2, "mig-2g.10gb": 1, "mig-3g.20gb": 1}
    assert offering("a100-mig-single-0", "nvidia.com/gpu").per_gpu == 7  # single strategy: all-1g.5gb


@pytest.mark.parametrize(("labels_set", "alloc"), [
    ({labels.MIG_CONFIG: "custom-config"}, {}),  # not one of mig-manager's all-* configs: GPUs may differ
    ({"nvidia.com/mig-1g.5gb.count": "15"}, {"nvidia.com/mig-1g.5gb": "15"}),  # 15 do not split over 8 GPUs
    ({}, {"nvidia.com/gpu": "1"}),  # one GPU left with MIG disabled: which one is unknown
    ({"nvidia.com/mig-3g.20gb.count": "16"}, {"nvidia.com/mig-3g.20gb": "16"}),  # 2x3g + 2x1g + 1x2g is no layout
], ids=["custom-config", "uneven-counts", "a-whole-gpu", "no-valid-layout"])
def test_a_layout_that_cannot_be_inferred_places_nothing_and_says_so(labels_set: dict[str, str],
                                                                   alloc: dict[str, str]) -> None:
    inv = inventory(MIXED, labels_set, alloc)
    one_g = inv.offering("nvidia.com/mig-1g.5gb")
    assert one_g is not None and one_g.per_gpu == 0
    f = fit(node_state(inv), demand_of(one_gpu_pod("nvidia.com/mig-1g.5gb", 2)))
    assert f.ok and f.placement is not None
    assert (f.placement.gpus, f.placement.unplaced, f.placement.note) == ((), 2, NOT_INFERRED)


@pytest.mark.parametrize(("counts", "gpus", "layout"), [
    ({"1g.5gb": 16, "2g.10gb": 8, "3g.20gb": 8}, 8, {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}),
    ({"1g.5gb": 56}, 8, {"1g.5gb": 7}),
    ({"7g.40gb": 4}, 4, {"7g.40gb": 1}),
    ({"1g.5gb": 16, "3g.20gb": 16}, 8, None),  # 2x 3g + 2x 1g take 8 compute slices of 7
    ({"1g.5gb": 9}, 8, None),
    ({"5g.50gb": 8}, 8, None),  # not an A100-40GB profile
    ({"1g.5gb": 8}, 0, None),
], ids=["all-balanced", "all-1g", "all-7g", "too-much", "uneven", "unknown-profile", "no-gpus"])
def test_uniform_layout(counts: dict[str, int], gpus: int, layout: dict[str, int] | None) -> None:
    assert mig.uniform_layout(mig.A100_40GB, counts, gpus) == layout


# ----- MIG: the count is the fit, each instance on its GPU ------------------------------------------

def mixed_node(held: dict[str, int]) -> NodeState:
    """The fixture A100 node with ``held`` instances per resource already placed where bind would put them."""
    ns = node_state(inventory(MIXED))
    for resource, n in held.items():
        for i in range(n):
            pod = one_gpu_pod(resource, 1)
            pod["metadata"]["name"] = f"held-{resource}-{i}"
            d = demand_of(pod)
            placement = recorded_placement(pod, ns, d)
            assert placement is not None
            ns.gpus.place(d.key, placement)
            ns.units_used[resource] = ns.units_used.get(resource, 0) + 1
    return ns


@pytest.mark.parametrize(("held", "ask", "verdict"), [
    ({}, ("nvidia.com/mig-3g.20gb", 8), (True, (0, 1, 2, 3, 4, 5, 6, 7))),
    ({}, ("nvidia.com/mig-1g.5gb", 3), (True, (0, 0, 1))),
    ({"nvidia.com/mig-1g.5gb": 3}, ("nvidia.com/mig-1g.5gb", 1), (True, (1,))),
    ({"nvidia.com/mig-1g.5gb": 15}, ("nvidia.com/mig-1g.5gb", 1), (True, (7,))),
    ({"nvidia.com/mig-1g.5gb": 15}, ("nvidia.com/mig-1g.5gb", 2), (False, "mig-1g.5gb: 1 of 16 free")),
    ({"nvidia.com/mig-2g.10gb": 8}, ("nvidia.com/mig-2g.10gb", 1), (False, "mig-2g.10gb: 0 of 8 free")),
    # other profiles never take a profile's instances: the layout is fixed
    ({"nvidia.com/mig-1g.5gb": 16, "nvidia.com/mig-3g.20gb": 8}, ("nvidia.com/mig-2g.10gb", 8),
     (True, (0, 1, 2, 3, 4, 5, 6, 7))),
], ids=["8x3g-idle", "3x1g-idle", "1g-after-3", "last-1g", "2x1g-one-left", "2g-full", "2g-beside-full-1g-3g"])
def test_mig_fit_is_the_per_profile_count(held: dict[str, int], ask: tuple[str, int],
                                          verdict: tuple[bool, Any]) -> None:
    f = fit(mixed_node(held), demand_of(one_gpu_pod(*ask)))
    ok, detail = verdict
    assert f.ok is ok
    if ok:
        assert f.placement is not None and f.placement.gpus == detail and f.placement.unplaced == 0
    else:
        assert f.reason == detail and not f.unresolvable  # preemption could help


def test_the_count_wins_over_a_per_gpu_picture_that_disagrees() -> None:
    """Instances recorded on other GPUs than the layout would give (an annotation we did not write): the
    device plugin's count still says one is free, so it fits; the placement says where it could not go."""
    ns = mixed_node({})
    ns.gpus.place("x/odd", Placement((0,) * 15, 142, whole=False, mig_profile="1g.5gb"))
    ns.units_used["nvidia.com/mig-1g.5gb"] = 15
    f = fit(ns, demand_of(one_gpu_pod("nvidia.com/mig-1g.5gb", 1)))
    assert f.ok and f.placement is not None and f.placement.gpus == (1,)  # GPU 1 still shows its two free
    ns.gpus.place("x/odd", Placement((0,) * 15 + (1,) * 2 + (2,) * 2 + (3,) * 2, 142, whole=False,
                                     mig_profile="1g.5gb"))  # 21 recorded, 15 counted: the picture is off
    f = fit(ns, demand_of(one_gpu_pod("nvidia.com/mig-1g.5gb", 1)))
    assert f.ok and f.placement is not None and f.placement.gpus == (4,)


def test_placing_without_room_on_any_gpu_counts_the_instance() -> None:
    o = offering(MIXED, "nvidia.com/mig-2g.10gb")
    gpus = NodeGpus(8, 40960)
    gpus.place("x/all", Placement(tuple(range(8)), 285, whole=False, mig_profile="2g.10gb"))
    f = devices.MIG.fit(o, gpus, used=0, units=1)
    assert f.ok and f.placement is not None and (f.placement.gpus, f.placement.unplaced) == ((), 1)
    assert "counted but not placed" in f.placement.note


def test_a_recorded_annotation_names_each_instance() -> None:
    ns = mixed_node({})
    pod = one_gpu_pod("nvidia.com/mig-1g.5gb", 2)
    pod["metadata"]["annotations"] = {labels.ANN_GPUS: "3,5"}
    placement = recorded_placement(pod, ns, demand_of(pod))
    assert placement is not None and placement.gpus == (3, 5) and placement.mig_profile == "1g.5gb"
    pod["metadata"]["annotations"] = {labels.ANN_GPUS: "6"}  # one written for two: both on it
    placement = recorded_placement(pod, ns, demand_of(pod))
    assert placement is not None and placement.gpus == (6, 6)


def test_filter_asks_only_the_count() -> None:
    f = fit(mixed_node({}), demand_of(one_gpu_pod("nvidia.com/mig-1g.5gb", 16)), place=False)
    assert f.ok and f.placement is None


# ----- several units in one container ---------------------------------------------------------------

@pytest.mark.parametrize(("device", "resource", "units", "sharing", "fails", "refusal"), [
    ("whole", "nvidia.com/gpu", 8, Sharing.NONE, False, None),
    ("mig", "nvidia.com/mig-1g.5gb", 2, Sharing.NONE, False, None),
    ("mig", "nvidia.com/gpu", 2, Sharing.NONE, False, UnitsRefusal.AMBIGUOUS),  # single strategy
    ("mig", "nvidia.com/gpu", 1, Sharing.NONE, False, None),
    ("mig", "nvidia.com/mig-1g.5gb.shared", 2, Sharing.MPS, False, UnitsRefusal.ONE_PER_CONTAINER),
    ("time-slicing", "nvidia.com/gpu.shared", 2, Sharing.TIME_SLICING, False, None),
    ("time-slicing", "nvidia.com/gpu.shared", 2, Sharing.TIME_SLICING, True, UnitsRefusal.ONE_PER_CONTAINER),
    ("time-slicing", "nvidia.com/gpu", 2, Sharing.TIME_SLICING, False, UnitsRefusal.AMBIGUOUS),
    ("mps", "nvidia.com/gpu.shared", 2, Sharing.MPS, False, UnitsRefusal.ONE_PER_CONTAINER),
    ("mps", "nvidia.com/gpu.shared", 1, Sharing.MPS, False, None),
], ids=["whole-8", "mig-2", "mig-single-gpu-2", "mig-single-gpu-1", "mig-mps-2", "ts-2", "ts-fails-2", "ts-gpu-2",
        "mps-2", "mps-1"])
def test_units_refusal(device: str, resource: str, units: int, sharing: Sharing, fails: bool,
                       refusal: UnitsRefusal | None) -> None:
    assert devices.DEVICES[device].units_refusal(resource, units, sharing, fails) is refusal


# ----- what the webhook reads and writes ------------------------------------------------------------

PRODUCT = (labels.GPU_PRODUCT, "In")


@pytest.mark.parametrize(("node", "resource", "affinity"), [
    ("h100-hgx-0", "nvidia.com/gpu", (("NVIDIA-H100-80GB-HBM3",), (labels.GPU_SHARING_STRATEGY, "NotIn",
                                                                   ("time-slicing", "mps")))),
    (MIXED, "nvidia.com/mig-2g.10gb", (("NVIDIA-A100-SXM4-40GB",), (labels.MIG_STRATEGY, "In", ("mixed",)))),
    ("a100-mig-single-0", "nvidia.com/gpu", (("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",),
                                             (labels.MIG_STRATEGY, "In", ("single",)))),
    ("t4-timeslice-0", "nvidia.com/gpu", (("Tesla-T4-SHARED",), (labels.GPU_SHARING_STRATEGY, "In", ("time-slicing",)),
                                          (labels.GPU_REPLICAS, "In", ("4",)))),
    ("v100-mps-0", "nvidia.com/gpu", (("Tesla-V100-SXM2-16GB-SHARED",), (labels.GPU_SHARING_STRATEGY, "In", ("mps",)),
                                      (labels.GPU_REPLICAS, "In", ("10",)))),
], ids=["whole", "mig-mixed", "mig-single", "time-slicing", "mps"])
def test_pod_write(node: str, resource: str, affinity: tuple[Any, ...]) -> None:
    inv = inventory(node)
    o = inv.offering(resource)
    assert o is not None
    write = devices.device_for(o).pod_write(o, inv.labels[labels.GPU_PRODUCT], inv.mig_strategy)
    (products, *rest) = affinity
    assert write.resource == resource and write.backing == o.label
    assert write.affinity == ((*PRODUCT, products), *rest)
    assert write.tolerations == (GPU_TOLERATION,) == (("nvidia.com/gpu", "Exists", "NoSchedule"),)


@pytest.mark.parametrize(("node", "resource", "served"), [
    ("h100-hgx-0", "nvidia.com/gpu", {Isolation.ANY, Isolation.EXCLUSIVE}),
    (MIXED, "nvidia.com/mig-1g.5gb", {Isolation.ANY, Isolation.MIG}),
    ("t4-timeslice-0", "nvidia.com/gpu", {Isolation.ANY, Isolation.TIME_SLICING}),
    ("v100-mps-0", "nvidia.com/gpu", {Isolation.ANY, Isolation.MPS}),
], ids=["whole", "mig", "time-slicing", "mps"])
def test_isolation_served(node: str, resource: str, served: set[Isolation]) -> None:
    o = offering(node, resource)
    assert {i for i in Isolation if devices.device_for(o).serves(i, o)} == served


def test_replicas_of_a_mig_instance_isolate_as_their_sharing_says() -> None:
    o = offering(MIXED, "nvidia.com/mig-1g.5gb.shared", labels_set={"nvidia.com/mig-1g.5gb.replicas": "2"},
                 alloc={"nvidia.com/mig-1g.5gb.shared": "32", "nvidia.com/mig-1g.5gb": "0"})
    assert o.sharing is Sharing.TIME_SLICING and o.replicas == 2 and o.per_gpu == 4
    assert {i for i in Isolation if devices.MIG.serves(i, o)} == {Isolation.ANY, Isolation.TIME_SLICING}
    assert not devices.MIG.units_add_up(o) and devices.MIG.units_add_up(offering(MIXED, "nvidia.com/mig-1g.5gb"))


def _container(milli: int = 0, memory_gib: int = 0) -> ContainerAsk:
    return ContainerAsk("c", False, False, 0, milli=milli, memory_bytes=memory_gib * 2**30)


@pytest.mark.parametrize(("node", "resource", "ask", "units"), [
    (MIXED, "nvidia.com/mig-2g.10gb", _container(memory_gib=10), 1),  # the name's 10 GiB, though 9984 MiB
    (MIXED, "nvidia.com/mig-2g.10gb", _container(memory_gib=11), None),
    (MIXED, "nvidia.com/mig-2g.10gb", _container(milli=2000), None),  # whole GPUs only from whole GPUs
    ("h100-hgx-0", "nvidia.com/gpu", _container(milli=2000, memory_gib=79), 2),  # 79.6 GiB each
    ("t4-timeslice-0", "nvidia.com/gpu", _container(milli=250), 1),
    ("t4-timeslice-0", "nvidia.com/gpu", _container(milli=251), None),
], ids=["mig-name-memory", "mig-too-little", "mig-whole", "whole-2", "replica-quarter", "replica-too-small"])
def test_units_for_a_portable_ask(node: str, resource: str, ask: ContainerAsk, units: int | None) -> None:
    o = offering(node, resource)
    assert devices.device_for(o).units_for(ask, o) == units
