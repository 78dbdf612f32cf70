"""Malformed Pod shapes inside a well-formed AdmissionReview get a clear answer, never a 500 (issue 19).

The API server only ever sends pods it has decoded, but the endpoint is on the network: a body whose
``metadata`` is a string or whose ``requests`` is a list is a bad request (an AdmissionReview answer
with ``allowed: false`` and code 400 naming the field), not a traceback.
"""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gpu_tailor.webhook.config import AdmissionPolicy
from gpu_tailor.webhook.mutate import decide
from gpu_tailor.webhook.server import make_app
from gpu_tailor.webhook.state import ClusterView
from tests.conftest import FIXTURES, review_fixture

NODES = [json.loads(p.read_text()) for p in sorted((FIXTURES / "nodes").glob("*.json"))]
Edit = Callable[[dict[str, Any]], None]


def _deep(levels: int) -> Any:
    out: Any = "x"
    for _ in range(levels):
        out = {"a": [out]}
    return out


def _set(path: str, value: Any, key: str | None = None) -> Edit:
    """An edit of the pod: ``path`` is dot-separated keys (ints index lists), then ``key`` if given."""
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    if key is not None:
        parents, last = [*parents, last], key

    def edit(pod: dict[str, Any]) -> None:
        node: Any = pod
        for p in parents:
            node = node[p]
        node[last] = value
    return edit


# (fixture, edit, field the message names)
MALFORMED = [
    pytest.param("d", _set("metadata", "x"), "metadata", id="metadata-string"),
    pytest.param("d", _set("metadata.annotations", ["a"]), "metadata.annotations", id="annotations-list"),
    pytest.param("f", _set("metadata.annotations", 3, "gpu-tailor.io/isolation"), "metadata.annotations",
                 id="annotation-value-int"),
    pytest.param("d", _set("spec", ["x"]), "spec", id="spec-list"),
    pytest.param("d", _set("spec.containers", {"name": "main"}), "spec.containers", id="containers-dict"),
    pytest.param("d", _set("spec.containers", "main"), "spec.containers", id="containers-string"),
    pytest.param("d", _set("spec.containers.0", "main"), "spec.containers[0]", id="container-string"),
    pytest.param("k", _set("spec.initContainers", 7), "spec.initContainers", id="init-containers-int"),
    pytest.param("d", _set("spec.containers.0.resources", ["x"]), "spec.containers[0].resources",
                 id="resources-list"),
    pytest.param("d", _set("spec.containers.0.resources.requests", ["x"]), "spec.containers[0].resources.requests",
                 id="requests-list"),
    pytest.param("d", _set("spec.containers.0.resources.limits", "250"), "spec.containers[0].resources.limits",
                 id="limits-string"),
    pytest.param("d", _set("spec.containers.0.resources.limits", {"v": 1}, "gpu-tailor.io/gpu-milli"),
                 "spec.containers[0].resources.limits", id="quantity-object"),
    pytest.param("d", _set("spec.containers.0.name", ["main"]), "spec.containers[0].name", id="name-list"),
    pytest.param("d", _set("spec.tolerations", {"key": "x"}), "spec.tolerations", id="tolerations-dict"),
    pytest.param("d", _set("spec.tolerations", ["x"]), "spec.tolerations[0]", id="toleration-string"),
    pytest.param("d", _set("spec.affinity", "x"), "spec.affinity", id="affinity-string"),
    pytest.param("d", _set("spec.affinity", {"nodeAffinity": []}), "spec.affinity.nodeAffinity",
                 id="node-affinity-list"),
    pytest.param("d", _set("spec.affinity", {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                                              {"nodeSelectorTerms": {}}}}),
                 "nodeSelectorTerms", id="terms-dict"),
    pytest.param("d", _set("spec.affinity", {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                                              {"nodeSelectorTerms": [{"matchExpressions": 1}]}}}),
                 "matchExpressions", id="match-expressions-int"),
    pytest.param("d", _set("spec.schedulerName", 5), "spec.schedulerName", id="scheduler-name-int"),
    pytest.param("d", _set("spec.overhead", [1]), "spec.overhead", id="overhead-list"),
    pytest.param("d", _set("spec.volumes", [_deep(300)]), "nested", id="nested-300-deep"),
]


def review_with(letter: str, edit: Edit) -> dict[str, Any]:
    review = copy.deepcopy(review_fixture(letter))
    edit(review["request"]["object"])
    return review


@pytest.mark.parametrize(("letter", "edit", "where"), MALFORMED)
def test_decide_answers_400_naming_the_field(letter: str, edit: Edit, where: str) -> None:
    view = ClusterView(AdmissionPolicy())
    view.reset(NODES)
    d = decide(review_with(letter, edit)["request"], view.candidates(), view.policy)
    assert (d.allowed, d.code) == (False, 400)
    assert where in d.message


@pytest.fixture
async def client() -> AsyncIterator[TestClient[web.Request, web.Application]]:
    view = ClusterView(AdmissionPolicy())
    view.reset(NODES)
    async with TestClient(TestServer(make_app(view))) as c:
        yield c


@pytest.mark.parametrize(("letter", "edit", "where"), MALFORMED)
async def test_over_http_it_is_an_admission_answer_not_a_500(
        client: TestClient[web.Request, web.Application], letter: str, edit: Edit, where: str) -> None:
    review = review_with(letter, edit)
    resp = await client.post("/mutate", json=review)
    assert resp.status == 200
    out = (await resp.json())["response"]
    assert out["uid"] == review["request"]["uid"] and out["allowed"] is False
    assert out["status"]["code"] == 400 and out["status"]["reason"] == "BadRequest"
    assert where in out["status"]["message"]


@pytest.mark.parametrize("obj", [None, "x", ["pod"], 3], ids=["null", "string", "list", "int"])
async def test_a_pod_review_without_a_pod_object_is_400(client: TestClient[web.Request, web.Application],
                                                        obj: Any) -> None:
    review = review_fixture("d")
    review["request"]["object"] = obj
    out = (await (await client.post("/mutate", json=review)).json())["response"]
    assert out["allowed"] is False and out["status"]["code"] == 400 and "object" in out["status"]["message"]


@pytest.mark.parametrize("letter", ["a", "d", "k", "l"])
async def test_nulls_where_kubernetes_omits_are_accepted(client: TestClient[web.Request, web.Application],
                                                         letter: str) -> None:
    review = review_fixture(letter)
    pod = review["request"]["object"]
    pod["metadata"]["annotations"] = None
    pod["spec"]["tolerations"] = None
    pod["spec"]["affinity"] = None
    for c in pod["spec"]["containers"]:
        c["resources"].setdefault("requests", None)
    out = (await (await client.post("/mutate", json=review)).json())["response"]
    assert out["allowed"] is True
