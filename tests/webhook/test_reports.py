"""``/reports``: a node agent writes its own node's NodeGPUReport only (the configuration sends nobody else's writes,
and a review of anyone else's fails closed).

The reviews are built on the envelope of a captured AdmissionReview (``tests/fixtures/admission``), with the
report as the object and the caller as the API server describes a pod's service account: on 1.32 and later
its node in ``userInfo.extra`` (``authentication.kubernetes.io/node-name``), before that only its pod."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpu_tailor.gpumodel.report import NodeReport
from gpu_tailor.webhook.config import AdmissionPolicy
from gpu_tailor.webhook.reports import check
from gpu_tailor.webhook.server import REPORTS, make_app
from gpu_tailor.webhook.state import ClusterView
from tests.conftest import review_fixture

AGENT = "system:serviceaccount:gpu-tailor:gpu-tailor-agent"
PODS = {"gpu-tailor-agent-x7k2p": ("uid-x7k2p", "gpu-node-1"), "gpu-tailor-agent-pending": ("uid-p", "")}


async def pods(namespace: str, name: str) -> tuple[str, str] | None:
    assert namespace == "gpu-tailor"
    return PODS.get(name)


def caller(node: str | None = None, pod: str | None = None, uid: str | None = None,
           username: str = AGENT) -> dict[str, Any]:
    extra: dict[str, list[str]] = {"authentication.kubernetes.io/credential-id": ["JTI=7f2c"]}
    if node is not None:
        extra["authentication.kubernetes.io/node-name"] = [node]
        extra["authentication.kubernetes.io/node-uid"] = [f"uid-{node}"]
    if pod is not None:
        extra["authentication.kubernetes.io/pod-name"] = [pod]
        extra["authentication.kubernetes.io/pod-uid"] = [uid or PODS.get(pod, ("?", ""))[0]]
    return {"username": username, "uid": "sa-uid", "groups": ["system:serviceaccounts",
            "system:serviceaccounts:gpu-tailor", "system:authenticated"], "extra": extra}


def review(name: str, user: dict[str, Any], operation: str = "UPDATE", spec_node: str | None = None) -> dict[str, Any]:
    out = copy.deepcopy(review_fixture("d"))
    report = NodeReport(name).object()
    report["spec"]["node"] = spec_node if spec_node is not None else name
    r = out["request"]
    r.update(kind={"group": "gpu-tailor.io", "version": "v1alpha1", "kind": "NodeGPUReport"},
             resource={"group": "gpu-tailor.io", "version": "v1alpha1", "resource": "nodegpureports"},
             name=name, operation=operation, userInfo=user,
             object=None if operation == "DELETE" else report, oldObject=report if operation != "CREATE" else None)
    r["requestKind"], r["requestResource"] = r["kind"], r["resource"]
    r.pop("namespace", None)  # cluster-scoped
    return out


@pytest.mark.parametrize(("name", "user", "operation", "allowed", "says"), [
    ("gpu-node-1", caller(node="gpu-node-1"), "UPDATE", True, ""),  # 1.32+: the node is in the token
    ("gpu-node-2", caller(node="gpu-node-1"), "UPDATE", False, "an agent on node gpu-node-1 may write "
                                                               "NodeGPUReport gpu-node-1 only, not 'gpu-node-2'"),
    ("gpu-node-2", caller(node="gpu-node-1"), "DELETE", False, "not 'gpu-node-2'"),
    ("gpu-node-1", caller(pod="gpu-tailor-agent-x7k2p"), "CREATE", True, ""),  # 1.28: the pod, read from the API
    ("gpu-node-2", caller(pod="gpu-tailor-agent-x7k2p"), "CREATE", False, "not 'gpu-node-2'"),
    ("gpu-node-1", caller(pod="gpu-tailor-agent-x7k2p", uid="uid-other"), "UPDATE", False, "does not exist"),
    ("gpu-node-1", caller(pod="gpu-tailor-agent-gone"), "UPDATE", False, "does not exist"),
    ("gpu-node-1", caller(pod="gpu-tailor-agent-pending"), "UPDATE", False, "is not on a node yet"),
    ("gpu-node-1", caller(), "UPDATE", False, "name no pod and no node"),  # a long-lived token, not a pod's
    # never sent here by the configuration: the ServiceAccounts disagree, so it fails closed
    ("gpu-node-2", caller(username="kubernetes-admin"), "UPDATE", False, "must name the same ServiceAccount"),
    ("gpu-node-1", caller(node="gpu-node-1", username="system:serviceaccount:other:gpu-tailor-agent"), "UPDATE",
     False, "not 'system:serviceaccount:other:gpu-tailor-agent'"),
], ids=["own-node", "other-node", "delete-other", "pod-own", "pod-other", "pod-uid-differs", "pod-gone",
        "pod-unscheduled", "no-pod-no-node", "admin", "other-namespace"])
async def test_an_agent_writes_its_own_nodes_report_only(name: str, user: dict[str, Any], operation: str,
                                                         allowed: bool, says: str) -> None:
    decision = await check(review(name, user, operation)["request"], "gpu-tailor", pods)
    assert decision.allowed is allowed, decision.message
    assert says in decision.message


async def test_the_agents_service_account_is_the_one_the_webhook_was_given() -> None:
    """The chart names the agents' ServiceAccount after its release (``--agent-service-account``)."""
    user = caller(node="gpu-node-1", username="system:serviceaccount:gpu-tailor:gpus-gpu-tailor-agent")
    request = review("gpu-node-1", user, "UPDATE")["request"]
    assert (await check(request, "gpu-tailor", pods, "gpus-gpu-tailor-agent")).allowed
    refused = await check(request, "gpu-tailor", pods)
    assert not refused.allowed and "system:serviceaccount:gpu-tailor:gpu-tailor-agent" in refused.message


async def test_spec_node_must_be_the_reports_own_name() -> None:
    decision = await check(review("gpu-node-1", caller(node="gpu-node-1"), spec_node="gpu-node-2")["request"],
                           "gpu-tailor", pods)
    assert not decision.allowed and decision.code == 400


async def test_over_http_the_answer_is_an_admission_review_that_refuses() -> None:
    app = make_app(ClusterView(AdmissionPolicy()))
    app[REPORTS].pods = pods
    async with TestClient(TestServer(app)) as client:
        body = review("gpu-node-2", caller(pod="gpu-tailor-agent-x7k2p"))
        resp = await client.post("/reports", json=body)
        assert resp.status == 200
        out = await resp.json()
        assert out["response"]["uid"] == body["request"]["uid"] and out["response"]["allowed"] is False
        assert out["response"]["status"]["code"] == 403 and "patch" not in out["response"]
        ok = await (await client.post("/reports", json=review("gpu-node-1", caller(node="gpu-node-1")))).json()
        assert ok["response"]["allowed"] is True and "patch" not in ok["response"]
        bad = await client.post("/reports", data=b"{")
        assert bad.status == 400 and "not an AdmissionReview v1" in (await bad.json())["error"]
        metrics = await (await client.get("/metrics")).text()
        assert 'outcome="denied",backing="report"' in metrics or 'backing="report",outcome="denied"' in metrics


async def test_without_an_api_client_a_pod_cannot_be_read_and_the_write_is_refused() -> None:
    decision = await check(review("gpu-node-1", caller(pod="gpu-tailor-agent-x7k2p"))["request"], "gpu-tailor", None)
    assert not decision.allowed and decision.code == 500
