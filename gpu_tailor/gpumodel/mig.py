"""MIG profiles of every MIG-capable GPU we support, and their valid placements.

A MIG profile ``<g>g.<m>gb`` takes ``g`` compute slices (of 7, or of 4 on the A30) and a number of
memory slices. Placements are given in memory-slice units as the NVIDIA MIG user guide lists them
(``nvidia-smi mig -lgipp``): a profile may start at any listed slot and occupies ``span`` slots.

The ``+me`` variants (``1g.10gb+me``: the same slices plus the media engines) are not profiles here.
``+`` is not allowed in a Kubernetes resource name or label, and the NVIDIA device plugin sells such an
instance under the plain profile's resource (``nvidia.com/mig-1g.10gb``; NVIDIA/k8s-device-plugin
issue 1462), so a cluster never shows a ``+me`` name. Its geometry is the plain profile's, so counting
it as one is right.

Node labels are the truth when present: memory per profile (``nvidia.com/mig-<p>.memory``) and even
profile names differ between SKUs and driver versions (``7g.79gb`` on some A100-80GB, ``1g.12gb`` on
the H100 NVL). This table is for reasoning when a node pool is not visible yet or labels are missing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpu_tailor.gpumodel.quantity import MIB

# Bounded so that ``nvidia.com/mig-<name>.shared`` always stays within a resource name's 63 characters.
_PROFILE_NAME = re.compile(r"^(?P<g>[1-9][0-9]?)g\.(?P<m>[0-9]{1,5})gb$")


@dataclass(frozen=True, slots=True)
class MigProfile:
    name: str  # "1g.10gb"
    compute_slices: int  # g
    total_compute_slices: int  # 7 (4 on A30)
    memory_mib: int  # nominal usable memory, MiB
    max_instances: int  # per GPU
    placements: tuple[int, ...]  # start slots (memory-slice units)
    span: int  # memory slices occupied

    @property
    def fraction(self) -> float:
        """Share of the GPU's compute this instance gets (2g on a 7-slice GPU = 2/7)."""
        return self.compute_slices / self.total_compute_slices

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB


@dataclass(frozen=True, slots=True)
class ProfileName:
    compute_slices: int
    memory_gb: int


def parse_profile_name(name: str) -> ProfileName | None:
    """``2g.20gb`` -> (2, 20); None when the string is not a MIG profile name (``1g.10gb+me`` is not:
    see the module notes)."""
    m = _PROFILE_NAME.match(name)
    if m is None:
        return None
    return ProfileName(int(m["g"]), int(m["m"]))


@dataclass(frozen=True, slots=True)
class MigSku:
    key: str  # "A100-40GB"
    products: tuple[str, ...]  # dash-separated name parts of nvidia.com/gpu.product that identify it
    memory_mib: int
    memory_slices: int
    compute_slices: int
    profiles: tuple[MigProfile, ...]

    def profile(self, name: str) -> MigProfile | None:
        for p in self.profiles:
            if p.name == name:
                return p
        return None

    def resolve(self, name: str) -> MigProfile | None:
        """The profile ``name``; also label-only names (``7g.79gb``), matched by compute slices,
        so a driver's renamed memory size still resolves to the right geometry."""
        exact = self.profile(name)
        if exact is not None:
            return exact
        parsed = parse_profile_name(name)
        if parsed is None:
            return None
        candidates = [p for p in self.profiles if p.compute_slices == parsed.compute_slices]
        if not candidates:
            return None
        # Two 1g profiles differ by memory: take the one whose nominal GB is closest to the name's.
        best = min(candidates, key=lambda p: abs(p.memory_mib / 1024 - parsed.memory_gb))
        return MigProfile(name, best.compute_slices, best.total_compute_slices, best.memory_mib,
                          best.max_instances, best.placements, best.span)


def _p(sku_mem_mib: int, slices: int, g: int, gb: int, mem_slices: int, starts: tuple[int, ...],
       max_instances: int, total_g: int = 7) -> MigProfile:
    name = f"{g}g.{gb}gb"
    memory = sku_mem_mib * mem_slices // slices
    return MigProfile(name, g, total_g, memory, max_instances, starts, mem_slices)


def _seven_slice_sku(key: str, products: tuple[str, ...], memory_mib: int,
                     gbs: tuple[int, int, int, int, int]) -> MigSku:
    """The A100/H100/H200 family: 8 memory slices, 7 compute slices, the same geometry.

    ``gbs`` are the names' memory numbers for 1g, 1g(2 slices), 2g, 3g/4g and 7g profiles.
    """
    one, one_big, two, three, seven = gbs
    profiles = (
        _p(memory_mib, 8, 1, one, 1, (0, 1, 2, 3, 4, 5, 6), 7),
        _p(memory_mib, 8, 1, one_big, 2, (0, 2, 4, 6), 4),
        _p(memory_mib, 8, 2, two, 2, (0, 2, 4), 3),
        _p(memory_mib, 8, 3, three, 4, (0, 4), 2),
        _p(memory_mib, 8, 4, three, 4, (0,), 1),
        _p(memory_mib, 8, 7, seven, 8, (0,), 1),
    )
    return MigSku(key, products, memory_mib, 8, 7, profiles)


A100_40GB = _seven_slice_sku("A100-40GB", ("A100-SXM4-40GB", "A100-PCIE-40GB", "A100-40GB", "A100"), 40960,
                            (5, 10, 10, 20, 40))
