"""Quantities, resource names, product labels and the MIG table."""

from __future__ import annotations

import re
from fractions import Fraction

import pytest

from gpu_tailor.gpumodel import mig
from gpu_tailor.gpumodel.products import normalise
from gpu_tailor.gpumodel.quantity import QuantityError, format_bytes, parse_bytes, parse_count, parse_quantity
from gpu_tailor.gpumodel.resources import (
    SHARED_GPU,
    WHOLE_GPU,
    ResourceKind,
    is_gpu_resource,
    mig_resource,
    parse_resource,
)


@pytest.mark.parametrize(("text", "value"), [
    ("10Gi", Fraction(10 * 2**30)), ("250m", Fraction(1, 4)), ("1e3", Fraction(1000)), ("1.5", Fraction(3, 2)),
    ("924157696Ki", Fraction(924157696 * 1024)), ("2k", Fraction(2000)), (".5Mi", Fraction(2**19)), (3, Fraction(3)),
])
def test_parse_quantity(text: str | int, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("bad", ["", "Gi", "10 Gi", "10GB", "1.2.3", True, None, 1.5])
def test_parse_quantity_rejects(bad: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(bad)


def test_counts_and_bytes() -> None:
    assert parse_count("4") == 4
    with pytest.raises(QuantityError, match="whole number"):
        parse_count("500m")
    with pytest.raises(QuantityError, match="negative"):
        parse_count("-1")
    assert parse_bytes("1.5Ki") == 1536
    assert format_bytes(10 * 2**30) == "10Gi" and format_bytes(1536) == "1536" and format_bytes(0) == "0"


@pytest.mark.parametrize("name", [
    "nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb",
    "nvidia.com/mig-7g.141gb", "nvidia.com/mig-1g.5gb.shared",
])
def test_resource_names_round_trip(name: str) -> None:
    parsed = parse_resource(name)
    assert parsed is not None and str(parsed) == name


def test_resource_name_details() -> None:
    shared_mig = parse_resource("nvidia.com/mig-1g.5gb.shared")
    assert shared_mig is not None
    assert (shared_mig.kind, shared_mig.mig_profile, shared_mig.shared) == (ResourceKind.MIG, "1g.5gb", True)
    for other in ("nvidia.com/mig-1g", "amd.com/gpu", "nvidia.com/gpu.shared.x", "cpu",
                  "nvidia.com/mig-1g.10gb+me", "nvidia.com/mig-1g.10gb+me.shared"):
        assert parse_resource(other) is None
    assert is_gpu_resource("gpu-tailor.io/gpu-milli") and is_gpu_resource("nvidia.com/anything")
    assert not is_gpu_resource("cpu")


@pytest.mark.parametrize(("raw", "base", "model", "shared", "profile", "invalid"), [
    ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-80GB-HBM3", "H100", False, None, False),
    ("Tesla-T4-SHARED", "Tesla-T4", "T4", True, None, False),
    ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "NVIDIA-A100-SXM4-40GB", "A100", False, "1g.5gb", False),
    ("NVIDIA-A100-SXM4-40GB-MIG-INVALID", "NVIDIA-A100-SXM4-40GB", "A100", False, None, True),
    ("Tesla-V100-SXM2-16GB-SHARED", "Tesla-V100-SXM2-16GB", "V100", True, None, False),
    ("NVIDIA-L40S", "NVIDIA-L40S", "L40S", False, None, False),
    ("NVIDIA-L4", "NVIDIA-L4", "L4", False, None, False),
    ("NVIDIA-A10G", "NVIDIA-A10G", "A10G", False, None, False),
    ("Mystery-GPU", "Mystery-GPU", "Mystery-GPU", False, None, False),
])
def test_product_normalisation(raw: str, base: str, model: str, shared: bool, profile: str | None,
                               invalid: bool) -> None:
    p = normalise(raw)
    assert (p.base, p.model, p.shared_suffix, p.mig_profile, p.mig_invalid) == (base, model, shared, profile, invalid)


def test_product_matching_is_case_insensitive_on_model_or_product() -> None:
    p = normalise("NVIDIA-H100-80GB-HBM3")
    assert p.matches("h100") and p.matches("NVIDIA-H100-80GB-HBM3") and not p.matches("A100")


@pytest.mark.parametrize(("product", "sku"), [
    ("NVIDIA-A100-SXM4-40GB", "A100-40GB"), ("NVIDIA-A100-SXM4-80GB", "A100-80GB"),
    ("NVIDIA-A100-80GB-PCIe", "A100-80GB"), ("NVIDIA-H100-80GB-HBM3", "H100-80GB"),
    ("NVIDIA-H100-NVL", "H100-94GB"), ("NVIDIA-H200", "H200-141GB"), ("NVIDIA-A30", "A30-24GB"),
    ("NVIDIA-RTX-A3000", None), ("Tesla-T4", None),
])
def test_sku_for_product(product: str, sku: str | None) -> None:
    found = mig.sku_for_product(product)
    assert (found.key if found else None) == sku


@pytest.mark.parametrize(("sku", "names"), [
    (mig.A100_40GB, ["1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]),
    (mig.A100_80GB, ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
    (mig.H100_80GB, ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
    (mig.H100_94GB, ["1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"]),
    (mig.H200_141GB, ["1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]),
    (mig.A30_24GB, ["1g.6gb", "2g.12gb", "4g.24gb"]),
])
def test_profile_names_per_sku(sku: mig.MigSku, names: list[str]) -> None:
    assert [p.name for p in sku.profiles] == names


def test_profile_geometry() -> None:
    p = mig.A100_40GB.profile("2g.10gb")
    assert p is not None and (p.compute_slices, p.max_instances, p.placements, p.span) == (2, 3, (0, 2, 4), 2)
    assert p.fraction == pytest.approx(2 / 7)
    a30 = mig.A30_24GB.profile("2g.12gb")
    assert a30 is not None and a30.fraction == 0.5


def test_label_only_profile_name_resolves_to_geometry() -> None:
    p = mig.profile_for("NVIDIA-A100-SXM4-80GB", "7g.79gb")
    assert p is not None and (p.name, p.compute_slices, p.max_instances) == ("7g.79gb", 7, 1)
    assert mig.profile_for("NVIDIA-A100-SXM4-80GB", "5g.50gb") is None
    assert mig.profile_for("Tesla-T4", "1g.5gb") is None


@pytest.mark.parametrize("name", ["1g.10gb+me", "1g.5gb+me", "2g.12gb+me", "1g.10gb+me.shared", "1g", "1g.10"])
def test_media_extension_and_malformed_names_are_not_profiles(name: str) -> None:
    # '+' is not allowed in a resource name; the device plugin sells +me instances as the plain profile
    assert mig.parse_profile_name(name) is None
    assert all(sku.resolve(name) is None for sku in mig.SKUS)
    assert parse_resource(f"nvidia.com/mig-{name}") is None


# k8s.io/apimachinery/pkg/util/validation: IsQualifiedName (prefix IsDNS1123Subdomain) and, for an
# extended resource, IsExtendedResourceName (no kubernetes.io prefix, "requests." + name qualified).
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*$")
_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def _qualified_name_problems(name: str) -> list[str]:
    prefix, sep, part = name.rpartition("/")
    problems = []
    if sep and (not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix)):
        problems.append(f"prefix {prefix!r} is not a DNS-1123 subdomain")
    if not part or len(part) > 63 or not _NAME_PART.match(part):
        problems.append(f"name part {part!r} is not alphanumerics, '-', '_' or '.' (at most 63)")
    return problems


def _every_resource_name_we_write() -> list[str]:
    names = {str(WHOLE_GPU), str(SHARED_GPU)}
    for sku in mig.SKUS:
        for p in sku.profiles:
            names |= {str(mig_resource(p.name)), str(mig_resource(p.name, shared=True))}
    return sorted(names)


def test_the_qualified_name_check_refuses_what_kube_scheduler_refused() -> None:
    assert _qualified_name_problems("nvidia.com/mig-1g.10gb+me")  # the v1.28.7 config error
    assert _qualified_name_problems("nvidia.com/-gpu") and _qualified_name_problems("Nvidia.com/gpu")
    assert _qualified_name_problems("nvidia.com/" + "x" * 64)
    assert not _qualified_name_problems("nvidia.com/mig-7g.141gb.shared")


@pytest.mark.parametrize("name", _every_resource_name_we_write())
def test_every_resource_name_we_write_is_a_valid_extended_resource_name(name: str) -> None:
    assert _qualified_name_problems(name) == []
    # IsExtendedResourceName: not native (a prefix, not kubernetes.io), no "requests." prefix, and
    # "requests." + name is itself a qualified name (the ResourceQuota key)
    assert "/" in name and "kubernetes.io/" not in name and not name.startswith("requests.")
    assert _qualified_name_problems("requests." + name) == []
    assert str(parse_resource(name)) == name  # and we read back what we write


def test_every_profile_name_we_accept_stays_a_valid_resource_name() -> None:
    # the longest names parse_profile_name lets through (label-only names like 7g.79gb are resolved too)
    longest = "99g.99999gb"
    assert mig.parse_profile_name(longest) is not None
    assert _qualified_name_problems(str(mig_resource(longest, shared=True))) == []
    assert mig.parse_profile_name("100g.10gb") is None and mig.parse_profile_name("1g.100000gb") is None


@pytest.mark.parametrize(("names", "ok"), [
    (["1g.5gb"] * 7, True),
    (["1g.5gb"] * 8, False),
    (["4g.20gb", "3g.20gb"], True),
    (["3g.20gb", "3g.20gb"], True),
    (["3g.20gb", "3g.20gb", "1g.5gb"], False),  # 7 compute slices but no memory slot left
    (["2g.10gb", "2g.10gb", "2g.10gb", "1g.5gb"], True),
    (["7g.40gb", "1g.5gb"], False),
    (["4g.20gb", "4g.20gb"], False),
])
def test_mig_instances_fit_together(names: list[str], ok: bool) -> None:
    profiles = [p for n in names if (p := mig.A100_40GB.profile(n)) is not None]
    assert mig.fits_together(mig.A100_40GB, profiles) is ok
