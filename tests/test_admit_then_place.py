"""The webhook and the extender agree on native asks: a pod the webhook admits is one the extender can
place on some node that sells its resource, and a pod it denies is one no node would take.

Both ask the offering's device (``gpumodel.devices``, ``Device.units_refusal``); this checks the two ends
on the fixture nodes (an empty cluster), on the real ExtenderArgs and AdmissionReview payloads with the
NVIDIA resource swapped. ``test_mig_follows_device_plugin`` does the same on a MIG node as it fills up.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpu_tailor.extender import verbs
from gpu_tailor.extender.cache import Cache
from gpu_tailor.webhook.config import AdmissionPolicy
from gpu_tailor.webhook.mutate import decide
from gpu_tailor.webhook.state import ClusterView
from tests.conftest import FIXTURES, node_fixture, review_fixture

ALL = sorted(p.stem for p in (FIXTURES / "nodes").glob("*.json"))
NO_WHOLE_GPUS = [n for n in ALL if not n.startswith("h100")]  # nvidia.com/gpu sold only as slices


def mps_renamed() -> dict[str, Any]:
    """The V100 MPS node with renameByDefault: its replicas sold as nvidia.com/gpu.shared."""
    node = copy.deepcopy(node_fixture("v100-mps-0"))
    node["metadata"]["name"] = "v100-mps-renamed-0"
    node["status"]["allocatable"].update({"nvidia.com/gpu": "0", "nvidia.com/gpu.shared": "10"})
    return node


def pod(per_container: list[dict[str, str]]) -> dict[str, Any]:
    """Fixture a's pod (plain, native) with one container per entry, each asking for those resources."""
    obj: dict[str, Any] = copy.deepcopy(review_fixture("a")["request"]["object"])
    first = obj["spec"]["containers"][0]
    obj["spec"]["containers"] = []
    for i, resources in enumerate(per_container):
        c = copy.deepcopy(first)
        c["name"] = f"c{i}"
        c["resources"] = {"limits": dict(resources), "requests": dict(resources)}
        obj["spec"]["containers"].append(c)
    return obj


# (id, nodes, containers' asks, admitted and placed?)
CASES: list[tuple[str, list[str], list[dict[str, str]], bool]] = [
    ("gpu-1", ALL, [{"nvidia.com/gpu": "1"}], True),
    ("gpu-8", ALL, [{"nvidia.com/gpu": "8"}], True),
    ("shared-2", ALL, [{"nvidia.com/gpu.shared": "2"}], True),
    ("shared-16", ALL, [{"nvidia.com/gpu.shared": "16"}], True),
    ("mig-1g-2", ALL, [{"nvidia.com/mig-1g.5gb": "2"}], True),
    ("mig-3g-8", ALL, [{"nvidia.com/mig-3g.20gb": "8"}], True),
    ("no-whole/gpu-1", NO_WHOLE_GPUS, [{"nvidia.com/gpu": "1"}], True),
    ("no-whole/gpu-2", NO_WHOLE_GPUS, [{"nvidia.com/gpu": "2"}], False),
    ("no-whole/gpu-1-in-each-of-2", NO_WHOLE_GPUS, [{"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "1"}], True),
    ("mps-and-timeslice/shared-2", [*ALL, "v100-mps-renamed-0"], [{"nvidia.com/gpu.shared": "2"}], True),
    ("mps-only/shared-2", ["v100-mps-renamed-0", "h100-hgx-0"], [{"nvidia.com/gpu.shared": "2"}], False),
    ("mps-only/shared-1-in-each-of-2", ["v100-mps-renamed-0"],
     [{"nvidia.com/gpu.shared": "1"}, {"nvidia.com/gpu.shared": "1"}], True),
]


def nodes(names: list[str]) -> list[dict[str, Any]]:
    return [mps_renamed() if n == "v100-mps-renamed-0" else node_fixture(n) for n in names]


@pytest.mark.parametrize(("names", "asks", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_admitted_exactly_when_some_node_can_place_it(names: list[str], asks: list[dict[str, str]],
                                                      expected: bool) -> None:
    obj = pod(asks)
    view = ClusterView(AdmissionPolicy())
    view.reset(nodes(names))
    request = {**review_fixture("a")["request"], "object": obj}
    decision = decide(request, view.candidates(), view.policy)
    cache = Cache()
    cache.reset_pods([])
    cache.reset_nodes(nodes(names))
    out = verbs.filter_nodes(cache.snapshot(), {"Pod": obj, "NodeNames": names})
    assert out["Error"] == ""
    placeable = bool(out["NodeNames"])
    assert (decision.allowed, placeable) == (expected, expected), (decision.message, out)
    if not expected:
        assert decision.message and "1" in decision.message  # says what to ask for instead
