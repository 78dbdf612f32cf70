"""Real GPU nodes without GPUs (``tests/e2e/realnode.py``): a kubelet of the control plane's release on containerd,
NVIDIA's device plugin and gpu-feature-discovery on NVIDIA's mock NVML. Pods go through gpu-tailor's webhook and
gpu-tailor-scheduler to a node whose kubelet really admits them and whose device plugin really picks their GPUs.

For every pod placed: it runs (the kubelet refused none), and the GPUs the kubelet allocated (its PodResources API,
read by the node agent) are the GPUs bind recorded, or among the set it recorded where the device plugin picks
among equals (``gpu-tailor.io/gpus-among``). Without the agent, the extender's picture of the node never names as
free a GPU the node has given away (``NodeGpus.surely_free``); with it, every prediction the agent's report
contradicts is counted (``gpu_tailor_agent_contradictions_total``) and none is.
"""

from __future__ import annotations

import functools
import re
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field

import pytest

from gpu_tailor.extender.cache import Cache
from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.occupancy import parse_gpu_annotation
from gpu_tailor.tools.explain import explain, table
from gpu_tailor.tools.source import Cluster, read_live
from gpu_tailor.webhook.config import AdmissionPolicy
from tests.e2e import realnode
from tests.e2e.cluster import OPTED_IN, Release
from tests.e2e.kube import Kube, Obj, api_path, wait_for
from tests.e2e.pods import unique
from tests.e2e.realnode import MockGpus, RealNode, mock_profile, real_node, real_pod
from tests.e2e.services import Stack, control_plane_with_gpu_tailor, install
from tests.gpumodel.dra_slices import device_classes

pytestmark = pytest.mark.e2e

MANAGED = {"key": labels.MANAGED_TAINT_KEY, "effect": "NoSchedule"}  # one scheduler per GPU node (docs/admin.md)
HGX, T4 = "hgx-0", "t4-0"


@dataclass
class Real:
    stack: Stack
    nodes: dict[str, RealNode]
    agents: bool = False
    seen: list[str] = field(default_factory=list)  # one line per pod placed: what was recorded, what was given

    @property
    def kube(self) -> Kube:
        return self.stack.kube


@pytest.fixture(scope="module")
def real(release: Release, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Real]:
    """A control plane with gpu-tailor and two real GPU nodes: an 8x H100 HGX board selling whole GPUs, and four
    T4s time-sliced four ways (the device plugin's default replica policy, distributed); both tainted for
    gpu-tailor-scheduler alone."""
    lacking = realnode.missing(release)
    if lacking:
        pytest.skip(f"no real GPU node on this machine: it lacks {'; '.join(lacking)}")
    work = tmp_path_factory.mktemp(f"real-{release.version}")
    installer = functools.partial(install, nodes=False, agent=realnode.agent_patch)
    with control_plane_with_gpu_tailor(release, work, installer, admission_probe=False) as stack, ExitStack() as up:
        hgx = up.enter_context(real_node(HGX, stack.cp, stack.kube, release, work / "nodes", taints=[MANAGED]))
        hgx.start_nvidia(MockGpus(mock_profile("h100")))
        t4 = up.enter_context(real_node(T4, stack.cp, stack.kube, release, work / "nodes", taints=[MANAGED]))
        t4.start_nvidia(MockGpus(mock_profile("t4"), replicas=4))
        stack.wait_admission_works()
        yield Real(stack, {HGX: hgx, T4: t4})


def running(real: Real, name: str) -> Obj:
    return realnode.running(real.kube, OPTED_IN, name, context=lambda: context(real))


def context(real: Real) -> str:
    return real.stack.context() + "\n" + "\n".join(n.context() for n in real.nodes.values())


def delete(real: Real, names: list[str]) -> None:
    """Deleted gracefully: the kubelet stops the containers and frees their devices before the pod is gone."""
    for n in names:
        real.kube.delete(api_path("pods", OPTED_IN, n), grace_seconds=2)
    wait_for(lambda: not any(real.kube.exists(api_path("pods", OPTED_IN, n)) for n in names), 90,
             f"pods {names} gone", interval=0.2, context=lambda: context(real))