A100_80GB = _seven_slice_sku("A100-80GB", ("A100-SXM4-80GB", "A100-80GB", "A100-PCIE-80GB"), 81920,
                            (10, 20, 20, 40, 80))
H100_80GB = _seven_slice_sku("H100-80GB", ("H100-80GB", "H100-SXM5-80GB", "H100-PCIE", "H100"), 81559,
                            (10, 20, 20, 40, 80))
H100_94GB = _seven_slice_sku("H100-94GB", ("H100-NVL", "H100-94GB"), 95830, (12, 24, 24, 47, 94))
H200_141GB = _seven_slice_sku("H200-141GB", ("H200",), 143771, (18, 35, 35, 71, 141))
A30_24GB = MigSku(
    "A30-24GB",
    ("A30",),
    24576,
    4,
    4,
    (
        _p(24576, 4, 1, 6, 1, (0, 1, 2, 3), 4, total_g=4),
        _p(24576, 4, 2, 12, 2, (0, 2), 2, total_g=4),
        _p(24576, 4, 4, 24, 4, (0,), 1, total_g=4),
    ),
)

SKUS: tuple[MigSku, ...] = (A100_80GB, A100_40GB, H100_94GB, H100_80GB, H200_141GB, A30_24GB)


def sku_for_product(product: str) -> MigSku | None:
    """The MIG SKU of a ``nvidia.com/gpu.product`` value (any -MIG-/-SHARED suffix is ignored).

    Names are matched on whole dash-separated parts, so ``A30`` never matches ``RTX-A3000``; the
    most specific name (most parts) wins, so an ``A100-SXM4-80GB`` is not taken for an A100-40GB.
    """
    parts = product.upper().split("-MIG-")[0].split("-")
    best: tuple[int, MigSku] | None = None
    for sku in SKUS:
        for name in sku.products:
            want = name.upper().split("-")
            hit = any(parts[i:i + len(want)] == want for i in range(len(parts) - len(want) + 1))
            if hit and (best is None or len(want) > best[0]):
                best = (len(want), sku)
    return best[1] if best else None


def profile_for(product: str, name: str) -> MigProfile | None:
    """The table's profile ``name`` on ``product`` (see ``MigSku.resolve``)."""
    sku = sku_for_product(product)
    return sku.resolve(name) if sku is not None else None


def fits_together(sku: MigSku, profiles: list[MigProfile]) -> bool:
    """Whether these instances can coexist on one GPU of ``sku`` (some non-overlapping placement)."""
    return placed_together(sku, profiles) is not None


def placed_together(sku: MigSku, profiles: list[MigProfile]) -> list[tuple[MigProfile, int]] | None:
    """A placement of these instances on one GPU of ``sku``, as (profile, start) by start, the largest placed first
    at its lowest start that lets the rest fit; None when they cannot coexist."""
    if sum(p.compute_slices for p in profiles) > sku.compute_slices:
        return None
    ordered = sorted(profiles, key=lambda p: -p.span)

    def place(i: int, used: frozenset[int]) -> list[tuple[MigProfile, int]] | None:
        if i == len(ordered):
            return []
        p = ordered[i]
        for start in p.placements:
            slots = frozenset(range(start, start + p.span))
            rest = place(i + 1, used | slots) if not slots & used else None
            if rest is not None:
                return [(p, start), *rest]
        return None

    found = place(0, frozenset())
    return sorted(found, key=lambda ps: ps[1]) if found is not None else None


def layouts(sku: MigSku) -> dict[str, dict[str, int]]:
    """mig-parted's standard configs for ``sku`` (NVIDIA/mig-parted, the GPU operator's default
    ``config-default.yaml``): instances of each profile on one GPU. ``all-<profile>`` cuts a GPU into as many of one
    profile as fit; ``all-balanced`` cuts one of the A100/H100/H200 family into 2 x the smallest 1g profile, 1 x 2g
    and 1 x 3g (A30: 2 x 1g, 1 x 2g)."""
    out = {f"all-{p.name}": {p.name: p.max_instances} for p in sku.profiles}
    by_slices = sorted(sku.profiles, key=lambda p: (p.compute_slices, p.span))
    one, two = by_slices[0], next(p for p in by_slices if p.compute_slices == 2)
    if sku.compute_slices == 7:
        three = next(p for p in by_slices if p.compute_slices == 3)
        out["all-balanced"] = {one.name: 2, two.name: 1, three.name: 1}
    else:
        out["all-balanced"] = {one.name: 2, two.name: 1}
    return out


def uniform_layout(sku: MigSku, instances: dict[str, int], gpus: int) -> dict[str, int] | None:
    """Instances of each profile on one GPU, when ``gpus`` GPUs cut the same way hold ``instances``
    (profile name -> instances on the node); None when the counts do not split evenly over the GPUs or
    one GPU's share is no valid layout of ``sku``.

    mig-manager applies one layout to every GPU under its ``all-*`` configs (``all-balanced``: per
    A100-40GB 2x 1g.5gb, 1x 2g.10gb, 1x 3g.20gb), so there the node's counts give each GPU's instances.
    """
    if gpus <= 0:
        return None
    layout: dict[str, int] = {}
    cut: list[MigProfile] = []
    for name, count in instances.items():
        profile = sku.resolve(name)
        if profile is None or count % gpus:
            return None
        layout[name] = count // gpus
        cut += [profile] * layout[name]
    return layout if cut and fits_together(sku, cut) else None

