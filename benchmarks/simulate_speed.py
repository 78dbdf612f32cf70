"""Speed and memory of one trace replay per policy (bundled openb cluster, default workload, seed 42).

Goal: ``tailor`` in at most 30 s per seed on a 2-core machine, memory under 1 GiB.

    python benchmarks/simulate_speed.py [--policy tailor --policy fgd ...]
"""

from __future__ import annotations

import argparse
import resource

from gpu_tailor.simulate.cli import TRACE, bundled_trace
from gpu_tailor.simulate.trace import load_nodes, load_pods, replay


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", action="append")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    nodes, pods = load_nodes(bundled_trace(TRACE[0])), load_pods(bundled_trace(TRACE[1]))
    print(f"{'policy':<14}{'seconds':>9}{'goal':>7}{'alloc@100%':>12}{'peak RSS MiB':>14}")
    for policy in args.policy or ["tailor", "fgd", "bestfit"]:
        r = replay(nodes, pods, policy, args.seed, workload="default")
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"{policy:<14}{r.seconds:>9.1f}{30:>7}{r.alloc['100']:>12.2f}{rss:>14.0f}")


if __name__ == "__main__":
    main()