def picture(real: Real) -> Cache:
    """The extender's picture of the cluster as explain builds it from the live API (the node agents' reports
    included where they run)."""
    cluster = read_live(str(real.stack.cp.kubeconfig))
    cache = Cache(report_stale=None)
    if real.agents:
        cache.reset_reports(cluster.reports)
    cache.reset_pods(cluster.pods)
    cache.reset_nodes(cluster.nodes)
    return cache


def explain_table(pod: Obj, cluster: Cluster) -> str:
    return table(explain(pod, f"pod {pod['metadata']['name']}", cluster, AdmissionPolicy()))


def metrics(real: Real) -> str:
    """The extender's /metrics."""
    with urllib.request.urlopen(real.stack.extender_probes + "/metrics", timeout=10) as resp:
        return str(resp.read().decode())


def contradictions(real: Real) -> float:
    return realnode.sample(metrics(real), "gpu_tailor_agent_contradictions_total") or 0.0


def place(real: Real, node: str, limits: dict[str, str], product: str, topology: str | None = None,
          pin: bool = False) -> str:
    """Create one pod (``pin``: to ``node``), wait until it runs, and check its record against what the kubelet gave
    it."""
    name = unique(f"{node.split('-')[0]}-{next(iter(limits.values()))}")
    real.kube.create(api_path("pods", OPTED_IN), real_pod(name, limits, product, topology, node if pin else None))
    pod = running(real, name)
    assert pod["spec"]["nodeName"] == node, f"{name} went to {pod['spec']['nodeName']}, not {node}"
    check(real, node, [pod])
    return name


def check(real: Real, node: str, pods: list[Obj]) -> None:
    """Each pod's allocated GPUs are its recorded ones, or within the recorded set; the extender's picture names as
    free no GPU the node gave away; with agents, the report settles each pod on what it holds, contradicting none."""
    pods = realnode.recorded(real.kube, pods, functools.partial(metrics, real), context=lambda: context(real))
    given = real.nodes[node].allocated()
    real.seen.extend(realnode.given_as_recorded(pod, given) for pod in pods)
    held = {g for gpus in given.values() for g in gpus}
    if real.agents:
        wait_for(lambda: _reported(real, node, given), 30, f"{node}'s report naming what its pods hold",
                 interval=0.5, context=lambda: context(real))
        wait_applied(real, node)
    state = picture(real).nodes[node].gpus
    if node != T4:  # whole GPUs: a GPU given away must not be named free
        wrongly_free = held & set(state.surely_free())
        assert not wrongly_free, f"the extender's picture names GPUs {wrongly_free} free, the node gave them away"
    if real.agents:
        for key, gpus in given.items():
            placed = state.placements.get(key)
            assert placed is not None and tuple(sorted(placed.gpus)) == gpus, f"{key}: the picture says {placed}"
    assert contradictions(real) == 0


def wait_applied(real: Real, node: str) -> None:
    realnode.wait_report_held(real.kube, node, lambda: metrics(real), context=lambda: context(real))


def _reported(real: Real, node: str, given: dict[str, tuple[int, ...]]) -> bool:
    report = real.kube.get(api_path("nodegpureports", name=node, group="gpu-tailor.io/v1alpha1"))
    return realnode.held_by_pod(report) == given


def whole_gpu_rounds(real: Real) -> None:
    """1, 2, 1 and 4 GPUs (the board full), two deleted, 2 GPUs on NVLink and 1 into the holes; then from empty: 8,
    and 2, 2, 4."""
    def ask(limits: dict[str, str], topology: str | None = None) -> str:
        return place(real, HGX, limits, "H100", topology)

    first = [ask({labels.GPU_MILLI: str(1000 * n)}) for n in (1, 2, 1, 4)]
    delete(real, first[1:3])
    rest = [ask({labels.GPU_MILLI: "2000"}, topology="nvlink"), ask({labels.GPU_MILLI: "1000"})]
    delete(real, [first[0], first[3], *rest])
    delete(real, [ask({labels.GPU_MILLI: "8000"})])
    delete(real, [ask({labels.GPU_MILLI: str(1000 * n)}) for n in (2, 2, 4)])
    # an empty board: no pick is left unsure, every GPU is named free again
    assert picture(real).nodes[HGX].gpus.surely_free() == list(range(8))


