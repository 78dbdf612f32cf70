"""Placement policies: each scores the placements ``fleet.candidates`` lists for a pod.

``POLICIES`` names them for the simulator's ``--policy``: the baselines of Weng et al., "Beware of
Fragmentation" (USENIX ATC'23) -- random, dotprod, gpupacking, gpuclustering, bestfit
(``baselines``), fgd (``fgd``) -- and ``tailor``, this project's own (``tailor``), which the
extender runs.
"""

from gpu_tailor.gpumodel.fleet import TIE_KEYS
from gpu_tailor.gpumodel.policies.base import NodeChoice, Policy
from gpu_tailor.gpumodel.policies.baselines import (
    BestFitPolicy,
    DotProdPolicy,
    GpuClusteringPolicy,
    GpuPackingPolicy,
    RandomPolicy,
)
from gpu_tailor.gpumodel.policies.fgd import FgdPolicy, Mix, Prior
from gpu_tailor.gpumodel.policies.tailor import HOST_RESERVE_FROM, MODEL_RESERVE_FROM, TailorPolicy

POLICIES: dict[str, type[Policy]] = {p.name: p for p in (RandomPolicy, DotProdPolicy, GpuPackingPolicy,
                                                          GpuClusteringPolicy, BestFitPolicy, FgdPolicy,
                                                          TailorPolicy)}

TIES = ("rank", *TIE_KEYS)  # rank: the node rank alone, as before issue 28; else ``Fleet.ties``'s keys first


def configure(engine: Policy, ties: str | None, prior: Prior | None = None) -> None:
    """How ``engine`` breaks ties between placements it scores alike (``TIES``; None: as its policy does) and the
    prior its learnt mix starts from (None: as it is); the same for the extender (its ``--config``) and the
    simulator (``--ties``, ``--prior``)."""
    if ties is not None:
        if ties not in TIES:
            raise ValueError(f"ties {ties!r}: expected one of {', '.join(TIES)}")
        engine.keep_whole_nodes = ties != "rank"
        engine.tie_keys = ties if ties != "rank" else "whole"
    if prior is not None and isinstance(engine, FgdPolicy):
        engine.mix.prior = prior


__all__ = [
    "HOST_RESERVE_FROM",
    "MODEL_RESERVE_FROM",
    "POLICIES",
    "TIES",
    "BestFitPolicy",
    "DotProdPolicy",
    "FgdPolicy",
    "GpuClusteringPolicy",
    "GpuPackingPolicy",
    "Mix",
    "NodeChoice",
    "Policy",
    "Prior",
    "RandomPolicy",
    "TailorPolicy",
    "configure",
]
