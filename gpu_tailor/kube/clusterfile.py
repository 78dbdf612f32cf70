"""Read ``kubectl get nodes,pods -A -o json`` output (JSON or YAML ``List``) for offline use."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml


class ClusterFileError(ValueError):
    pass


def parse_cluster(text: str, source: str = "cluster file") -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Nodes and pods of a List (``items`` with ``kind`` set, as kubectl prints mixed lists)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ClusterFileError(f"{source}: neither JSON nor YAML: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("items"), list):
        raise ClusterFileError(f"{source}: expected a Kubernetes List with 'items'")
    list_kind = str(data.get("kind", ""))
    nodes: list[dict[str, Any]] = []
    pods: list[dict[str, Any]] = []
    for i, item in enumerate(data["items"]):
        if not isinstance(item, dict):
            raise ClusterFileError(f"{source}: items[{i}] is not an object")
        kind = item.get("kind") or list_kind.removesuffix("List")
        if kind == "Node":
            nodes.append(item)
        elif kind == "Pod":
            pods.append(item)
    return nodes, pods


def load_cluster(path: str | Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ClusterFileError(f"{path}: {exc.strerror}") from exc
    return parse_cluster(text, str(path))
