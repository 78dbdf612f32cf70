"""The node agent end to end, in process: a stand-in kubelet speaking the PodResources gRPC protocol on a unix
socket, NVML's answers for the board, the report the agent builds, and what the extender's cache and
``explain`` make of it."""

from __future__ import annotations

import copy
import datetime as dt
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpu_tailor.agent import collect, nvml, podresources
from gpu_tailor.agent.__main__ import Agent
from gpu_tailor.extender.cache import Cache
from gpu_tailor.extender.pools import AgentMetrics
from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.report import NodeReport, ReportedGpu, parse
from gpu_tailor.tools.explain import explain, table
from gpu_tailor.tools.source import Cluster
from gpu_tailor.webhook.config import AdmissionPolicy
from tests.agent.kubelet import Held, Kubelet, serving
from tests.agent.nvml_answers import FakeNvml, hgx, pcie
from tests.conftest import node_fixture
from tests.tools.builders import NODES, pod, review_pod

T4 = "t4-timeslice-0"  # 4 T4s time-sliced 4 ways, selling nvidia.com/gpu
HGX = "h100-hgx-0"


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="gt-") as d:  # a unix socket path has room for 107 bytes
        yield Path(d)


def replica(gpu_uuid: str, n: int) -> str:
    """A time-sliced replica's device id, as NVIDIA's device plugin names it (uuid strategy)."""
    return f"{gpu_uuid}::{n}"


async def test_the_kubelets_answers_over_grpc(socket_dir: Path) -> None:
    t4 = pcie()
    kubelet = Kubelet([Held("team-a", "p", "main", "nvidia.com/gpu", [replica(t4[2].uuid, 0)]),
                       Held("team-a", "p", "side", "example.com/fpga", ["fpga0"])],
                      {"nvidia.com/gpu": [replica(g.uuid, n) for g in t4 for n in range(4)]})
    async with serving(kubelet, socket_dir) as path:
        client = podresources.Client(path)
        try:
            held = await client.assigned()
            offered = await client.allocatable()
        finally:
            await client.close()
    assert kubelet.calls == ["List", "GetAllocatableResources"]
    assert held == [podresources.Devices("nvidia.com/gpu", (replica(t4[2].uuid, 0),), "team-a", "p", "main"),
                    podresources.Devices("example.com/fpga", ("fpga0",), "team-a", "p", "side")]
    assert [(d.resource, len(d.ids)) for d in offered] == [("nvidia.com/gpu", 16)]


async def test_no_kubelet_is_an_error_that_says_where(socket_dir: Path) -> None:
    client = podresources.Client(str(socket_dir / "none.sock"), timeout=2)
    with pytest.raises(podresources.PodResourcesError, match=r"List on .*none.sock: UNAVAILABLE"):
        await client.assigned()
    await client.close()


def test_device_ids_of_every_strategy_find_their_gpu() -> None:
    by_uuid = {"GPU-aaa": 0, "GPU-bbb": 1, "MIG-ccc": 1}
    assert [collect.gpu_index(i, by_uuid) for i in ("GPU-bbb", "GPU-aaa::3", "MIG-ccc", "2", "3:1", "1::0",
                                                    "GPU-zzz", "MIG-zzz", "x:1")] == [1, 0, 1, 2, 3, 1, None, None,
                                                                                    None]


def the_cluster(reports: list[dict[str, Any]]) -> Cluster:
    """The fixture nodes; on the T4 node three one-replica pods bound by the extender to GPU 0 (two) and GPU 1."""
    held = [pod(n, {"nvidia.com/gpu": "1"}, node=T4, annotations={labels.ANN_GPUS: str(g)})
            for n, g in (("r0", 0), ("r1", 0), ("r2", 1))]
    return Cluster([copy.deepcopy(node_fixture(n)) for n in NODES], held, None, "the fixture nodes", reports=reports)


async def report_of(kubelet: Kubelet, boards: FakeNvml, node: str, socket_dir: Path) -> dict[str, Any]:
    async with serving(kubelet, socket_dir) as path:
        client = podresources.Client(path)
        try:
            report = await Agent(node, client, boards).look()
        finally:
            await client.close()
    return report.object()


