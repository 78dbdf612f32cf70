"""MIG follows the NVIDIA device plugin: what is free of a profile is its allocatable minus what is used.

mig-manager has cut every GPU of the fixture A100 node into the fixed all-balanced layout (per GPU
2x 1g.5gb, 1x 2g.10gb, 1x 3g.20gb) and the device plugin advertises 16, 8 and 8 instances. Whatever
order pods arrive in, exactly that many are placed and the next one of a profile is turned away: the
webhook's decision says no instance is free (the pod is admitted and waits), the extender's filter
fails the node (preemption could help). Each bound instance is recorded on a GPU the layout gives it,
and several instances in one pod are that many instances.

The webhook is fed the bound pods (``ClusterView`` with used counts); the extender is driven over HTTP
(filter, bind), with the watch confirming each binding, as kube-scheduler and the API server would.
"""

from __future__ import annotations

import copy
import itertools
from collections import Counter
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpu_tailor.extender.cache import Cache
from gpu_tailor.extender.server import make_app
from gpu_tailor.gpumodel import labels
from gpu_tailor.webhook.config import AdmissionPolicy
from gpu_tailor.webhook.mutate import Decision, decide
from gpu_tailor.webhook.state import ClusterView
from tests.conftest import FIXTURES, load_fixture, node_fixture, review_fixture

NODE = "a100-mig-mixed-0"
NODES = sorted(p.stem for p in (FIXTURES / "nodes").glob("*.json"))
COUNTS = {"1g.5gb": 16, "2g.10gb": 8, "3g.20gb": 8}  # allocatable
PER_GPU = {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}  # all-balanced, on each of the 8 GPUs
ORDERS = list(itertools.permutations(COUNTS))
ORDER_IDS = [",".join(p.split(".")[0] for p in order) for order in ORDERS]


def mig_pod(name: str, profile: str, units: int = 1) -> dict[str, Any]:
    """The captured MIG pod (as kube-scheduler sent it to filter), asking ``units`` instances of ``profile``."""
    pod: dict[str, Any] = copy.deepcopy(load_fixture("extender", "filter-nodecache-true-pod-mig-1g.5gb.json")["Pod"])
    pod["metadata"].update(name=name, uid=f"uid-{name}")
    asked = {f"nvidia.com/mig-{profile}": str(units)}
    pod["spec"]["containers"][0]["resources"] = {"limits": dict(asked), "requests": dict(asked)}
    return pod


def bound(pod: dict[str, Any], gpus: str | None = None) -> dict[str, Any]:
    """The pod as the watch shows it once bound to the A100 node (with the GPUs bind recorded)."""
    out = copy.deepcopy(pod)
    out["spec"]["nodeName"] = NODE
    out["status"] = {"phase": "Running"}
    if gpus is not None:
        out["metadata"]["annotations"] = {labels.ANN_GPUS: gpus}
    return out


def admit(pod: dict[str, Any], running: list[dict[str, Any]]) -> Decision:
    view = ClusterView(AdmissionPolicy())
    view.reset([node_fixture(n) for n in NODES], running)
    request = {**review_fixture("h")["request"], "object": pod}
    return decide(request, view.candidates(), view.policy)


def waits(decision: Decision) -> list[str]:
    assert decision.allowed, decision.message
    return [w for w in decision.warnings if "free right now" in w]


def no_room(profile: str, units: int = 1) -> list[str]:
    return [f"no node has {units} x nvidia.com/mig-{profile} free right now; the pod waits for capacity"]


# ----- the webhook ---------------------------------------------------------------------------------

@pytest.mark.parametrize("order", ORDERS, ids=ORDER_IDS)
def test_the_webhook_counts_exactly_the_advertised_instances_free(order: tuple[str, ...]) -> None:
    running: list[dict[str, Any]] = []
    for profile in order:
        for i in range(COUNTS[profile]):
            pod = mig_pod(f"{profile}-{i}", profile)
            assert waits(admit(pod, running)) == [], (profile, i)
            running.append(bound(pod))
        assert waits(admit(mig_pod(f"{profile}-next", profile), running)) == no_room(profile)
    for profile in COUNTS:  # and at the end, none of any profile
        assert waits(admit(mig_pod(f"{profile}-last", profile), running)) == no_room(profile)


