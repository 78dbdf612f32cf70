"""Parse and print every NVIDIA extended-resource name, in one place.

Forms (the device plugin's, see its README and the GPU operator docs):

* ``nvidia.com/gpu``                  whole GPUs, or single-strategy MIG devices, or replicas of a
                                      shared GPU when ``renameByDefault`` is off
* ``nvidia.com/gpu.shared``           replicas of a time-sliced / MPS GPU with ``renameByDefault``
* ``nvidia.com/mig-<g>g.<m>gb``       a MIG device of one profile (mixed strategy)
* ``nvidia.com/mig-<profile>.shared`` replicas of a shared MIG device (renamed)

There is no ``nvidia.com/mig-<profile>+me``: ``+`` is not allowed in a resource name (the API server
and kube-scheduler's config validation refuse it), and the device plugin counts ``+me`` instances in
the plain profile's resource (see ``mig``). Every name gpu-tailor writes is a valid qualified
resource name (``tests/gpumodel/test_names.py`` checks them all).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from gpu_tailor.gpumodel import labels


class ResourceKind(StrEnum):
    GPU = "gpu"
    GPU_SHARED = "gpu.shared"
    MIG = "mig"


_MIG_RESOURCE = re.compile(r"^nvidia\.com/mig-(?P<profile>[0-9]+g\.[0-9]+gb)(?P<shared>\.shared)?$")


@dataclass(frozen=True, slots=True)
class NvidiaResource:
    """A parsed NVIDIA resource name; ``str()`` prints it back exactly."""

    kind: ResourceKind
    mig_profile: str | None = None  # e.g. "1g.10gb"
    shared: bool = False

    def __str__(self) -> str:
        if self.kind is ResourceKind.GPU:
            return labels.GPU_RESOURCE
        if self.kind is ResourceKind.GPU_SHARED:
            return labels.GPU_SHARED_RESOURCE
        suffix = ".shared" if self.shared else ""
        return f"{labels.MIG_LABEL_PREFIX}{self.mig_profile}{suffix}"

    @property
    def is_mig(self) -> bool:
        return self.kind is ResourceKind.MIG


WHOLE_GPU = NvidiaResource(ResourceKind.GPU)
SHARED_GPU = NvidiaResource(ResourceKind.GPU_SHARED)


def mig_resource(profile: str, *, shared: bool = False) -> NvidiaResource:
    return NvidiaResource(ResourceKind.MIG, mig_profile=profile, shared=shared)


def parse_resource(name: str) -> NvidiaResource | None:
    """The NVIDIA GPU resource ``name`` denotes, or None for any other resource name."""
    if name == labels.GPU_RESOURCE:
        return WHOLE_GPU
    if name == labels.GPU_SHARED_RESOURCE:
        return SHARED_GPU
    m = _MIG_RESOURCE.match(name)
    if m is None:
        return None
    return mig_resource(m["profile"], shared=m["shared"] is not None)


def is_nvidia_resource(name: str) -> bool:
    """Any resource in the nvidia.com domain, known form or not (for limits == requests checks)."""
    return name.startswith(labels.RESOURCE_DOMAIN + "/")


def is_gpu_resource(name: str) -> bool:
    """Resources whose requests and limits must agree: nvidia.com/* and gpu-tailor.io/*."""
    return is_nvidia_resource(name) or name.startswith(labels.TAILOR_DOMAIN + "/")
