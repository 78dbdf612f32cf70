"""Cliques kept whole for the groups that need one: 54 GB200-like trays (4 GPUs each, ``test_gangs.py``'s trays) in
three NVLink cliques of 18, as on three NVL72 racks, on the session's control plane.

Single pods of 1, 2 and 4 GPUs (a fixed seeded sequence, each asking for GB200 as a user of the racks would, with no
node affinity of their own) are created a few at a time, each batch bound before the next is created, as a real
scheduler queue would hand them to gpu-tailor-scheduler, until half the fleet's GPUs (108) are bound. Single pods keep
off an untouched clique while one in use holds them, so one clique should stay whole: how many whole trays the
emptiest clique has left is recorded (``record_property``; 18 of 18 when they keep off it) and must be at least 16.
Then a group of 16 pods of 4 GPUs (gpu-tailor's annotations, one clique required) binds whole in one clique.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from gpu_tailor.gpumodel import labels
from tests.e2e.kube import Obj, api_path
from tests.e2e.pods import Pods, gpu_pod, unique
from tests.e2e.services import Stack
from tests.e2e.test_gangs import TRAY_GPUS, Trays, assert_sound, assert_whole, bound_all, installed, member, tray

pytestmark = pytest.mark.e2e

CLIQUES = {"x": 18, "y": 18, "z": 18}  # NVLink domain -> its trays: 54 nodes, 216 GPUs
HALF = sum(CLIQUES.values()) * TRAY_GPUS // 2  # 108 GPUs of single pods
SIZES, SEED, BATCH = (1, 2, 4), 20261128, 4
GROUP = 16  # pods of 4 GPUs, one clique required
GB200 = "NVIDIA-GB200"


def singles(seed: int = SEED, total: int = HALF) -> list[int]:
    """The GPUs of each single pod, in the order they are created: drawn from 1, 2 and 4, the last ones cut to what is
    left of ``total``."""
    rng, out, left = random.Random(seed), [], total
    while left:
        drawn = rng.choice(SIZES)
        gpus = max(s for s in SIZES if s <= min(drawn, left))
        out.append(gpus)
        left -= gpus
    return out


def rack_tray(clique: str, i: int) -> Obj:
    """``test_gangs.tray`` under names of this module's own (gb200-x-00 ...), in cliques x, y, z."""
    node = tray(clique, i)
    assert node["metadata"]["name"] == f"gb200-{clique}-{i:02d}"
    return node


@pytest.fixture(scope="module")
def racks(stack: Stack) -> Iterator[Trays]:
    with installed(stack, CLIQUES, rack_tray) as made:
        others = [n["metadata"]["name"] for n in stack.kube.list(api_path("nodes"))
                  if (n["metadata"].get("labels") or {}).get(labels.GPU_PRODUCT) == GB200
                  and n["metadata"]["name"] not in made.all]
        assert not others, f"other GB200 nodes beside this module's racks: {others}"
        yield made


def single(gpus: int) -> Obj:
    """A single pod as a user of the racks writes it: so many GPUs, on GB200."""
    return gpu_pod(unique(f"single{gpus}"), {labels.GPU_RESOURCE: str(gpus)},
                   annotations={labels.ANN_GPU_PRODUCT: GB200})


def gpus_used(placed: list[Obj]) -> Counter[str]:
    """GPUs asked by the bound pods, by node."""
    used: Counter[str] = Counter()
    for pod in placed:
        used[pod["spec"]["nodeName"]] += int(pod["spec"]["containers"][0]["resources"]["limits"][labels.GPU_RESOURCE])
    return used


def whole_trays(racks: Trays, used: Counter[str]) -> dict[str, int]:
    """Per clique: its trays no pod uses."""
    return {c: sum(1 for n in names if not used[n]) for c, names in racks.by_clique.items()}


def test_single_pods_keep_a_clique_whole_for_a_group_that_needs_one(cluster: Stack, pods: Pods, racks: Trays,
                                                                   record_property: Callable[[str, object], None]
                                                                   ) -> None:
    ns = cluster.opted_in
    sequence = singles()
    assert sum(sequence) == HALF and set(sequence) == set(SIZES)
    placed: list[Obj] = []
    for start in range(0, len(sequence), BATCH):
        batch = [pods.create(ns, single(g)) for g in sequence[start:start + BATCH]]
        placed += [pods.wait_bound(p) for p in batch]
    off = [p["metadata"]["name"] for p in placed if p["spec"]["nodeName"] not in racks.all]
    assert not off, f"single pods bound off the racks: {off}"
    used = gpus_used(placed)
    assert sum(used.values()) == HALF and all(v <= TRAY_GPUS for v in used.values()), used
    whole = whole_trays(racks, used)
    emptiest = max(whole, key=lambda c: whole[c])
    record_property("singles", len(sequence))
    record_property("whole_trays_per_clique", whole)
    record_property("whole_trays_in_emptiest_clique", whole[emptiest])
    print(f"{len(sequence)} single pods, {HALF} GPUs: whole trays per clique {whole}")
    assert whole[emptiest] >= GROUP, f"no clique keeps {GROUP} whole trays: {whole}"

    group = unique("kept")
    created = []
    for i in range(GROUP):
        pod = member(group, i, GROUP)
        pod["metadata"]["annotations"][labels.ANN_GPU_PRODUCT] = GB200
        created.append(pods.create(ns, pod))
    members = bound_all(cluster, pods, created, timeout=90)
    landed = assert_whole(racks, members)
    assert whole[landed] >= GROUP, f"the group went to clique {landed}, which had {whole[landed]} whole trays"
    assert not {p["spec"]["nodeName"] for p in members} & {n for n, gpus in used.items() if gpus}
    assert_sound(cluster)
