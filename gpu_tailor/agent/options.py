"""The agent's flags, apart from its code, so that ``gpu-tailor --help`` imports neither gRPC nor NVML."""

from __future__ import annotations

import argparse
import os

SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"  # the kubelet's PodResources socket


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node", default=os.environ.get("NODE_NAME", ""), metavar="NAME",
                   help="this node's name (default: $NODE_NAME, set from the pod's spec.nodeName)")
    p.add_argument("--pod-resources-socket", default=SOCKET, metavar="PATH",
                   help=f"the kubelet's PodResources socket (default {SOCKET})")
    p.add_argument("--interval", type=float, default=10.0, metavar="SECONDS", help="how often to look (default 10)")
    p.add_argument("--renew", type=float, default=300.0, metavar="SECONDS",
                   help="write the report this often even when nothing changed (default 300; the extender forgets a "
                        "report not renewed for 900)")
    p.add_argument("--no-nvml", action="store_true", help="do not load NVML (report the kubelet's view only)")
    p.add_argument("--once", action="store_true", help="print one report as JSON and exit; write nothing")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: the pod's service account)")
    src.add_argument("--in-cluster", action="store_true", help="use the pod's service account (the default)")
