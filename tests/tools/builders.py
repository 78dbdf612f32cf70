"""Clusters for the tools' tests: the fixture nodes (real API payloads), pods bound to them, namespaces."""

from __future__ import annotations

import copy
from typing import Any

from gpu_tailor.tools.source import Cluster
from tests.conftest import FIXTURES, node_fixture, review_fixture

Obj = dict[str, Any]
NODES = sorted(p.stem for p in (FIXTURES / "nodes").glob("*.json"))


def fixture_cluster(pods: list[Obj] | None = None, namespaces: dict[str, dict[str, str]] | None = None) -> Cluster:
    return Cluster([node_fixture(n) for n in NODES], list(pods or []), namespaces, "the fixture nodes")


def review_pod(letter: str) -> Obj:
    """The pod of admission fixture ``letter`` as the API server sent it to the webhook."""
    pod: Obj = copy.deepcopy(review_fixture(letter)["request"]["object"])
    return pod


def pod(name: str, limits: dict[str, str], *, namespace: str = "team-a", node: str | None = None,
        cpu: str | None = None, annotations: dict[str, str] | None = None) -> Obj:
    """A one-container pod asking ``limits`` (and ``cpu``); bound to ``node`` when given."""
    resources: Obj = {"limits": dict(limits), "requests": dict(limits)}
    if cpu:
        resources["requests"]["cpu"] = cpu
    spec: Obj = {"containers": [{"name": "main", "image": "busybox", "resources": resources}]}
    if node:
        spec["nodeName"] = node
    meta: Obj = {"name": name, "namespace": namespace, "uid": f"uid-{name}"}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
            "status": {"phase": "Running" if node else "Pending"}}
