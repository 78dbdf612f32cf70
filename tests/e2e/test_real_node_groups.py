"""Groups of pods on real GB200 nodes without GPUs (``tests/e2e/realnode.py``): four kubelets of the control plane's
release, each with NVIDIA's device plugin, gpu-feature-discovery and gpu-tailor's node agent on NVIDIA's mock NVML
with its GB200 profile (8 GPUs a node), in two NVLink domains.

The mock gives every GPU the fabric state of its profile (``device_defaults.fabric``: cluster UUID, clique id and
``state: auto``, which the mock resolves to "completed" when its fake fabric manager is off, as here). GFD labels a
node ``nvidia.com/gpu.clique=<cluster UUID>.<clique id>`` when every fabric-attached GPU agrees on both, a GPU being
fabric-attached when its state is completed, its cluster UUID not all zeros and its status success (go-nvlib's
``IsFabricAttached``); with another state it labels nothing. Two nodes run the profile as NVIDIA ships it (clique 0),
two a copy written at test time with clique id 1: GFD publishes the two cliques, and gpu-tailor reads its domains from
that label alone.

Each group is declared with gpu-tailor's annotations (``gpu-tailor.io/group``, ``group-size``, ``nvlink-domain:
required``) on 3 pods of 4 GPUs. What is checked: GFD published each node's clique; a group goes whole into the
clique already in use that holds it, and whole into the other clique where the one in use no longer holds it; every
pod runs (the kubelet refused none), and for every pod on the nodes the group used, the GPUs the kubelet allocated
(its PodResources API, read by the node agent) are the GPUs gpu-tailor recorded (``gpu-tailor.io/gpus``), or within
the set it recorded where the device plugin picks among equals (``gpu-tailor.io/gpus-among``); the agents' reports
settle every pod on what it holds, and the extender counts no contradiction (``gpu_tailor_agent_contradictions_total``).
"""

from __future__ import annotations

import functools
import json
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from gpu_tailor.extender.cache import Cache
from gpu_tailor.gpumodel import labels
from gpu_tailor.tools.source import read_live
from tests.e2e import realnode
from tests.e2e.cluster import OPTED_IN, Release
from tests.e2e.kube import Kube, Obj, api_path, wait_for
from tests.e2e.pods import unique
from tests.e2e.realnode import MockGpus, RealNode, mock_profile, real_node, real_pod
from tests.e2e.services import Stack, control_plane_with_gpu_tailor, install

pytestmark = pytest.mark.e2e

MANAGED = {"key": labels.MANAGED_TAINT_KEY, "effect": "NoSchedule"}  # one scheduler per GPU node (docs/admin.md)
CLIQUES = {"a": 0, "b": 1}  # our name of a clique -> the clique id its nodes' mock GPUs report
NODES = {f"gb200-{c}-{i}": c for c in CLIQUES for i in range(2)}
NODE_GPUS = 8  # the GB200 profile's GPUs (a real GB200 tray has 4; the mock ships 8)
MEMBER_GPUS = "4"


def clique_profile(clique_id: int, out: Path) -> Path:
    """A copy of the mock's GB200 profile whose GPUs report fabric clique ``clique_id`` (the rest as shipped)."""
    profile = yaml.safe_load(mock_profile("gb200").read_text())
    profile["device_defaults"]["fabric"]["clique_id"] = clique_id
    path = out / f"mock-nvml-config-gb200-clique-{clique_id}.yaml"
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    return path


def fabric_cluster() -> str:
    return str(yaml.safe_load(mock_profile("gb200").read_text())["device_defaults"]["fabric"]["cluster_uuid"])


@dataclass
class Racks:
    stack: Stack
    nodes: dict[str, RealNode]
    cliques: dict[str, str] = field(default_factory=dict)  # node -> the clique label GFD published
    seen: list[str] = field(default_factory=list)  # one line per pod checked: what was recorded, what was given

    @property
    def kube(self) -> Kube:
        return self.stack.kube

    def clique_nodes(self, clique: str) -> list[str]:
        return sorted(n for n, c in NODES.items() if c == clique)


