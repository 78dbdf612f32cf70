"""Pure GPU knowledge shared by the webhook, the extender and the simulator.

No I/O, no clock, no network: functions over plain dicts (Kubernetes objects as the API returns
them) and frozen values, so admission and scheduling always compute the same numbers.

Modules: ``labels`` (every name), ``quantity`` (Kubernetes quantities), ``resources`` (NVIDIA resource
names), ``mig`` (MIG profiles per SKU), ``products`` (product-label normalisation), ``inventory``
(node -> what it offers and its health), ``ask`` (pod -> what it asks), ``topology`` (links and set
scores), ``occupancy`` (per-GPU use of a node), ``fleet`` (every node's free resources as arrays, for
placement) and ``policies`` (placement policies that score the fleet's candidate placements).
"""

from gpu_tailor.gpumodel.ask import AskError, ContainerAsk, Isolation, PodAsk, Topology, from_pod
from gpu_tailor.gpumodel.inventory import (
    BackingKind,
    Health,
    HealthState,
    NodeInventory,
    Offering,
    Sharing,
    from_node,
)
from gpu_tailor.gpumodel.occupancy import NodeGpus, Placement
from gpu_tailor.gpumodel.topology import GpuTopology, Link

__all__ = [
    "AskError", "BackingKind", "ContainerAsk", "GpuTopology", "Health", "HealthState", "Isolation", "Link",
    "NodeGpus", "NodeInventory", "Offering", "Placement", "PodAsk", "Sharing", "Topology", "from_node", "from_pod",
]
