"""One device per way a node sells GPU capacity, and the registry that picks one.

``base`` draws the interface; ``whole``, ``mig``, ``timeslicing`` and ``mps`` (the last two over
``replicas``) implement it. Everything else -- the inventory, the webhook's catalog, the extender's
fit -- reaches a backing's knowledge through ``device_for(offering)`` or ``DEVICES[name]``, never
through a branch of its own.
"""

from gpu_tailor.gpumodel.devices.base import Device, NodeFacts, Offering, Reading
from gpu_tailor.gpumodel.devices.mig import MigInstances
from gpu_tailor.gpumodel.devices.mps import MpsReplicas
from gpu_tailor.gpumodel.devices.timeslicing import TimeSlicedReplicas
from gpu_tailor.gpumodel.devices.whole import WholeGpus

WHOLE = WholeGpus()
MIG = MigInstances()
TIME_SLICING = TimeSlicedReplicas()
MPS = MpsReplicas()

DEVICES: dict[str, Device] = {d.name: d for d in (WHOLE, MIG, TIME_SLICING, MPS)}

# The first device that claims a node reads it: a MIG-cut or shared node also shows nvidia.com/gpu, so
# whole GPUs, which claim any node, come last.
_READ_ORDER: tuple[Device, ...] = (MIG, TIME_SLICING, MPS)


def device_for(offering: Offering) -> Device:
    return DEVICES[offering.device]


def read(node: NodeFacts) -> Reading:
    """What the node sells, read by the device that claims it."""
    for device in _READ_ORDER:
        reading = device.read(node)
        if reading is not None:
            return reading
    return WHOLE.read(node)


__all__ = ["DEVICES", "MIG", "MPS", "TIME_SLICING", "WHOLE", "Device", "device_for", "read"]
