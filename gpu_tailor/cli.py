"""The ``gpu-tailor`` command: one entry point, its subcommands.

Each subcommand's work lives in its own package; this module only parses flags and dispatches, so
``gpu-tailor --help`` stays fast and does not import aiohttp or the Kubernetes client.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gpu_tailor import __version__
from gpu_tailor.tools.cli import add_commands  # its flags only: the standard library at import

# Every --config key, named in --help (tests/test_cli.py holds these to the models; the models are not imported here,
# so that the CLI starts without pydantic); docs/configuration.md describes each.
WEBHOOK_CONFIG_HELP = (
    "YAML policy (docs/configuration.md): schedulerName (default gpu-tailor-scheduler), cpuOnlyPods (true), "
    "defaultIsolation (any), onMismatch (deny, or useLimits), offerings: pools scaled to zero, each with backing, "
    "product, migProfile, migStrategy, replicas, renamed, failRequestsGreaterThanOne, gpuMemory, gpusPerNode, "
    "nodeSelector")
EXTENDER_CONFIG_HELP = (
    "YAML settings (docs/configuration.md): maxBodyMiB (default 64), ties (rank | whole | blocks | multi-blocks, "
    "default multi-blocks), prior: weight, floor, minGpus (whole-node jobs the learnt pod mix counts from the start), "
    "domainLabels (node labels naming an NVLink domain, before nvidia.com/gpu.clique), groupTimeoutSeconds (300: how "
    "long a group's plan holds GPUs for its pods not bound yet)")


def _cluster_source(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig for a live list+watch of the cluster")
    src.add_argument("--in-cluster", action="store_true", help="use the pod's service account (default in a pod)")
    src.add_argument("--cluster-file", metavar="FILE",
                     help="offline: a JSON or YAML List as printed by 'kubectl get nodes,pods -A -o json'")


def _dra(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dra", choices=("auto", "off"), default="auto",
                   help="auto (default): also read NVIDIA's DRA pools where the API server serves resource.k8s.io/v1 "
                        "(asked again every minute until it does); off: device-plugin pools only, and no list or "
                        "watch of resource.k8s.io (its RBAC rules can go)")


def _drain(p: argparse.ArgumentParser) -> None:
    p.add_argument("--drain", type=float, default=2.0, metavar="SECONDS",
                   help="on SIGTERM: answer /readyz 503 but keep serving this long, then let requests in "
                        "flight finish and exit")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-tailor", description=(
        "Portable GPU asks for Kubernetes: an admission webhook, a scheduler extender, their "
        "certificates, and a trace-replay simulator of the placement policy."))
    parser.add_argument("--version", action="version", version=f"gpu-tailor {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    wh = sub.add_parser("webhook", help="serve the mutating admission webhook (HTTPS)",
                        description="Rewrite portable GPU asks (gpu-tailor.io/gpu-milli, gpu-memory) into "
                                    "the NVIDIA resources the cluster offers; enforce limits == requests.")
    wh.add_argument("--listen", default="0.0.0.0:8443", metavar="HOST:PORT", help="address to serve on")
    wh.add_argument("--tls-cert", metavar="FILE", help="serving certificate (PEM); reloaded when it changes")
    wh.add_argument("--tls-key", metavar="FILE", help="private key of the serving certificate (PEM)")
    wh.add_argument("--certs-secret", metavar="NAMESPACE/NAME",
                    help="instead of --tls-cert/--tls-key: keep a CA and the serving certificate in this Secret "
                         "(created if missing, renewed before expiry, shared by all replicas) and write the CA "
                         "into --webhook-config's caBundle")
    wh.add_argument("--webhook-config", default="gpu-tailor", metavar="NAME",
                    help="MutatingWebhookConfiguration whose caBundle --certs-secret keeps (default gpu-tailor)")
    wh.add_argument("--service", default="gpu-tailor-webhook", metavar="NAME",
                    help="Service in front of the webhook, named by the certificate (with --certs-secret)")
    wh.add_argument("--host", action="append", metavar="NAME", help="extra DNS name for the certificate")
    wh.add_argument("--ip", action="append", metavar="ADDRESS",
                    help="extra IP address for the certificate (a webhook registered by URL, e.g. 127.0.0.1)")
    wh.add_argument("--cert-days", type=int, default=365, metavar="DAYS", help="validity of a serving certificate")
    wh.add_argument("--renew-before", type=int, default=30, metavar="DAYS", help="renew when this close to expiry")
    wh.add_argument("--certs-sync-interval", type=float, default=60.0, metavar="SECONDS",
                    help="how often the Secret and the caBundle are checked (with --certs-secret)")
    wh.add_argument("--config", metavar="FILE", help=WEBHOOK_CONFIG_HELP)
    wh.add_argument("--agent-namespace", metavar="NAME",
                    help="namespace of the node agents whose NodeGPUReport writes /reports checks (default: "
                         "--certs-secret's namespace, else gpu-tailor)")
    wh.add_argument("--agent-service-account", metavar="NAME", default="gpu-tailor-agent",
                    help="the node agents' ServiceAccount in --agent-namespace (the chart names it after its release)")
    wh.add_argument("--watch-window", type=int, default=60, metavar="SECONDS",
                    help="how long each watch asks the API server to keep it open; the view counts as stale (a "
                         "warning on GPU pods, never unready) after twice this plus 15 s without news")
    _dra(wh)
    _drain(wh)
    _cluster_source(wh)

    ex = sub.add_parser("extender", help="serve the kube-scheduler extender",
                        description="Filter, prioritize, bind and preempt for GPU pods, by per-GPU "
                                    "occupancy and NVLink topology.")
    ex.add_argument("--listen", default="127.0.0.1:8888", metavar="HOST:PORT", help="address to serve on")
    ex.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate (optional)")
    ex.add_argument("--tls-key", metavar="FILE", help="private key for --tls-cert")
    ex.add_argument("--config", metavar="FILE", help=EXTENDER_CONFIG_HELP)
    ex.add_argument("--metrics-listen", metavar="HOST:PORT",
                    help="also serve /metrics, /healthz, /readyz and /livez here over plain HTTP (e.g. 0.0.0.0:9090, "
                         "the pod IP for Prometheus and the kubelet), and nothing else: the verbs stay on --listen")
    ex.add_argument("--unhealthy-after", type=float, default=300, metavar="SECONDS",
                    help="answer /healthz and /livez 503 once every list and watch has failed this long, or no first "
                         "sync this long after start, so the kubelet restarts the pair and the Lease moves on")
    ex.add_argument("--scheduler-healthz", metavar="URL",
                    help="/livez also asks the kube-scheduler beside it (e.g. https://127.0.0.1:10259/healthz): "
                         "kube-scheduler's liveness probe asks /livez")
    _dra(ex)
    _drain(ex)
    _cluster_source(ex)

    ce = sub.add_parser("certs", help="make a CA and a serving certificate for the webhook",
                        description="Write ca.crt, tls.crt, tls.key, a kubernetes.io/tls Secret manifest, "
                                    "and the caBundle into the webhook configuration.")
    ce.add_argument("--service", default="gpu-tailor-webhook", help="Service name of the webhook")
    ce.add_argument("--namespace", default="gpu-tailor", help="namespace of the Service")
    ce.add_argument("--out", default="certs-out", metavar="DIR", help="directory for the PEM files and manifests")
    ce.add_argument("--days", type=int, default=365, help="validity of the serving certificate")
    ce.add_argument("--renew-before", type=int, default=30, metavar="DAYS",
                    help="renew the serving certificate when it expires within DAYS (the CA is kept)")
    ce.add_argument("--host", action="append", metavar="NAME",
                    help="extra DNS name for the serving certificate (repeatable)")
    ce.add_argument("--ip", action="append", metavar="ADDRESS",
                    help="extra IP address for the serving certificate, e.g. 127.0.0.1 for a webhook "
                         "registered by URL (repeatable)")

    si = sub.add_parser("simulate", help="replay a GPU cluster workload through the placement policies",
                        description="Replay a cluster workload through the placement policies, no cluster needed: "
                                    "by default an openb-like cluster and workload that gpu-tailor generates, "
                                    "or the real Alibaba openb trace (gpu-tailor trace fetch DIR, then --trace DIR).")
    si.add_argument("--trace", metavar="DIR",
                    help="replay the openb trace in DIR (openb_node_list_gpu_node.csv and the --workload's pod list)")
    si.add_argument("--workload", default="default", metavar="NAME",
                    help="with --trace: which pod list, openb_pod_list_NAME.csv (default, gpushare20, gpuspec10, "
                         "multigpu20 ...)")
    si.add_argument("--nodes", metavar="CSV", help="node list CSV in openb's columns (default: the generated cluster)")
    si.add_argument("--pods", metavar="CSV", help="pod list CSV in openb's columns (default: the generated workload)")
    si.add_argument("--policy", action="append", metavar="NAME",
                    help="random, dotprod, gpupacking, gpuclustering, bestfit, fgd, tailor (repeatable)")
    si.add_argument("--seeds", default="42", help="seeds: '42-51' or '42,43'")
    si.add_argument("--inflate", type=float, default=1.3, help="arrived workload target, x GPU capacity")
    si.add_argument("--topology", choices=("none", "hgx", "pairs"), default="none",
                    help="GPU interconnect given to 8-GPU nodes")
    si.add_argument("--json", metavar="FILE", help="write the per-run results as JSON")
    si.add_argument("--plot", metavar="FILE.png",
                    help="write the allocation curve plot here (needs: pip install 'gpu-tailor[plot]')")
    si.add_argument("--workers", type=int, default=1, help="parallel runs")
    si.add_argument("--scheduler", action="append", metavar="NAME", choices=("kube-default", "gpu-tailor"),
                    help="replay through a model of kube-scheduler: kube-default (the cluster's scheduler alone) or "
                         "gpu-tailor (gpu-tailor-scheduler with the extender, running --policy, default tailor); "
                         "repeatable; both when --cluster-file is given")
    si.add_argument("--cluster-file", metavar="DUMP",
                    help="simulate on this cluster's nodes (kubectl get nodes,pods,namespaces -A -o json), empty, with "
                         "a workload drawn from its pods (or from --trace/--pods)")
    si.add_argument("--time-sliced", type=float, default=0.3, metavar="SHARE",
                    help="with --scheduler on trace or generated nodes: this share of each model's nodes time-sliced")
    si.add_argument("--replicas", type=int, default=20, help="with --time-sliced: replicas per GPU")
    si.add_argument("--dra", type=float, default=0.0, metavar="SHARE",
                    help="with --scheduler on trace or generated nodes: this share of each model's GPU nodes "
                         "published through NVIDIA's DRA driver instead of the device plugin (1: all of them): GPUs "
                         "as devices a claim takes whole, time-sliced nodes' GPUs as shared devices a claim takes "
                         "memory of; kube-scheduler's DRA allocator picks the devices (first fit)")
    si.add_argument("--replica-policy", choices=("distributed", "packed", "spread"),
                    help="with --scheduler: how the device plugin hands out replicas (its "
                         "--shared-devices-allocation-policy; default: distributed, or a dump's node labels)")
    si.add_argument("--mig", action="store_true",
                    help="MIG pools on DRA instead: H100 nodes carved on demand (NVIDIA's DynamicMIG) or cut in "
                         "advance (all-1g.10gb, all-balanced), placed by gpu-tailor and by kube-scheduler alone, with "
                         "the single-GPU pods of the trace or generated workload asking for their share of a GPU")
    si.add_argument("--mig-nodes", type=int, default=16, metavar="N", help="with --mig: nodes of 8 H100s (16)")
    si.add_argument("--extender-weight", type=int, metavar="N",
                    help="with --scheduler gpu-tailor: the extender's weight (default: 11, as manifests/scheduler "
                         "ships it)")
    si.add_argument("--ties", choices=("rank", "whole", "blocks", "multi-blocks"),
                    help="how placements the policy scores alike are told apart: rank (a fixed node order alone, as "
                         "the FGD paper's policies do); whole (a used node before a whole free one, then the rank); "
                         "blocks (then the smallest free NVLink block and the fewest GPUs stranded); multi-blocks "
                         "(those for multi-GPU pods only: tailor's own)")
    si.add_argument("--prior", metavar="WEIGHT[:FLOOR]",
                    help="the learnt mix starts from whole-node jobs counted as WEIGHT pods, and keeps FLOOR of the "
                         "mix for them (default: none; what each costs: docs/tailor-experiments.md)")
    si.add_argument("--inventory", action="store_true",
                    help="print the parsed GPU inventory of the bundled example nodes and exit")
    si.add_argument("--jobs", metavar="WORKLOAD",
                    help="multi-pod jobs on NVLink-domain fleets under gpu-tailor and kube-scheduler with and without "
                         "gangs: training (generated), openb (the trace's pods as jobs, needs --trace DIR) or cliques "
                         "(single pods filling NVL72 racks: how large a job of whole trays still fits in one)")
    si.add_argument("--fleet", action="append", metavar="NAME",
                    help="with --jobs: nvl72-gb200, nvl72-gb300, hgx-h100 (repeatable; default: all three, for "
                         "cliques nvl72-gb200)")
    si.add_argument("--racks", type=int, metavar="N",
                    help="with --jobs: NVL72 racks of 18 trays, or 9 x N HGX nodes (default 8; cliques 3)")
    si.add_argument("--durations", action="store_true",
                    help="with --jobs: jobs arrive over time, queue, run and leave (default: arrive until --inflate x "
                         "the GPUs have, placed or dropped, never leaving)")
    tr = sub.add_parser("trace", help="get the openb trace, or write the generated workload as CSV",
                        description="fetch: download the Alibaba openb trace (CC BY 4.0) from its public home into "
                                    "DIR, checking every file's size and SHA-256; generate: write the cluster "
                                    "and workload simulate generates by default as openb-format CSVs.")
    trs = tr.add_subparsers(dest="trace_command", required=True)
    tf = trs.add_parser("fetch", help="download the openb CSVs into DIR")
    tf.add_argument("dir", metavar="DIR")
    tf.add_argument("--base-url", metavar="URL", help="where the CSVs are (default: the public clusterdata repository)")
    tf.add_argument("--timeout", type=float, default=60, metavar="SECONDS", help="per connection and read")
    tg = trs.add_parser("generate", help="write the generated cluster and workload into DIR")
    tg.add_argument("dir", metavar="DIR")
    tg.add_argument("--seed", type=int, default=2023, help="the workload's seed")
    tg.add_argument("--pods", type=int, metavar="N", help="how many pods (default: as many as openb has)")
    ag = sub.add_parser("agent", help="on a GPU node: publish which GPUs each pod really holds (NodeGPUReport)",
                        description="Read the kubelet's PodResources API and NVML, and publish this node's "
                                    "NodeGPUReport, which the extender prefers to its own prediction.")
    from gpu_tailor.agent.options import add_arguments as agent_arguments

    agent_arguments(ag)
    add_commands(sub)  # explain, capacity
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "simulate":
        from gpu_tailor.simulate.cli import run as run_simulate

        return run_simulate(args)
    if args.command == "trace":
        from gpu_tailor.simulate.cli import run_trace

        return run_trace(args)
    if args.command == "webhook":
        from gpu_tailor.webhook.__main__ import run as run_webhook

        return run_webhook(args)
    if args.command == "extender":
        from gpu_tailor.extender.__main__ import run as run_extender

        return run_extender(args)
    if args.command == "agent":
        from gpu_tailor.agent.__main__ import run as run_agent

        return run_agent(args)
    if args.command == "certs":
        from gpu_tailor.certs.__main__ import run as run_certs

        return run_certs(args)
    if args.command == "explain":
        from gpu_tailor.tools.cli import run_explain

        return run_explain(args)
    if args.command == "capacity":
        from gpu_tailor.tools.cli import run_capacity

        return run_capacity(args)
    print(f"gpu-tailor {args.command}: not implemented yet in this version", file=sys.stderr)
    return 2


def kubectl_main(argv: Sequence[str] | None = None) -> int:
    """The ``kubectl-gpu_tailor`` plugin: ``kubectl gpu-tailor explain|capacity``."""
    from gpu_tailor.tools.cli import kubectl_main as run

    return run(list(argv) if argv is not None else None)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
