"""``explain`` on the fixture nodes: the webhook's own answer and patch, the nodes kube-scheduler and the
extender turn away and why, the node and GPUs bind would choose."""

from __future__ import annotations

import json
from pathlib import Path

import jsonpatch
import pytest

from gpu_tailor.tools.explain import admission_review, api_defaults, explain, pending_message, table
from gpu_tailor.webhook.config import AdmissionPolicy
from gpu_tailor.webhook.mutate import decide
from gpu_tailor.webhook.state import ClusterView
from tests.tools.builders import fixture_cluster, pod, review_pod

HGX = "h100-hgx-0"
POLICY = AdmissionPolicy()

# where each admitted fixture pod goes on the empty fixture nodes (tests/e2e/test_scheduling.py: the real
# kube-scheduler with the extender put them there), and the GPUs bind hands out
PLACEMENTS = {"a": (HGX, [0, 1]), "k": (HGX, [0]), "d": ("t4-timeslice-0", [0]),
              "e": ("a100-mig-mixed-0", [0]), "h": ("a100-mig-mixed-0", [0])}


@pytest.mark.parametrize("letter", sorted(PLACEMENTS))
def test_where_an_admitted_fixture_pod_goes(letter: str) -> None:
    said = explain(review_pod(letter), "pod", fixture_cluster(), POLICY)
    assert said.admission.allowed and said.admission.called
    assert (said.chosen, said.gpus) == PLACEMENTS[letter]
    assert len(said.nodes) == 9
    assert max((v.score or 0, v.node == said.chosen) for v in said.nodes if v.fits)[1]


@pytest.mark.parametrize("letter", ["a", "d", "e", "g", "h", "k"])
def test_the_pod_as_stored_is_the_webhooks_own_patch(letter: str) -> None:
    cluster = fixture_cluster()
    written = api_defaults(review_pod(letter))
    view = ClusterView(POLICY)
    view.reset(cluster.nodes, cluster.pods)
    decision = decide(admission_review(written), view.candidates(), POLICY)
    said = explain(review_pod(letter), "pod", cluster, POLICY)
    assert said.admission.patch == decision.patch
    assert said.stored == jsonpatch.apply_patch(written, decision.patch)
    assert said.admission.warnings == list(decision.warnings)
    if decision.patch:
        assert said.admission.diff.startswith("--- as written\n+++ as stored\n")


def test_two_whole_gpus_on_an_nvlink_pair_and_the_degraded_node_scored_last() -> None:
    said = explain(review_pod("a"), "pod", fixture_cluster(), POLICY)
    nodes = {v.node: v for v in said.nodes}
    assert said.nvlink == "all NVLink-connected"
    assert nodes[HGX].score == 10 and nodes["h100-degraded-0"].fits and nodes["h100-degraded-0"].score == 0
    # the degraded node sells 5 of 8 GPUs, and which 5 is not known: it promises no GPU
    assert nodes["h100-degraded-0"].detail == (
        "degraded: 3 of 8 GPUs not sold, which not known; scored last; which GPUs is not known: counted only")
    assert nodes["h100-degraded-0"].gpus is None and nodes[HGX].gpus == [0, 1]
    assert nodes["cpu-node-0"].by == "kube-scheduler" and nodes["cpu-node-0"].reasons == ["Insufficient nvidia.com/gpu"]
    t4 = nodes["t4-timeslice-0"]
    assert t4.by == "gpu-tailor extender" and t4.unresolvable
    assert t4.reasons == ["node sells nvidia.com/gpu as shared:time-slicing:4: 2 units would be 2 slices or "
                          "replicas, not 2 GPUs"]


def test_a_pod_nothing_can_hold_gets_kube_schedulers_message() -> None:
    holder = pod("holder", {"nvidia.com/gpu": "1"}, node=HGX, annotations={"gpu-tailor.io/gpus": "0"})
    said = explain(pod("big", {"nvidia.com/gpu": "8"}), "pod", fixture_cluster([holder]), POLICY)
    assert said.chosen is None and said.gpus is None
    assert said.pending.startswith("0/9 nodes are available: ")
    # kube-scheduler counts nvidia.com/gpu: the HGX board has 7 left, the degraded H100 sells 5, and four nodes
    # sell none under that name
    assert "6 Insufficient nvidia.com/gpu" in said.pending
    assert {v.node: v.detail for v in said.nodes}[HGX] == "nvidia.com/gpu: 8 asked, 7 of 8 free"
    assert "1 node sells nvidia.com/gpu as shared:mps:10: 8 units would be 8 slices or replicas, not 8 GPUs" \
        in said.pending
    assert "stays Pending: 0/9 nodes are available" in table(said)


def test_bound_pods_take_their_gpus() -> None:
    holder = pod("holder", {"nvidia.com/gpu": "2"}, node=HGX, annotations={"gpu-tailor.io/gpus": "0,1"})
    said = explain(review_pod("a"), "pod", fixture_cluster([holder]), POLICY)
    assert (said.chosen, said.gpus) == (HGX, [2, 3])


