"""From what the kubelet and the driver say to a ``NodeReport``: each device id to the GPU it is on.

NVIDIA's device plugin names devices by its ``--device-id-strategy``:

* ``uuid`` (the default): ``GPU-<uuid>`` for a whole GPU, ``MIG-<uuid>`` for a MIG device, and a
  replica of a shared GPU is the GPU's id with ``::<n>`` appended;
* ``index``: ``<n>`` for GPU n, ``<n>:<m>`` for MIG device m of GPU n (replicas again with ``::<k>``).

UUIDs need NVML to be turned into indices; indices do not. A device id that cannot be placed is listed
as ``unmapped`` rather than guessed.

A GPU is healthy when NVML can read it and, where the kubelet lists the node's allocatable devices, at
least one of them is on it: the device plugin no longer offers a GPU it marked unhealthy, and a GPU in MIG mode with
no instance cut offers nothing (under the mixed strategy its neighbours are still sold as whole GPUs, and it is not
one of them).
"""

from __future__ import annotations

from gpu_tailor.agent.nvml import Reading
from gpu_tailor.agent.podresources import Devices
from gpu_tailor.gpumodel.report import ContainerGpus, NodeReport, ReportedGpu

NVIDIA = "nvidia.com/"


def gpu_index(device_id: str, by_uuid: dict[str, int]) -> int | None:
    """The GPU a device id is on; None when it cannot be told."""
    base = device_id.split("::", 1)[0]
    if base in by_uuid:
        return by_uuid[base]
    head, sep, tail = base.partition(":")
    if head.isdigit() and (not sep or tail.isdigit()):
        return int(head)
    return None


def uuids(reading: Reading) -> dict[str, int]:
    """Each GPU and MIG device UUID NVML named in ``reading``, to its GPU's index."""
    out: dict[str, int] = {}
    for g in reading.gpus:
        if g.uuid:
            out[g.uuid] = g.index
        for mig in g.mig:
            out[mig] = g.index
    return out


def remembered(seen: dict[str, int], reading: Reading, named: set[str]) -> dict[str, int]:
    """The UUIDs to keep knowing: those ``reading`` names, and those NVML named before that a device of the kubelet
    still names (``named``) on a GPU NVML cannot read now (lost). A UUID whose GPU index a readable GPU holds now is
    forgotten: a MIG device cut away, or indices moved by a driver reload."""
    readable = {g.index for g in reading.gpus if g.uuid}
    return {**{u: i for u, i in seen.items() if u in named and i not in readable}, **uuids(reading)}


def build(node: str, assigned: list[Devices], allocatable: list[Devices], reading: Reading | None,
          observed_at: str, known: dict[str, int] | None = None) -> NodeReport:
    """``known``: UUIDs an earlier reading named (a GPU lost since cannot say its own), under this reading's."""
    by_uuid = {**(known or {}), **(uuids(reading) if reading is not None else {})}
    unmapped: list[str] = []

    def where(ids: tuple[str, ...]) -> tuple[int, ...]:
        out = []
        for i in ids:
            g = gpu_index(i, by_uuid)
            if g is None:
                unmapped.append(i)
            else:
                out.append(g)
        return tuple(out)

    containers = tuple(ContainerGpus(d.namespace, d.pod, d.container, d.resource, held)
                       for d in assigned if d.resource.startswith(NVIDIA) and (held := where(d.ids)))
    offered = {at for d in allocatable if d.resource.startswith(NVIDIA) for i in d.ids
               if (at := gpu_index(i, by_uuid)) is not None}
    gpus: tuple[ReportedGpu, ...] = ()
    if reading is not None:
        gpus = tuple(ReportedGpu(g.index, g.uuid, g.healthy and (not offered or g.index in offered), g.peers)
                     for g in reading.gpus)
    problems = reading.problems if reading is not None else ()
    return NodeReport(node, observed_at, reading.driver if reading is not None else "", gpus, containers,
                      tuple(sorted(set(unmapped))), problems)
