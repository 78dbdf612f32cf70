"""Offerings declared in the policy file (node pools scaled to zero), one per backing, through its device.

Each backing of the config is one device of ``gpumodel.devices``: the device checks the declaration and
says what one node of the pool would sell and what a pod sent there gets written.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, get_args

import pytest

from gpu_tailor.gpumodel import devices, labels
from gpu_tailor.webhook.config import ConfigError, DeclaredOffering, parse_policy
from gpu_tailor.webhook.state import declared_candidate


def test_every_backing_of_the_config_is_a_device() -> None:
    assert get_args(DeclaredOffering.model_fields["backing"].annotation) == tuple(devices.DEVICES)


STRATEGY, SHARING, REPLICAS = labels.MIG_STRATEGY, labels.GPU_SHARING_STRATEGY, labels.GPU_REPLICAS

# (id, offering, resource, backing, units per node, memory per unit MiB, fraction, affinity)
CASES: list[tuple[str, str, str, str, int, int, Fraction, tuple[Any, ...]]] = [
    ("whole", "{backing: whole, product: NVIDIA-H100-80GB-HBM3, gpusPerNode: 8}", "nvidia.com/gpu", "whole", 8,
     81559, Fraction(1), ((labels.GPU_PRODUCT, "In", ("NVIDIA-H100-80GB-HBM3",)),)),
    ("whole/selector", "{backing: whole, product: Tesla-T4, gpuMemory: 15Gi, nodeSelector: {pool: t4, zone: a}}",
     "nvidia.com/gpu", "whole", 1, 15360, Fraction(1), (("pool", "In", ("t4",)), ("zone", "In", ("a",)))),
    ("mig/mixed", "{backing: mig, product: NVIDIA-H100-80GB-HBM3, migProfile: 1g.10gb, gpusPerNode: 8}",
     "nvidia.com/mig-1g.10gb", "mig-1g.10gb", 56, 10194, Fraction(1, 7), ((STRATEGY, "In", ("mixed",)),)),
    ("mig/single", "{backing: mig, product: NVIDIA-A100-SXM4-40GB, migProfile: 3g.20gb, migStrategy: single, "
     "gpusPerNode: 4}", "nvidia.com/gpu", "mig-3g.20gb", 8, 20480, Fraction(3, 7), ((STRATEGY, "In", ("single",)),)),
    ("time-slicing/renamed", "{backing: time-slicing, product: Tesla-T4, replicas: 4, renamed: true, gpuMemory: 16Gi, "
     "gpusPerNode: 2}", "nvidia.com/gpu.shared", "shared:time-slicing:4", 8, 4096, Fraction(1, 4),
     ((SHARING, "In", ("time-slicing",)), (REPLICAS, "In", ("4",)))),
    ("mps", "{backing: mps, product: Tesla-V100-SXM2-16GB, replicas: 10, gpuMemory: 16Gi}", "nvidia.com/gpu",
     "shared:mps:10", 10, 1638, Fraction(1, 10), ((SHARING, "In", ("mps",)), (REPLICAS, "In", ("10",)))),
]


@pytest.mark.parametrize(("text", "resource", "backing", "units", "memory", "fraction", "affinity"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_declared_offering_is_a_candidate_with_no_nodes(text: str, resource: str, backing: str, units: int,
                                                          memory: int, fraction: Fraction,
                                                          affinity: tuple[Any, ...]) -> None:
    c = declared_candidate(parse_policy(f"offerings: [{text}]").offerings[0])
    assert (c.resource, c.backing, c.max_units_per_node, c.memory_mib, c.fraction) == (
        resource, backing, units, memory, fraction)
    assert c.affinity == affinity and c.write.tolerations == (("nvidia.com/gpu", "Exists", "NoSchedule"),)
    assert c.declared and c.nodes == () and c.free_units == c.most_free == 0


def test_fail_requests_greater_than_one_is_kept() -> None:
    c = declared_candidate(parse_policy("offerings: [{backing: time-slicing, product: Tesla-T4, replicas: 4, "
                                        "gpuMemory: 16Gi, failRequestsGreaterThanOne: true}]").offerings[0])
    assert c.fail_requests_gt_one


@pytest.mark.parametrize(("text", "message"), [
    ("{backing: mig, product: NVIDIA-H100-80GB-HBM3}", "backing mig needs migProfile (e.g. 1g.10gb)"),
    ("{backing: mig, product: NVIDIA-H100-80GB-HBM3, migProfile: 1g.10gb, replicas: 2}",
     "replicas is only for time-slicing or mps, not mig"),
    ("{backing: whole, product: NVIDIA-H100-80GB-HBM3, migProfile: 1g.10gb}",
     "migProfile is only for backing mig, not whole"),
    ("{backing: whole, product: NVIDIA-H100-80GB-HBM3, replicas: 2}",
     "replicas is only for time-slicing or mps, not whole"),
    ("{backing: time-slicing, product: Tesla-T4, gpuMemory: 16Gi}", "backing time-slicing needs replicas (>= 2)"),
    ("{backing: mps, product: Tesla-T4, gpuMemory: 16Gi, migProfile: 1g.5gb, replicas: 2}",
     "migProfile is only for backing mig, not mps"),
    ("{backing: mps, product: Tesla-T4, replicas: 2}", "gpuMemory is required for Tesla-T4 (not in the MIG table)"),
], ids=["mig-no-profile", "mig-replicas", "whole-profile", "whole-replicas", "ts-no-replicas", "mps-profile",
        "no-memory"])
def test_each_device_checks_its_declarations(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_policy(f"offerings: [{text}]")
    assert str(exc.value) == f"config: offerings[0]: Value error, {message}"