@pytest.fixture(scope="module")
def racks(release: Release, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Racks]:
    """A control plane with gpu-tailor and four real GB200 nodes, two in clique 0 and two in clique 1, tainted for
    gpu-tailor-scheduler alone, each with the node agent running."""
    lacking = realnode.missing(release)
    lacking += [f"the mock NVML profile {p}" for p in (mock_profile("gb200"),) if not p.is_file()]
    if lacking:
        pytest.skip(f"no real GPU node on this machine: it lacks {'; '.join(lacking)}")
    work = tmp_path_factory.mktemp(f"real-groups-{release.version}")
    profiles = {c: clique_profile(i, work) for c, i in CLIQUES.items()}
    installer = functools.partial(install, nodes=False, agent=realnode.agent_patch)
    with control_plane_with_gpu_tailor(release, work, installer, admission_probe=False) as stack, ExitStack() as up:
        nodes = {}
        for name, clique in NODES.items():
            node = up.enter_context(real_node(name, stack.cp, stack.kube, release, work / "nodes", taints=[MANAGED]))
            node.start_nvidia(MockGpus(profiles[clique]))
            nodes[name] = node
        for node in nodes.values():
            node.start_agent()
        stack.wait_admission_works()
        yield Racks(stack, nodes, {n: node.gfd_labels.get(labels.GPU_CLIQUE, "") for n, node in nodes.items()})


def context(racks: Racks) -> str:
    return racks.stack.context() + "\n" + "\n".join(n.context() for n in racks.nodes.values())


def metrics(racks: Racks) -> str:
    """The extender's /metrics."""
    with urllib.request.urlopen(racks.stack.extender_probes + "/metrics", timeout=10) as resp:
        return str(resp.read().decode())


def contradictions(racks: Racks) -> float:
    return realnode.sample(metrics(racks), "gpu_tailor_agent_contradictions_total") or 0.0


def running(racks: Racks, name: str) -> Obj:
    return realnode.running(racks.kube, OPTED_IN, name, context=lambda: context(racks))


def member(group: str, i: int, size: int) -> Obj:
    """Member ``i`` of ``group``: a pod of 4 whole GB200s with gpu-tailor's group annotations, one domain required."""
    pod = real_pod(f"{group}-{i}", {labels.GPU_RESOURCE: MEMBER_GPUS}, "GB200")
    pod["metadata"]["annotations"].update({labels.ANN_GROUP: group, labels.ANN_GROUP_SIZE: str(size),
                                           labels.ANN_GROUP_DOMAIN: "required"})
    return pod


def holder(racks: Racks, node: str, gpus: int) -> str:
    """A single pod of ``gpus`` GB200s pinned to ``node``, running: a clique in use."""
    name = unique(f"holder-{node}")
    racks.kube.create(api_path("pods", OPTED_IN), real_pod(name, {labels.GPU_RESOURCE: str(gpus)}, "GB200",
                                                           node=node))
    assert running(racks, name)["spec"]["nodeName"] == node
    return name


def run_group(racks: Racks, size: int) -> tuple[list[Obj], Obj]:
    """A group of ``size`` members created at once; every member Running, and the plan its first member carries."""
    group = unique("train")
    names = [f"{group}-{i}" for i in range(size)]
    for i in range(size):
        racks.kube.create(api_path("pods", OPTED_IN), member(group, i, size))
    placed = [running(racks, n) for n in names]

    def carried() -> list[Obj]:
        now = [racks.kube.get(api_path("pods", OPTED_IN, n))["metadata"].get("annotations") or {} for n in names]
        return [json.loads(a[labels.ANN_GROUP_PLAN]) for a in now if labels.ANN_GROUP_PLAN in a]

    plans = wait_for(carried, 30, f"{group}'s plan written on its first member", interval=0.2,
                     context=lambda: context(racks))
    assert plans is not None and len(plans) == 1, f"the group's plan is carried by {plans}"
    assert plans[0]["group"] == f"{OPTED_IN}/group/{group}", plans[0]
    return placed, plans[0]


def delete_all(racks: Racks) -> None:
    """Every pod of the test deleted gracefully: the kubelets stop the containers and free their devices."""
    names = [p["metadata"]["name"] for p in racks.kube.list(api_path("pods", OPTED_IN))]
    for n in names:
        racks.kube.delete(api_path("pods", OPTED_IN, n), grace_seconds=2)
    wait_for(lambda: not racks.kube.list(api_path("pods", OPTED_IN)), 90, f"pods {names} gone", interval=0.2,
             context=lambda: context(racks))
    for node in racks.nodes.values():  # the reports and the extender's picture empty again before the next test
        wait_for(functools.partial(_reported, racks, node.name, {}), 30, f"{node.name}'s report naming no pod",
                 interval=0.5, context=lambda: context(racks))


def _reported(racks: Racks, node: str, given: dict[str, tuple[int, ...]]) -> bool:
    report = racks.kube.get(api_path("nodegpureports", name=node, group="gpu-tailor.io/v1alpha1"))
    return realnode.held_by_pod(report) == given


def picture(racks: Racks) -> Cache:
    """The extender's picture of the cluster as explain builds it from the live API, the agents' reports included."""
    cluster = read_live(str(racks.stack.cp.kubeconfig))
    cache = Cache(report_stale=None)
    cache.reset_reports(cluster.reports)
    cache.reset_pods(cluster.pods)
    cache.reset_nodes(cluster.nodes)
    return cache


