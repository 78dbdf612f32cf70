"""The webhook on clusters with DRA pools (issue 27): a portable ask lands on whichever dialect holds it with the
least GPU, device-plugin pools answer exactly as before, a DRA pod names a ResourceClaimTemplate that the server
makes before admitting it (never for a dry run), and an ask no pool of either dialect holds is refused with both
reasons. Real AdmissionReviews from ``../shared/fixtures``; hand-written NVIDIA-shaped slices."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import jsonpatch
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.dra_state import DraState
from gpu_tailor.webhook.config import AdmissionPolicy
from gpu_tailor.webhook.mutate import Decision, decide
from gpu_tailor.webhook.server import ApiRefusal, Templates, make_app
from gpu_tailor.webhook.state import ClusterView
from tests.conftest import FIXTURES, review_fixture
from tests.gpumodel.dra_slices import a100_mig, device_classes, hgx, plain_node, shared_t4
from tests.webhook.test_mutate import assert_kubernetes_valid

NODES = [json.loads(p.read_text()) for p in sorted((FIXTURES / "nodes").glob("*.json"))]
LETTERS = sorted(p.name[0] for p in (FIXTURES / "admission").glob("*.json"))


def dra_state(slices: list[dict[str, Any]] | None = None, classes: list[dict[str, Any]] | None = None) -> DraState:
    state = DraState()
    state.reset_slices([hgx(), a100_mig(), shared_t4()] if slices is None else slices)
    state.reset_claims([])
    state.reset_classes(device_classes() if classes is None else classes)
    return state


DRA_NODES = ["dra-h100-hgx-0", "dra-a100-mig-0", "dra-t4-shared-0"]


def cluster(nodes: list[dict[str, Any]], dra: DraState | None = None) -> ClusterView:
    """The view of ``nodes`` plus the nodes of the DRA pools (no GPUs of their own: only DRA publishes them)."""
    view = ClusterView(AdmissionPolicy())
    view.reset([*nodes, *(plain_node(n) for n in DRA_NODES)], [])
    if dra is not None:
        view.dra = dra
    return view


def admit(review: dict[str, Any], view: ClusterView) -> tuple[Decision, dict[str, Any]]:
    req = review["request"]
    d = decide(req, view.candidates(), view.policy, view.dra, view.nodes_taking_pods())
    pod = jsonpatch.apply_patch(req["object"], d.patch) if d.allowed else req["object"]
    return d, pod


def with_resources(letter: str, **resources: str) -> dict[str, Any]:
    review = copy.deepcopy(review_fixture(letter))
    res = {k.replace("_", "-").replace("gpu-tailor-io-", "gpu-tailor.io/"): v for k, v in resources.items()}
    review["request"]["object"]["spec"]["containers"][0]["resources"] = {"requests": res, "limits": dict(res)}
    return review


@pytest.mark.parametrize("letter", LETTERS)
def test_device_plugin_pools_answer_exactly_as_before(letter: str) -> None:
    """Every fixture gets the same answer with an HGX node and a MIG node on DRA beside the device-plugin nodes:
    each ask is met by a device-plugin offering no bigger than any DRA device that holds it (ties stay there)."""
    review = review_fixture(letter)
    before, _ = admit(review, cluster(NODES))
    after, _ = admit(review, cluster(NODES, dra_state([hgx(), a100_mig()])))
    assert (after.allowed, after.patch, after.warnings, after.message, after.backing) == (
        before.allowed, before.patch, before.warnings, before.message, before.backing)
    assert after.template is None


def test_on_dra_pools_only_a_memory_ask_becomes_a_claim_of_the_smallest_mig_device() -> None:
    d, pod = admit(with_resources("e", gpu_tailor_io_gpu_memory="20Gi"), cluster([], dra_state()))
    assert d.allowed and d.template is not None and d.backing == "dra:mig-3g-20gb"
    name = d.template["metadata"]["name"]
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu-tailor", "resourceClaimTemplateName": name}]
    (container,) = pod["spec"]["containers"]
    assert container["resources"] == {"claims": [{"name": "gpu-tailor", "request": "gpu-0"}]}
    assert_kubernetes_valid(pod)
    rungs = [r["name"] for r in d.template["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]]
    assert rungs == ["mig-3g-20gb", "gpu-nvidia-h100-80gb-hbm3"]
    ask = json.loads(pod["metadata"]["annotations"][labels.ANN_ASK])
    assert ask["containers"] == {container["name"]: {"gpuMemory": "20Gi"}}
    assert pod["metadata"]["annotations"][labels.ANN_BACKING] == "dra:mig-3g-20gb"
    assert pod["spec"]["schedulerName"] == AdmissionPolicy().schedulerName


def test_dra_wins_where_it_holds_the_ask_with_less_gpu_than_the_device_plugin() -> None:
    """Fixture i asks for half a GPU: the device-plugin nodes sell no shared offering that holds half a GPU, so
    it takes a whole one there; a pool that shares T4s on DRA holds it in half of one."""
    review = review_fixture("i")
    before, _ = admit(review, cluster(NODES))
    after, pod = admit(review, cluster(NODES, dra_state()))
    assert before.backing == "whole"
    assert after.backing == "dra:shared-tesla-t4" and after.template is not None
    shared = after.template["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"][0]
    assert shared["capacity"] == {"requests": {"memory": "7680Mi"}}  # half of a 15 GiB T4
    assert "affinity" not in pod["spec"] or pod["spec"]["affinity"] == review["request"]["object"]["spec"].get(
        "affinity")  # the claim, not node affinity, decides where it can go


def test_an_existing_claim_named_gpu_tailor_is_kept_and_ours_gets_another_name() -> None:
    review = with_resources("e", gpu_tailor_io_gpu_memory="4Gi")
    spec = review["request"]["object"]["spec"]
    spec["resourceClaims"] = [{"name": "gpu-tailor", "resourceClaimName": "theirs"}]
    spec["containers"][0]["resources"]["requests"]["cpu"] = "1"
    d, pod = admit(review, cluster([], dra_state()))
    assert d.allowed
    assert [c["name"] for c in pod["spec"]["resourceClaims"]] == ["gpu-tailor", "gpu-tailor-1"]
    assert pod["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "1"},
                                                         "claims": [{"name": "gpu-tailor-1", "request": "gpu-0"}]}


def test_an_ask_neither_dialect_holds_is_refused_with_both_reasons() -> None:
    d, _ = admit(with_resources("e", gpu_tailor_io_gpu_memory="200Gi"), cluster(NODES, dra_state()))
    assert not d.allowed and d.template is None
    assert d.message.startswith("pod cannot get its GPU ask: needs 200Gi of GPU memory")
    assert d.message.endswith("; on DRA pools: container main: needs 200Gi of GPU memory; the largest DRA device "
                              "is NVIDIA H100 80GB HBM3 (80Gi)")


def test_dra_off_or_empty_changes_nothing() -> None:
    off = DraState(enabled=False)
    for dra in (off, dra_state(slices=[])):
        d, _ = admit(with_resources("e", gpu_tailor_io_gpu_memory="20Gi"), cluster([], dra))
        assert not d.allowed and "on DRA pools" not in d.message


def test_native_gpus_served_by_dra_count_as_free() -> None:
    """``nvidia.com/gpu: 2`` with the device-plugin HGX node full: free on the DRA HGX node, where DeviceClass
    gpu.nvidia.com serves nvidia.com/gpu (KEP-5004); without that class nothing serves it there."""
    review = review_fixture("a")  # nvidia.com/gpu: 2
    hgx_node = [n for n in NODES if n["metadata"]["name"] == "h100-hgx-0"]
    full = {"metadata": {"uid": "u", "name": "full", "namespace": "x"},
            "spec": {"nodeName": "h100-hgx-0",
                     "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
            "status": {"phase": "Running"}}

    def warnings(dra: DraState) -> tuple[str, ...]:
        view = cluster(hgx_node, dra)
        view.reset_pods([full])
        d, _ = admit(review, view)
        assert d.allowed
        return d.warnings

    assert not any("free right now" in w for w in warnings(dra_state()))
    unmapped = [c for c in device_classes() if not c["spec"].get("extendedResourceName")]
    assert "no node has 2 x nvidia.com/gpu free right now; the pod waits for capacity" in warnings(
        dra_state(classes=unmapped))


class FakeApi:
    def __init__(self, status: int | None = None) -> None:
        self.status = status
        self.created: list[tuple[str, str]] = []

    async def create(self, namespace: str, template: dict[str, Any]) -> None:
        self.created.append((namespace, template["metadata"]["name"]))
        if self.status is not None:
            raise ApiRefusal(self.status, "forbidden" if self.status == 403 else "exists")


@pytest.fixture
def fake_api() -> Iterator[FakeApi]:
    yield FakeApi()


async def post(client: TestClient[web.Request, web.Application], review: dict[str, Any]) -> dict[str, Any]:
    resp = await client.post("/mutate", json=review)
    assert resp.status == 200
    body: dict[str, Any] = (await resp.json())["response"]
    return body


async def test_the_server_makes_the_template_for_each_pod_and_never_for_a_dry_run(fake_api: FakeApi) -> None:
    async with TestClient(TestServer(make_app(cluster([], dra_state()), Templates(fake_api.create)))) as client:
        dry = await post(client, review_fixture("j"))  # gpu-milli 250, dryRun
        assert dry["allowed"] and dry.get("patch") and fake_api.created == []
        first = await post(client, with_resources("e", gpu_tailor_io_gpu_memory="20Gi"))
        second = await post(client, with_resources("e", gpu_tailor_io_gpu_memory="20Gi"))
        assert first["allowed"] and second["allowed"]
        # posted for each pod (a 409 says it exists): one deleted meanwhile is made again, never left missing
        assert len(fake_api.created) == 2 and fake_api.created[0] == fake_api.created[1]
        assert fake_api.created[0][0] == "team-a" and fake_api.created[0][1].startswith("gpu-tailor-")


@pytest.mark.parametrize(("status", "allowed"), [(409, True), (403, False)])
async def test_a_template_that_exists_is_fine_and_one_that_cannot_be_made_refuses_the_pod(status: int,
                                                                                          allowed: bool) -> None:
    api = FakeApi(status)
    async with TestClient(TestServer(make_app(cluster([], dra_state()), Templates(api.create)))) as client:
        answer = await post(client, with_resources("e", gpu_tailor_io_gpu_memory="20Gi"))
    assert answer["allowed"] is allowed
    if not allowed:
        assert answer["status"]["message"].startswith("pod cannot get its GPU ask: cannot create "
                                                      "ResourceClaimTemplate team-a/gpu-tailor-")
        assert "HTTP 403: forbidden" in answer["status"]["message"]


def test_a_dra_pod_seen_again_keeps_its_records_and_a_forged_one_does_not() -> None:
    """The API server calls the webhook's second entry (and reinvokes it) with the pod as the first call left it:
    the claim and the ask and backing records stay. The same records on a pod without gpu-tailor's claim go."""
    view = cluster([], dra_state())
    first, rewritten = admit(with_resources("e", gpu_tailor_io_gpu_memory="20Gi"), view)
    again = copy.deepcopy(review_fixture("e"))
    again["request"]["object"] = rewritten
    seen, after = admit(again, view)
    assert seen.allowed and seen.patch == [] and after == rewritten
    forged = copy.deepcopy(again)
    forged["request"]["object"]["spec"]["resourceClaims"] = [{"name": "gpu-tailor", "resourceClaimName": "mine"}]
    dropped, stored = admit(forged, view)
    assert dropped.allowed and labels.ANN_BACKING not in stored["metadata"].get("annotations", {})
    assert any("removed" in w for w in dropped.warnings) and first.template is not None


@pytest.mark.parametrize(("where", "value"), [("resourceClaims", [{"name": {"x": 1}}]),
                                              ("claims", [{"name": "gpu-tailor", "request": ["a"]}])])
def test_claim_names_that_are_not_strings_are_a_bad_request(where: str, value: Any) -> None:
    review = with_resources("e", gpu_tailor_io_gpu_memory="20Gi")
    spec = review["request"]["object"]["spec"]
    if where == "claims":
        spec["containers"][0]["resources"]["claims"] = value
    else:
        spec["resourceClaims"] = value
    d, _ = admit(review, cluster([], dra_state()))
    assert not d.allowed and d.code == 400 and "expected a string" in d.message


def test_pools_of_cordoned_nodes_are_left_out() -> None:
    view = cluster([], dra_state())
    view.apply_node("MODIFIED", {**plain_node("dra-a100-mig-0"), "spec": {"unschedulable": True}})
    d, _ = admit(with_resources("e", gpu_tailor_io_gpu_memory="20Gi"), view)
    assert d.allowed and d.backing == "dra:gpu-nvidia-h100-80gb-hbm3"  # the 3g.20gb is on a cordoned node
