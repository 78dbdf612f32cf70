"""MIG re-layouts seen (issue 32): a node whose ``nvidia.com/mig.config.state`` is not ``success`` is being re-cut by
mig-manager; its labels and allocatable move at different times, so nothing it sells is counted until it is done.
The extender filters it with that reason as resolvable (it comes back), the webhook does not count its capacity, and
the tools say why."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpu_tailor.extender import verbs, wire
from gpu_tailor.extender.cache import Cache
from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.devices.base import HealthState
from gpu_tailor.gpumodel.inventory import from_node
from gpu_tailor.simulate.cluster import sim_node
from gpu_tailor.webhook.config import AdmissionPolicy
from gpu_tailor.webhook.server import make_app
from gpu_tailor.webhook.state import ClusterView
from tests.conftest import FIXTURES, node_fixture, review_fixture
from tests.extender.builders import args

NODES = [json.loads(p.read_text()) for p in sorted((FIXTURES / "nodes").glob("*.json"))]
MIG_NODES = ("a100-mig-mixed-0", "a100-mig-single-0")


def with_state(state: str | None) -> list[dict[str, Any]]:
    out = copy.deepcopy(NODES)
    for n in out:
        if n["metadata"]["name"] in MIG_NODES:
            if state is None:
                n["metadata"]["labels"].pop(labels.MIG_CONFIG_STATE, None)
            else:
                n["metadata"]["labels"][labels.MIG_CONFIG_STATE] = state
    return out


@pytest.mark.parametrize("state", ["pending", "rebooting", "failed"])
def test_a_node_being_re_cut_is_reconfiguring_with_the_reason(state: str) -> None:
    node = node_fixture("a100-mig-mixed-0")
    node["metadata"]["labels"][labels.MIG_CONFIG_STATE] = state
    health = from_node(node).health
    assert health.state is HealthState.RECONFIGURING
    assert f"{labels.MIG_CONFIG_STATE}={state}" in health.reason
    assert f"{labels.MIG_CONFIG}={node['metadata']['labels'][labels.MIG_CONFIG]}" in health.reason


def test_success_or_no_mig_manager_is_healthy() -> None:
    assert from_node(node_fixture("a100-mig-mixed-0")).health.state is HealthState.HEALTHY  # its label says success
    (node,) = [n for n in with_state(None) if n["metadata"]["name"] == "a100-mig-mixed-0"]
    assert from_node(node).health.state is HealthState.HEALTHY


def test_the_extender_filters_it_as_resolvable_with_the_reason() -> None:
    cache = Cache()
    cache.reset_pods([])
    cache.reset_nodes(with_state("pending"))
    body = args("filter-nodecache-true-pod-gpu4", [n["metadata"]["name"] for n in NODES])
    body["Pod"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/mig-1g.5gb": "1"},
                                                         "requests": {"nvidia.com/mig-1g.5gb": "1"}}
    out = verbs.filter_nodes(cache.snapshot(), wire.extender_args(body))
    assert not out["NodeNames"]
    assert "pending" in out["FailedNodes"]["a100-mig-mixed-0"]  # resolvable: it comes back
    assert "a100-mig-mixed-0" not in out["FailedAndUnresolvableNodes"]


async def admit(nodes: list[dict[str, Any]], letter: str) -> tuple[bool, str]:
    view = ClusterView(AdmissionPolicy())
    view.reset(nodes)
    async with TestClient(TestServer(make_app(view))) as client:
        answer = await (await client.post("/mutate", json=review_fixture(letter))).json()
    return bool(answer["response"]["allowed"]), (answer["response"].get("status") or {}).get("message", "")


def test_the_webhook_does_not_count_its_capacity() -> None:
    # f asks for a quarter of an A100 or H100 with MIG isolation: only the A100 MIG nodes sell that
    assert asyncio.run(admit(with_state("success"), "f"))[0]
    allowed, why = asyncio.run(admit(with_state("pending"), "f"))
    assert not allowed and "isolation mig" in why


def test_the_simulator_leaves_it_out_saying_why() -> None:
    (node,) = [n for n in with_state("rebooting") if n["metadata"]["name"] == "a100-mig-mixed-0"]
    why = sim_node(from_node(node))
    assert isinstance(why, str) and why.startswith("reconfiguring") and "rebooting" in why
