"""Speed and memory of one replay per policy (seed 42): the generated default, or with ``--trace`` the openb
cluster and default workload.

Goal: ``tailor`` in at most 30 s per seed on a 2-core machine, memory under 1 GiB.

    python benchmarks/simulate_speed.py [--trace ../shared/data] [--policy tailor --policy fgd ...]
"""

from __future__ import annotations

import argparse
import resource
from pathlib import Path

from gpu_tailor.simulate import synthetic
from gpu_tailor.simulate.cli import OPENB_NODES, openb_pods
from gpu_tailor.simulate.trace import load_nodes, load_pods, replay


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", action="append")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--trace", type=Path, metavar="DIR", help="the openb trace's folder (default: generated)")
    args = parser.parse_args()
    if args.trace:
        nodes, pods = load_nodes(args.trace / OPENB_NODES), load_pods(args.trace / openb_pods("default"))
    else:
        nodes, pods = synthetic.cluster(), synthetic.workload()
    print(f"{'policy':<14}{'seconds':>9}{'goal':>7}{'alloc@100%':>12}{'peak RSS MiB':>14}")
    for policy in args.policy or ["tailor", "fgd", "bestfit"]:
        r = replay(nodes, pods, policy, args.seed, workload="default")
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"{policy:<14}{r.seconds:>9.1f}{30:>7}{r.alloc['100']:>12.2f}{rss:>14.0f}")


if __name__ == "__main__":
    main()
