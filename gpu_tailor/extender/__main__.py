"""``gpu-tailor extender``: wire flags to the extender and run it until SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpu_tailor.extender.cache import Cache
from gpu_tailor.extender.gangbook import GROUP_TIMEOUT
from gpu_tailor.extender.server import DEFAULT_MAX_BODY, make_app, watch_ctx
from gpu_tailor.gpumodel.policies import Prior, configure
from gpu_tailor.gpumodel.schedule import DOMAIN_LABELS
from gpu_tailor.serving import CertReloader, serve_until_stopped, split_listen, tls_context


class PriorSettings(BaseModel):
    """``prior:`` whole-node jobs the learnt pod mix counts before any arrives (``gpumodel.policies.fgd.Prior``)."""

    model_config = ConfigDict(extra="forbid")
    weight: float = Field(default=0.0, ge=0, le=1e6)  # how many pods they count as at the start
    floor: float = Field(default=0.0, ge=0, lt=1)  # the share of the mix they keep
    minGpus: int = Field(default=8, ge=2, le=64)  # node sizes (GPUs) that get a whole-node job


class Settings(BaseModel):
    """``--config`` YAML of the extender."""

    model_config = ConfigDict(extra="forbid")
    maxBodyMiB: int = Field(default=DEFAULT_MAX_BODY // 2**20, ge=1, le=1024)
    # placements the policy scores alike: rank | whole | blocks | multi-blocks (gpumodel.policies.TIES)
    ties: Literal["rank", "whole", "blocks", "multi-blocks"] = "multi-blocks"
    prior: PriorSettings = Field(default_factory=PriorSettings)
    # node labels naming an NVLink domain (a rack, a network block), read before GFD's nvidia.com/gpu.clique
    domainLabels: list[str] = Field(default_factory=list, max_length=8)
    groupTimeoutSeconds: float = Field(default=GROUP_TIMEOUT, ge=10, le=86_400)  # a group plan's wait for its pods

    def apply(self, cache: Cache) -> None:
        """The tie-break and the prior, on the cache's policy; where NVLink domains are read; how long a plan waits."""
        p = self.prior
        configure(cache.policy, self.ties, Prior(p.weight, p.floor, p.minGpus))
        cache.domain_keys = (*self.domainLabels, *DOMAIN_LABELS)
        cache.groups.timeout = self.groupTimeoutSeconds


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


async def serve(args: argparse.Namespace) -> None:
    settings = load_settings(args.config)
    cache = Cache()
    settings.apply(cache)
    if args.cluster_file:
        from gpu_tailor.kube.clusterfile import load_cluster

        nodes, pods = load_cluster(args.cluster_file)
        cache.reset_pods(pods)
        cache.reset_nodes(nodes)
    if not 0 < args.unhealthy_after <= 3600:
        raise ValueError("--unhealthy-after: expected seconds between 1 and 3600")
    probes_port = split_listen(args.metrics_listen)[1] if args.metrics_listen else None
    if probes_port is not None and probes_port in (0, split_listen(args.listen)[1]):
        raise ValueError("--metrics-listen needs a port of its own, not 0 nor --listen's")
    app = make_app(cache, max_body=settings.maxBodyMiB * 2**20, unhealthy_after=args.unhealthy_after,
                   scheduler_healthz=args.scheduler_healthz, probes_port=probes_port)
    if not args.cluster_file:
        app.cleanup_ctx.append(watch_ctx(cache, args.kubeconfig, args.in_cluster, dra=args.dra != "off"))
    ssl_ctx, reloader = None, None
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            raise ValueError("--tls-cert and --tls-key go together")
        ssl_ctx = tls_context(args.tls_cert, args.tls_key)
        reloader = CertReloader(ssl_ctx, args.tls_cert, args.tls_key)
    await serve_until_stopped(app, args.listen, ssl_ctx, reloader, "extender", drain=args.drain,
                              probes_listen=args.metrics_listen)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # no access log: kube-scheduler calls filter, prioritize and bind for every pod, and writing three
    # lines per pod cost more CPU than filter itself (py-spy during schedbench); /metrics counts them
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    try:
        asyncio.run(serve(args))
    except (ValueError, OSError) as exc:
        print(f"gpu-tailor extender: {exc}", file=sys.stderr)
        return 2
    return 0
