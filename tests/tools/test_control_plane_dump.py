"""Both commands on a dump of the real control plane (``kubectl get nodes,pods,namespaces -A -o json``, taken
by ``tests/e2e/test_explain.py`` with ``GPU_TAILOR_WRITE_DUMP``): the fixture nodes, a 2-GPU pod on the HGX
board, three quarter T4s and a MIG slice bound by gpu-tailor-scheduler, gpu-tailor's own pods, and the
namespaces with their labels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_tailor.cli import kubectl_main, main
from gpu_tailor.tools.capacity import capacity
from gpu_tailor.tools.explain import explain
from gpu_tailor.tools.source import load_dump
from gpu_tailor.webhook.config import AdmissionPolicy
from tests.conftest import FIXTURES
from tests.tools.builders import pod, review_pod

DUMP = FIXTURES / "cluster" / "control-plane-dump.json"


def test_the_dump_reads_nodes_pods_and_namespace_labels() -> None:
    cluster = load_dump(str(DUMP))
    assert len(cluster.nodes) == 9 and len(cluster.pods) == 9
    assert cluster.namespaces is not None
    assert cluster.namespaces["team-a"]["gpu-tailor.io/enabled"] == "true"
    assert "gpu-tailor.io/enabled" not in cluster.namespaces["team-b"]


def test_explain_sees_what_is_bound() -> None:
    cluster = load_dump(str(DUMP))
    said = explain(review_pod("a"), "pod", cluster, AdmissionPolicy())
    assert (said.chosen, said.gpus) == ("h100-hgx-0", [2, 3])  # hold-two has GPUs 0 and 1
    assert not any("assumed opted in" in n for n in said.notes)  # the dump has the namespaces
    quarter = explain(review_pod("d"), "pod", cluster, AdmissionPolicy())
    # GPU 0 holds three replicas: the device plugin's default policy takes one of the GPUs with none
    assert (quarter.chosen, quarter.gpus, quarter.maybe) == ("t4-timeslice-0", [1], [1, 2, 3])


def test_explain_in_a_namespace_the_dump_shows_not_opted_in() -> None:
    said = explain(pod("p", {"gpu-tailor.io/gpu-milli": "250"}, namespace="team-b"), "pod", load_dump(str(DUMP)),
                   AdmissionPolicy())
    assert not said.admission.called and said.scheduler == "default-scheduler"


def test_capacity_of_the_dump() -> None:
    r = capacity(load_dump(str(DUMP)))
    assert r.mix == "learnt from 5 GPU pod(s) bound now"
    assert r.fits["8x H100 on NVLink"] == 0 and r.fits["1x H100"] == 11
    assert r.fits["quarter T4 (time-slicing)"] == 13 and r.fits["mig-1g.5gb (A100)"] == 15
    t4 = next(p for p in r.pools if p.product == "T4")
    assert (t4.in_use, t4.free, t4.units["nvidia.com/gpu"]) == (1, 7, "3/16")


@pytest.mark.parametrize("entry", [main, kubectl_main], ids=["gpu-tailor", "kubectl gpu-tailor"])
def test_both_commands_print_tables_and_json(entry: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert callable(entry)
    manifest = tmp_path / "deploy.yaml"
    manifest.write_text(json.dumps({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                                    "spec": {"template": {"spec": review_pod("d")["spec"]}}}))
    assert entry(["explain", "-f", str(manifest), "-n", "team-a", "--cluster-file", str(DUMP)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Deployment team-a/web, read from cluster file {DUMP}")
    assert "would bind to t4-timeslice-0, GPU 1, 2 or 3 (the device plugin picks)" in out
    assert "+        nvidia.com/gpu: '1'" in out
    assert entry(["explain", "-f", str(manifest), "-n", "team-a", "--cluster-file", str(DUMP), "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["chosen"] == "t4-timeslice-0"
    assert entry(["capacity", "--cluster-file", str(DUMP)]) == 0
    assert "8x H100 on NVLink                                   0" in capsys.readouterr().out
    assert entry(["capacity", "--cluster-file", str(DUMP), "--output", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["fits"]["1x H100"] == 11
