"""A group's object read on the spot, against a real API server and under the extender's own ServiceAccount (its
RBAC from manifests/): the getter the group watches give ``LiveGroups`` for Jobs (``kube.groupobjects.getter`` on
their ``SOURCES`` row) reads an Indexed Job that a store no watch feeds has never seen, and a Job that does not exist
is answered as absent, not as an error. The extender uses this for a pod that reaches its filter before the watch has
brought the object sizing its group."""

from __future__ import annotations

import logging

import pytest

from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.groups import GroupObjects, group_of, resolved
from gpu_tailor.kube.groupobjects import SOURCES, LiveGroups, getter
from gpu_tailor.kube.watch import watching
from tests.e2e.kube import Obj, api_path
from tests.e2e.pods import gpu_pod, unique
from tests.e2e.services import Stack

pytestmark = pytest.mark.e2e


def indexed_job(name: str, parallelism: int) -> Obj:
    """A suspended Indexed Job: the API holds it, the Job controller makes no pod of it."""
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"completionMode": "Indexed", "completions": parallelism, "parallelism": parallelism,
                     "suspend": True, "template": {"spec": {"restartPolicy": "Never", "containers": [
                         {"name": "main", "image": "registry.k8s.io/pause:3.9"}]}}}}


def job_pod(job: str, namespace: str) -> Obj:
    """Index 0 of the Job's pods, as the Job controller labels it."""
    pod = gpu_pod(f"{job}-0", {labels.GPU_RESOURCE: "4"})
    pod["metadata"].update(namespace=namespace, labels={labels.JOB_NAME: job},
                           annotations={labels.JOB_COMPLETION_INDEX: "0"})
    return pod


async def test_an_indexed_job_is_read_on_the_spot_under_the_extenders_rbac(cluster: Stack,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    """Jobs' row of the group sources, read with the getter the watches give ``LiveGroups`` once Jobs are served (no
    watch runs here: a store no watch feeds is the one read into)."""
    caplog.set_level(logging.WARNING, logger="gpu_tailor.kube.groupobjects")
    ns, name = cluster.opted_in, unique("sized")
    cluster.kube.create(api_path("jobs", ns, group="batch/v1"), indexed_job(name, 3))
    kubeconfig = cluster.extender.argv[cluster.extender.argv.index("--kubeconfig") + 1]
    unseen = GroupObjects()
    live = LiveGroups(unseen)
    async with watching(kubeconfig, False, lambda api: []) as api:
        from kubernetes_asyncio import client

        (row,) = [s for s in SOURCES if s[0] == "job"]
        live.getters["job"] = (getter(client.CustomObjectsApi(api), *row[1:4]), row[4])
        ref = group_of(job_pod(name, ns))
        assert ref is not None and resolved(ref, unseen.objects, ()).size == 0
        await live.fetch(ref)
        assert resolved(ref, unseen.objects, ()).size == 3
        missing = group_of(job_pod(unique("never"), ns))
        assert missing is not None
        await live.fetch(missing)  # 404: absent, kept absent
        assert (missing.source or missing.key) not in unseen.objects and (missing.source or missing.key) in live.asked
    # neither read was refused (a 403 would be logged and leave the store as empty as a 404 does)
    assert not [r.getMessage() for r in caplog.records if r.name == "gpu_tailor.kube.groupobjects"]
