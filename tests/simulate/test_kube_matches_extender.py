"""The kube-scheduler model of ``simulate --scheduler`` holds the extender's view, pod for pod.

The extender's own code (``Cache``, ``verbs.filter_nodes``, ``verbs.prioritize``, ``verbs.plan_bind``, then the pod
as the watch shows it bound) is driven the way kube-scheduler drives it, on a 5% cut of the openb trace
(``benchmarks/cluster_replay.py``'s nodes and arrivals): only nodes kube-scheduler's filter passes are offered, the
extender is asked to prioritize only where more than one node is left (kube-scheduler binds a lone feasible node
unscored), and the node bound is one of the best totals. The model (``simulate.kube.run``) stepped along those
choices must rate every one of them best. kube-scheduler's own part (the count filter, MostAllocated) is the
model's here; ``tests/e2e/test_replay.py`` checks that part against real kube-schedulers.

This caught the model learning its pod mix from pods the extender never hears of (an 8-GPU pod no node could take
was learnt by the model alone, and 3 of ~370 one-GPU pods then went elsewhere on the real control plane).
"""

from __future__ import annotations

import copy
import random
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from gpu_tailor.extender import verbs, wire
from gpu_tailor.extender.cache import Cache
from gpu_tailor.extender.records import pod_record
from gpu_tailor.gpumodel import labels
from gpu_tailor.gpumodel.fleet import MILLI
from gpu_tailor.simulate.kube import MAX_NODE_SCORE, KubeModel, SimPod, run
from gpu_tailor.simulate.trace import build_fleet
from tests.conftest import cluster_replay, openb

REPLICAS = 20


def _replay() -> ModuleType:
    openb("openb_pod_list_default.csv")  # skips, saying why, where the trace is absent
    return cluster_replay()


def drive_extender(replay: ModuleType, nodes: list[Any], seq: list[SimPod], seed: int) -> list[str | None]:
    """Each pod through the extender's verbs as kube-scheduler calls them; the node each was bound to."""
    weight = replay.manifest_weight()
    sim = replay.sim_nodes(nodes, MILLI // REPLICAS)
    cache = Cache()
    objects = []
    for n in nodes:
        obj, status = replay.node_object(n, REPLICAS)
        objects.append(copy.deepcopy(obj) | {"status": status})
    cache.reset_nodes(objects)
    cache.reset_pods([])
    names = [n.name for n in sim]
    index = {n: i for i, n in enumerate(names)}
    fleet = build_fleet([n.node for n in sim], "none", seed)
    kube = KubeModel(fleet, fleet.rows(), sim, seed)  # kube-scheduler's counts, fed the extender's binds
    rng = random.Random(seed)
    where: list[str | None] = []
    for i, pod in enumerate(seq):
        obj = replay.pod_object(pod, i, "gpu-tailor-scheduler", REPLICAS)
        obj["metadata"] |= {"namespace": "team-a", "uid": f"uid-{i}", "resourceVersion": str(1000 + 2 * i)}
        offered = [names[j] for j in np.flatnonzero(kube.fits(pod))]
        passed = verbs.filter_nodes(cache.snapshot(), wire.extender_args({"Pod": obj, "NodeNames": offered}))
        left = (passed.get("NodeNames") or []) if offered else []
        if not left:
            where.append(None)
            continue
        node = left[0]
        if len(left) > 1:
            snap = cache.snapshot()
            args = wire.extender_args({"Pod": obj, "NodeNames": left})
            asked = verbs.shape_asked(snap, args)
            if asked is not None:
                cache.observe(*asked)  # as extender.server's prioritize does
            most = kube.most_allocated(pod)
            totals = {h["Host"]: h["Score"] * weight * (MAX_NODE_SCORE // 10) + int(most[index[h["Host"]]])
                      for h in verbs.prioritize(snap, args)}
            top = max(totals.values())
            best = sorted(h for h, v in totals.items() if v == top)
            node = best[rng.randrange(len(best))]
        rec = pod_record(obj)
        plan = verbs.plan_bind(cache.snapshot(), rec, node)
        assert not plan.error, plan.error
        cache.assume(rec, node, plan.placement)
        cache.finish_binding(rec.key, rec.uid)
        bound = copy.deepcopy(obj)
        bound["spec"]["nodeName"] = node
        bound["metadata"]["resourceVersion"] = str(1001 + 2 * i)
        if plan.gpus:
            bound["metadata"].setdefault("annotations", {})[labels.ANN_GPUS] = plan.gpus
        cache.apply_pod("MODIFIED", bound)  # the watch's news
        gpus = tuple(plan.placement.gpus) if plan.placement is not None and not pod.fractional else ()
        kube.place(index[node], pod, gpus)
        where.append(node)
    return where


@pytest.mark.parametrize("seed", [42, 43, 44])
def test_the_model_rates_every_choice_of_the_extender_best(seed: int) -> None:
    replay = _replay()
    nodes = replay.scaled_nodes(0.05, 0.3, seed)
    pods = replay.trace_pods(REPLICAS)
    seq = replay.arrival_order(nodes, pods, seed)
    where = drive_extender(replay, nodes, seq, seed)
    assert sum(w is not None for w in where) > 0.9 * len(seq)  # the cut packs: the check is not vacuous
    followed = run(replay.sim_nodes(nodes, MILLI // REPLICAS), seq, "gpu-tailor", seed, mix=pods,
                   weight=replay.manifest_weight(), follow=where)
    assert followed.disagree == []
