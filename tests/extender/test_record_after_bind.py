"""kube-scheduler binds (no bindVerb): the extender counts a GPU pod on the node it ranked first until the
watch shows where it went, and the replica that scored it writes its GPUs on it after the bind, once, when
kube-scheduler goes quiet (``extender/recorder.py``)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from gpu_tailor.extender import verbs
from gpu_tailor.extender.cache import Cache
from gpu_tailor.extender.recorder import Changed, Recorder, Refused, record_patch
from gpu_tailor.extender.snapshot import Verdicts
from gpu_tailor.gpumodel import labels
from tests.conftest import node_fixture
from tests.extender.builders import RecordingBinder, args, cluster, gpu_pod, pod_of

KEY = "gpu-jobs/train-gpu4"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def held(cache: Cache, node: str) -> list[int]:
    return [i for i in range(8) if i not in cache.snapshot().nodes[node].state.gpus.free_whole()]


def bound(node: str, version: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    pod = copy.deepcopy(pod_of("prioritize-nodecache-true-pod-gpu4"))
    pod["spec"]["nodeName"] = node
    pod["metadata"]["resourceVersion"] = version
    if annotations:
        pod["metadata"].setdefault("annotations", {}).update(annotations)
    return pod


async def prioritized(client: Any) -> str:
    """Prioritize the gpu4 fixture pod; the node it ranked first (the only 10)."""
    scores = await (await client.post("/prioritize", json=args("prioritize-nodecache-true-pod-gpu4"))).json()
    top = [s["Host"] for s in scores if s["Score"] == max(x["Score"] for x in scores)]
    assert len(top) == 1, scores
    return str(top[0])


async def test_the_node_ranked_first_counts_the_pod_until_the_watch_shows_it_bound_then_its_gpus_are_recorded(
        client_for: Any) -> None:
    cache = cluster()
    client = await client_for(cache)
    first = await prioritized(client)
    rec = cache.pods[KEY]
    assert (rec.node, rec.scored, rec.assumed) == (first, True, True)
    gpus = held(cache, first)
    assert len(gpus) == 4  # the next filter sees them taken, while kube-scheduler binds
    assert not cache.unrecorded  # nothing to write before the pod is seen bound
    cache.apply_pod("MODIFIED", bound(first, "900"))  # kube-scheduler's Binding: no annotation
    rec = cache.pods[KEY]
    assert (rec.node, rec.assumed, rec.recorded) == (first, False, None)
    assert held(cache, first) == gpus  # the GPUs it was counted on stay
    recorder = Recorder(cache, no_write, CollectorRegistry())
    taken = recorder.take()
    assert taken is not None
    among = verbs.BindPlan(rec.placement).among  # where the device plugin may pick other GPUs, the set
    assert taken == (KEY, rec.uid, record_patch(rec.uid, "900", ",".join(map(str, gpus)), among))
    assert recorder.take() is None  # once
    # the write's news: the same GPUs, nothing moves and nothing is queued again
    cache.apply_pod("MODIFIED", bound(first, "901", {labels.ANN_GPUS: ",".join(map(str, gpus))}))
    assert cache.pods[KEY].recorded == tuple(gpus) and held(cache, first) == gpus
    assert not cache.unrecorded


async def test_bound_elsewhere_the_pod_is_counted_where_it_went_and_recorded_there(client_for: Any) -> None:
    twin = copy.deepcopy(node_fixture("h100-hgx-0"))
    twin["metadata"]["name"] = other = "h100-hgx-twin"
    cache = cluster(extra_nodes=[twin])
    client = await client_for(cache)
    first = await prioritized(client)  # among the fixture's candidates, which the twin is not
    before = held(cache, other)
    cache.apply_pod("MODIFIED", bound(other, "900"))  # another score plugin outweighed the extender's
    assert held(cache, first) == []
    assert len(set(held(cache, other)) - set(before)) == 4
    assert KEY in cache.unrecorded  # scored by this replica: its record is still written


async def test_asked_again_the_pod_no_longer_counts_where_it_was_ranked_first(client_for: Any) -> None:
    cache = cluster()
    client = await client_for(cache)
    first = await prioritized(client)
    assert len(held(cache, first)) == 4
    out = await (await client.post("/filter", json=args("filter-nodecache-true-pod-gpu4"))).json()
    assert first in out["NodeNames"]  # its own earlier assumption does not keep it from that node
    assert held(cache, first) == []
    assert cache.pods[KEY].node == ""


async def test_a_first_choice_never_bound_frees_its_gpus_after_the_ttl(client_for: Any) -> None:
    clock = Clock()
    cache = cluster(clock=clock, scored_ttl=10.0)
    client = await client_for(cache)
    first = await prioritized(client)
    clock.now += 9
    assert len(held(cache, first)) == 4
    clock.now += 2
    assert held(cache, first) == []
    assert not cache.pods[KEY].assumed and not cache.unrecorded


async def test_a_standby_replica_that_scored_nothing_writes_nothing() -> None:
    standby = cluster()
    standby.apply_pod("MODIFIED", bound("h100-hgx-0", "900"))  # the leader's kube-scheduler bound it
    assert len(held(standby, "h100-hgx-0")) == 4  # counted, as predicted
    assert not standby.unrecorded  # but the replica that scored it writes its record


async def test_with_the_bind_verb_a_first_choice_is_bound_without_reading_the_pod(client_for: Any) -> None:
    cache = cluster()
    binder = RecordingBinder()
    client = await client_for(cache, binder)
    first = await prioritized(client)
    gpus = held(cache, first)
    body = {**args("bind-pod-gpu4"), "Node": first}
    assert (await (await client.post("/bind", json=body)).json())["Error"] == ""
    assert binder.reads == []  # the assumption was prioritize's, not a Binding of unknown outcome
    assert binder.calls[-1][3:] == (first, ",".join(map(str, gpus)))
    rec = cache.pods[KEY]
    assert not rec.scored and rec.assumed and held(cache, first) == gpus
    cache.apply_pod("MODIFIED", bound(first, "900", {labels.ANN_GPUS: ",".join(map(str, gpus))}))
    assert not cache.unrecorded  # the Binding carried the record


async def no_write(namespace: str, name: str, patch: dict[str, Any]) -> None:
    raise AssertionError("not written in this test")


class Api:
    """Takes merge patches; ``fail``: how to answer the next ones ("down", "gone")."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.fail: list[str] = []
        self.called = asyncio.Event()

    async def patch(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self.called.set()
        if self.fail:
            what = self.fail.pop(0)
            if what == "gone":
                raise Refused('404: pods "x" not found')
            if what == "conflict":
                raise Changed("the object has been modified")
            raise aiohttp.ClientConnectionError("connection refused")
        self.patches.append((f"{namespace}/{name}", patch))


class Sleeps:
    """``sleep`` for the recorder: advances the fake clock instead of waiting, and lets the loop turn."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.slept: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.clock.now += seconds
        await asyncio.sleep(0)


def scored_and_bound(clock: Clock) -> Cache:
    cache = cluster(clock=clock)
    cache.remember(pod_of("prioritize-nodecache-true-pod-gpu4"))  # asked about by this replica's kube-scheduler
    rec = cache.pending(KEY, "")
    assert rec is not None
    cache.assume(rec, "h100-hgx-0", None, scored=True)
    cache.apply_pod("MODIFIED", bound("h100-hgx-0", "900"))
    assert KEY in cache.unrecorded
    return cache


async def run_until(recorder: Recorder, done: Any) -> None:
    task = asyncio.create_task(recorder.run())
    try:
        for _ in range(10_000):  # bounded: each turn of the fake clock is one loop turn
            if done():
                return
            await asyncio.sleep(0)
        raise AssertionError("the recorder never got there")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_records_wait_for_kube_scheduler_to_go_quiet() -> None:
    clock = Clock()
    cache = scored_and_bound(clock)
    cache.last_asked = clock.now  # kube-scheduler is asking
    api, sleeps = Api(), Sleeps(clock)
    recorder = Recorder(cache, api.patch, CollectorRegistry(), writers=2, quiet=0.5, overdue=30.0, sleep=sleeps)
    await run_until(recorder, lambda: api.patches)
    assert clock.now - cache.last_asked >= 0.5  # written once quiet, not before
    rec = cache.pods[KEY]
    gpus = ",".join(map(str, held(cache, "h100-hgx-0")))
    assert api.patches == [(KEY, record_patch(rec.uid, "900", gpus, verbs.BindPlan(rec.placement).among))]


async def test_an_overdue_record_is_written_though_kube_scheduler_never_goes_quiet() -> None:
    clock = Clock()
    cache = scored_and_bound(clock)
    api = Api()

    class Busy(Sleeps):
        async def __call__(self, seconds: float) -> None:
            self.clock.now += seconds
            cache.last_asked = clock.now  # asked again whenever time passes
            await asyncio.sleep(0)

    cache.last_asked = clock.now
    recorder = Recorder(cache, api.patch, CollectorRegistry(), writers=2, quiet=0.5, overdue=30.0, sleep=Busy(clock))
    await run_until(recorder, lambda: api.patches)
    assert clock.now - 1000.0 >= 30.0 and len(api.patches) == 1


async def test_a_write_is_retried_while_the_api_server_is_away_and_dropped_when_the_pod_is_gone() -> None:
    clock = Clock()
    cache = scored_and_bound(clock)
    api, sleeps = Api(), Sleeps(clock)
    api.fail = ["down", "down"]
    registry = CollectorRegistry()
    recorder = Recorder(cache, api.patch, registry, writers=1, quiet=0.0, sleep=sleeps)
    await run_until(recorder, lambda: api.patches)
    assert len(api.patches) == 1 and sleeps.slept[-2:] == [0.5, 1.0]  # growing delay
    assert registry.get_sample_value("gpu_tailor_extender_records_written_total", {"outcome": "retried"}) == 2

    cache = scored_and_bound(clock)
    api = Api()
    api.fail = ["gone"]
    registry = CollectorRegistry()
    recorder = Recorder(cache, api.patch, registry, writers=1, quiet=0.0, sleep=Sleeps(clock))
    await run_until(recorder, lambda: registry.get_sample_value("gpu_tailor_extender_records_written_total",
                                                                {"outcome": "refused"}) == 1)
    assert api.patches == [] and not cache.unrecorded


@pytest.mark.parametrize("change", ["deleted", "recorded", "replaced"])
async def test_a_pod_that_moved_on_before_its_turn_is_not_written(change: str) -> None:
    clock = Clock()
    cache = scored_and_bound(clock)
    if change == "deleted":
        cache.apply_pod("DELETED", bound("h100-hgx-0", "901"))
    elif change == "recorded":  # written meanwhile (by the replica that led before)
        cache.apply_pod("MODIFIED", bound("h100-hgx-0", "901", {labels.ANN_GPUS: "0,1,2,3"}))
    else:
        pod = bound("h100-hgx-0", "901")
        pod["metadata"]["uid"] = "another"
        cache.apply_pod("MODIFIED", pod)
    recorder = Recorder(cache, no_write, CollectorRegistry())
    assert recorder.take() is None and not cache.unrecorded


async def test_a_conflict_is_written_again_at_the_newer_version_unless_another_replica_wrote_it() -> None:
    clock = Clock()
    cache = scored_and_bound(clock)
    api = Api()
    api.fail = ["conflict"]

    class KubeletWrites(Sleeps):  # the watch brings the version that conflicted a little later
        async def __call__(self, seconds: float) -> None:
            await super().__call__(seconds)
            if len(self.slept) == 2:
                status = bound("h100-hgx-0", "950")
                status["status"] = {"phase": "Running"}
                cache.apply_pod("MODIFIED", status)

    recorder = Recorder(cache, api.patch, CollectorRegistry(), writers=1, quiet=0.0, sleep=KubeletWrites(clock))
    await run_until(recorder, lambda: api.patches)
    assert [p["metadata"]["resourceVersion"] for _, p in api.patches] == ["950"]

    cache = scored_and_bound(clock)
    api = Api()
    api.fail = ["conflict"]

    class OtherReplicaWrote(Sleeps):
        async def __call__(self, seconds: float) -> None:
            await super().__call__(seconds)
            cache.apply_pod("MODIFIED", bound("h100-hgx-0", "951", {labels.ANN_GPUS: "4,5,6,7"}))

    registry = CollectorRegistry()
    recorder = Recorder(cache, api.patch, registry, writers=1, quiet=0.0, sleep=OtherReplicaWrote(clock))
    await run_until(recorder, lambda: recorder.writing == 0 and not cache.unrecorded and registry.get_sample_value(
        "gpu_tailor_extender_records_written_total", {"outcome": "conflict"}) == 1)
    assert api.patches == []
    assert cache.pods[KEY].recorded == (4, 5, 6, 7)  # the other replica's record stands


async def test_a_pod_asked_about_after_the_watch_showed_it_deleted_counts_nowhere(client_for: Any) -> None:
    # kube-scheduler's queue lags the watch: a pod deleted right after its create can still be filtered and scored
    cache = cluster()
    client = await client_for(cache)
    cache.apply_pod("DELETED", pod_of("prioritize-nodecache-true-pod-gpu4"))
    scores = await (await client.post("/prioritize", json=args("prioritize-nodecache-true-pod-gpu4"))).json()
    assert max(s["Score"] for s in scores) == 10  # scored as ever
    assert KEY not in cache.pods and KEY not in cache.asked
    assert held(cache, "h100-hgx-0") == []  # but no phantom where it was ranked first


async def test_a_filter_alone_counts_the_pod_nowhere(client_for: Any) -> None:
    # kube-scheduler takes a lone feasible node without asking prioritize, but a filter call (a probe, a pod a later
    # plugin turns away) binds nothing: the pod is counted once the watch shows it bound
    cache = cluster()
    client = await client_for(cache)
    out = await (await client.post("/filter", json=args("filter-nodecache-true-pod-gpu4", ["h100-hgx-0"]))).json()
    assert out["NodeNames"] == ["h100-hgx-0"]
    assert held(cache, "h100-hgx-0") == [] and cache.pods[KEY].node == ""
    cache.apply_pod("MODIFIED", bound("h100-hgx-0", "900"))  # kube-scheduler bound it there, without prioritize
    assert len(held(cache, "h100-hgx-0")) == 4
    assert KEY in cache.unrecorded  # asked about by this replica: its record is written


async def test_prioritize_right_after_filter_does_not_fit_the_candidates_again(client_for: Any,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    cache = cluster()
    client = await client_for(cache)
    calls: list[int] = []
    fits = Verdicts.fits

    def counted(self: Verdicts, *a: Any) -> Any:
        calls.append(1)
        return fits(self, *a)

    async def filter_then_prioritize(between: Any = None) -> Any:
        out = await (await client.post("/filter", json=args("filter-nodecache-true-pod-gpu4"))).json()
        if between is not None:
            between()
        body = args("prioritize-nodecache-true-pod-gpu4", out["NodeNames"])  # what filter passed, as kube-scheduler
        return await (await client.post("/prioritize", json=body)).json()

    monkeypatch.setattr(Verdicts, "fits", counted)
    scores = await filter_then_prioritize()
    assert len(calls) == 1  # filter's verdicts stand: nothing changed between the two calls
    first = next(s["Host"] for s in scores if s["Score"] == 10)
    calls.clear()
    again = await filter_then_prioritize(lambda: cache.apply_pod("MODIFIED", gpu_pod("other", 1, node=first)))
    assert len(calls) == 2  # a node changed in between: fitted again
    assert [s["Host"] for s in again] == [s["Host"] for s in scores]
