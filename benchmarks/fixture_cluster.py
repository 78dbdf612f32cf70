"""A cluster of N nodes for benchmarks: renamed copies of the nine bundled fixture nodes, in turn."""

from __future__ import annotations

import copy
import json
from importlib import resources
from typing import Any


def fixture_nodes(n: int) -> list[dict[str, Any]]:
    folder = resources.files("gpu_tailor") / "data" / "nodes"
    base = [json.loads(f.read_text()) for f in sorted(folder.iterdir(), key=lambda f: f.name)
            if f.name.endswith(".json")]
    out = []
    for i in range(n):
        node = copy.deepcopy(base[i % len(base)])
        node["metadata"]["name"] = f"{node['metadata']['name']}-{i}"
        out.append(node)
    return out
