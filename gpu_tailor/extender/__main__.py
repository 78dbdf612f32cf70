"""``gpu-tailor extender``: wire flags to the extender and run it until SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

import yaml
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpu_tailor.certs.serving import CertReloader, tls_context
from gpu_tailor.extender.server import DEFAULT_MAX_BODY, make_app, watch_ctx
from gpu_tailor.extender.state import ClusterState


class Settings(BaseModel):
    """``--config`` YAML of the extender."""

    model_config = ConfigDict(extra="forbid")
    maxBodyMiB: int = Field(default=DEFAULT_MAX_BODY // 2**20, ge=1, le=1024)


def load_settings(path: str | None) -> Settings:
    if not path:
        return Settings()
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
        return Settings.model_validate(data)
    except ValidationError as exc:
        errs = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"{path}: {errs}") from exc
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: {exc}") from exc


def split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--listen {listen!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


async def serve(args: argparse.Namespace) -> None:
    settings = load_settings(args.config)
    state = ClusterState()
    if args.cluster_file:
        from gpu_tailor.kube.clusterfile import load_cluster

        nodes, pods = load_cluster(args.cluster_file)
        state.reset_pods(pods)
        state.reset_nodes(nodes)
    app = make_app(state, max_body=settings.maxBodyMiB * 2**20)
    if not args.cluster_file:
        app.cleanup_ctx.append(watch_ctx(state, args.kubeconfig, args.in_cluster))
    ssl_ctx = None
    reloader = None
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            raise ValueError("--tls-cert and --tls-key go together")
        ssl_ctx = tls_context(args.tls_cert, args.tls_key)
        reloader = asyncio.create_task(CertReloader(ssl_ctx, args.tls_cert, args.tls_key).run())
    host, port = split_listen(args.listen)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=ssl_ctx).start()
    logging.info("extender serving %s://%s:%d", "https" if ssl_ctx else "http", host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        if reloader is not None:
            reloader.cancel()
        await runner.cleanup()


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(serve(args))
    except (ValueError, OSError) as exc:
        print(f"gpu-tailor extender: {exc}", file=sys.stderr)
        return 2
    return 0
