"""Where the tools read the cluster from: a ``kubectl get nodes,pods,namespaces -A -o json`` dump (with
``resourceslices,resourceclaims,deviceclasses`` for DRA pools, ``nodegpureports`` where the node agent runs, and the
objects that size groups of pods: ``jobs`` and PodGroups or Workloads), or the live API through a kubeconfig,
read-only (list nodes, pods, the node agents' reports where their CRD is installed, where ``resource.k8s.io/v1`` is
served ResourceSlices, ResourceClaims and DeviceClasses, and the group objects the extender watches where served;
get one namespace; nothing is written).

``namespaces`` is None when the source does not say (a dump taken without them): the caller then
assumes the pod's namespace opted in and says so.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpu_tailor.gpumodel.dra_state import DraState
from gpu_tailor.gpumodel.groups import GroupObjects
from gpu_tailor.gpumodel.report import GROUP, KIND, PLURAL, VERSION
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
    dra: DraState = field(default_factory=lambda: DraState(enabled=False))  # ResourceSlices, claims, classes
    reports: list[Obj] = field(default_factory=list)  # the node agents' NodeGPUReports
    groups: GroupObjects = field(default_factory=GroupObjects)  # what sizes groups of pods: PodGroups, Workloads, Jobs


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
    by_kind: dict[str, list[Obj]] = {"ResourceSlice": [], "ResourceClaim": [], "DeviceClass": [], KIND: []}
    for item in data.get("items") or []:
        if isinstance(item, dict) and item.get("kind") == "Namespace":
            meta = item.get("metadata") or {}
            namespaces[str(meta.get("name", ""))] = dict(meta.get("labels") or {})
        elif isinstance(item, dict) and item.get("kind") in by_kind:
            by_kind[item["kind"]].append(item)
    dra_kinds = (by_kind["ResourceSlice"], by_kind["ResourceClaim"], by_kind["DeviceClass"])
    return Cluster(nodes, pods, namespaces or None, f"cluster file {path}",
                   dra=dra_state(*dra_kinds, enabled=any(dra_kinds)), reports=by_kind[KIND],
                   groups=group_objects(data.get("items") or []))


def group_objects(items: list[Any], store: GroupObjects | None = None) -> GroupObjects:
    """The objects among ``items`` (a dump's, a manifest's) that size groups of pods, added to ``store`` (a new one by
    default) as the extender's watches keep them (``kube.groupobjects.SOURCES``: an object is one by its
    ``apiVersion`` and kind)."""
    from gpu_tailor.kube.groupobjects import SOURCES

    store = GroupObjects() if store is None else store
    for kind, group, version, plural, read in SOURCES:
        for item in items:
            if isinstance(item, dict) and item.get("apiVersion") == f"{group}/{version}" \
                    and f"{str(item.get('kind', '')).lower()}s" == plural:
                store.apply(kind, read, "ADDED", item)
    return store


def dra_state(slices: list[Obj], claims: list[Obj], classes: list[Obj], enabled: bool = True) -> DraState:
    state = DraState(enabled=enabled)
    state.reset_slices(slices)
    state.reset_claims(claims)
    state.reset_classes(classes)
    return state


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
        notes = []
        resource = client.ResourceV1Api(api)
        try:
            await resource.get_api_resources()
            slices, _ = await list_all(resource.list_resource_slice)
            held, _ = await list_all(resource.list_resource_claim_for_all_namespaces)
            classes, _ = await list_all(resource.list_device_class)
            dra = dra_state(slices, held, classes)
        except ApiException as exc:
            dra = DraState(enabled=False)
            if exc.status != 404:
                notes.append(f"DRA could not be read (HTTP {exc.status}: {exc.reason}): DRA pools are left out")
        except (TimeoutError, OSError) as exc:
            dra = DraState(enabled=False)
            notes.append(f"DRA could not be read ({exc}): DRA pools are left out")
        reports: list[Obj] = []
        try:
            reports, _ = await list_all(functools.partial(client.CustomObjectsApi(api).list_cluster_custom_object,
                                                          GROUP, VERSION, PLURAL))
        except ApiException as exc:
            if exc.status != 404:  # 404: no node agent installed
                notes.append(f"the node agents' reports could not be read (HTTP {exc.status}: {exc.reason}): "
                             "GPUs within nodes are predicted")
        except (TimeoutError, OSError) as exc:
            notes.append(f"the node agents' reports could not be read ({exc}): GPUs within nodes are predicted")
        groups = await _read_groups(client.CustomObjectsApi(api), notes)
        ns = namespace or default_ns
        namespaces: dict[str, dict[str, str]] | None
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
    return Cluster(nodes, pods, namespaces, where, default_ns, notes, dra, reports, groups)


async def _read_groups(custom: Any, notes: list[str]) -> GroupObjects:
    """The group objects the API server serves (those the extender watches; 404: not served, nothing to say)."""
    import aiohttp
    from kubernetes_asyncio.client.exceptions import ApiException

    from gpu_tailor.kube.groupobjects import SOURCES
    from gpu_tailor.kube.watch import list_all

    store = GroupObjects()
    for kind, group, version, plural, read in SOURCES:
        try:
            items, _ = await list_all(functools.partial(custom.list_cluster_custom_object, group, version, plural))
        except ApiException as exc:
            if exc.status != 404:
                notes.append(f"{plural} ({group}/{version}) could not be read (HTTP {exc.status}: {exc.reason}): "
                             "groups sized by them are taken as single pods")
            continue
        except (TimeoutError, OSError, aiohttp.ClientError) as exc:
            notes.append(f"{plural} ({group}/{version}) could not be read ({exc}): groups sized by them are taken "
                         "as single pods")
            continue
        store.reset(kind, read, items)
    return store


def read_live(kubeconfig: str | None, context: str | None = None, namespace: str | None = None) -> Cluster:
    """Nodes, pods and the namespace ``namespace`` (else the context's) of the live cluster."""
    return asyncio.run(_read_live(kubeconfig, context, namespace))
