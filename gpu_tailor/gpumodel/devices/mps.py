"""MPS replicas: the device plugin's ``sharing.mps`` config (NVIDIA Multi-Process Service).

Each replica gets 1/replicas of the GPU's compute and memory, enforced by the MPS control daemon.
The device plugin always fails a container's request for more than one MPS replica
(``Device.units_refusal``), so a pod takes one per container.
"""

from __future__ import annotations

from gpu_tailor.gpumodel.devices.base import Sharing
from gpu_tailor.gpumodel.devices.replicas import Replicas


class MpsReplicas(Replicas):
    name = "mps"
    sharing = Sharing.MPS