def check(racks: Racks, nodes: set[str]) -> None:
    """On each of ``nodes``, every pod's allocated GPUs are its recorded ones, or within the recorded set; the node's
    report settles each pod on what it holds, the extender's picture names no GPU given away free, and no prediction
    is contradicted."""
    pods = [p for p in racks.kube.list(api_path("pods", OPTED_IN)) if p["spec"].get("nodeName") in nodes]
    pods = realnode.recorded(racks.kube, pods, functools.partial(metrics, racks), context=lambda: context(racks))
    for node in sorted(nodes):
        given = racks.nodes[node].allocated()
        here = [p for p in pods if p["spec"]["nodeName"] == node]
        assert sorted(given) == sorted(f"{OPTED_IN}/{p['metadata']['name']}" for p in here), (node, given)
        racks.seen.extend(realnode.given_as_recorded(pod, given, f" on {node} ({racks.cliques[node]})")
                          for pod in here)
        wait_for(functools.partial(_reported, racks, node, given), 30, f"{node}'s report naming what its pods hold",
                 interval=0.5, context=lambda: context(racks))
        realnode.wait_report_held(racks.kube, node, functools.partial(metrics, racks), context=lambda: context(racks))
        state = picture(racks).nodes[node].gpus
        held = {g for gpus in given.values() for g in gpus}
        wrongly_free = held & set(state.surely_free())
        assert not wrongly_free, f"the picture names GPUs {wrongly_free} of {node} free, the node gave them away"
        for key, gpus in given.items():
            placed = state.placements.get(key)
            assert placed is not None and tuple(sorted(placed.gpus)) == gpus, f"{key}: the picture says {placed}"
    assert contradictions(racks) == 0


def assert_in_one_clique(racks: Racks, placed: list[Obj], plan: Obj, clique: str) -> None:
    """Every member on a node of ``clique``, the plan in that clique's domain, and its slots where they run."""
    where = sorted(p["spec"]["nodeName"] for p in placed)
    assert {NODES[n] for n in where} == {clique}, f"the group ran on {where}, not all in clique {clique}"
    label = f"{labels.GPU_CLIQUE}={racks.cliques[where[0]]}"  # the extender names a domain by its label
    assert plan["domain"] == label, f"planned in {plan['domain']!r}, ran in {label!r}"
    assert sorted(n for n, _, _ in plan["slots"]) == where, (plan, where)


def test_gfd_publishes_each_nodes_clique(racks: Racks) -> None:
    """GFD on the mock NVML labels each node with its GPUs' fabric cluster UUID and clique id, as on an NVL72 rack."""
    cluster = fabric_cluster()
    for name, clique in NODES.items():
        node = racks.kube.get(api_path("nodes", name=name))["metadata"]["labels"]
        assert node.get(labels.GPU_CLIQUE) == f"{cluster}.{CLIQUES[clique]}", (name, racks.nodes[name].gfd_labels)
        assert node.get(labels.GPU_PRODUCT) == "NVIDIA-GB200" and node.get(labels.GPU_COUNT) == str(NODE_GPUS)
    print("\nGFD published:", json.dumps(racks.cliques, indent=1))


def test_a_group_runs_whole_in_the_clique_in_use_that_holds_it(racks: Racks) -> None:
    """Clique a in use (2 GPUs on gb200-a-0) holds the group's 12 GPUs exactly (4 of the 6 free on gb200-a-0, all 8
    of gb200-a-1), clique b is untouched: the group runs whole in clique a, recorded where the kubelets put it."""
    started = time.monotonic()
    try:
        holder(racks, "gb200-a-0", 2)
        placed, plan = run_group(racks, 3)
        assert_in_one_clique(racks, placed, plan, "a")
        check(racks, set(racks.clique_nodes("a")))
    finally:
        print("\n".join(["", f"clique in use ({time.monotonic() - started:.0f}s):", *racks.seen]))
        racks.seen.clear()
        delete_all(racks)


def test_a_group_the_clique_in_use_cannot_hold_runs_whole_in_the_other(racks: Racks) -> None:
    """Clique a in use on both nodes (2 GPUs each) holds only 2 of the group's 3 pods; the cluster holds all 3 only
    across both cliques. One domain is required: the group runs whole in clique b, none of it in a."""
    started = time.monotonic()
    try:
        for node in racks.clique_nodes("a"):
            holder(racks, node, 2)
        placed, plan = run_group(racks, 3)
        assert_in_one_clique(racks, placed, plan, "b")
        check(racks, set(NODES))
    finally:
        print("\n".join(["", f"the other clique ({time.monotonic() - started:.0f}s):", *racks.seen]))
        racks.seen.clear()
        delete_all(racks)
