"""``gpu-tailor explain`` and ``gpu-tailor capacity`` (and the same under ``kubectl gpu-tailor``): read the
cluster, run the pure functions of ``explain`` and ``capacity``, print a table or JSON.

The flags are defined with the standard library only; what the commands run (numpy, pydantic, the
services' modules) is imported when they run, so ``gpu-tailor --help`` stays fast."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpu_tailor.tools.source import Cluster

PLOT_HINT = "--plot needs matplotlib: pip install 'gpu-tailor[plot]'"


def add_source(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--kubeconfig", metavar="FILE",
                     help="read the live cluster (read-only) with this kubeconfig (default: $KUBECONFIG, else "
                          "~/.kube/config)")
    src.add_argument("--cluster-file", metavar="DUMP",
                     help="offline: 'kubectl get nodes,pods,namespaces -A -o json' output (JSON or YAML)")
    p.add_argument("--context", metavar="NAME", help="kubeconfig context (default: the current one)")
    p.add_argument("--output", "-o", choices=("table", "json"), default="table", help="table for people, json for "
                   "scripts")


def _cluster(args: argparse.Namespace, namespace: str | None) -> Cluster:
    from gpu_tailor.tools.source import load_dump, read_live

    if args.cluster_file:
        return load_dump(args.cluster_file)
    return read_live(args.kubeconfig, args.context, namespace)


def run_explain(args: argparse.Namespace, prog: str = "gpu-tailor explain") -> int:
    from gpu_tailor.tools import explain
    from gpu_tailor.tools.manifest import ManifestError, group_sizers, pod_of
    from gpu_tailor.tools.source import SourceError, group_objects
    from gpu_tailor.webhook.config import ConfigError, load_policy

    try:
        text = sys.stdin.read() if args.filename == "-" else Path(args.filename).read_text()
        policy = load_policy(args.config)
        written, _ = pod_of(text, args.filename, args.namespace, "")  # "": the context's, known once read
        cluster = _cluster(args, written["metadata"]["namespace"] or None)
        pod, subject = pod_of(text, args.filename, args.namespace, cluster.default_namespace)
        # the manifest's own PodGroup, Workload or Job sizes its pods' group, as once applied
        group_objects(group_sizers(text, args.filename, pod["metadata"]["namespace"]), cluster.groups)
        result = explain.explain(pod, subject, cluster, policy)
    except OSError as exc:
        print(f"{prog}: {args.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    except (ManifestError, SourceError, ConfigError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    if args.output == "json":
        print(json.dumps(result.wire(), indent=1))
    else:
        sys.stdout.write(explain.table(result))
    return 0


def run_capacity(args: argparse.Namespace, prog: str = "gpu-tailor capacity") -> int:
    from gpu_tailor.gpumodel.quantity import QuantityError, parse_bytes, parse_quantity
    from gpu_tailor.tools import capacity
    from gpu_tailor.tools.source import SourceError

    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print(f"{prog}: {PLOT_HINT}", file=sys.stderr)
            return 2
    try:
        cpu = int(parse_quantity(args.cpu) * 1000)
        memory = parse_bytes(args.memory) // 2**20
    except (QuantityError, ValueError) as exc:
        print(f"{prog}: --cpu/--memory: {exc}", file=sys.stderr)
        return 2
    if not 0 < args.recent_hours <= 24 * 365:
        print(f"{prog}: --recent-hours: expected hours between 0 and a year, not {args.recent_hours:g}",
              file=sys.stderr)
        return 2
    try:
        report = capacity.capacity(_cluster(args, None), cpu, memory, args.pool_label, args.recent_hours)
    except SourceError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    if args.output == "json":
        print(json.dumps(report.wire(), indent=1))
    else:
        sys.stdout.write(capacity.table(report))
    if args.plot:
        capacity.plot(report, args.plot)
        print(f"plot: {Path(args.plot).resolve()}", file=sys.stderr if args.output == "json" else sys.stdout)
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ex = sub.add_parser("explain", help="what the webhook would do to a pod, and where it would be scheduled, and why",
                        description="Read-only: what gpu-tailor's webhook would do to the pod (allowed or denied, "
                                    "the pod as stored), then for every node whether it fits and why not, its "
                                    "score, and the node and GPUs the extender would choose. A Deployment, "
                                    "StatefulSet, DaemonSet, ReplicaSet, Job or CronJob stands for its pods.")
    ex.add_argument("-f", "--filename", required=True, metavar="POD.yaml", help="the manifest ('-': stdin)")
    ex.add_argument("-n", "--namespace", metavar="NS",
                    help="namespace of the pod (default: the manifest's, else the context's, else default)")
    ex.add_argument("--config", metavar="FILE", help="the webhook's policy file, if it runs with one")
    add_source(ex)
    ca = sub.add_parser("capacity", help="GPUs per node pool and product: used, free, fragmented, what more fits",
                        description="Read-only: per node pool and GPU product, GPUs in use and free, FGD "
                                    "fragmentation, GPUs stranded beside too little CPU or memory, how many more "
                                    "pods of each common shape fit now, and nodes that are degraded or initializing.")
    ca.add_argument("--cpu", default="1", help="CPU each counted pod also asks for (default 1)")
    ca.add_argument("--memory", default="4Gi", help="memory each counted pod also asks for (default 4Gi)")
    ca.add_argument("--pool-label", metavar="LABEL",
                    help="node label that names a pool (default: the GKE, AKS, EKS or Karpenter pool label)")
    ca.add_argument("--recent-hours", type=float, default=24.0, metavar="HOURS",
                    help="MIG advice: weigh layouts by the MIG asks of pods created this long before the newest pod "
                         "(default 24)")
    ca.add_argument("--plot", metavar="FILE.png", help="also draw the pools (needs: pip install 'gpu-tailor[plot]')")
    add_source(ca)


def kubectl_main(argv: list[str] | None = None) -> int:
    """``kubectl gpu-tailor explain|capacity``: kubectl finds ``kubectl-gpu_tailor`` on PATH and runs it with
    the arguments after the plugin's name; the kubeconfig is kubectl's ($KUBECONFIG, else ~/.kube/config)."""
    parser = argparse.ArgumentParser(prog="kubectl gpu-tailor", description=(
        "Why is my GPU pod Pending, and what would fit: gpu-tailor's explain and capacity, read-only, "
        "with the current kubeconfig context."))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_commands(sub)
    args = parser.parse_args(argv)
    if args.command == "explain":
        return run_explain(args, "kubectl gpu-tailor explain")
    return run_capacity(args, "kubectl gpu-tailor capacity")