def test_the_webhook_counts_several_instances_of_one_pod() -> None:
    running = [bound(mig_pod(f"pair-{i}", "1g.5gb", 2)) for i in range(7)]
    assert waits(admit(mig_pod("pair-7", "1g.5gb", 2), running)) == []
    running.append(bound(mig_pod("one", "1g.5gb")))  # 15 of 16 used: one instance left, not two
    assert waits(admit(mig_pod("pair-8", "1g.5gb", 2), running)) == no_room("1g.5gb", 2)
    assert waits(admit(mig_pod("one-more", "1g.5gb"), running)) == []


def test_a_portable_mig_ask_is_told_when_no_instance_is_free() -> None:
    """A virtual ask takes a profile that is free; when none is, it is admitted with a warning."""
    pod = copy.deepcopy(review_fixture("e")["request"]["object"])  # 10Gi of GPU memory
    pod["metadata"]["annotations"] = {labels.ANN_ISOLATION: "mig"}
    request = {**review_fixture("e")["request"], "object": pod}
    view = ClusterView(AdmissionPolicy())
    running = [bound(mig_pod(f"{p}-{i}", p)) for p in ("2g.10gb",) for i in range(8)]
    view.reset([node_fixture(n) for n in NODES], running)
    d = decide(request, view.candidates(), view.policy)
    assert d.allowed and d.backing == "mig-3g.20gb" and d.warnings == ()  # 2g.10gb is full: the free 3g.20gb
    running += [bound(mig_pod(f"3g.20gb-{i}", "3g.20gb")) for i in range(8)]
    view.reset([node_fixture(n) for n in NODES], running)
    d = decide(request, view.candidates(), view.policy)
    assert d.allowed and d.backing == "mig-2g.10gb"
    assert d.warnings == ("no mig-2g.10gb is free right now; the pod waits for capacity",)


# ----- the extender --------------------------------------------------------------------------------

class Binder:
    """Takes every Binding; keeps (pod name, the gpu-tailor.io/gpus annotation bind wrote)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None]] = []

    async def bind(self, namespace: str, name: str, uid: str, node: str, gpus: str | None,
                   among: str | None = None) -> None:
        self.calls.append((name, gpus))

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None


class Scheduler:
    """kube-scheduler's side of the extender: filter, then bind on the node that passed; the watch then
    shows the pod bound, with the annotation bind wrote."""

    def __init__(self, client: TestClient[Any, Any], cache: Cache, binder: Binder) -> None:
        self.client, self.cache, self.binder = client, cache, binder

    async def filter(self, pod: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = await (await self.client.post("/filter", json={"Pod": pod, "NodeNames": NODES})).json()
        assert out["Error"] == ""
        return out

    async def schedule(self, pod: dict[str, Any]) -> str | None:
        out = await self.filter(pod)
        assert out["NodeNames"] == [NODE], (pod["metadata"]["name"], out["FailedNodes"])
        meta = pod["metadata"]
        bind = {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": NODE}
        assert await (await self.client.post("/bind", json=bind)).json() == {"Error": ""}
        gpus = self.binder.calls[-1][1]
        self.cache.apply_pod("MODIFIED", bound(pod, gpus))
        return gpus


async def extender(nodes: list[dict[str, Any]] | None = None) -> tuple[TestClient[Any, Any], Cache, Binder]:
    """The extender's app over the fixture nodes (or ``nodes``), no pods yet."""
    cache, binder = Cache(), Binder()
    cache.reset_pods([])
    cache.reset_nodes(nodes if nodes is not None else [node_fixture(n) for n in NODES])
    client: TestClient[Any, Any] = TestClient(TestServer(make_app(cache, binder)))
    await client.start_server()
    return client, cache, binder