async def test_what_the_node_did_wins_over_the_prediction(socket_dir: Path) -> None:
    """The device plugin put the three replicas on GPUs 3, 3 and 2 (not 0, 0 and 1 as bind recorded): the
    extender's cache and explain show the reported GPUs."""
    t4 = pcie()
    kubelet = Kubelet([Held("team-a", "r0", "main", "nvidia.com/gpu", [replica(t4[3].uuid, 0)]),
                       Held("team-a", "r1", "main", "nvidia.com/gpu", [replica(t4[3].uuid, 1)]),
                       Held("team-a", "r2", "main", "nvidia.com/gpu", [replica(t4[2].uuid, 0)])],
                      {"nvidia.com/gpu": [replica(g.uuid, n) for g in t4 for n in range(4)]})
    obj = await report_of(kubelet, FakeNvml(t4), T4, socket_dir)
    assert obj["spec"]["pods"] == [
        {"namespace": "team-a", "name": n, "container": "main", "resource": "nvidia.com/gpu", "gpus": [g]}
        for n, g in (("r0", 3), ("r1", 3), ("r2", 2))]
    assert [g["healthy"] for g in obj["spec"]["gpus"]] == [True] * 4

    before = explain(review_pod("d"), "pod", the_cluster([]), AdmissionPolicy())  # a quarter GPU: one replica
    assert (before.chosen, before.gpus, before.maybe) == (T4, [2], [2, 3])  # GPUs 2 and 3 hold none, predicted
    after = explain(review_pod("d"), "pod", the_cluster([obj]), AdmissionPolicy())
    assert (after.chosen, after.gpus, after.maybe) == (T4, [0], [0, 1])  # GPUs 0 and 1 really hold none
    assert f"would bind to {T4}, GPU 0 or 1 (the device plugin picks)" in table(after)

    cache = Cache()
    cache.reset_pods(the_cluster([]).pods)
    cache.reset_nodes(the_cluster([]).nodes)
    cache.apply_report("ADDED", obj)  # as the watch delivers it, after the nodes and pods
    state = cache.snapshot().nodes[T4].state
    assert [s.replicas_used for s in state.gpus.slots] == [0, 0, 1, 2]
    # read back from bind's annotations, as after a restart: the sets they were picked from are not known here,
    # so they count as no contradiction
    assert cache.contradictions == 0
    cache.apply_report("DELETED", obj)  # the agent is gone: the pods keep the GPUs last known
    assert [s.replicas_used for s in cache.snapshot().nodes[T4].state.gpus.slots] == [0, 0, 1, 2]


