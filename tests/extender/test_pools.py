"""The pool gauges of the extender's ``/metrics`` (``extender.pools``), read from a real scrape."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpu_tailor.gpumodel import labels
from tests.extender.builders import cluster, gpu_pod


def samples(text: str) -> dict[tuple[str, str, str], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("gpu_tailor_pool_"):
                out[(s.name, s.labels["model"], s.labels["backing"])] = s.value
    return out


async def scrape(client_for: Any, pods: list[dict[str, Any]]) -> dict[tuple[str, str, str], float]:
    client = await client_for(cluster(pods))
    resp = await client.get("/metrics")
    assert resp.status == 200
    return samples(await resp.text())


async def test_each_pool_counts_what_it_sells_holds_and_leaves_idle(client_for: Any) -> None:
    held = gpu_pod("held", 2, node="h100-hgx-0", annotations={labels.ANN_GPUS: "0,1"})
    got = await scrape(client_for, [held])
    hgx = {name.removeprefix("gpu_tailor_pool_"): v for (name, model, backing), v in got.items()
           if backing == "whole" and model == "H100"}
    # h100-hgx-0 (8 GPUs, 2 held) and h100-degraded-0 (5 of 8 sold) are both H100 nodes sold whole
    assert (hgx["gpus"], hgx["gpus_used"], hgx["gpus_idle"]) == (13, 2, 11)
    assert hgx["gpus_stranded"] == 0  # 96 cores and plenty of memory left
    assert {b for (_, _, b) in got} == {"whole", "mig", "time-slicing", "mps"}  # h100-initializing-0 sells none
    assert got[("gpu_tailor_pool_gpus", "A100", "mig")] == 16  # the mixed and the single MIG nodes
    empty = await scrape(client_for, [])
    assert empty[("gpu_tailor_pool_gpus_used", "H100", "whole")] == 0
    assert empty[("gpu_tailor_pool_gpus_idle", "H100", "whole")] == 13


async def test_each_nvlink_domain_says_its_gpus_and_the_largest_group_that_still_fits(client_for: Any) -> None:
    from tests.extender.test_gangs import NODES as TRAYS
    from tests.extender.test_gangs import synced

    cache = synced([gpu_pod("busy", 2, node="gb-1-0", annotations={labels.ANN_GPUS: "0,1"})])
    cache.snapshot()  # the fleet rows a request would have written
    client = await client_for(cache)
    text = await (await client.get("/metrics")).text()
    got = {(s.name, s.labels["domain"], s.labels.get("gpus_per_pod", "")): s.value
           for f in text_string_to_metric_families(text) for s in f.samples if s.name.startswith("gpu_tailor_domain_")}
    one, busy = f"{labels.GPU_CLIQUE}=uuid-0.0", f"{labels.GPU_CLIQUE}=uuid-1.1"
    assert len({d for _, d, _ in got}) == len(TRAYS) // 4
    pools = {s.labels["model"] for f in text_string_to_metric_families(text) for s in f.samples
             if s.name == "gpu_tailor_pool_gpus"}
    models = {s.labels["model"] for f in text_string_to_metric_families(text) for s in f.samples
              if s.name.startswith("gpu_tailor_domain_")}
    assert models == {"GB200"} <= pools  # the trays' product as the pools name it: a domain joins its pool by model
    assert got[("gpu_tailor_domain_gpus", busy, "")] == 16
    assert got[("gpu_tailor_domain_gpus_idle", busy, "")] == 14
    assert got[("gpu_tailor_domain_whole_nodes", busy, "")] == 3
    assert got[("gpu_tailor_domain_largest_group", busy, "4")] == 3
    assert got[("gpu_tailor_domain_largest_group", busy, "1")] == 14
    assert got[("gpu_tailor_domain_largest_group", one, "4")] == 4
