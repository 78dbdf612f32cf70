"""``gpu-tailor simulate``: until the trace replay lands, print the bundled example inventory."""

from __future__ import annotations

import argparse
import json
from importlib import resources

from gpu_tailor.gpumodel.inventory import NodeInventory, from_node


def bundled_nodes() -> list[NodeInventory]:
    folder = resources.files("gpu_tailor") / "data" / "nodes"
    return [from_node(json.loads(f.read_text())) for f in sorted(folder.iterdir(), key=lambda f: f.name)
            if f.name.endswith(".json")]


def inventory_table(nodes: list[NodeInventory]) -> str:
    header = ("node", "model", "GPUs", "GiB/GPU", "health", "offers")
    rows = [header]
    for n in nodes:
        offers = ", ".join(f"{o.allocatable} x {o.label} as {o.resource}" for o in n.offerings) or "-"
        health = n.health.state.value + (f" ({n.health.reason})" if n.health.reason else "")
        rows.append((n.name, n.model or "-", str(n.gpu_count), f"{n.gpu_memory_mib / 1024:.0f}", health, offers))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1] for r in rows)


def run(args: argparse.Namespace) -> int:
    print(inventory_table(bundled_nodes()))
    return 0
