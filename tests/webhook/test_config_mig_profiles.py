"""The policy file's MIG profiles: only names the device plugin can sell, so only valid resource names."""

from __future__ import annotations

import pytest

from gpu_tailor.webhook.config import ConfigError, parse_policy
from gpu_tailor.webhook.state import declared_candidate


def _mig_offering(product: str, profile: str) -> str:
    return f"offerings: [{{backing: mig, product: {product}, migProfile: {profile}, gpusPerNode: 8}}]"


@pytest.mark.parametrize(("product", "profile", "plain"), [
    ("NVIDIA-H100-80GB-HBM3", "1g.10gb+me", "1g.10gb"),
    ("NVIDIA-A100-SXM4-40GB", "1g.5gb+me", "1g.5gb"),
    ("NVIDIA-A30", "2g.12gb+me", "2g.12gb"),
], ids=["h100", "a100-40gb", "a30"])
def test_media_extension_profiles_are_unknown_and_the_message_says_what_to_declare(
        product: str, profile: str, plain: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_policy(_mig_offering(product, profile))
    message = str(exc.value)
    assert f"offerings[0]: Value error, unknown MIG profile '{profile}' for {product}" in message
    assert f"+me instances are sold as nvidia.com/mig-{plain}" in message
    known = message.split("(known: ", 1)[1].split(")", 1)[0]
    assert plain in known and "+me" not in known


def test_an_unknown_profile_without_me_gets_no_media_hint() -> None:
    with pytest.raises(ConfigError) as exc:
        parse_policy(_mig_offering("NVIDIA-H100-80GB-HBM3", "5g.50gb"))
    assert "unknown MIG profile '5g.50gb'" in str(exc.value) and "+me" not in str(exc.value)


def test_the_plain_profile_is_declared_under_its_own_resource() -> None:
    policy = parse_policy(_mig_offering("NVIDIA-H100-80GB-HBM3", "1g.10gb"))
    candidate = declared_candidate(policy.offerings[0])
    assert (candidate.resource, candidate.backing) == ("nvidia.com/mig-1g.10gb", "mig-1g.10gb")
