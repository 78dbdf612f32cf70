"""What admission checks of a pod's group (``gpumodel.groups``): that its group ask reads, and that a group asking for
one NVLink domain could ever fit in the largest domain the cluster has.

Whether the members ask alike, and where the group goes, is the extender's: admission sees one pod at a time.
"""

from __future__ import annotations

from typing import Any

from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.ask import PodAsk
from gpu_tailor.gpumodel.gangs import REQUIRED
from gpu_tailor.gpumodel.groups import GroupError, group_of


def refusal(pod: dict[str, Any], ask: PodAsk, largest_domain: int, plugin_domain: int = 0) -> tuple[int, str] | None:
    """A denial (HTTP code, message) for a pod whose group ask cannot be met, else None. ``largest_domain``: the most
    GPUs one NVLink domain of the cluster has (a clique of nodes, or one node; 0: not known)."""
    try:
        ref = group_of(pod)
    except GroupError as exc:
        return 422, f"group: {exc}"
    if not ask.virtual and plugin_domain > 0:  # a native ask goes to the device plugin's nodes where they sell GPUs
        largest_domain = plugin_domain
    if ref is None or ref.size < 2 or ref.domain != REQUIRED or largest_domain <= 0:
        return None
    whole = ask.effective_native.get(labels.GPU_RESOURCE, 0)
    need = ref.size * whole
    if need > largest_domain:
        return 403, (f"{ref.name}: {ref.size} pods of {whole} x {labels.GPU_RESOURCE} need {need} GPUs in one NVLink "
                     f"domain ({labels.ANN_GROUP_DOMAIN}: {REQUIRED}), and the largest domain here has "
                     f"{largest_domain}; ask {labels.ANN_GROUP_DOMAIN}: preferred to allow several")
    return None
