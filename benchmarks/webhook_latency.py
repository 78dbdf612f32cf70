"""Webhook latency: the pure decision and the full HTTP round trip, per fixture review.

Builds a cluster of N copies of the nine bundled fixture nodes (default 1,000 nodes), then times
``decide`` and ``POST /mutate`` (aiohttp test server on loopback, no TLS) for each fixture review.
Prints percentiles in microseconds, all from this one run.

    python benchmarks/webhook_latency.py [--nodes 1000] [--rounds 300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer
from fixture_cluster import fixture_nodes

from gpu_tailor.webhook.config import AdmissionPolicy
from gpu_tailor.webhook.mutate import decide
from gpu_tailor.webhook.server import make_app
from gpu_tailor.webhook.state import ClusterView

REVIEWS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "admission"


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if q < 100 else max(values)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    view = ClusterView(AdmissionPolicy())
    view.reset(fixture_nodes(args.nodes))
    reviews = {p.name[0]: json.loads(p.read_text()) for p in sorted(REVIEWS.glob("*.json"))}
    candidates = view.candidates()
    print(f"{args.nodes} nodes, {len(candidates)} offering groups, {args.rounds} rounds per review")
    print(f"{'review':<8}{'outcome':<10}{'decide p50':>12}{'p99':>10}{'HTTP p50':>12}{'p99':>10}   (microseconds)")
    async with TestClient(TestServer(make_app(view))) as client:
        for letter, review in reviews.items():
            pure, http = [], []
            outcome = ""
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                d = decide(review["request"], view.candidates(), view.policy)
                pure.append((time.perf_counter() - t0) * 1e6)
                outcome = d.outcome
                t0 = time.perf_counter()
                resp = await client.post("/mutate", json=review)
                await resp.read()
                http.append((time.perf_counter() - t0) * 1e6)
            print(f"{letter:<8}{outcome:<10}{pct(pure, 50):>12.0f}{pct(pure, 99):>10.0f}"
                  f"{pct(http, 50):>12.0f}{pct(http, 99):>10.0f}")


if __name__ == "__main__":
    asyncio.run(main())
