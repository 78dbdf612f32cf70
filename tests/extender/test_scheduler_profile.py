"""manifests/scheduler's profile lets the extender's scores decide among GPU nodes (issue 20)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from gpu_tailor.extender.scores import MAX_SCORE
from tests.extender.test_manifests import (
    _load_with_kube_scheduler,
    gpu_resource_names,
    scheduler_config,
)

MAX_NODE_SCORE = 100  # a score plugin's range; an extender's 0..MAX_SCORE is scaled by 100 / 10
# kube-scheduler v1.28's default score plugins and weights (pkg/scheduler/apis/config/v1/default_plugins.go)
DEFAULT_SCORE_WEIGHTS = {"TaintToleration": 3, "NodeAffinity": 2, "NodeResourcesFit": 1, "PodTopologySpread": 2,
                         "InterPodAffinity": 2, "NodeResourcesBalancedAllocation": 1, "ImageLocality": 1,
                         "VolumeBinding": 1}
# the plugins whose score changes as pods fill nodes; the rest follow taints, affinities, images and
# volumes the pod asks for
BY_FILL = ("NodeResourcesFit", "NodeResourcesBalancedAllocation")


def profile_problems(config: dict[str, Any]) -> list[str]:
    """What in a KubeSchedulerConfiguration (as written, or as kube-scheduler writes it back with its
    defaults) would let kube-scheduler's own scores fight the extender's among GPU nodes."""
    problems = []
    (profile,) = config["profiles"]
    ext = config["extenders"][0]
    plugins = profile.get("plugins") or {}
    score = plugins.get("score") or {}
    disabled = {p["name"] for p in score.get("disabled") or []}
    # as written back, kube-scheduler lists its defaults under multiPoint; score.disabled still turns them off
    multi = {p["name"]: p["weight"] for p in (plugins.get("multiPoint") or {}).get("enabled") or []
             if p["name"] in DEFAULT_SCORE_WEIGHTS}
    weights = {n: w for n, w in (multi or DEFAULT_SCORE_WEIGHTS).items() if n not in disabled and "*" not in disabled}
    weights.update({p["name"]: p.get("weight") or weights.get(p["name"], 1) for p in score.get("enabled") or []})
    configs = profile.get("pluginConfig") or []
    fit_args: dict[str, Any] = next((c["args"] for c in configs if c["name"] == "NodeResourcesFit"), {})
    strategy = fit_args.get("scoringStrategy") or {"type": "LeastAllocated"}  # kube-scheduler's default
    if strategy["type"] != "MostAllocated":
        problems.append(f"NodeResourcesFit scores {strategy['type']}: it does not pack")
    by_name = {r["name"]: r["weight"] for r in strategy.get("resources") or []}
    managed = sorted(gpu_resource_names())
    if missing := [n for n in managed if n not in by_name]:
        problems.append(f"GPU resources not scored by NodeResourcesFit: {missing[:3]}...")
    elif min(by_name[n] for n in managed) <= max(by_name.get("cpu", 0), by_name.get("memory", 0)):
        problems.append("GPU resources weigh no more than CPU or memory")
    if "NodeResourcesBalancedAllocation" in weights:
        problems.append("NodeResourcesBalancedAllocation is on: it rewards balance, not fill")
    fill_range = sum(weights.get(n, 0) for n in BY_FILL) * MAX_NODE_SCORE
    level = ext["weight"] * MAX_NODE_SCORE // MAX_SCORE
    if level <= fill_range:
        problems.append(f"one extender level ({level}) does not outweigh what fill scores can add ({fill_range})")
    return problems


def _least_allocated() -> dict[str, Any]:
    config = copy.deepcopy(scheduler_config())
    config["profiles"][0]["pluginConfig"][0]["args"]["scoringStrategy"]["type"] = "LeastAllocated"
    return config


def _default_profile() -> dict[str, Any]:
    config = copy.deepcopy(scheduler_config())
    config["profiles"] = [{"schedulerName": "gpu-tailor-scheduler"}]
    return config


def _balanced_on() -> dict[str, Any]:
    config = copy.deepcopy(scheduler_config())
    del config["profiles"][0]["plugins"]
    return config


def _old_weight() -> dict[str, Any]:
    config = copy.deepcopy(scheduler_config())
    config["extenders"][0]["weight"] = 5
    return config


def _gpu_unweighted() -> dict[str, Any]:
    config = copy.deepcopy(scheduler_config())
    strategy = config["profiles"][0]["pluginConfig"][0]["args"]["scoringStrategy"]
    strategy["resources"] = [{"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1}]
    return config


def test_the_shipped_profile_packs_and_lets_the_extender_decide() -> None:
    assert profile_problems(scheduler_config()) == []


@pytest.mark.parametrize("config,why", [
    pytest.param(_least_allocated, "scores LeastAllocated", id="least-allocated"),
    pytest.param(_default_profile, "scores LeastAllocated", id="kube-scheduler-defaults"),
    pytest.param(_balanced_on, "BalancedAllocation is on", id="balanced-allocation-on"),
    pytest.param(_old_weight, "does not outweigh", id="extender-weight-5"),
    pytest.param(_gpu_unweighted, "not scored by NodeResourcesFit", id="gpu-resources-not-scored"),
])
def test_profiles_that_fight_packing_are_caught(config: Any, why: str) -> None:
    assert any(why in p for p in profile_problems(config()))


def test_kube_scheduler_runs_the_profile_as_written(kube_scheduler: Path, tmp_path: Path) -> None:
    """The real kube-scheduler of each release found loads and validates the config (extended resources in
    scoringStrategy, resource weights in 1..100, the extender's weight) and writes it back with its
    defaults filled in: what it will run has no problem either, and a LeastAllocated one has."""
    binary = kube_scheduler
    code, err, written = _load_with_kube_scheduler(binary, scheduler_config(), tmp_path / "ours")
    assert code == 0, err
    assert profile_problems(written) == []
    (profile,) = written["profiles"]
    score = profile["plugins"]["score"]
    assert [p["name"] for p in score["disabled"]] == ["NodeResourcesBalancedAllocation"]
    assert "NodeResourcesBalancedAllocation" not in [p["name"] for p in score.get("enabled") or []]
    fit = next(c["args"] for c in profile["pluginConfig"] if c["name"] == "NodeResourcesFit")
    assert fit["scoringStrategy"]["type"] == "MostAllocated"
    assert {"name": "nvidia.com/gpu", "weight": 10} in fit["scoringStrategy"]["resources"]
    code, err, written = _load_with_kube_scheduler(binary, _least_allocated(), tmp_path / "least")
    assert code == 0, err
    assert any("LeastAllocated" in p for p in profile_problems(written))