def test_a_denied_pod_is_not_scheduled() -> None:
    said = explain(pod("huge", {"gpu-tailor.io/gpu-memory": "500Gi"}), "pod", fixture_cluster(), POLICY)
    assert not said.admission.allowed and said.admission.outcome == "denied"
    assert said.admission.message.startswith("pod cannot get its GPU ask")
    assert not said.nodes and "DENIED by the gpu-tailor webhook (HTTP 403)" in table(said)


@pytest.mark.parametrize(("namespaces", "called", "note"), [
    pytest.param(None, True, "assumed opted in", id="labels unknown: assumed opted in, and said"),
    pytest.param({"team-a": {"gpu-tailor.io/enabled": "true"}}, True, "", id="opted in"),
    pytest.param({"team-a": {}}, False, "", id="not opted in"),
])
def test_the_namespace_opt_in(namespaces: dict[str, dict[str, str]] | None, called: bool, note: str) -> None:
    said = explain(review_pod("d"), "pod", fixture_cluster(namespaces=namespaces), POLICY)
    assert said.admission.called is called
    assert any(note in n for n in said.notes) if note else not any("assumed" in n for n in said.notes)
    if not called:
        assert said.scheduler == "default-scheduler" and not said.extender_asked
        assert "not labelled gpu-tailor.io/enabled=true" in said.admission.message


@pytest.mark.parametrize(("namespace", "labels"), [("kube-system", {}), ("team-a", {"gpu-tailor.io/skip": "true"})])
def test_pods_the_webhook_never_sees(namespace: str, labels: dict[str, str]) -> None:
    p = pod("p", {"gpu-tailor.io/gpu-milli": "250"}, namespace=namespace)
    p["metadata"]["labels"] = labels
    said = explain(p, "pod", fixture_cluster(), POLICY)
    assert not said.admission.called and said.admission.outcome == "not-called"


def test_pending_message_counts_nodes_per_reason() -> None:
    from gpu_tailor.tools.explain import NodeVerdict

    verdicts = [NodeVerdict("a", False, "kube-scheduler", ["Insufficient cpu"]),
                NodeVerdict("b", False, "kube-scheduler", ["Insufficient cpu", "Insufficient memory"]),
                NodeVerdict("c", False, "gpu-tailor extender", ["mig-1g.5gb: 0 of 16 free"])]
    assert pending_message(verdicts) == ("0/3 nodes are available: 2 Insufficient cpu, 1 Insufficient memory, "
                                         "1 mig-1g.5gb: 0 of 16 free.")


def test_a_groups_pod_is_explained_with_its_plan_and_the_nvlink_domains() -> None:
    from gpu_tailor.gpumodel import labels
    from gpu_tailor.tools.source import Cluster
    from tests.extender.test_gangs import NODES as TRAYS

    busy = pod("busy", {"nvidia.com/gpu": "2"}, node="gb-1-0", annotations={"gpu-tailor.io/gpus": "0,1"})
    member = pod("train-0", {"nvidia.com/gpu": "4"}, annotations={
        labels.ANN_GROUP: "train", labels.ANN_GROUP_SIZE: "3", labels.ANN_GROUP_DOMAIN: "required"})
    said = explain(member, "pod", Cluster(TRAYS, [busy], None, "trays"), POLICY)
    assert said.chosen is not None and said.chosen.startswith("gb-1-")
    (plan,) = [n for n in said.notes if n.startswith("group team-a/train")]
    assert "planned in NVLink domain nvidia.com/gpu.clique=uuid-1.1" in plan and f"this pod: {said.chosen}" in plan
    domains = [n for n in said.notes if n.startswith("NVLink domain")]
    assert len(domains) == 3
    assert any("uuid-1.1: 14 of 16 GPUs free" in d and "still fits there: 3" in d for d in domains)
    too_big = pod("huge-0", {"nvidia.com/gpu": "4"}, annotations={
        labels.ANN_GROUP: "huge", labels.ANN_GROUP_SIZE: "5", labels.ANN_GROUP_DOMAIN: "required"})
    said = explain(too_big, "pod", Cluster(TRAYS, [busy], None, "trays"), POLICY)
    assert said.chosen is None
    assert any("fits in no NVLink domain as a whole" in n for n in said.notes)


def test_a_group_sized_by_its_podgroup_in_a_dump_is_explained_as_a_group(tmp_path: Path) -> None:
    """The pods of a kube-scheduler PodGroup do not say the group's size; the dump's PodGroup does, as the
    extender's watch of it does."""
    from gpu_tailor.tools.source import load_dump
    from tests.extender.test_gangs import NODES as TRAYS

    member = pod("pg-0", {"nvidia.com/gpu": "4"})
    member["spec"]["schedulingGroup"] = {"podGroupName": "pg"}
    podgroup = {"apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup",
                "metadata": {"name": "pg", "namespace": "team-a"},
                "spec": {"schedulingPolicy": {"gang": {"minCount": 3}},
                         "schedulingConstraints": {"topology": [{"key": "nvidia.com/gpu.clique"}]}}}
    dump = tmp_path / "dump.json"
    for items, planned in (([*TRAYS, podgroup], True), (TRAYS, False)):
        dump.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
        said = explain(member, "pod", load_dump(str(dump)), POLICY)
        plans = [n for n in said.notes if n.startswith("podgroup team-a/pg: 3 pods (required one NVLink domain)")]
        assert bool(plans) is planned, said.notes  # without the PodGroup: a single pod
