"""``gpu-tailor webhook``: wire flags to the server and run it until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
from pathlib import Path

from gpu_tailor.certs.authority import Names
from gpu_tailor.kube.freshness import stale_after
from gpu_tailor.serving import CertReloader, serve_until_stopped, server_context, tls_context
from gpu_tailor.webhook.config import ConfigError, load_policy
from gpu_tailor.webhook.server import KeptCerts, cluster_file_ctx, make_app, watch_ctx
from gpu_tailor.webhook.state import ClusterView


def kept_certs(args: argparse.Namespace) -> KeptCerts:
    namespace, _, secret = args.certs_secret.partition("/")
    if not namespace or not secret:
        raise ValueError(f"--certs-secret {args.certs_secret!r}: expected NAMESPACE/NAME")
    names = Names(args.service, namespace, tuple(args.host or ()), tuple(args.ip or ()))
    names.ip_addresses()  # a bad --ip fails here, with its value in the message
    # a private directory under TMPDIR (an emptyDir under readOnlyRootFilesystem)
    directory = Path(tempfile.mkdtemp(prefix="gpu-tailor-tls-"))
    ctx = server_context()
    return KeptCerts(ctx=ctx, reloader=CertReloader(ctx, str(directory / "tls.crt"), str(directory / "tls.key")),
                     directory=directory, names=names, namespace=namespace, secret=secret,
                     webhook_config=args.webhook_config, days=args.cert_days, renew_before_days=args.renew_before,
                     interval=args.certs_sync_interval)


async def serve(args: argparse.Namespace) -> None:
    if not 5 <= args.watch_window <= 3600:
        raise ValueError("--watch-window: expected seconds between 5 and 3600")
    view = ClusterView(load_policy(args.config), stale_after=stale_after(args.watch_window))
    kept = kept_certs(args) if args.certs_secret else None
    app = make_app(view, agents=args.agent_namespace or (kept.namespace if kept is not None else "gpu-tailor"),
                   agent_account=args.agent_service_account)
    if args.cluster_file:
        app.cleanup_ctx.append(cluster_file_ctx(args.cluster_file))
    else:
        app.cleanup_ctx.append(watch_ctx(args.kubeconfig, args.in_cluster, kept, args.watch_window,
                                         dra=args.dra != "off"))
    if kept is not None:
        ctx, reloader = kept.ctx, None  # the keeper reloads it
    else:
        ctx = tls_context(args.tls_cert, args.tls_key)
        reloader = CertReloader(ctx, args.tls_cert, args.tls_key)
    await serve_until_stopped(app, args.listen, ctx, reloader, "webhook", drain=args.drain)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # no access log: a line per pod create cost 5% of the webhook's CPU under load (py-spy during
    # benchmarks/webhook_create_latency.py); /metrics counts the reviews and times them
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    if args.certs_secret and (args.tls_cert or args.tls_key):
        print("gpu-tailor webhook: --certs-secret and --tls-cert/--tls-key are alternatives", file=sys.stderr)
        return 2
    if args.certs_secret and args.cluster_file:
        print("gpu-tailor webhook: --certs-secret needs the API server (not --cluster-file)", file=sys.stderr)
        return 2
    if args.certs_secret and args.cert_days <= args.renew_before:
        print(f"gpu-tailor webhook: --cert-days {args.cert_days} must be more than --renew-before "
              f"{args.renew_before} (else every check would issue a new certificate)", file=sys.stderr)
        return 2
    if not args.certs_secret and (not args.tls_cert or not args.tls_key):
        print("gpu-tailor webhook: give --tls-cert and --tls-key, or --certs-secret (the API server only "
              "calls HTTPS)", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(args))
    except (ConfigError, ValueError, OSError, RuntimeError) as exc:
        print(f"gpu-tailor webhook: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0
