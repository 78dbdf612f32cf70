"""The extender's ``--config``: the tie-break and the prior it hands its policy (issue 28), and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_tailor.extender.__main__ import load_settings
from gpu_tailor.extender.cache import Cache


def test_defaults_keep_whole_nodes_with_the_finer_keys_for_multi_gpu_pods_and_no_prior() -> None:
    cache = Cache()
    load_settings(None).apply(cache)
    policy = cache.policy
    assert policy.keep_whole_nodes and policy.tie_keys == "multi-blocks"
    assert (policy.mix.prior.weight, policy.mix.prior.floor) == (0, 0)


def test_a_config_sets_the_ties_and_the_prior(tmp_path: Path) -> None:
    config = tmp_path / "extender.yaml"
    config.write_text("ties: rank\nprior: {weight: 20, floor: 0.002, minGpus: 4}\n")
    cache = Cache()
    load_settings(str(config)).apply(cache)
    policy = cache.policy
    assert not policy.keep_whole_nodes
    prior = policy.mix.prior
    assert (prior.weight, prior.floor, prior.min_gpus) == (20, 0.002, 4)


@pytest.mark.parametrize(("text", "says"), [("ties: nearest\n", "ties"), ("prior: {floor: 1.5}\n", "prior.floor"),
                                            ("prior: {weight: -1}\n", "prior.weight"),
                                            ("prior: {wieght: 3}\n", "prior.wieght")])
def test_bad_settings_name_the_field(tmp_path: Path, text: str, says: str) -> None:
    config = tmp_path / "extender.yaml"
    config.write_text(text)
    with pytest.raises(ValueError, match=says):
        load_settings(str(config))
