"""``gpu-tailor webhook``: wire flags to the server and run it until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from gpu_tailor.serving import CertReloader, serve_until_stopped, tls_context
from gpu_tailor.webhook.config import ConfigError, load_policy
from gpu_tailor.webhook.server import cluster_file_ctx, make_app, watch_ctx
from gpu_tailor.webhook.state import ClusterView


async def serve(args: argparse.Namespace) -> None:
    view = ClusterView(load_policy(args.config))
    app = make_app(view)
    if args.cluster_file:
        app.cleanup_ctx.append(cluster_file_ctx(args.cluster_file))
    else:
        app.cleanup_ctx.append(watch_ctx(args.kubeconfig, args.in_cluster))
    ctx = tls_context(args.tls_cert, args.tls_key)
    await serve_until_stopped(app, args.listen, ctx, CertReloader(ctx, args.tls_cert, args.tls_key), "webhook")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.tls_cert or not args.tls_key:
        print("gpu-tailor webhook: --tls-cert and --tls-key are required (the API server only calls HTTPS)",
              file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(args))
    except (ConfigError, ValueError, OSError) as exc:
        print(f"gpu-tailor webhook: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0