def layout_of(calls: list[tuple[str, str | None]], profile_of: dict[str, str]) -> Counter[tuple[str, int]]:
    """(profile, GPU) -> instances, from the annotations bind wrote."""
    out: Counter[tuple[str, int]] = Counter()
    for name, gpus in calls:
        assert gpus, f"{name}: no GPUs recorded"
        out.update((profile_of[name], int(g)) for g in gpus.split(","))
    return out


ALL_BALANCED = Counter({(p, g): n for p, n in PER_GPU.items() for g in range(8)})


@pytest.mark.parametrize("order", ORDERS, ids=ORDER_IDS)
async def test_the_extender_places_exactly_the_advertised_instances(order: tuple[str, ...]) -> None:
    client, cache, binder = await extender()
    scheduler = Scheduler(client, cache, binder)
    profile_of: dict[str, str] = {}
    try:
        for profile in order:
            for i in range(COUNTS[profile]):
                name = f"{profile.split('.')[0]}-{i}"
                profile_of[name] = profile
                await scheduler.schedule(mig_pod(name, profile))
            out = await scheduler.filter(mig_pod("next", profile))
            assert out["NodeNames"] == []
            assert out["FailedNodes"] == {NODE: f"mig-{profile}: 0 of {COUNTS[profile]} free"}
        cache.apply_node("MODIFIED", node_fixture(NODE))  # a node event changes nothing of it
        for profile in COUNTS:
            out = await scheduler.filter(mig_pod("last", profile))
            assert out["FailedNodes"] == {NODE: f"mig-{profile}: 0 of {COUNTS[profile]} free"}
    finally:
        await client.close()
    assert layout_of(binder.calls, profile_of) == ALL_BALANCED


@pytest.mark.parametrize(("profile", "units", "first"), [
    ("1g.5gb", 2, "0,0"),
    ("2g.10gb", 2, "0,1"),
    ("3g.20gb", 8, "0,1,2,3,4,5,6,7"),
], ids=["2x1g", "2x2g", "8x3g"])
async def test_a_pod_takes_several_instances(profile: str, units: int, first: str) -> None:
    client, cache, binder = await extender()
    scheduler = Scheduler(client, cache, binder)
    pods = COUNTS[profile] // units
    try:
        for i in range(pods):
            gpus = await scheduler.schedule(mig_pod(f"many-{i}", profile, units))
            assert len((gpus or "").split(",")) == units
            if i == 0:
                assert gpus == first
        out = await scheduler.filter(mig_pod("more", profile, units))
        assert out["FailedNodes"] == {NODE: f"mig-{profile}: 0 of {COUNTS[profile]} free"}
    finally:
        await client.close()
    assert layout_of(binder.calls, dict.fromkeys((n for n, _ in binder.calls), profile)) == Counter(
        {(profile, g): PER_GPU[profile] for g in range(8)})


async def test_where_the_layout_cannot_be_told_instances_are_counted_not_placed() -> None:
    """A node cut by a custom mig-manager config: its GPUs may differ, so which GPU holds an instance
    cannot be told. Bind records no GPUs; the count still decides."""
    node = copy.deepcopy(node_fixture(NODE))
    node["metadata"]["labels"][labels.MIG_CONFIG] = "custom-config"
    client, cache, binder = await extender([node_fixture(n) for n in NODES if n != NODE] + [node])
    scheduler = Scheduler(client, cache, binder)
    try:
        for i in range(4):
            assert await scheduler.schedule(mig_pod(f"custom-{i}", "3g.20gb", 2)) is None
        out = await scheduler.filter(mig_pod("more", "3g.20gb"))
        assert out["FailedNodes"] == {NODE: "mig-3g.20gb: 0 of 8 free"}
    finally:
        await client.close()
