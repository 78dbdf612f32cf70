"""Property-based fuzzing of ``/mutate`` with mutated real AdmissionReviews (issue 19).

Each body starts as one of the captured reviews (fixtures a..l, from a v1.28.7 API server) and gets a
few mutations: fields dropped, replaced by any JSON (huge numbers, unicode, deep nesting), renamed,
wrapped or turned into strings; a GPU ask or one of gpu-tailor's annotations set; the operation,
namespace or kind changed; or the bytes cut short. Whatever comes in:

* no 5xx and no exception: a body that is not an AdmissionReview v1 is a 400 naming why, anything
  else an AdmissionReview v1 answer with the request's uid;
* a denial carries a code and a message;
* an allowed JSONPatch applies cleanly (``jsonpatch``) to the object sent, and the pod it yields holds
  GPU resources only as Kubernetes accepts them: no gpu-tailor.io resource left, every NVIDIA
  resource an integer with a limit, requests equal to limits.

Most bodies go to ``server.answer`` (the handler without the HTTP), a slice through the real aiohttp
app. Derandomized, so CI sees the same bodies every run; ``GPU_TAILOR_FUZZ_EXAMPLES`` scales it.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import os
from collections.abc import Iterator
from typing import Any

import jsonpatch
import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.quantity import QuantityError, parse_count, parse_quantity
from gpu_tailor.webhook.config import AdmissionPolicy
from gpu_tailor.webhook.server import answer, make_app
from gpu_tailor.webhook.state import ClusterView
from tests.conftest import FIXTURES, review_fixture

LETTERS = "abcdefghijkl"
REVIEWS = {letter: review_fixture(letter) for letter in LETTERS}
RAW = {letter: orjson.dumps(review) for letter, review in REVIEWS.items()}
NODES = [json.loads(p.read_text()) for p in sorted((FIXTURES / "nodes").glob("*.json"))]
# examples of CHAIN (3) bodies each: 3,000 straight to the handler and 334 through HTTP, 10,002 bodies
DIRECT = int(os.environ.get("GPU_TAILOR_FUZZ_EXAMPLES", "3000"))
OVER_HTTP = max(1, DIRECT // 9 + 1)

QUANTITIES = ["0", "1", "2", "4", "8", "-1", "250", "1000", "1500", "2000", "500m", "1000m", "0.5", "1e3", "1E400",
              "1e-400", "10Gi", "1024Mi", "0.5Gi", "9999999999999999999999Ei", "", " 1", "1 ", "+1", "\u0664", "\uff11",
              "NaN", "0x10", "1.5Gi"]
RESOURCES = [labels.GPU_MILLI, labels.GPU_MEMORY_RESOURCE, labels.GPU_RESOURCE, labels.GPU_SHARED_RESOURCE,
             "nvidia.com/mig-1g.5gb", "nvidia.com/mig-2g.10gb", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-9x.5gb",
             "nvidia.com/foo", "gpu-tailor.io/gpu-cores", "cpu", "memory"]
ANNOTATIONS = [labels.ANN_ASK, labels.ANN_BACKING, labels.ANN_GPUS, labels.ANN_ISOLATION, labels.ANN_TOPOLOGY,
               labels.ANN_GPU_PRODUCT]
ANNOTATION_VALUES = ["whole", "mig-2g.10gb", "shared:time-slicing:4", "0,1", "0", "mig", "mps", "exclusive", "any",
                     "nvlink", "A100|H100", "A100||", "{}", '{"containers":{"main":{"gpuMilli":250}}}', "", "ノード"]
KEYS = ["metadata", "spec", "containers", "initContainers", "resources", "limits", "requests", "annotations",
        "name", "restartPolicy", "overhead", "tolerations", "affinity", "nodeAffinity", "schedulerName", "object",
        "request", "uid", "kind", "operation", "namespace", "Always", *RESOURCES, *ANNOTATIONS]
STRINGS = [*QUANTITIES, *RESOURCES, *ANNOTATIONS, *ANNOTATION_VALUES, "Pod", "CREATE", "UPDATE", "DELETE", "Always",
           "kube-system", "gpu-tailor", "team-a", "default-scheduler", "a" * 300, "\u0000", "\U0001f600"]

leaves = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12), st.sampled_from(STRINGS),
)
values = st.recursive(leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=3),
), max_leaves=6)

Path = tuple[str | int, ...]
# one mutation: (what, where (an index into the body's paths), a JSON value, a key, a number); the
# value and the key are drawn only for the mutations that use them (drawing is most of the run's time)
Op = tuple[str, int, Any, str, int]
where = st.integers(min_value=0, max_value=10**6)
number = st.integers(min_value=0, max_value=400)
keys = st.sampled_from(KEYS) | st.text(max_size=6)
ops = st.one_of(
    st.tuples(st.sampled_from(["drop", "stringify", "deep", "gpu", "annotate"]), where, st.none(), st.just(""), number),
    st.tuples(st.sampled_from(["replace", "add", "request"]), where, values, keys, number),
    st.tuples(st.sampled_from(["retag", "wrap"]), where, st.none(), keys, number),
)
CHAIN = 3  # mutations per example; each prefix of the chain is a body, so an example is CHAIN bodies
bodies = st.tuples(st.sampled_from(LETTERS), st.lists(ops, min_size=CHAIN, max_size=CHAIN),
                   st.sampled_from(["json", "json", "json", "json", "json", "json", "json", "cut", "bytes"]),
                   st.integers(min_value=0, max_value=10**6))


def paths(doc: Any, at: Path = ()) -> Iterator[Path]:
    """Every path in the review, but not into managedFields (big, and nothing reads it)."""
    yield at
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k != "managedFields":
                yield from paths(v, (*at, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from paths(v, (*at, i))


# the paths of each unmutated review (not the root); a mutation picks one, and skips it if an earlier one
# removed it
PATHS = {letter: [p for p in paths(review) if p] for letter, review in REVIEWS.items()}


def parent_of(doc: Any, path: Path) -> Any:
    for step in path[:-1]:
        doc = doc[step]
    return doc


def deep(value: Any, levels: int) -> Any:
    for i in range(levels):
        value = [value] if i % 2 else {"a": value}
    return value


def mutate(letter: str, review: dict[str, Any], op: Op) -> None:
    what, where, value, key, number = op
    obj = (review.get("request") or {}).get("object") if isinstance(review.get("request"), dict) else None
    if what in ("gpu", "annotate"):
        if not isinstance(obj, dict):
            return
        if what == "annotate":
            meta = obj.get("metadata")
            if isinstance(meta, dict) and isinstance(meta.get("annotations", {}), dict):
                annotations = meta.setdefault("annotations", {})
                annotations[ANNOTATIONS[number % len(ANNOTATIONS)]] = ANNOTATION_VALUES[where % len(ANNOTATION_VALUES)]
            return
        spec = obj.get("spec")
        containers = spec.get("initContainers" if number % 3 == 0 else "containers") if isinstance(spec, dict) else None
        if not isinstance(containers, list) or not containers or not isinstance(containers[where % len(containers)],
                                                                                dict):
            return
        c = containers[where % len(containers)]
        if not isinstance(c.get("resources", {}), dict):
            return
        res = c.setdefault("resources", {})
        quantity = QUANTITIES[number % len(QUANTITIES)]
        for part in (("limits", "requests"), ("limits",), ("requests",))[where % 3]:
            if isinstance(res.get(part, {}), dict):
                res.setdefault(part, {})[RESOURCES[(where // 3) % len(RESOURCES)]] = quantity
        if number % 5 == 0:
            c["restartPolicy"] = "Always"
        return
    if what == "request":
        request = review.get("request")
        if isinstance(request, dict):
            field = ["operation", "namespace", "kind", "uid", "oldObject", "userInfo"][number % 6]
            if field == "userInfo" and where % 3 == 0:
                request[field] = {"username": value}
                return
            request[field] = value if where % 2 else {
                "operation": "UPDATE", "namespace": "kube-system", "kind": {"kind": "Node"},
                "uid": "", "oldObject": copy.deepcopy(obj), "userInfo": {"username": "system:serviceaccount:x:y"},
            }[field]
        return
    everywhere = PATHS[letter]
    path = everywhere[where % len(everywhere)]
    try:
        parent: Any = parent_of(review, path)
    except (KeyError, IndexError, TypeError):  # gone or changed by an earlier mutation
        return
    last: Any = path[-1]
    if not ((isinstance(parent, dict) and last in parent)
            or (isinstance(parent, list) and isinstance(last, int) and last < len(parent))):
        return
    if what == "drop":
        del parent[last]
    elif what == "replace":
        parent[last] = value
    elif what == "retag" and isinstance(parent, dict):
        parent[key] = parent.pop(last)
    elif what == "wrap":
        parent[last] = [parent[last]] if number % 2 else {key: parent[last]}
    elif what == "stringify":
        parent[last] = str(parent[last])
    elif what == "deep":
        parent[last] = deep(parent[last], number)
    elif what == "add" and isinstance(parent[last], dict):
        parent[last][key] = value


def bodies_of(letter: str, mutations: list[Op], encoding: str, cut: int) -> Iterator[tuple[bytes, dict[str, Any]]]:
    """The review after each mutation of the chain in turn (the last one's bytes spoiled, for some)."""
    review = orjson.loads(RAW[letter])  # a fresh copy, several times faster than deepcopy
    for i, op in enumerate(mutations):
        mutate(letter, review, op)
        raw = json.dumps(review).encode()
        if i == len(mutations) - 1 and encoding == "cut":
            raw = raw[: cut % max(1, len(raw))]
        elif i == len(mutations) - 1 and encoding == "bytes":
            raw = raw.replace(b'"', b"\xff", 1 + cut % 3)
        yield raw, review


def check(status: int, payload: bytes, review: dict[str, Any]) -> None:
    assert status < 500, payload[:300]
    body = json.loads(payload)
    if status != 200:
        assert status == 400 and body["error"].startswith("not an AdmissionReview v1: "), body
        return
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    out = body["response"]
    request = review["request"]
    assert out["uid"] == request["uid"] and isinstance(request["uid"], str) and request["uid"]
    assert isinstance(out["allowed"], bool)
    assert all(isinstance(w, str) and w for w in out.get("warnings", []))
    if not out["allowed"]:
        assert "patch" not in out
        assert out["status"]["code"] in (400, 403, 422) and out["status"]["message"]
        return
    if "patch" not in out:
        return
    assert out["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(out["patch"]))
    pod = jsonpatch.apply_patch(request["object"], patch)  # raises if it does not apply cleanly
    assert_gpu_resources_as_kubernetes_accepts(pod)


def assert_gpu_resources_as_kubernetes_accepts(pod: dict[str, Any]) -> None:
    spec = pod.get("spec") or {}
    for key in ("initContainers", "containers"):
        for c in spec.get(key) or []:
            res = c.get("resources") or {}
            requests, limits = res.get("requests") or {}, res.get("limits") or {}
            for name in set(requests) | set(limits):
                if not name.startswith(("nvidia.com/", "gpu-tailor.io/")):
                    continue
                assert not name.startswith("gpu-tailor.io/"), f"virtual resource left: {name}"
                assert name in limits, f"{c.get('name')}: {name} requested without a limit"
                parse_count(limits[name])  # a whole number, as the API server requires of extended resources
                if name in requests:
                    assert _same(requests[name], limits[name]), f"{c.get('name')}: {name} requests != limits"


def _same(a: Any, b: Any) -> bool:
    try:
        return parse_quantity(str(a)) == parse_quantity(str(b))
    except QuantityError:
        return False


def view() -> ClusterView:
    v = ClusterView(AdmissionPolicy())
    v.reset(NODES)
    return v


VIEW = view()
FUZZ = settings(deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@settings(FUZZ, max_examples=DIRECT)
@given(bodies)
def test_fuzz_answer(case: tuple[str, list[Op], str, int]) -> None:
    for raw, review in bodies_of(*case):
        out = answer(raw, VIEW)
        check(out.status, out.body, review)


@pytest.fixture(scope="module")
def http() -> Iterator[tuple[asyncio.AbstractEventLoop, TestClient[Any, Any]]]:
    loop = asyncio.new_event_loop()
    client: TestClient[Any, Any] = TestClient(TestServer(make_app(view())), loop=loop)
    loop.run_until_complete(client.start_server())
    try:
        yield loop, client
    finally:
        loop.run_until_complete(client.close())
        loop.close()


def test_fuzz_over_http(http: tuple[asyncio.AbstractEventLoop, TestClient[Any, Any]]) -> None:
    loop, client = http

    async def post(raw: bytes) -> tuple[int, bytes]:
        async with client.post("/mutate", data=raw, headers={"Content-Type": "application/json"}) as resp:
            return resp.status, await resp.read()

    @settings(FUZZ, max_examples=OVER_HTTP)
    @given(bodies)
    def one(case: tuple[str, list[Op], str, int]) -> None:
        for raw, review in bodies_of(*case):
            check(*loop.run_until_complete(post(raw)), review)

    one()


@pytest.mark.parametrize("letter", LETTERS)
def test_unmutated_fixtures_pass_the_same_checks(letter: str) -> None:
    review = REVIEWS[letter]
    out = answer(json.dumps(review).encode(), VIEW)
    check(out.status, out.body, review)


# What the fuzzer found, kept as plain cases (each failed before its fix)
@pytest.mark.parametrize(("letter", "container", "requests", "limits"), [
    # limits 0 made the container ask for no GPU, so its requests 1 were never compared: the pod was
    # allowed, and mutated, with requests 1 and limits 0 on its init container
    pytest.param("k", ("initContainers", 0), {"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "0"}, id="k-init-limits-0"),
    pytest.param("l", ("containers", 0), {"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "0"}, id="l-no-gpu-limits-0"),
])
def test_found_zero_limits_under_a_request_are_a_mismatch(letter: str, container: tuple[str, int],
                                                           requests: dict[str, str], limits: dict[str, str]) -> None:
    review = copy.deepcopy(REVIEWS[letter])
    key, index = container
    review["request"]["object"]["spec"][key][index]["resources"] = {"requests": requests, "limits": limits}
    out = answer(json.dumps(review).encode(), VIEW)
    check(out.status, out.body, review)
    assert out.decision is not None and not out.decision.allowed and out.decision.code == 422
    assert "requests (1) must equal limits (0)" in out.decision.message
