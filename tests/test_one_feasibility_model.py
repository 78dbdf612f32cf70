"""One feasibility model: the extender (``fit`` over its cache, plus kube-scheduler's own CPU and
memory check) and the simulator's fleet reach the same verdict and the same GPUs for the same node,
the same pods already bound there, and the same ask.

Hypothesis draws nodes of every backing the simulator models (whole GPUs on NVSwitch, NVLink-mesh
and PCIe boards, healthy or degraded; time-sliced and MPS replicas, renamed or not), binds a random
sequence of pods through the extender's real cache, rebuilds the same node the way the simulator
does (a full row, then ``Fleet.take`` for each pod on the GPUs the extender recorded), and asks
both about one more pod. The simulator places a replica where the node's device plugin would put it
(``Fleet.pick``: by default its ``distributed`` policy), which is what the extender predicts.

Out of scope, because the simulator does not model them: MIG (the trace has no MIG) and several
replicas in one ask (the fleet models a pod as N GPUs of one share each).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gpu_tailor.extender.cache import Cache
from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.fleet import Fleet
from gpu_tailor.gpumodel.occupancy import format_gpu_annotation
from gpu_tailor.gpumodel.policies import POLICIES
from gpu_tailor.gpumodel.schedule import demand_of, fit, fleet_row, shape_of
from tests.conftest import node_fixture

NODE = "node-0"


@dataclass(frozen=True)
class Board:
    fixture: str
    product: str
    count: int


WHOLE_BOARDS = [Board("h100-hgx-0", "NVIDIA-H100-80GB-HBM3", 8),  # NVSwitch
                Board("h100-hgx-0", "Tesla-V100-SXM2-16GB", 8),  # NVLink hybrid mesh
                Board("h100-hgx-0", "Tesla-T4", 4)]  # PCIe


@st.composite
def nodes(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["whole", "time-slicing", "time-slicing-renamed", "mps"]))
    cpu = draw(st.sampled_from([8, 32, 96, 128]))
    mem_gib = draw(st.sampled_from([32, 256, 1024]))
    if kind == "whole":
        board = draw(st.sampled_from(WHOLE_BOARDS))
        node = copy.deepcopy(node_fixture(board.fixture))
        lab = node["metadata"]["labels"]
        lab[labels.GPU_PRODUCT], lab[labels.GPU_COUNT] = board.product, str(board.count)
        allocatable = draw(st.integers(1, board.count))  # fewer than labelled: degraded
        gpu = {labels.GPU_RESOURCE: str(allocatable)}
    else:
        fixture = {"time-slicing": "t4-timeslice-0", "time-slicing-renamed": "t4-timeslice-renamed-0",
                   "mps": "v100-mps-0"}[kind]
        node = copy.deepcopy(node_fixture(fixture))
        lab = node["metadata"]["labels"]
        count, replicas = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([2, 4, 10]))
        lab[labels.GPU_COUNT], lab[labels.GPU_REPLICAS] = str(count), str(replicas)
        name = labels.GPU_SHARED_RESOURCE if kind == "time-slicing-renamed" else labels.GPU_RESOURCE
        gpu = {name: str(count * replicas)}
        if name == labels.GPU_SHARED_RESOURCE:
            gpu[labels.GPU_RESOURCE] = "0"
    node["metadata"]["name"] = NODE
    node["spec"].pop("taints", None)
    status = node["status"]
    for key in ("capacity", "allocatable"):
        status[key] = {k: v for k, v in status[key].items() if not k.startswith("nvidia.com/")}
        status[key].update(cpu=str(cpu), memory=f"{mem_gib}Gi", **gpu)
    return node


@st.composite
def asks(draw: st.DrawFn, node: dict[str, Any]) -> dict[str, Any]:
    """A pod the simulator can model on ``node``: k whole GPUs (NVLink or not), or one replica."""
    alloc = node["status"]["allocatable"]
    resource = labels.GPU_SHARED_RESOURCE if labels.GPU_SHARED_RESOURCE in alloc else labels.GPU_RESOURCE
    replicas = int(node["metadata"]["labels"].get(labels.GPU_REPLICAS, "1"))
    units = draw(st.integers(1, 8)) if replicas == 1 else 1
    annotations = {}
    if units > 1 and draw(st.booleans()):
        annotations["gpu-tailor.io/topology"] = "nvlink"
    cpu = draw(st.sampled_from(["0", "0", "1", "4", "16", "64"]))
    mem = draw(st.sampled_from(["0", "1Gi", "64Gi"]))
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"namespace": "t", "name": "", "uid": "", "annotations": annotations},
            "spec": {"containers": [{"name": "main", "resources": {
                "limits": {resource: str(units)},
                "requests": {resource: str(units), "cpu": cpu, "memory": mem}}}]}}


def simulator_fleet(cache: Cache, node: dict[str, Any], bound: list[dict[str, Any]]) -> tuple[Fleet, int]:
    """The node as the simulator keeps it: a full row, then each pod taken on its recorded GPUs."""
    state = cache.snapshot().nodes[NODE].state
    inv = state.inventory
    usable = inv.usable_gpus
    fleet = Fleet()
    row = fleet.upsert(NODE, inv.cpu_milli, inv.memory_bytes // 2**20,
                       [1000] * usable + [0] * (inv.gpu_count - usable), inv.model, fleet_row(state).topology,
                       pick=fleet_row(state).pick, step=fleet_row(state).step)
    for pod in bound:
        demand = demand_of(pod)
        gpus = tuple(int(g) for g in pod["metadata"]["annotations"][labels.ANN_GPUS].split(","))
        fleet.take(row, shape_of(demand, inv.offering(demand.resource)), gpus)
    return fleet, row


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_extender_and_simulator_agree_on_verdict_and_gpus(data: st.DataObject) -> None:
    node = data.draw(nodes(), "node")
    cache = Cache()
    cache.reset_nodes([node])
    cache.reset_pods([])
    bound: list[dict[str, Any]] = []
    for i in range(data.draw(st.integers(0, 12), "pods already bound")):
        pod = data.draw(asks(node), f"bound pod {i}")
        pod["metadata"].update(name=f"p{i}", uid=f"u{i}")
        state = cache.snapshot().nodes[NODE].state
        demand = demand_of(pod)
        placed = fit(state, demand)
        books = fleet_row(state)
        if not placed.ok or placed.placement is None or demand.cpu_milli > books.cpu_free \
                or demand.memory_mib > books.mem_free_mib:
            continue
        pod["metadata"]["annotations"][labels.ANN_GPUS] = format_gpu_annotation(placed.placement.gpus)
        pod["spec"]["nodeName"] = NODE
        pod["status"] = {"phase": "Running"}
        cache.apply_pod("ADDED", pod)
        bound.append(pod)

    state = cache.snapshot().nodes[NODE].state
    fleet, row = simulator_fleet(cache, node, bound)
    # the two keep the same books: free CPU, memory and per-GPU share
    mine = fleet_row(state)
    assert (int(fleet.cpu[row]), int(fleet.mem[row])) == (mine.cpu_free, mine.mem_free_mib)
    assert tuple(int(g) for g in fleet.gpu[row, : len(mine.gpu_free)]) == mine.gpu_free

    pod = data.draw(asks(node), "the ask")
    pod["metadata"].update(name="asked", uid="asked")
    demand = demand_of(pod)
    verdict = fit(state, demand)
    extender_ok = verdict.ok and demand.cpu_milli <= mine.cpu_free and demand.memory_mib <= mine.mem_free_mib
    shape = shape_of(demand, state.inventory.offering(demand.resource))
    rows = np.asarray([row])
    simulator_ok = bool(fleet.feasible(shape, rows)[0])
    assert extender_ok == simulator_ok, (verdict.reason, shape)
    event(f"{state.inventory.offerings[0].label if state.inventory.offerings else 'none'}: "
          f"{'fits' if extender_ok else 'does not fit'}")
    event(f"{len(bound)} pods bound" if len(bound) < 3 else "3+ pods bound")
    if extender_ok:
        choice = POLICIES["bestfit"](fleet).choose(shape, rows)
        assert choice is not None and verdict.placement is not None
        assert sorted(choice.gpus) == sorted(verdict.placement.gpus)
