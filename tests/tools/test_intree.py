"""kube-scheduler's own filters as explain models them: the first plugin that fails names the reason."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_tailor.tools.intree import reasons
from tests.tools.builders import pod

Obj = dict[str, Any]


def node(*, taints: list[Obj] | None = None, labels: dict[str, str] | None = None, unschedulable: bool = False,
         allocatable: dict[str, str] | None = None) -> Obj:
    return {"metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1", **(labels or {})}},
            "spec": {"taints": taints or [], "unschedulable": unschedulable},
            "status": {"allocatable": allocatable or {"cpu": "8", "memory": "32Gi", "pods": "110",
                                                      "nvidia.com/gpu": "2"}}}


GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
TOLERATE_GPU = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def with_spec(p: Obj, **spec: Any) -> Obj:
    p["spec"].update(spec)
    return p


CASES = [
    pytest.param(pod("p", {"nvidia.com/gpu": "1"}), node(), [], [], id="fits"),
    pytest.param(pod("p", {"nvidia.com/gpu": "1"}), node(unschedulable=True), [],
                 ["node(s) were unschedulable"], id="cordoned"),
    pytest.param(pod("p", {"nvidia.com/gpu": "1"}), node(taints=[GPU_TAINT]), [],
                 ["node(s) had untolerated taint {nvidia.com/gpu: present}"], id="taint"),
    pytest.param(with_spec(pod("p", {"nvidia.com/gpu": "1"}), tolerations=[TOLERATE_GPU]), node(taints=[GPU_TAINT]),
                 [], [], id="tolerated taint"),
    pytest.param(pod("p", {"nvidia.com/gpu": "1"}),
                 node(taints=[{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]), [], [],
                 id="not-ready: tolerated by default"),
    pytest.param(with_spec(pod("p", {}), nodeSelector={"pool": "a"}), node(labels={"pool": "b"}), [],
                 ["node(s) didn't match Pod's node affinity/selector"], id="nodeSelector"),
    pytest.param(with_spec(pod("p", {}), affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["x"]}]},
                              {"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["a"]}]}]}}}),
                 node(labels={"pool": "b"}), [], [], id="affinity terms are ORed"),
    pytest.param(with_spec(pod("p", {"nvidia.com/gpu": "1"}), nodeSelector={"pool": "a"}), node(unschedulable=True),
                 [], ["node(s) were unschedulable"], id="only the first plugin that fails"),
    pytest.param(pod("p", {"nvidia.com/gpu": "2"}, cpu="2"), node(), [pod("q", {"nvidia.com/gpu": "1"}, node="n1",
                                                                          cpu="7")],
                 ["Insufficient cpu", "Insufficient nvidia.com/gpu"], id="every resource short"),
    pytest.param(pod("p", {"nvidia.com/gpu": "1"}), node(), [pod("q", {"nvidia.com/gpu": "1"}, node="n1")], [],
                 id="room left"),
]


@pytest.mark.parametrize(("p", "n", "on_node", "expected"), CASES)
def test_reasons(p: Obj, n: Obj, on_node: list[Obj], expected: list[str]) -> None:
    assert reasons(p, n, on_node) == expected


def test_shortfalls_say_how_much_is_free() -> None:
    from gpu_tailor.tools.intree import shortfalls

    bound = [pod("q", {"nvidia.com/gpu": "1"}, node="n1", cpu="7500m")]
    assert shortfalls(pod("p", {"nvidia.com/gpu": "2"}, cpu="1"), node(), bound) == [
        "cpu: 1 asked, 0.5 of 8 free", "nvidia.com/gpu: 2 asked, 1 of 2 free"]