def quarter_burst(real: Real, count: int = 12) -> None:
    """``count`` quarter-GPU pods created at once onto the time-sliced T4s, then checked together."""
    names = [unique("t4-quarter") for _ in range(count)]
    for n in names:
        real.kube.create(api_path("pods", OPTED_IN), real_pod(n, {labels.GPU_MILLI: "250"}, "T4"))
    pods = [running(real, n) for n in names]
    assert {p["spec"]["nodeName"] for p in pods} == {T4}
    check(real, T4, pods)
    delete(real, names)


def test_whole_gpus_and_replicas_without_the_agent(real: Real) -> None:
    """No node agent: every record holds what the node gave (exactly, or within the recorded set)."""
    real.agents = False
    whole_gpu_rounds(real)
    quarter_burst(real)
    print("\n".join(["", "without the agent:", *real.seen]))


def test_whole_gpus_and_replicas_with_the_agent(real: Real) -> None:
    """The node agent on both nodes, as its DaemonSet runs it from gpu-tailor's image, with the identity the kubelet
    gives its pod: the reports settle every pod on the GPUs it holds, and no prediction is contradicted."""
    for node in real.nodes.values():
        node.start_agent()
    real.agents = True
    real.seen.clear()
    whole_gpu_rounds(real)
    quarter_burst(real)
    print("\n".join(["", "with the agent:", *real.seen]))


def test_a_mig_node_sells_the_gpus_not_in_mig_mode_whole(real: Real, release: Release) -> None:
    """An H100 board with GPUs 0-3 in MIG mode and no instance cut (mig-manager between layouts; the mock lists no
    MIG device), the rest sold whole by the device plugin's mixed strategy. The node sells 4 of the 8 GPUs GFD
    counts; the agent's report says which, and whole-GPU pods go to GPUs 4-7, recorded there."""
    mig = {"mig": {"mode_current": "enabled", "mode_pending": "enabled", "max_gpu_instances": 7}}
    name = "mig-0"
    agents = real.agents
    with real_node(name, real.stack.cp, real.kube, release, real.nodes[HGX].home.parent, taints=[MANAGED]) as node:
        try:
            node.start_nvidia(MockGpus(mock_profile("h100"), mig_strategy="mixed",
                                       overrides={i: mig for i in range(4)}))
            assert node.gfd_labels["nvidia.com/mig.strategy"] == "mixed"
            node.start_agent()
            real.nodes[name], real.agents = node, True
            report = api_path("nodegpureports", name=name, group="gpu-tailor.io/v1alpha1")
            wait_for(lambda: [g.get("healthy") for g in real.kube.get(report)["spec"].get("gpus") or []] ==
                     [False] * 4 + [True] * 4, 60, "the agent to report GPUs 0-3 unsold", interval=0.5)
            placed = [place(real, name, {labels.GPU_MILLI: str(1000 * n)}, "H100", pin=True) for n in (1, 2, 1)]
            given = node.allocated()
            assert sorted(g for p in placed for g in given[f"{OPTED_IN}/{p}"]) == [4, 5, 6, 7]
            delete(real, placed)
        finally:
            real.nodes.pop(name, None)
            real.agents = agents
    real.kube.delete(api_path("nodes", name=name))  # its kubelet has stopped: nothing registers it again


