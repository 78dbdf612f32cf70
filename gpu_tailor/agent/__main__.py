"""``gpu-tailor agent``: publish what this node did with its GPUs, as a ``NodeGPUReport`` named after it.

Every ``--interval`` seconds it asks the kubelet (PodResources, over ``--pod-resources-socket``) and the
driver (NVML, where there is one) and, when the report changed or ``--renew`` seconds after it was last written,
writes it: created if missing, else replaced at the version read (a conflict is simply retried on the next
round). The extender forgets a report not renewed for 15 minutes. The report is owned by the
Node object, so deleting the node deletes it. The node is the pod's own (``NODE_NAME``, from the
downward API's ``spec.nodeName``); the webhook refuses an agent's write to any other node's report
(``webhook.reports``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import logging
import sys
import time
from typing import Any

from gpu_tailor.agent import collect, nvml, podresources
from gpu_tailor.gpumodel.report import GROUP, PLURAL, VERSION, NodeReport

log = logging.getLogger("gpu_tailor.agent")


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Agent:
    """One round at a time: ``look`` builds the report, ``publish`` writes it when it changed."""

    def __init__(self, node: str, kubelet: podresources.Client, driver: Any | None) -> None:
        self.node, self.kubelet, self.driver = node, kubelet, driver
        self.last: NodeReport | None = None  # as last written (reports that differ only in time are equal)
        # device UUIDs NVML named, to their GPU: a GPU the driver loses can no longer be asked its UUID, but a pod the
        # device plugin gave it still holds it (``collect.remembered`` says which are kept)
        self.seen: dict[str, int] = {}

    async def look(self) -> NodeReport:
        assigned = await self.kubelet.assigned()
        offered = await self.kubelet.allocatable()
        reading = nvml.read(self.driver) if self.driver is not None else None
        if reading is not None:
            named = {i.split("::", 1)[0] for d in (*assigned, *offered) for i in d.ids}
            self.seen = collect.remembered(self.seen, reading, named)
        return collect.build(self.node, assigned, offered, reading, now(), known=self.seen)

    async def publish(self, custom: Any, core: Any, report: NodeReport, renew: bool = False) -> bool:
        """Write ``report`` unless it says what the last one written said (``renew``: write it anyway, so that its
        ``observedAt`` says the agent is alive); whether it wrote."""
        if self.last is not None and report == self.last and not renew:
            return False
        from kubernetes_asyncio.client.exceptions import ApiException

        body = report.object()
        node = await core.read_node(self.node)
        body["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": self.node,
                                                "uid": node.metadata.uid}]
        try:
            existing = await custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, self.node)
        except ApiException as exc:
            if exc.status != 404:
                raise
            await custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
        else:
            body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
            await custom.replace_cluster_custom_object(GROUP, VERSION, PLURAL, self.node, body)
        self.last = report
        return True


async def serve(args: argparse.Namespace) -> int:
    driver = None
    if not args.no_nvml:
        try:
            driver = nvml.load()
        except nvml.NvmlUnavailable as exc:
            log.warning("%s: reporting the kubelet's view only (GPU indices only for index device ids)", exc)
    kubelet = podresources.Client(args.pod_resources_socket)
    agent = Agent(args.node, kubelet, driver)
    try:
        if args.once:
            import orjson

            try:
                report = await agent.look()
            except podresources.PodResourcesError as exc:
                print(f"gpu-tailor agent: {exc}", file=sys.stderr)
                return 1
            print(orjson.dumps(report.object(), option=orjson.OPT_INDENT_2).decode())
            return 0
        from kubernetes_asyncio import client

        from gpu_tailor.kube.watch import watching

        async with watching(args.kubeconfig, args.in_cluster, lambda api: []) as api:
            custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
            renewed = time.monotonic()
            while True:
                try:
                    renew = time.monotonic() - renewed >= args.renew
                    if await agent.publish(custom, core, await agent.look(), renew):
                        renewed = time.monotonic()
                        log.info("report for %s written", args.node)
                except podresources.PodResourcesError as exc:
                    log.warning("kubelet: %s", exc)
                except Exception as exc:  # the API server browns out, a conflict: the next round tries again
                    log.warning("report for %s not written: %s", args.node, exc)
                await asyncio.sleep(args.interval)
    finally:
        await kubelet.close()


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.node:
        raise SystemExit("gpu-tailor agent: --node (or NODE_NAME) is required: the node this agent reports on")
    if not 1 <= args.interval <= 3600:
        raise SystemExit("gpu-tailor agent: --interval: expected seconds between 1 and 3600")
    if not args.interval <= args.renew <= 600:
        raise SystemExit("gpu-tailor agent: --renew: expected seconds between --interval and 600 (the extender "
                         "forgets a report not renewed for 900)")
    return asyncio.run(serve(args))
