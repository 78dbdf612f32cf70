"""Time-sliced replicas: the device plugin's ``sharing.timeSlicing`` config.

Replicas take turns on the whole GPU: nothing isolates their memory or faults, and the memory a
replica is sold as (the GPU's over ``replicas``) is nominal. A container may ask for several replicas
unless the config sets ``failRequestsGreaterThanOne`` (only the webhook's declared offerings can say
so: no label tells). Several replicas give no more GPU than one.
"""

from __future__ import annotations

from gpu_tailor.gpumodel.devices.base import Sharing
from gpu_tailor.gpumodel.devices.replicas import Replicas


class TimeSlicedReplicas(Replicas):
    name = "time-slicing"
    sharing = Sharing.TIME_SLICING
