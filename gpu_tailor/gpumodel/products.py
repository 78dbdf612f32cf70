"""GPU product names as GFD labels them, normalised.

``nvidia.com/gpu.product`` carries decorations: ``-SHARED`` when a sharing config renames nothing
(``Tesla-T4-SHARED``), ``-MIG-<profile>`` under the single MIG strategy
(``NVIDIA-A100-SXM4-40GB-MIG-1g.5gb``), ``-MIG-INVALID`` when a single-strategy node has mixed MIG
devices. ``normalise`` strips them and names the model (``T4``, ``H100``) that users write in
``gpu-tailor.io/gpu-product``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Longest first where one name is a prefix of another (L40S before L40 before L4, A100 before A10).
_MODELS = ("GH200", "H200", "H100", "H800", "H20", "A100", "A800", "A30", "A40", "A10G", "A10", "A16", "A2",
           "L40S", "L40", "L4", "T4", "V100", "P100", "P40", "P4", "K80", "B200", "B100", "GB200")
_MODEL_RE = re.compile(r"(?:^|-)(" + "|".join(_MODELS) + r")(?=-|$)", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Product:
    raw: str  # the label as written
    base: str  # without -SHARED / -MIG-...: "NVIDIA-A100-SXM4-40GB"
    model: str  # "A100"; the base itself when the model is not one we know
    shared_suffix: bool  # "-SHARED" was present
    mig_profile: str | None  # "1g.5gb" under the single strategy
    mig_invalid: bool  # "-MIG-INVALID"

    def matches(self, wanted: str) -> bool:
        """``gpu-tailor.io/gpu-product`` semantics: a model or a product, case-insensitive."""
        w = wanted.strip().upper()
        return w in (self.model.upper(), self.base.upper(), self.raw.upper())


def normalise(raw: str) -> Product:
    name = raw.strip()
    shared = name.upper().endswith("-SHARED")
    if shared:
        name = name[: -len("-SHARED")]
    mig_profile: str | None = None
    invalid = False
    idx = name.upper().find("-MIG-")
    if idx >= 0:
        suffix = name[idx + len("-MIG-"):]
        name = name[:idx]
        if suffix.upper() == "INVALID":
            invalid = True
        else:
            mig_profile = suffix
    m = _MODEL_RE.search(name)
    model = m.group(1).upper() if m else name
    return Product(raw, name, model, shared, mig_profile, invalid)
