"""``gpu-tailor explain`` and ``capacity`` against the real control plane: explain a pod with ``--kubeconfig``,
then create it, and check that explain said what the webhook stored and what gpu-tailor-scheduler did
(the node and GPUs it bound the pod to, or the reasons of its FailedScheduling event). Capacity read
live, through a ``kubectl get ... -o json`` dump, and through ``kubectl gpu-tailor`` must agree.

``GPU_TAILOR_WRITE_DUMP=PATH`` saves the dump the capacity test takes (how
``tests/fixtures/cluster/control-plane-dump.json`` was made).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.cluster import REPO
from tests.e2e.kube import Obj, api_path, wait_for
from tests.e2e.pods import Pods, gpu_pod, gpus_annotation, pod_from_review, unique
from tests.e2e.services import Stack, failed_scheduling, pod_events

pytestmark = pytest.mark.e2e

GPU_TAILOR = [sys.executable, "-m", "gpu_tailor"]
HGX = "h100-hgx-0"


def gpu_tailor(*args: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run([*GPU_TAILOR, *args], capture_output=True, text=True, timeout=120, check=False, cwd=REPO,
                          env=env)
    assert proc.returncode == 0, f"gpu-tailor {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}"
    return proc.stdout


def explain(cluster: Stack, pod: Obj, tmp_path: Path, namespace: str) -> Any:
    manifest = tmp_path / f"{pod['metadata']['name']}.yaml"
    manifest.write_text(yaml.safe_dump(pod))
    return json.loads(gpu_tailor("explain", "-f", str(manifest), "--kubeconfig", str(cluster.cp.kubeconfig),
                                 "-n", namespace, "-o", "json"))


def containers(pod: Obj) -> list[Obj]:
    return [{"name": c["name"], "resources": c.get("resources") or {}}
            for key in ("initContainers", "containers") for c in pod["spec"].get(key) or []]


def gpu_tailor_annotations(pod: Obj) -> dict[str, str]:
    return {k: v for k, v in (pod["metadata"].get("annotations") or {}).items() if k.startswith("gpu-tailor.io/")}


def assert_stored_as_explained(said: Any, stored: Obj) -> None:
    """What the webhook wrote is what explain said it would write."""
    expected = said["stored"]
    assert containers(stored) == containers(expected)
    assert gpu_tailor_annotations(stored) == gpu_tailor_annotations(expected)
    assert stored["spec"]["schedulerName"] == expected["spec"]["schedulerName"]
    assert stored["spec"].get("affinity") == expected["spec"].get("affinity")
    for toleration in expected["spec"].get("tolerations") or []:
        assert toleration in stored["spec"]["tolerations"]


# a fixture pod per backing: 2 whole H100s (an NVLink pair on the HGX board), a quarter of a time-sliced
# T4, a 10 GiB ask served by a MIG slice, a native MIG instance
@pytest.mark.parametrize("letter", ["a", "d", "e", "h"])
def test_explain_agrees_with_the_webhook_and_the_scheduler(letter: str, cluster: Stack, pods: Pods,
                                                           tmp_path: Path) -> None:
    pod = pod_from_review(letter)
    said = explain(cluster, pod, tmp_path, cluster.opted_in)
    assert said["admission"]["called"] and said["admission"]["allowed"], said["admission"]
    assert said["chosen"], said["pending"]
    created = pods.create(cluster.opted_in, pod)
    assert_stored_as_explained(said, created)
    bound = pods.wait_bound(created)
    assert bound["spec"]["nodeName"] == said["chosen"], pod_events(cluster.kube, bound)
    if said["gpus"] is not None:
        assert gpus_annotation(bound) == said["gpus"]
    if letter == "a":
        assert said["nvlink"].startswith("all NVLink-connected")


def test_explain_gives_the_reasons_of_failed_scheduling(cluster: Stack, pods: Pods, tmp_path: Path) -> None:
    holder = pods.create(cluster.opted_in, gpu_pod(unique("hold-one"), {"nvidia.com/gpu": "1"}, node=HGX))
    assert pods.wait_bound(holder)["spec"]["nodeName"] == HGX
    big = gpu_pod(unique("eight-gpus"), {"nvidia.com/gpu": "8"})
    said = explain(cluster, big, tmp_path, cluster.opted_in)
    assert said["chosen"] is None
    created = pods.create(cluster.opted_in, big)
    assert_stored_as_explained(said, created)
    events = wait_for(lambda: failed_scheduling(cluster.kube, created), 30, "a FailedScheduling event",
                      context=cluster.context)
    message = events[-1]
    # explain: "0/9 nodes are available: 1 node sells ..., 5 Insufficient nvidia.com/gpu." -- every part, with
    # its count of nodes, is in kube-scheduler's event
    head, _, parts = said["pending"].rstrip(".").partition(": ")
    assert head in message
    for part in parts.split(", "):
        assert part in message, f"explain said {part!r}; kube-scheduler said {message!r}"
    by_extender = [v for v in said["nodes"] if v["by"] == "gpu-tailor extender"]
    assert by_extender and all(v["reasons"][0] in message for v in by_extender)


def test_explain_in_a_namespace_that_did_not_opt_in(cluster: Stack, pods: Pods, tmp_path: Path) -> None:
    pod = gpu_pod(unique("plain"), {"gpu-tailor.io/gpu-milli": "250"})
    said = explain(cluster, pod, tmp_path, cluster.plain)
    assert not said["admission"]["called"] and "not labelled gpu-tailor.io/enabled=true" in said["admission"]["message"]
    created = pods.create(cluster.plain, pod)
    assert containers(created) == containers(said["stored"])  # as written: the webhook was not called
    assert not gpu_tailor_annotations(created)


def test_capacity_live_from_a_dump_and_as_a_kubectl_plugin(cluster: Stack, pods: Pods, tmp_path: Path) -> None:
    holder = pods.create(cluster.opted_in, gpu_pod(unique("hold-two"), {"nvidia.com/gpu": "2"}, node=HGX))
    assert pods.wait_bound(holder)["spec"]["nodeName"] == HGX
    for letter in ("d", "d", "d", "h"):  # three quarter T4s and a MIG slice: a pod mix to learn from
        pods.wait_bound(pods.create(cluster.opted_in, pod_from_review(letter)))
    live = json.loads(gpu_tailor("capacity", "--kubeconfig", str(cluster.cp.kubeconfig), "-o", "json"))
    dump = tmp_path / "dump.json"
    dump.write_text(cluster.cp.kubectl("get", "nodes,pods,namespaces", "-A", "-o", "json"))
    if os.environ.get("GPU_TAILOR_WRITE_DUMP"):
        Path(os.environ["GPU_TAILOR_WRITE_DUMP"]).write_text(dump.read_text())
    offline = json.loads(gpu_tailor("capacity", "--cluster-file", str(dump), "-o", "json"))
    assert live["pools"] == offline["pools"] and live["fits"] == offline["fits"]
    h100 = next(p for p in live["pools"] if p["product"] == "H100")
    assert h100["in_use"] == 2 and h100["unavailable"] == 3
    assert live["mix"] == "learnt from 5 GPU pod(s) bound now"
    assert live["fits"]["8x H100 on NVLink"] == 0  # two of the HGX board's GPUs are taken
    # kubectl finds kubectl-gpu_tailor on PATH and runs it with kubectl's kubeconfig ($KUBECONFIG)
    env = {**os.environ, "KUBECONFIG": str(cluster.cp.kubeconfig),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run([str(cluster.cp.bin / "kubectl"), "gpu-tailor", "capacity", "-o", "json"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["pools"] == live["pools"]
    # and explain, with the context named as kubectl users name it
    context = yaml.safe_load(cluster.cp.kubeconfig.read_text())["current-context"]
    manifest = tmp_path / "quarter.yaml"
    manifest.write_text(yaml.safe_dump(gpu_pod("quarter", {"gpu-tailor.io/gpu-milli": "250"})))
    direct = json.loads(gpu_tailor("explain", "-f", str(manifest), "--kubeconfig", str(cluster.cp.kubeconfig),
                                   "-n", cluster.opted_in, "-o", "json"))
    proc = subprocess.run([str(cluster.cp.bin / "kubectl"), "gpu-tailor", "explain", "-f", str(manifest), "-n",
                           cluster.opted_in, "--context", context, "-o", "json"], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    plugin = json.loads(proc.stdout)
    assert plugin["source"] == f"kubeconfig {cluster.cp.kubeconfig}, context {context}"
    assert (plugin["chosen"], plugin["gpus"], plugin["stored"]) == (direct["chosen"], direct["gpus"], direct["stored"])
    assert not plugin["notes"]  # the namespace's labels were read: opted in, nothing assumed


def test_explain_sizes_a_group_by_its_indexed_job_read_from_the_api(cluster: Stack, tmp_path: Path) -> None:
    """An Indexed Job's pods say nothing of their group's size: explain reads the Job, as the extender's watch does,
    and shows the group's plan (the Job is suspended: it makes no pod)."""
    ns, name = cluster.opted_in, unique("explained-job")
    template = gpu_pod("member", {"nvidia.com/gpu": "4"})
    template["spec"]["restartPolicy"] = "Never"
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
           "spec": {"suspend": True, "completionMode": "Indexed", "completions": 2, "parallelism": 2,
                    "template": {"spec": template["spec"]}}}
    cluster.kube.create(api_path("jobs", ns, group="batch/v1"), job)
    try:
        member = gpu_pod(f"{name}-0", {"nvidia.com/gpu": "4"}, labels={"batch.kubernetes.io/job-name": name},
                         annotations={"batch.kubernetes.io/job-completion-index": "0"})
        said = explain(cluster, member, tmp_path, ns)
        plans = [n for n in said["notes"] if n.startswith(f"job {ns}/{name}: 2 pods")]
        assert plans and "planned" in plans[0] and f"this pod: {said['chosen']}" in plans[0], said["notes"]
    finally:
        cluster.kube.delete(api_path("jobs", ns, name, group="batch/v1"))
