"""Inventory of each real fixture node, written out by hand from its labels and allocatable."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import pytest

from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.inventory import BackingKind, HealthState, Sharing, from_node
from tests.conftest import node_fixture


@dataclass(frozen=True)
class Expected:
    model: str
    gpus: int
    memory_mib: int
    health: HealthState
    missing: int
    offers: tuple[tuple[str, int, str, Fraction], ...]  # (resource, allocatable, backing label, fraction)
    mig_strategy: str = "none"
    sharing: Sharing = Sharing.NONE
    taint: bool = False


CASES: dict[str, Expected] = {
    "h100-hgx-0": Expected("H100", 8, 81559, HealthState.HEALTHY, 0,
                           (("nvidia.com/gpu", 8, "whole", Fraction(1)),), taint=True),
    "h100-degraded-0": Expected("H100", 8, 81559, HealthState.DEGRADED, 3,
                                (("nvidia.com/gpu", 5, "whole", Fraction(1)),)),
    "h100-initializing-0": Expected("", 0, 0, HealthState.INITIALIZING, 0, ()),
    "a100-mig-mixed-0": Expected("A100", 8, 40960, HealthState.HEALTHY, 0, (
        ("nvidia.com/mig-1g.5gb", 16, "mig-1g.5gb", Fraction(1, 7)),
        ("nvidia.com/mig-2g.10gb", 8, "mig-2g.10gb", Fraction(2, 7)),
        ("nvidia.com/mig-3g.20gb", 8, "mig-3g.20gb", Fraction(3, 7)),
    ), mig_strategy="mixed"),
    "a100-mig-single-0": Expected("A100", 8, 40960, HealthState.HEALTHY, 0,
                                  (("nvidia.com/gpu", 56, "mig-1g.5gb", Fraction(1, 7)),), mig_strategy="single"),
    "t4-timeslice-0": Expected("T4", 4, 15360, HealthState.HEALTHY, 0,
                               (("nvidia.com/gpu", 16, "shared:time-slicing:4", Fraction(1, 4)),),
                               sharing=Sharing.TIME_SLICING),
    "t4-timeslice-renamed-0": Expected("T4", 4, 15360, HealthState.HEALTHY, 0,
                                       (("nvidia.com/gpu.shared", 16, "shared:time-slicing:4", Fraction(1, 4)),),
                                       sharing=Sharing.TIME_SLICING),
    "v100-mps-0": Expected("V100", 1, 16384, HealthState.HEALTHY, 0,
                           (("nvidia.com/gpu", 10, "shared:mps:10", Fraction(1, 10)),), sharing=Sharing.MPS),
    "cpu-node-0": Expected("", 0, 0, HealthState.NO_GPU, 0, ()),
}


@pytest.mark.parametrize("name", sorted(CASES), ids=sorted(CASES))
def test_fixture_node_inventory(name: str) -> None:
    want = CASES[name]
    inv = from_node(node_fixture(name))
    assert inv.name == name
    assert inv.model == want.model
    assert inv.gpu_count == want.gpus
    assert inv.gpu_memory_mib == want.memory_mib
    assert inv.health.state is want.health
    assert inv.health.missing_gpus == want.missing
    assert inv.mig_strategy == want.mig_strategy
    assert inv.sharing is want.sharing
    assert inv.gpu_taint is want.taint
    got = tuple((str(o.resource), o.allocatable, o.label, o.fraction) for o in inv.offerings)
    assert got == want.offers
    assert inv.problems == ()


def test_degraded_reason_names_the_missing_gpus() -> None:
    inv = from_node(node_fixture("h100-degraded-0"))
    assert inv.health.reason == "3 of 8 GPUs missing (allocatable 5 < nvidia.com/gpu.count 8)"
    assert inv.usable_gpus == 5


def test_initializing_reason() -> None:
    inv = from_node(node_fixture("h100-initializing-0"))
    assert "initializing" in inv.health.reason and "no nvidia.com/gpu allocatable" in inv.health.reason


def test_mig_memory_comes_from_labels_not_the_table() -> None:
    inv = from_node(node_fixture("a100-mig-mixed-0"))
    memory = {o.label: o.memory_mib for o in inv.offerings}
    assert memory == {"mig-1g.5gb": 4864, "mig-2g.10gb": 9984, "mig-3g.20gb": 20096}
    one_g = inv.offering("nvidia.com/mig-1g.5gb")
    assert one_g is not None and one_g.mig_profile is not None and one_g.mig_profile.max_instances == 7


def test_replica_size_in_memory() -> None:
    t4 = from_node(node_fixture("t4-timeslice-renamed-0")).offerings[0]
    assert (t4.memory_mib, t4.replicas, t4.per_gpu) == (15360 // 4, 4, 4)
    mps = from_node(node_fixture("v100-mps-0")).offerings[0]
    assert mps.memory_mib == 16384 // 10


def _edit(name: str, labels_set: dict[str, str | None], alloc_set: dict[str, str | None]) -> dict[str, Any]:
    node = copy.deepcopy(node_fixture(name))
    for key, value in labels_set.items():
        if value is None:
            node["metadata"]["labels"].pop(key, None)
        else:
            node["metadata"]["labels"][key] = value
    for key, value in alloc_set.items():
        if value is None:
            node["status"]["allocatable"].pop(key, None)
        else:
            node["status"]["allocatable"][key] = value
    return node


def test_invalid_mig_product() -> None:
    node = _edit("a100-mig-single-0", {labels.GPU_PRODUCT: "NVIDIA-A100-SXM4-40GB-MIG-INVALID"}, {})
    inv = from_node(node)
    assert inv.health.state is HealthState.INVALID_MIG
    assert inv.offerings == ()
    assert "MIG-INVALID" in inv.health.reason


def test_time_sliced_node_missing_replicas_is_degraded() -> None:
    inv = from_node(_edit("t4-timeslice-0", {}, {"nvidia.com/gpu": "12"}))
    assert inv.health.state is HealthState.DEGRADED
    assert inv.health.missing_gpus == 1


def test_mixed_mig_missing_instances_is_degraded() -> None:
    inv = from_node(_edit("a100-mig-mixed-0", {}, {"nvidia.com/mig-1g.5gb": "9"}))
    assert inv.health.state is HealthState.DEGRADED
    assert "7 of 32 MIG instances missing" in inv.health.reason


def test_allocatable_without_labels_is_whole_gpus() -> None:
    node = {"metadata": {"name": "bare"}, "status": {"allocatable": {"nvidia.com/gpu": "2", "cpu": "4"}}}
    inv = from_node(node)
    assert inv.health.state is HealthState.HEALTHY
    assert inv.gpu_count == 2 and inv.cpu_milli == 4000
    assert [o.backing for o in inv.offerings] == [BackingKind.WHOLE]


def test_bad_label_values_are_reported_not_raised() -> None:
    inv = from_node(_edit("h100-hgx-0", {labels.GPU_COUNT: "eight"}, {}))
    assert any("gpu.count" in p for p in inv.problems)
    assert inv.gpu_count == 8  # falls back to what is allocatable


def test_empty_object_is_no_gpu() -> None:
    assert from_node({}).health.state is HealthState.NO_GPU
