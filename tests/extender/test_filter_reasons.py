"""Filter turns away every node short of the NVIDIA resource a pod asks for, with a reason people can read.

kube-scheduler's NodeResourcesFit counts the managed GPU resources as well (``ignoredByScheduler:
false``, see manifests/scheduler/configmap.yaml), but the extender must not lean on it: its reason is
what a pod's FailedScheduling event shows for the nodes it turns away, and a node it passes is one
the pod is bound to. So for every fixture node and every ask: a node passes only when allocatable
minus what the bound pods use covers the ask, and each node turned away gets a reason that says why.
Asks are the real ExtenderArgs that kube-scheduler v1.28.7 sent, with the NVIDIA resource swapped.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpu_tailor.extender import verbs
from gpu_tailor.extender.cache import Cache
from gpu_tailor.extender.snapshot import Snapshot
from gpu_tailor.gpumodel.quantity import parse_count
from tests.conftest import FIXTURES, load_fixture, node_fixture

NODE_NAMES = sorted(p.stem for p in (FIXTURES / "nodes").glob("*.json"))
GPU4 = "filter-nodecache-true-pod-gpu4"
GPU8 = "filter-nodecache-true-pod-high-gpu8-after-preemption"
MIG = "filter-nodecache-true-pod-mig-1g.5gb"


def _set_nvidia(pod: dict[str, Any], resource: str, units: int) -> dict[str, Any]:
    res = pod["spec"]["containers"][0]["resources"]
    for part in ("limits", "requests"):
        res[part] = {k: v for k, v in (res.get(part) or {}).items() if not k.startswith("nvidia.com/")}
        res[part][resource] = str(units)
    return pod


def ask(fixture: str, resource: str | None = None, units: int = 1, nodes: list[str] | None = None) -> dict[str, Any]:
    """A real ExtenderArgs (nodeCacheCapable) over ``nodes``, asking for ``units`` of ``resource``
    instead of what the captured pod asked (``resource=None``: as captured, ``units`` says how many)."""
    body: dict[str, Any] = load_fixture("extender", f"{fixture}.json")
    body["NodeNames"] = list(NODE_NAMES if nodes is None else nodes)
    if resource is not None:
        _set_nvidia(body["Pod"], resource, units)
    requests = body["Pod"]["spec"]["containers"][0]["resources"]["requests"]
    assert [int(v) for k, v in requests.items() if k.startswith("nvidia.com/")] == [units]
    return body


def held(node: str, resource: str, units: int, count: int = 1) -> list[dict[str, Any]]:
    """``count`` running pods bound to ``node``, each holding ``units`` of ``resource`` (GPU only)."""
    pods = []
    for i in range(count):
        pod = copy.deepcopy(load_fixture("extender", f"{GPU4}.json")["Pod"])
        pod["metadata"].update(name=f"held-{node}-{resource.rsplit('/', 1)[1]}-{i}", annotations={})
        pod["metadata"]["uid"] = f"uid-{pod['metadata']['name']}"
        pod["spec"]["containers"][0]["resources"] = {}
        _set_nvidia(pod, resource, units)
        pod["spec"]["nodeName"] = node
        pod["status"] = {"phase": "Running"}
        pods.append(pod)
    return pods


def cluster(pods: list[dict[str, Any]] = ()) -> Snapshot:  # type: ignore[assignment]
    cache = Cache()
    cache.reset_pods(list(pods))
    cache.reset_nodes([node_fixture(n) for n in NODE_NAMES])
    return cache.snapshot()


def verdict(out: dict[str, Any], node: str) -> tuple[str, str]:
    if node in (out["NodeNames"] or []):
        return "pass", ""
    if node in out["FailedNodes"]:
        return "failed", out["FailedNodes"][node]
    return "unresolvable", out["FailedAndUnresolvableNodes"][node]


NOT_HERE = "no {} on this node (it offers {})"
MIXED_OFFERS = "nvidia.com/mig-1g.5gb, nvidia.com/mig-2g.10gb, nvidia.com/mig-3g.20gb"

# (id, ask: fixture, resource override, units; pods bound first; node; verdict; reason)
CASES: list[tuple[str, tuple[str, str | None, int], list[dict[str, Any]], str, str, str]] = [
    # nodes with no GPU resource at all
    ("cpu-node/gpu", (GPU4, None, 4), [], "cpu-node-0", "unresolvable", "node has no NVIDIA GPUs"),
    ("cpu-node/mig", (MIG, None, 1), [], "cpu-node-0", "unresolvable", "node has no NVIDIA GPUs"),
    ("cpu-node/shared", (GPU4, "nvidia.com/gpu.shared", 1), [], "cpu-node-0", "unresolvable",
     "node has no NVIDIA GPUs"),
    ("initializing/gpu", (GPU4, None, 4), [], "h100-initializing-0", "unresolvable",
     "GPU stack initializing: no nvidia.com/gpu allocatable yet"),
    ("initializing/mig", (MIG, None, 1), [], "h100-initializing-0", "unresolvable",
     "GPU stack initializing: no nvidia.com/gpu allocatable yet"),
    # allocatable lacks the resource asked for (another MIG profile, another strategy, another name)
    ("mixed/profile-not-sold", (MIG, "nvidia.com/mig-1g.10gb", 1), [], "a100-mig-mixed-0", "unresolvable",
     NOT_HERE.format("nvidia.com/mig-1g.10gb", MIXED_OFFERS)),
    ("mixed/7g-not-sold", (MIG, "nvidia.com/mig-7g.40gb", 1), [], "a100-mig-mixed-0", "unresolvable",
     NOT_HERE.format("nvidia.com/mig-7g.40gb", MIXED_OFFERS)),
    ("mixed/whole-gpu-is-0", (GPU4, None, 4), [], "a100-mig-mixed-0", "unresolvable",
     NOT_HERE.format("nvidia.com/gpu", MIXED_OFFERS)),
    ("single/mig-resource", (MIG, None, 1), [], "a100-mig-single-0", "unresolvable",
     NOT_HERE.format("nvidia.com/mig-1g.5gb", "nvidia.com/gpu")),
    ("hgx/mig-resource", (MIG, None, 1), [], "h100-hgx-0", "unresolvable",
     NOT_HERE.format("nvidia.com/mig-1g.5gb", "nvidia.com/gpu")),
    ("renamed/gpu", (GPU4, "nvidia.com/gpu", 1), [], "t4-timeslice-renamed-0", "unresolvable",
     NOT_HERE.format("nvidia.com/gpu", "nvidia.com/gpu.shared")),
    ("timeslice/shared", (GPU4, "nvidia.com/gpu.shared", 1), [], "t4-timeslice-0", "unresolvable",
     NOT_HERE.format("nvidia.com/gpu.shared", "nvidia.com/gpu")),
    # more asked than allocatable, whatever runs there
    ("degraded/8-of-5", (GPU8, None, 8), [], "h100-degraded-0", "unresolvable",
     "3 of 8 GPUs missing (allocatable 5 < nvidia.com/gpu.count 8); 8 x nvidia.com/gpu asked, 5 allocatable"),
    ("mixed/9-of-8", (MIG, "nvidia.com/mig-2g.10gb", 9), [], "a100-mig-mixed-0", "unresolvable",
     "9 x nvidia.com/mig-2g.10gb asked, 8 allocatable"),
    ("renamed/17-of-16", (GPU4, "nvidia.com/gpu.shared", 17), [], "t4-timeslice-renamed-0", "unresolvable",
     "17 x nvidia.com/gpu.shared asked, 16 allocatable"),
    # allocatable minus what bound pods use falls short (preemption could help: FailedNodes)
    ("hgx/6-held", (GPU4, None, 4), held("h100-hgx-0", "nvidia.com/gpu", 6), "h100-hgx-0", "failed",
     "4 whole GPUs asked, 2 of 8 free"),
    ("hgx/8-held", (GPU4, "nvidia.com/gpu", 1), held("h100-hgx-0", "nvidia.com/gpu", 8), "h100-hgx-0", "failed",
     "1 whole GPUs asked, 0 of 8 free"),
    ("degraded/2-held", (GPU4, None, 4), held("h100-degraded-0", "nvidia.com/gpu", 2), "h100-degraded-0", "failed",
     "4 whole GPUs asked, 3 of 5 free"),
    ("degraded/5-held", (GPU4, "nvidia.com/gpu", 1), held("h100-degraded-0", "nvidia.com/gpu", 1, 5), "h100-degraded-0",
     "failed", "1 whole GPUs asked, 0 of 5 free"),
    ("mixed/1g-full", (MIG, None, 1), held("a100-mig-mixed-0", "nvidia.com/mig-1g.5gb", 1, 16), "a100-mig-mixed-0",
     "failed", "mig-1g.5gb: 0 of 16 free"),
    ("mixed/2g-full", (MIG, "nvidia.com/mig-2g.10gb", 1), held("a100-mig-mixed-0", "nvidia.com/mig-2g.10gb", 1, 8),
     "a100-mig-mixed-0", "failed", "mig-2g.10gb: 0 of 8 free"),
    ("single/full", (GPU4, "nvidia.com/gpu", 1), held("a100-mig-single-0", "nvidia.com/gpu", 1, 56),
     "a100-mig-single-0", "failed", "mig-1g.5gb: 0 of 56 free"),
    ("timeslice/full", (GPU4, "nvidia.com/gpu", 1), held("t4-timeslice-0", "nvidia.com/gpu", 1, 16), "t4-timeslice-0",
     "failed", "shared:time-slicing:4: 0 of 16 free"),
    ("renamed/full", (GPU4, "nvidia.com/gpu.shared", 1), held("t4-timeslice-renamed-0", "nvidia.com/gpu.shared", 1, 16),
     "t4-timeslice-renamed-0", "failed", "shared:time-slicing:4: 0 of 16 free"),
    ("mps/full", (GPU4, "nvidia.com/gpu", 1), held("v100-mps-0", "nvidia.com/gpu", 1, 10), "v100-mps-0", "failed",
     "shared:mps:10: 0 of 10 free"),
    # several units in one container: replicas or MIG instances where the name only ever sells those ...
    ("renamed/2-replicas", (GPU4, "nvidia.com/gpu.shared", 2), [], "t4-timeslice-renamed-0", "pass", ""),
    ("renamed/16-replicas", (GPU4, "nvidia.com/gpu.shared", 16), [], "t4-timeslice-renamed-0", "pass", ""),
    ("renamed/2-of-1-left", (GPU4, "nvidia.com/gpu.shared", 2),
     held("t4-timeslice-renamed-0", "nvidia.com/gpu.shared", 1, 15), "t4-timeslice-renamed-0", "failed",
     "shared:time-slicing:4: 1 of 16 free"),
    ("mixed/2-instances", (MIG, "nvidia.com/mig-1g.5gb", 2), [], "a100-mig-mixed-0", "pass", ""),
    ("mixed/8-3g-instances", (MIG, "nvidia.com/mig-3g.20gb", 8), [], "a100-mig-mixed-0", "pass", ""),
    ("mixed/2-of-1-left", (MIG, "nvidia.com/mig-1g.5gb", 2), held("a100-mig-mixed-0", "nvidia.com/mig-1g.5gb", 1, 15),
     "a100-mig-mixed-0", "failed", "mig-1g.5gb: 1 of 16 free"),
    # ... but nvidia.com/gpu: N still means N GPUs, which a node selling slices under that name cannot give
    ("timeslice/gpu-2", (GPU4, "nvidia.com/gpu", 2), [], "t4-timeslice-0", "unresolvable",
     "node sells nvidia.com/gpu as shared:time-slicing:4: 2 units would be 2 slices or replicas, not 2 GPUs"),
    ("single/gpu-2", (GPU4, "nvidia.com/gpu", 2), [], "a100-mig-single-0", "unresolvable",
     "node sells nvidia.com/gpu as mig-1g.5gb: 2 units would be 2 slices or replicas, not 2 GPUs"),
    ("mps/gpu-2", (GPU4, "nvidia.com/gpu", 2), [], "v100-mps-0", "unresolvable",
     "node sells nvidia.com/gpu as shared:mps:10: 2 units would be 2 slices or replicas, not 2 GPUs"),
    # and the last unit left still passes
    ("mixed/3g-one-left", (MIG, "nvidia.com/mig-3g.20gb", 1), held("a100-mig-mixed-0", "nvidia.com/mig-3g.20gb", 1, 7),
     "a100-mig-mixed-0", "pass", ""),
    ("renamed/one-left", (GPU4, "nvidia.com/gpu.shared", 1),
     held("t4-timeslice-renamed-0", "nvidia.com/gpu.shared", 1, 15), "t4-timeslice-renamed-0", "pass", ""),
    ("degraded/4-of-5-free", (GPU4, None, 4), held("h100-degraded-0", "nvidia.com/gpu", 1), "h100-degraded-0",
     "pass", ""),
]


@pytest.mark.parametrize(("the_ask", "pods", "node", "want", "reason"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_filter_verdict_and_reason(the_ask: tuple[str, str | None, int], pods: list[dict[str, Any]], node: str,
                                   want: str, reason: str) -> None:
    fixture, resource, units = the_ask
    out = verbs.filter_nodes(cluster(pods), ask(fixture, resource, units))
    assert out["Error"] == ""
    assert verdict(out, node) == (want, reason)


# Every ask against every node, on an empty cluster and on a busy one: a node passes only if its
# allocatable minus the bound pods' requests (read from the raw objects here, not by the extender)
# covers the ask, which is what NodeResourcesFit would have checked.
ASKS = [(GPU4, None, 4), (GPU8, None, 8), (GPU4, "nvidia.com/gpu", 1), (GPU4, "nvidia.com/gpu", 2),
        (MIG, None, 1), (MIG, "nvidia.com/mig-2g.10gb", 1), (MIG, "nvidia.com/mig-3g.20gb", 1),
        (MIG, "nvidia.com/mig-1g.10gb", 1), (MIG, "nvidia.com/mig-7g.80gb", 1),
        (GPU4, "nvidia.com/gpu.shared", 1), (GPU4, "nvidia.com/gpu.shared", 2), (MIG, "nvidia.com/mig-1g.5gb", 2),
        (MIG, "nvidia.com/mig-2g.10gb", 2)]
BUSY = [*held("h100-hgx-0", "nvidia.com/gpu", 6), *held("h100-degraded-0", "nvidia.com/gpu", 2, 2),
        *held("a100-mig-mixed-0", "nvidia.com/mig-1g.5gb", 1, 16),
        *held("a100-mig-mixed-0", "nvidia.com/mig-2g.10gb", 1, 7),
        *held("a100-mig-single-0", "nvidia.com/gpu", 1, 55), *held("t4-timeslice-0", "nvidia.com/gpu", 1, 16),
        *held("t4-timeslice-renamed-0", "nvidia.com/gpu.shared", 1, 15), *held("v100-mps-0", "nvidia.com/gpu", 1, 10)]


def _free(node: str, resource: str, pods: list[dict[str, Any]]) -> int:
    allocatable = node_fixture(node)["status"].get("allocatable") or {}
    free = parse_count(str(allocatable.get(resource, "0")))
    for pod in pods:
        if pod["spec"].get("nodeName") == node:
            free -= sum(parse_count(str(c["resources"].get("requests", {}).get(resource, "0")))
                        for c in pod["spec"]["containers"])
    return free


@pytest.mark.parametrize("pods", [[], BUSY], ids=["empty", "busy"])
@pytest.mark.parametrize("the_ask", ASKS, ids=[f"{u}x{r or f.removeprefix('filter-nodecache-true-pod-')}"
                                               for f, r, u in ASKS])
def test_no_node_passes_without_enough_of_the_resource(the_ask: tuple[str, str | None, int],
                                                      pods: list[dict[str, Any]]) -> None:
    fixture, resource, units = the_ask
    body = ask(fixture, resource, units)
    wanted = resource or next(k for k in body["Pod"]["spec"]["containers"][0]["resources"]["requests"]
                              if k.startswith("nvidia.com/"))
    out = verbs.filter_nodes(cluster(pods), body)
    assert sorted([*out["NodeNames"], *out["FailedNodes"], *out["FailedAndUnresolvableNodes"]]) == NODE_NAMES
    for node in out["NodeNames"]:
        assert _free(node, wanted, pods) >= units, f"{node} passed {units} x {wanted}"
    for node in NODE_NAMES:
        if _free(node, wanted, pods) < units:
            kind, reason = verdict(out, node)
            assert kind != "pass" and reason.strip(), f"{node}: no reason for {units} x {wanted}"