async def test_the_contradictions_of_a_prediction_are_counted_once(socket_dir: Path) -> None:
    """Beside the three pods bind recorded on GPUs 0, 0 and 1, two one-replica pods bound without a record: this
    extender predicts the first on GPU 2 or 3 (they hold none), and the second on GPU 3 or, should the first have
    gone to 3, GPU 2 (a pick among equals leaves the next pick unsure too). The node's device plugin in fact put
    them on GPUs 0 and 1 (it packs): both are contradictions."""
    t4 = pcie()
    cluster = the_cluster([])
    cluster.pods += [pod(n, {"nvidia.com/gpu": "1"}, node=T4) for n in ("r3", "r4")]
    cache = Cache()
    cache.reset_nodes(cluster.nodes)
    for p in cluster.pods:  # bound one after the other, as the watch shows them
        cache.apply_pod("ADDED", p)
    assert [cache.pods[f"team-a/{n}"].placement.maybe for n in ("r3", "r4")] == [  # type: ignore[union-attr]
        (2, 3), (2, 3)]
    kubelet = Kubelet([Held("team-a", n, "main", "nvidia.com/gpu", [replica(t4[g].uuid, k)])
                       for n, g, k in (("r0", 0, 0), ("r1", 0, 1), ("r2", 1, 0), ("r3", 0, 2), ("r4", 1, 1))])
    obj = await report_of(kubelet, FakeNvml(t4), T4, socket_dir)
    cache.apply_node("MODIFIED", copy.deepcopy(node_fixture(T4)) | {"metadata": {  # a node update re-places them
        **node_fixture(T4)["metadata"], "labels": {**node_fixture(T4)["metadata"]["labels"], "x": "y"}}})
    cache.apply_report("ADDED", obj)
    assert cache.contradictions == 2
    assert [s.replicas_used for s in cache.snapshot().nodes[T4].state.gpus.slots] == [3, 2, 0, 0]
    cache.apply_report("MODIFIED", obj)  # the same report again counts nothing twice
    registry = CollectorRegistry()
    registry.register(AgentMetrics(cache))
    scraped = generate_latest(registry).decode()
    assert "gpu_tailor_agent_contradictions_total 2.0" in scraped and "gpu_tailor_agent_reports 1.0" in scraped
    observed = dt.datetime.strptime(obj["spec"]["observedAt"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    held = re.search(rf'^gpu_tailor_agent_report_observed_timestamp_seconds{{node="{T4}"}} (\S+)$', scraped, re.M)
    assert held is not None and float(held.group(1)) == observed.timestamp()


async def test_a_report_within_the_predicted_set_is_no_contradiction(socket_dir: Path) -> None:
    """A new pod predicted 'GPU 2 or 3' that the plugin put on GPU 3 was predicted right."""
    t4 = pcie()
    cluster = the_cluster([])
    cluster.pods.append(pod("new", {"nvidia.com/gpu": "1"}, node=T4))  # bound without an annotation
    cache = Cache()
    cache.reset_pods(cluster.pods)
    cache.reset_nodes(cluster.nodes)
    placed = cache.pods["team-a/new"].placement
    assert placed is not None and placed.maybe == (2, 3)
    kubelet = Kubelet([Held("team-a", n, "main", "nvidia.com/gpu", [replica(t4[g].uuid, 0)])
                       for n, g in (("r0", 0), ("r1", 0), ("r2", 1), ("new", 3))])
    cache.apply_report("ADDED", await report_of(kubelet, FakeNvml(t4), T4, socket_dir))
    assert cache.contradictions == 0 and cache.pods["team-a/new"].placement.gpus == (3,)  # type: ignore[union-attr]


async def test_a_degraded_node_is_told_which_gpus_are_gone(socket_dir: Path) -> None:
    """The degraded H100 sells 5 of 8 GPUs. Without a report it promises none; the agent says GPUs 1, 4 and 6
    are not offered (and NVML's NVSwitch fabric joins the rest), and an NVLink pair is placed on sold GPUs."""
    boards = hgx()
    node = "h100-degraded-0"
    sold = [b for i, b in enumerate(boards) if i not in (1, 4, 6)]
    obj = await report_of(Kubelet([], {"nvidia.com/gpu": [b.uuid for b in sold]}), FakeNvml(boards), node,
                          socket_dir)
    assert [g["index"] for g in obj["spec"]["gpus"] if not g["healthy"]] == [1, 4, 6]
    two = pod("pair", {"nvidia.com/gpu": "2"}, annotations={"gpu-tailor.io/topology": "nvlink"})
    cluster = Cluster([copy.deepcopy(node_fixture(n)) for n in NODES], [], None, "the fixture nodes")
    blind = {v.node: v for v in explain(two, "pod", cluster, AdmissionPolicy()).nodes}[node]
    assert not blind.fits and "which ones is not known" in blind.reasons[0]
    cluster.reports = [obj]
    told = {v.node: v for v in explain(two, "pod", cluster, AdmissionPolicy()).nodes}[node]
    assert told.fits and told.gpus is not None and not {1, 4, 6} & set(told.gpus)


async def test_a_pod_holding_a_gpu_lost_since_is_still_reported_on_it(socket_dir: Path) -> None:
    """A pod holds GPU 7 when the driver loses it (or is handed it after: the device plugin still sells it until an
    Xid). NVML can no longer say GPU 7's UUID; the running agent remembers it and reports the pod on GPU 7, while an
    agent started after the loss lists the device as unmapped rather than guess."""
    boards = hgx()
    kubelet = Kubelet([Held("team-a", "p", "main", "nvidia.com/gpu", [boards[6].uuid, boards[7].uuid])],
                      {"nvidia.com/gpu": [b.uuid for b in boards]})
    async with serving(kubelet, socket_dir) as path:
        client = podresources.Client(path)
        try:
            agent = Agent(HGX, client, FakeNvml(boards))
            before = (await agent.look()).object()
            boards[7].lost = True
            after = (await agent.look()).object()
            fresh = (await Agent(HGX, client, FakeNvml(boards)).look()).object()
        finally:
            await client.close()
    assert [c["gpus"] for c in before["spec"]["pods"]] == [[6, 7]]
    assert [c["gpus"] for c in after["spec"]["pods"]] == [[6, 7]] and not after["spec"].get("unmapped")
    assert [g["index"] for g in after["spec"]["gpus"] if not g["healthy"]] == [7]
    assert [c["gpus"] for c in fresh["spec"]["pods"]] == [[6]] and fresh["spec"]["unmapped"] == [boards[7].uuid]
    # the fresh agent's report names one of the pod's two GPUs: not the whole answer, so no contradiction either
    cluster = the_cluster([])
    cluster.pods.append(pod("p", {"nvidia.com/gpu": "2"}, node=HGX))
    cache = Cache()
    cache.reset_pods(cluster.pods)
    cache.reset_nodes(cluster.nodes)
    cache.apply_report("ADDED", fresh)
    assert cache.contradictions == 0


async def test_a_gpu_the_driver_lost_is_not_placed_on_though_the_plugin_still_sells_it(socket_dir: Path) -> None:
    """The HGX node sells 8 GPUs, but NVML says GPU 7 is lost (the device plugin learns of it from an Xid event, or
    at its next start): with the agent's report, gpu-tailor counts 7, refuses 8 and names GPU 7; a report that
    leaves more GPUs than the node sells (behind the node) is not followed."""
    boards = hgx()
    boards[7].lost = True
    obj = await report_of(Kubelet([], {"nvidia.com/gpu": [b.uuid for b in boards]}), FakeNvml(boards), HGX,
                          socket_dir)
    assert [g["index"] for g in obj["spec"]["gpus"] if not g["healthy"]] == [7]
    cluster = Cluster([copy.deepcopy(node_fixture(n)) for n in NODES], [], None, "the fixture nodes", reports=[obj])
    eight = {v.node: v for v in explain(pod("all", {"nvidia.com/gpu": "8"}), "pod", cluster,
                                        AdmissionPolicy()).nodes}[HGX]
    assert not eight.fits and "8 whole GPUs asked, 7 of 7 free" in eight.reasons[0]
    one = {v.node: v for v in explain(pod("one", {"nvidia.com/gpu": "1"}), "pod", cluster, AdmissionPolicy()).nodes}
    # placed on 0-6, but the plugin may still hand out GPU 7: the record says it picks among all eight
    assert one[HGX].fits and one[HGX].gpus == [0] and one[HGX].maybe == list(range(8))
    assert one[HGX].detail == ("GPU 7 not sold or lost (the node agent's report); the device plugin still sells it "
                               "and may hand it out")

    degraded = "h100-degraded-0"  # sells 5 of 8; a report naming only one GPU unsold is behind it
    behind = copy.deepcopy(obj)
    behind["metadata"]["name"] = behind["spec"]["node"] = degraded
    cache = Cache()
    cache.reset_reports([behind])
    cache.reset_nodes([copy.deepcopy(node_fixture(n)) for n in NODES])
    state = cache.snapshot().nodes[degraded].state.gpus
    assert state.unhealthy is None and state.usable == 5


def test_a_malformed_report_is_said_and_names_nothing() -> None:
    bad = {"metadata": {"name": "n1"}, "spec": {"node": "n2", "pods": [{"namespace": "a", "name": "p", "gpus": [0]}]}}
    assert parse(bad).problems == ("spec.node 'n2' is not the report's name 'n1'",)
    assert parse(bad).pod_gpus() == {}
    worse = {"metadata": {"name": "n1"}, "spec": {"node": "n1", "gpus": [{"uuid": "x"}],
                                                  "pods": [{"namespace": "a", "name": "p", "gpus": ["0"]}]}}
    assert parse(worse).problems == ("gpus[0]: no index", "pods[0].gpus: expected a list of GPU indices, got ['0']")


class FakeApi:
    """What the agent calls of the API: the Node's uid, and get/create/replace of its report."""

    def __init__(self) -> None:
        self.stored: dict[str, Any] | None = None
        self.writes: list[str] = []

    async def read_node(self, name: str) -> Any:
        return type("Node", (), {"metadata": type("Meta", (), {"uid": f"uid-{name}"})()})()

    async def get_cluster_custom_object(self, group: str, version: str, plural: str, name: str) -> dict[str, Any]:
        from kubernetes_asyncio.client.exceptions import ApiException

        if self.stored is None:
            raise ApiException(status=404, reason="Not Found")
        return self.stored

    async def create_cluster_custom_object(self, group: str, version: str, plural: str, body: dict[str, Any]) -> None:
        self.writes.append("create")
        self.stored = {**body, "metadata": {**body["metadata"], "resourceVersion": "1"}}

    async def replace_cluster_custom_object(self, group: str, version: str, plural: str, name: str,
                                            body: dict[str, Any]) -> None:
        assert self.stored is not None and body["metadata"]["resourceVersion"] == self.stored["metadata"][
            "resourceVersion"]
        self.writes.append("replace")
        self.stored = {**body, "metadata": {**body["metadata"], "resourceVersion": "2"}}


async def test_a_report_is_written_when_it_changes_and_owned_by_its_node(socket_dir: Path) -> None:
    t4 = pcie()
    kubelet = Kubelet([Held("team-a", "r0", "main", "nvidia.com/gpu", [replica(t4[0].uuid, 0)])])
    api = FakeApi()
    async with serving(kubelet, socket_dir) as path:
        client = podresources.Client(path)
        agent = Agent(T4, client, FakeNvml(t4))
        try:
            assert await agent.publish(api, api, await agent.look())
            assert not await agent.publish(api, api, await agent.look())  # nothing changed but the time
            kubelet.held.append(Held("team-a", "r1", "main", "nvidia.com/gpu", [replica(t4[1].uuid, 0)]))
            assert await agent.publish(api, api, await agent.look())
        finally:
            await client.close()
    assert api.writes == ["create", "replace"]
    assert api.stored is not None
    assert api.stored["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": T4,
                                                          "uid": f"uid-{T4}"}]
    assert [p["name"] for p in api.stored["spec"]["pods"]] == ["r0", "r1"]


def test_without_nvml_index_ids_still_place_pods() -> None:
    held = [podresources.Devices("nvidia.com/gpu", ("2", "3"), "team-a", "p", "main"),
            podresources.Devices("nvidia.com/gpu", ("GPU-abc",), "team-a", "q", "main")]
    report = collect.build("n", held, [], None, "2026-11-26T12:00:00Z")
    assert report.pod_gpus() == {"team-a/p": (2, 3)} and report.unmapped == ("GPU-abc",)
    assert report.gpus == () and report.unhealthy() is None  # health needs NVML


def test_a_report_its_agent_stopped_renewing_is_forgotten() -> None:
    """A report not renewed for 15 minutes goes (its agent is gone): the node's GPUs are predicted again. A report
    whose count of unsold GPUs disagrees with the node's allocatable is not trusted on which ones."""
    now = [1_800_000_000.0]
    tick = [0.0]
    cache = Cache(clock=lambda: tick[0], wall=lambda: now[0])
    node = "h100-degraded-0"  # sells 5 of 8
    cache.reset_nodes([copy.deepcopy(node_fixture(node))])
    cache.reset_pods([])

    def report(unsold: list[int], at: float) -> dict[str, Any]:
        stamp = dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return NodeReport(node, stamp, "550.54.15", tuple(ReportedGpu(i, f"GPU-{i}", i not in unsold)
                                                          for i in range(8))).object()

    cache.apply_report("ADDED", report([1, 4], now[0]))  # two unsold, but allocatable says three
    assert not cache.snapshot().nodes[node].state.gpus.per_gpu_known
    cache.apply_report("MODIFIED", report([1, 4, 6], now[0]))
    assert cache.snapshot().nodes[node].state.gpus.free_whole() == [0, 2, 3, 5, 7]
    now[0] += 600
    tick[0] += 600
    assert node in cache.snapshot().nodes and node in cache.reports  # 10 min: still fresh
    now[0] += 400
    tick[0] += 400
    snap = cache.snapshot()
    assert node not in cache.reports and not snap.nodes[node].state.gpus.per_gpu_known


def test_a_gpu_in_mig_mode_not_cut_yet_is_not_sold_and_bad_lists_are_said() -> None:
    """Under the mixed strategy a GPU in MIG mode with no instance cut offers nothing, and its neighbours are sold as
    whole GPUs: the report says which GPU is not sold, so that the whole GPUs are known."""
    boards = pcie(2)
    boards[1].mig = []  # MIG mode on, no instance yet: the kubelet offers nothing on it
    reading = nvml.read(FakeNvml(boards))
    offered = [podresources.Devices("nvidia.com/gpu", (boards[0].uuid,))]
    report = collect.build("n", [], offered, reading, "2026-11-26T12:00:00Z")
    assert [g.healthy for g in report.gpus] == [True, False]
    assert [g.healthy for g in collect.build("n", [], [], reading, "2026-11-26T12:00:00Z").gpus] == [True, True]
    assert parse({"metadata": {"name": "n"}, "spec": {"node": "n", "gpus": "all", "unmapped": 3}}).problems == (
        "spec.gpus: expected a list, got str", "spec.unmapped: expected a list, got int")


async def test_an_unchanged_report_is_renewed_when_asked(socket_dir: Path) -> None:
    t4 = pcie()
    api = FakeApi()
    async with serving(Kubelet([]), socket_dir) as path:
        client = podresources.Client(path)
        agent = Agent(T4, client, FakeNvml(t4))
        try:
            assert await agent.publish(api, api, await agent.look())
            assert not await agent.publish(api, api, await agent.look())
            assert await agent.publish(api, api, await agent.look(), renew=True)
        finally:
            await client.close()
    assert api.writes == ["create", "replace"]
