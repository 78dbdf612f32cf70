"""Pods for the e2e tests: rebuilt from the captured AdmissionReviews, or made by hand, and tracked so that
each test deletes what it created (force, grace 0: there is no kubelet to finish a graceful deletion)."""

from __future__ import annotations

import copy
import itertools
from functools import partial
from typing import Any

from tests.conftest import review_fixture
from tests.e2e.kube import ApiError, Kube, Obj, api_path, wait_for
from tests.e2e.services import Service, records_pending

_serial = itertools.count()

CONTAINER_FIELDS = ("name", "image", "command", "args", "resources")


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_serial)}"


def pod_from_review(letter: str, name: str | None = None) -> Obj:
    """The pod a user sent in admission fixture ``letter``, without what the API server filled in
    (kube-api-access volume and mounts, default tolerations, priority, status, managedFields ...)."""
    sent = review_fixture(letter)["request"]["object"]
    meta = sent["metadata"]
    out_meta: Obj = {k: copy.deepcopy(meta[k]) for k in ("labels", "annotations") if k in meta}
    if "name" in meta:
        out_meta["name"] = name or unique(meta["name"])
    else:
        out_meta["generateName"] = meta["generateName"]
    spec: Obj = {}
    for key in ("initContainers", "containers"):
        if sent["spec"].get(key):
            spec[key] = [{k: copy.deepcopy(c[k]) for k in CONTAINER_FIELDS if k in c} for c in sent["spec"][key]]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": out_meta, "spec": spec}


def gpu_pod(name: str, limits: dict[str, str], *, node: str | None = None, annotations: dict[str, str] | None = None,
            labels: dict[str, str] | None = None) -> Obj:
    """A one-container pod asking ``limits`` (requests default to them); ``node`` pins it by hostname."""
    spec: Obj = {"containers": [{"name": "main", "image": "nvcr.io/nvidia/cuda:12.2.0-base-ubuntu22.04",
                                 "command": ["sleep", "infinity"], "resources": {"limits": dict(limits)}}]}
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    meta: Obj = {"name": name}
    if annotations:
        meta["annotations"] = dict(annotations)
    if labels:
        meta["labels"] = dict(labels)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def gpus_annotation(pod: Obj) -> list[int]:
    """The GPU indices the extender recorded at bind (``gpu-tailor.io/gpus: "0,1"``)."""
    raw = (pod["metadata"].get("annotations") or {}).get("gpu-tailor.io/gpus", "")
    return [int(g) for g in raw.split(",") if g.strip()]


def _resources(pod: Obj, container: str, which: str) -> dict[str, Any]:
    for key in ("initContainers", "containers"):
        for c in pod["spec"].get(key) or []:
            if c["name"] == container:
                res = c.get("resources") or {}
                return dict(res.get(which) or {})
    raise AssertionError(f"pod has no container {container}")


def limits_of(pod: Obj, container: str) -> dict[str, Any]:
    return _resources(pod, container, "limits")


def requests_of(pod: Obj, container: str) -> dict[str, Any]:
    return _resources(pod, container, "requests")


class Pods:
    """Creates pods and deletes them all (and waits until they are gone) at the end of the test."""

    def __init__(self, kube: Kube, extender: Service | None = None) -> None:
        """``extender``: the one whose kube-scheduler binds the pods; ``wait_bound`` then also waits for the GPUs it
        records after the bind."""
        self.kube, self.extender = kube, extender
        self.created: list[tuple[str, str]] = []

    def create(self, namespace: str, pod: Obj) -> Obj:
        out = self.kube.create(api_path("pods", namespace), pod)
        self.created.append((namespace, out["metadata"]["name"]))
        return out

    def get(self, pod: Obj) -> Obj:
        meta = pod["metadata"]
        return self.kube.get(api_path("pods", meta["namespace"], meta["name"]))

    def wait_bound(self, pod: Obj, timeout: float = 30) -> Obj:
        def bound() -> Obj:
            now = self.get(pod)
            return now if now["spec"].get("nodeName") else {}

        out: Obj = wait_for(bound, timeout, f"pod {pod['metadata']['name']} bound to a node")
        if self.extender is None or not self.extender.alive:
            return out
        # kube-scheduler bound it; the extender that scored it writes its GPUs on it once kube-scheduler is quiet
        extender = self.extender
        wait_for(lambda: records_pending(extender) == 0, timeout, "the extender to write the records",
                 interval=0.1, context=extender.tail)
        return self.get(pod)

    def delete(self, namespace: str, name: str) -> None:
        self.kube.delete(api_path("pods", namespace, name), grace_seconds=0)

    def gone(self, namespace: str, name: str) -> bool:
        return not self.kube.exists(api_path("pods", namespace, name))

    def settled(self, namespace: str, name: str) -> bool:
        """Gone, bound, or told it cannot be placed: no scheduler is in the middle of binding it."""
        try:
            pod = self.kube.get(api_path("pods", namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return True
            raise
        if pod["spec"].get("nodeName"):
            return True
        return any(e.get("reason") == "FailedScheduling" for e in self.kube.events(namespace, "Pod", name))

    def cleanup(self) -> None:
        """Delete every pod the test made, once its scheduling has settled: a pod deleted while it is being
        bound is what test_churn.py is about, not something every test should stumble into."""
        for ns, name in reversed(self.created):  # the last first: deleting an earlier one may let it fit
            wait_for(partial(self.settled, ns, name), 30, f"pod {ns}/{name} scheduled or reported unschedulable")
            self.delete(ns, name)
        for ns, name in self.created:
            wait_for(partial(self.gone, ns, name), 30, f"pod {ns}/{name} deleted")
        self.created.clear()
