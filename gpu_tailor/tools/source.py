"""Where the tools read the cluster from: a ``kubectl get nodes,pods,namespaces -A -o json`` dump, or the
live API through a kubeconfig, read-only (list nodes, list pods, get one namespace; nothing is written).

``namespaces`` is None when the source does not say (a dump taken without them): the caller then
assumes the pod's namespace opted in and says so.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpu_tailor.kube.clusterfile import ClusterFileError, parse_cluster

Obj = dict[str, Any]


class SourceError(RuntimeError):
    """The cluster could not be read: the message says what and where."""


@dataclass
class Cluster:
    nodes: list[Obj]
    pods: list[Obj]
    namespaces: dict[str, dict[str, str]] | None  # name -> labels; None: the source does not say
    source: str  # for people: "cluster file X", "kubeconfig X, context Y"
    default_namespace: str = "default"  # the kubeconfig context's namespace, else "default"
    notes: list[str] = field(default_factory=list)


def load_dump(path: str) -> Cluster:
    try:
        text = Path(path).read_text()
        nodes, pods = parse_cluster(text, path)
    except OSError as exc:
        raise SourceError(f"{path}: {exc.strerror}") from exc
    except ClusterFileError as exc:
        raise SourceError(str(exc)) from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = yaml.safe_load(text)
    namespaces: dict[str, dict[str, str]] = {}
    for item in data.get("items") or []:
        if isinstance(item, dict) and item.get("kind") == "Namespace":
            meta = item.get("metadata") or {}
            namespaces[str(meta.get("name", ""))] = dict(meta.get("labels") or {})
    return Cluster(nodes, pods, namespaces or None, f"cluster file {path}")


def kubeconfig_path(given: str | None) -> str:
    """Where kubectl would read its kubeconfig: ``--kubeconfig``, else the first file of ``$KUBECONFIG``
    (kubectl merges a list; the first file holds the current context in nearly every setup), else
    ``~/.kube/config``. Read at call time: kubernetes-asyncio reads ``$KUBECONFIG`` once, at import."""
    if given:
        return given
    listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    return listed[0] if listed else str(Path.home() / ".kube" / "config")


async def _read_live(given: str | None, context: str | None, namespace: str | None) -> Cluster:
    from kubernetes_asyncio import client, config
    from kubernetes_asyncio.client.exceptions import ApiException

    from gpu_tailor.kube.watch import list_all

    kubeconfig = kubeconfig_path(given)
    try:
        await config.load_kube_config(config_file=kubeconfig, context=context)
        contexts, current = config.list_kube_config_contexts(config_file=kubeconfig)
    except (config.ConfigException, OSError) as exc:
        raise SourceError(f"kubeconfig {kubeconfig}: {exc}") from exc
    active: dict[str, Any] = current or {}
    if context is not None:
        active = next((c for c in contexts if c.get("name") == context), active)
    context = str(active.get("name", ""))
    default_ns = str((active.get("context") or {}).get("namespace") or "default")
    where = f"kubeconfig {kubeconfig}, context {context}"
    api = client.ApiClient()
    try:
        core = client.CoreV1Api(api)
        try:
            nodes, _ = await list_all(core.list_node)
            pods, _ = await list_all(core.list_pod_for_all_namespaces)
        except (TimeoutError, ApiException, OSError) as exc:
            raise SourceError(f"{where}: listing nodes and pods: {getattr(exc, 'reason', exc)}") from exc
        ns = namespace or default_ns
        namespaces: dict[str, dict[str, str]] | None
        notes = []
        try:
            resp: Any = await core.read_namespace(ns, _preload_content=False)
            body = json.loads(await resp.read())
            resp.release()
            if resp.status == 200:
                namespaces = {ns: dict((body.get("metadata") or {}).get("labels") or {})}
            else:
                namespaces = None
                notes.append(f"namespace {ns} could not be read (HTTP {resp.status}: {body.get('message', '')})")
        except (ApiException, OSError, ValueError) as exc:
            namespaces = None
            notes.append(f"namespace {ns} could not be read: {exc}")
    finally:
        await api.close()
    return Cluster(nodes, pods, namespaces, where, default_ns, notes)


def read_live(kubeconfig: str | None, context: str | None = None, namespace: str | None = None) -> Cluster:
    """Nodes, pods and the namespace ``namespace`` (else the context's) of the live cluster."""
    return asyncio.run(_read_live(kubeconfig, context, namespace))
