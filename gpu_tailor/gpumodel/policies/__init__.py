"""Placement policies: each scores the placements ``fleet.candidates`` lists for a pod.

``POLICIES`` names them for the simulator's ``--policy``: the baselines of Weng et al., "Beware of
Fragmentation" (USENIX ATC'23) -- random, dotprod, gpupacking, gpuclustering, bestfit
(``baselines``), fgd (``fgd``) -- and ``tailor``, this project's own (``tailor``), which the
extender runs.
"""

from gpu_tailor.gpumodel.policies.base import NodeChoice, Policy
from gpu_tailor.gpumodel.policies.baselines import (
    BestFitPolicy,
    DotProdPolicy,
    GpuClusteringPolicy,
    GpuPackingPolicy,
    RandomPolicy,
)
from gpu_tailor.gpumodel.policies.fgd import FgdPolicy, Mix
from gpu_tailor.gpumodel.policies.tailor import HOST_RESERVE_FROM, MODEL_RESERVE_FROM, TailorPolicy

POLICIES: dict[str, type[Policy]] = {p.name: p for p in (RandomPolicy, DotProdPolicy, GpuPackingPolicy,
                                                          GpuClusteringPolicy, BestFitPolicy, FgdPolicy,
                                                          TailorPolicy)}

__all__ = [
    "HOST_RESERVE_FROM", "MODEL_RESERVE_FROM", "POLICIES", "BestFitPolicy", "DotProdPolicy", "FgdPolicy",
    "GpuClusteringPolicy", "GpuPackingPolicy", "Mix", "NodeChoice", "Policy", "RandomPolicy", "TailorPolicy",
]