def test_a_gpu_pod_no_one_sent_to_gpu_tailor_waits_with_the_reason(real: Real) -> None:
    """In a namespace not opted in, a native GPU ask goes to default-scheduler, which the GPU nodes' taint keeps
    off them: it stays Pending with kube-scheduler's reason, and neither real node runs it."""
    name = unique("plain")
    pod = real_pod(name, {"nvidia.com/gpu": "1"}, "H100")
    real.kube.create(api_path("pods", real.stack.plain), pod)
    try:
        def reason() -> str:
            got = real.kube.get(api_path("pods", real.stack.plain, name))
            assert not got["spec"].get("nodeName"), f"{name} was bound to {got['spec'].get('nodeName')}"
            cond = [c for c in (got.get("status") or {}).get("conditions") or [] if c["type"] == "PodScheduled"]
            return str(cond[0].get("message") or "") if cond and cond[0].get("reason") == "Unschedulable" else ""

        message = wait_for(reason, 60, f"{name} Unschedulable", interval=0.5)
        assert "untolerated taint" in message, message
    finally:
        real.kube.delete(api_path("pods", real.stack.plain, name), grace_seconds=0)


def test_a_lost_gpu_is_no_longer_placed_on_and_explain_names_it(real: Real) -> None:
    """GPU 7 of the HGX board is lost (the mock NVML's failure injection). NVIDIA's device plugin, whose health check
    learns of a loss only from an Xid event, still sells 8 (the mock's Xid never reached the plugin's health check
    here, nor after a restart of it). Within a minute the node agent reports the GPU lost, explain names it, an
    8-GPU pod is refused with the reason, and a 7-GPU pod runs, recorded on GPUs 0-6 picked among all 8: the plugin
    may hand it the lost GPU. Once the GPU is back, an 8-GPU pod runs."""
    if not real.agents:  # run alone: the agent is what tells which GPU is gone
        for n in real.nodes.values():
            n.start_agent()
        real.agents = True
    node = real.nodes[HGX]
    report = api_path("nodegpureports", name=HGX, group="gpu-tailor.io/v1alpha1")

    def healthy() -> list[bool]:
        return [bool(g.get("healthy")) for g in real.kube.get(report)["spec"].get("gpus") or []]

    def selling(count: int) -> bool:
        return bool(realnode.node_status(real.kube, HGX)["allocatable"].get("nvidia.com/gpu") == str(count))

    node.inject({7: {"failure": {"mode": "lost"}}})
    try:
        wait_for(lambda: healthy() == [True] * 7 + [False], 60, "the agent to report GPU 7 lost", interval=0.5,
                 context=lambda: context(real))
        assert selling(8)  # the plugin had no Xid: it still sells GPU 7

        def told() -> str:
            probe = real_pod("probe", {labels.GPU_MILLI: "1000"}, "H100")
            probe["metadata"]["namespace"] = OPTED_IN
            said = explain_table(probe, read_live(str(real.stack.cp.kubeconfig)))
            return said if "GPU 7 not sold or lost (the node agent's report)" in said else ""

        wait_for(told, 60, "explain to name GPU 7", interval=1)
        name = unique("hgx-8000")
        real.kube.create(api_path("pods", OPTED_IN), real_pod(name, {labels.GPU_MILLI: "8000"}, "H100"))

        def said_why() -> str:
            events = real.kube.events(OPTED_IN, "Pod", name)
            said = [str(e.get("message")) for e in events if e.get("reason") == "FailedScheduling"]
            assert not real.kube.get(api_path("pods", OPTED_IN, name))["spec"].get("nodeName"), f"{name} was bound"
            return next((m for m in said if "7 of 7 free" in m), "")

        wait_for(said_why, 60, f"{name} refused for GPU 7", interval=0.5, context=lambda: context(real))
        # kube-scheduler retries an unschedulable pod on a cluster event or after 5 minutes; a report is no event to it
        real.kube.delete(api_path("pods", OPTED_IN, name), grace_seconds=0)
        # the plugin may hand out GPU 7: the record says so (its GPU no NVML call can name any more), or -- where the
        # agent's report of the running pod reached the extender before the record was written after the bind -- the
        # record is what the pod holds
        seven = unique("hgx-7000")
        real.kube.create(api_path("pods", OPTED_IN), real_pod(seven, {labels.GPU_MILLI: "7000"}, "H100"))
        notes = realnode.recorded(real.kube, [running(real, seven)], functools.partial(metrics, real),
                                  context=lambda: context(real))[0]["metadata"]["annotations"]
        key = f"{OPTED_IN}/{seven}"
        # the agent still reports the pod on all 7 GPUs it holds (a lost GPU's UUID remembered), within the set
        wait_for(lambda: len(realnode.held_by_pod(real.kube.get(report)).get(key, ())) == 7, 60,
                 f"{HGX}'s report naming the 7 GPUs {seven} holds", interval=0.5, context=lambda: context(real))
        given = tuple(sorted(realnode.held_by_pod(real.kube.get(report))[key]))
        gpus, among = (parse_gpu_annotation(notes.get(k, "")) for k in (labels.ANN_GPUS, labels.ANN_GPUS_AMONG))
        assert (gpus, among) in ((tuple(range(7)), tuple(range(8))), (given, None)), (notes, given)
        wait_applied(real, HGX)
        assert contradictions(real) == 0
        delete(real, [seven])
    finally:
        node.inject({})
    wait_for(lambda: healthy() == [True] * 8, 60, "the agent to report GPU 7 back", interval=0.5)
    delete(real, [place(real, HGX, {labels.GPU_MILLI: "8000"}, "H100")])


def test_nvidias_dra_driver_publishes_what_gpu_tailor_places_on(real: Real, release: Release) -> None:
    """On 1.34 and later, a third node runs NVIDIA's DRA driver (its kubelet plugin on the mock NVML) instead of the
    device plugin. With the device-plugin nodes cordoned, portable asks become claims on the slices the driver
    published; kube-scheduler allocates them, the kubelet has the driver prepare them, the pods run, and each
    allocated device is the one explain said the allocator would pick."""
    if release.minor < 34:
        pytest.skip(f"{release.version} serves no resource.k8s.io/v1 (DRA is GA from 1.34)")
    driver = realnode.nvidia_home() / "bin" / realnode.DRA_DRIVER
    if not driver.exists():
        pytest.skip(f"no NVIDIA DRA driver here: {driver} is absent")
    kube, group = real.kube, "resource.k8s.io/v1"
    made = []
    with real_node("dra-0", real.stack.cp, kube, release, real.nodes[HGX].home.parent, taints=[MANAGED]) as node:
        try:
            node.start_dra_driver(MockGpus(mock_profile("h100")), real.stack.cp.kubeconfig)
            for cls in device_classes():
                made.append(api_path("deviceclasses", name=cls["metadata"]["name"], group=group))
                kube.create(api_path("deviceclasses", group=group), cls)
            for n in (HGX, T4):
                kube.patch(api_path("nodes", name=n), {"spec": {"unschedulable": True}})

            def routed_to_dra() -> bool:
                probe = kube.create(api_path("pods", OPTED_IN), real_pod("probe", {labels.GPU_MILLI: "1000"}, "H100"),
                                    dry_run=True)
                return bool(probe["spec"].get("resourceClaims"))

            wait_for(routed_to_dra, 60, "the webhook to send a whole-H100 ask to the DRA node", interval=0.5)
            published = {d["name"] for sl in kube.list(api_path("resourceslices", group=group))
                         if sl["spec"].get("nodeName") == "dra-0" for d in sl["spec"]["devices"]}
            assert published == {f"gpu-{i}" for i in range(8)}, published
            for _ in range(3):
                name = unique("dra-1000")
                ask = real_pod(name, {labels.GPU_MILLI: "1000"}, "H100")
                said = explain(dict(ask, metadata={**ask["metadata"], "namespace": OPTED_IN}), f"pod {name}",
                               read_live(str(real.stack.cp.kubeconfig)), AdmissionPolicy())
                predicted = re.search(r"-> device (\S+)", {v.node: v.detail for v in said.nodes}["dra-0"])
                kube.create(api_path("pods", OPTED_IN), ask)
                pod = running(real, name)
                assert pod["spec"]["nodeName"] == "dra-0"
                (claim,) = [c for c in kube.list(api_path("resourceclaims", OPTED_IN, group=group))
                            if any(o.get("name") == name for o in c["metadata"].get("ownerReferences") or [])]
                (result,) = claim["status"]["allocation"]["devices"]["results"]
                assert result["pool"] == "dra-0" and result["device"] in published
                assert predicted is not None and predicted.group(1) == result["device"], (predicted, result)
                real.seen.append(f"{OPTED_IN}/{name}: explain predicted {predicted.group(1)}, allocated "
                                 f"{result['device']}")
        finally:
            for n in (HGX, T4):
                kube.patch(api_path("nodes", name=n), {"spec": {"unschedulable": None}})
            for pod in kube.list(api_path("pods", OPTED_IN)):
                if pod["spec"].get("nodeName") == "dra-0":
                    kube.delete(api_path("pods", OPTED_IN, pod["metadata"]["name"]), grace_seconds=2)
            wait_for(lambda: not [p for p in kube.list(api_path("pods", OPTED_IN))
                                  if p["spec"].get("nodeName") == "dra-0"], 90, "the DRA node's pods gone",
                     interval=0.5)
            for path in made:
                kube.delete(path)
    kube.delete(api_path("nodes", name="dra-0"))  # its kubelet has stopped: nothing registers it again
    for sl in kube.list(api_path("resourceslices", group=group)):
        if sl["spec"].get("nodeName") == "dra-0":  # collected with the Node; deleted here so no later test waits on it
            kube.delete(api_path("resourceslices", name=sl["metadata"]["name"], group=group))
    print("\n".join(["", "NVIDIA's DRA driver:", *real.seen[-3:]]))


def _pool_gpus(real: Real) -> dict[str, float]:
    text = metrics(real)
    return {m.group(1): float(m.group(2)) for m in re.finditer(r'^gpu_tailor_pool_gpus\{([^}]*)\} (\S+)$', text, re.M)}


def test_a_drained_and_removed_node_leaves_nothing_behind(real: Real) -> None:
    """Last in this module: the HGX node is cordoned, its pods evicted (``kubectl drain``), its kubelet stopped and its
    Node deleted. Its report goes with it (owned by the Node), the extender forgets its GPUs, and no record of its
    pods is left anywhere."""
    names = [place(real, HGX, {labels.GPU_MILLI: str(1000 * n)}, "H100") for n in (2, 1)]
    assert any('model="H100"' in k and v > 0 for k, v in _pool_gpus(real).items()), _pool_gpus(real)
    real.kube.patch(api_path("nodes", name=HGX), {"spec": {"unschedulable": True}})
    for n in names:
        real.kube.create(api_path("pods", OPTED_IN, n, subresource="eviction"), {
            "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": n, "namespace": OPTED_IN}})
    wait_for(lambda: not any(real.kube.exists(api_path("pods", OPTED_IN, n)) for n in names), 90,
             "the evicted pods gone", interval=0.2, context=lambda: context(real))
    assert real.nodes[HGX].allocated() == {}
    node = real.nodes[HGX]
    node.stop("kubelet")  # the agent's DaemonSet pod goes with the Node (its pods are collected)
    real.kube.delete(api_path("nodes", name=HGX))
    report = api_path("nodegpureports", name=HGX, group="gpu-tailor.io/v1alpha1")
    wait_for(lambda: not real.kube.exists(report), 60, f"{HGX}'s NodeGPUReport collected with its Node",
             interval=0.5)
    wait_for(lambda: not any('model="H100"' in k and v > 0 for k, v in _pool_gpus(real).items()), 30,
             "the extender to forget the H100 pool", interval=0.5)
    assert HGX not in picture(real).nodes
    left = [p["metadata"]["name"] for p in real.kube.list(api_path("pods", OPTED_IN))
            if labels.ANN_GPUS in (p["metadata"].get("annotations") or {})]
    assert not left, f"pods with bind's record left: {left}"
