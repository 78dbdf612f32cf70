"""What ``gpu-tailor simulate`` shows of its runs: the tables it prints (the replays, ``--scheduler`` runs and
``--inventory``) and the allocation curve ``--plot`` draws, which needs the optional ``plot`` extra (matplotlib)."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable
from statistics import mean

from gpu_tailor.gpumodel.inventory import NodeInventory
from gpu_tailor.simulate.headroom import Headroom
from gpu_tailor.simulate.kube import Meter
from gpu_tailor.simulate.trace import RunResult, TraceError


def aligned(rows: list[list[str]], right: Callable[[int], bool]) -> list[str]:
    """``rows`` as lines of columns two spaces apart, column ``i`` right-aligned where ``right(i)``."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(w) if right(i) else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
            .rstrip() for r in rows]


def table(results: list[RunResult], topology: str, refs: list[Headroom] | None = None) -> str:
    groups: dict[tuple[str, str], list[RunResult]] = defaultdict(list)
    for r in results:
        groups[(r.workload, r.policy)].append(r)
    header = ["workload", "policy", "seeds", "alloc@90%", "alloc@100%", "alloc@130%", "frag@100%", "failed", "seconds"]
    if topology != "none":
        header.append("multi-GPU on NVLink")
    rows = [header]
    for (workload, policy), rs in groups.items():
        top = max(rs[0].alloc, key=int)
        row = [workload, policy, str(len(rs)),
               f"{mean(r.alloc.get('90', 0.0) for r in rs):.2f}",
               f"{mean(r.alloc.get('100', 0.0) for r in rs):.2f}",
               f"{mean(r.alloc[top] for r in rs):.2f}",
               f"{mean(r.frag.get('100', 0.0) for r in rs):.2f}",
               f"{mean(r.failed_pods for r in rs):.0f}",
               f"{mean(r.seconds for r in rs):.1f}"]
        if topology != "none":
            multi = sum(r.multi_gpu_pods for r in rs)
            row.append(f"{100 * sum(r.multi_gpu_nvlinked for r in rs) / multi:.1f}%" if multi else "-")
        rows.append(row)
    out = "\n".join(aligned(rows, lambda i: i > 1))
    if refs:
        out += (f"\nGPU-only references at 100% arrived, mean of {len(refs)} seed(s), with CPU, memory, models and"
                f" node boundaries ignored:\n  online best-fit {mean(r.online for r in refs):.2f}"
                f"   offline best-fit-decreasing {mean(r.offline for r in refs):.2f}")
    return out


def check_plot_available() -> None:
    """``--plot`` needs the optional ``plot`` extra: say so before a replay that can take minutes."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise TraceError("--plot needs matplotlib: pip install 'gpu-tailor[plot]'") from exc


def plot(results: list[RunResult], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple[str, str], list[RunResult]] = defaultdict(list)
    for r in results:
        groups[(r.workload, r.policy)].append(r)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (workload, policy), rs in groups.items():
        xs = sorted(int(k) for k in rs[0].alloc)
        ys = [mean(r.alloc[str(x)] for r in rs) for x in xs]
        label = policy if len({w for w, _ in groups}) == 1 else f"{policy} ({workload})"
        ax.plot(xs, ys, label=label, linewidth=1.4)
    ax.plot([0, 100], [0, 100], color="grey", linestyle=":", linewidth=0.8)
    ax.set_xlabel("arrived workload (% of cluster GPU capacity)")
    ax.set_ylabel("GPUs allocated (%)")
    ax.set_ylim(60, 100)
    ax.set_xlim(60, max(int(k) for k in results[0].alloc))
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(f"GPU allocation vs arrived workload ({', '.join(sorted({w for w, _ in groups}))})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def inventory_table(nodes: list[NodeInventory]) -> str:
    header = ("node", "model", "GPUs", "GiB/GPU", "health", "offers")
    rows = [header]
    for n in nodes:
        offers = ", ".join(f"{o.allocatable} x {o.label} as {o.resource}" for o in n.offerings) or "-"
        health = n.health.state.value + (f" ({n.health.reason})" if n.health.reason else "")
        rows.append((n.name, n.model or "-", str(n.gpu_count), f"{n.gpu_memory_mib / 1024:.0f}", health, offers))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1] for r in rows)


def scheduled_table(runs: list[tuple[str, str, int, Meter]], top: int, largest: int) -> str:
    groups: dict[tuple[str, str], list[Meter]] = defaultdict(list)
    for scheduler, policy, _, meter in runs:
        groups[(scheduler, policy)].append(meter)
    header = ["scheduler", "policy", "seeds", "alloc@90%", "alloc@100%", f"alloc@{top}%", "failed pods",
              f"whole {largest}-GPU nodes free @90% / @100%"]
    rows = [header]
    for (scheduler, policy), ms in groups.items():
        curves = [m.curve(top) for m in ms]
        failed = Counter[str]()
        for m in ms:
            failed.update(m.failed)
        kinds = ", ".join(f"{k} {failed[k] / len(ms):.1f}".removesuffix(".0") for k in ("frac", "1gpu", "multi", "cpu")
                          if failed[k])
        whole = [f"{mean(m.whole_nodes.get(mark, 0) for m in ms):.1f}" for mark in ("90", "100")]
        rows.append([scheduler, policy or "-", str(len(ms)),
                     f"{mean(c.get('90', math.nan) for c in curves):.2f}",
                     f"{mean(c.get('100', math.nan) for c in curves):.2f}",
                     f"{mean(c[str(top)] for c in curves):.2f}", kinds or "none", " / ".join(whole)])
    return "\n".join(aligned(rows, lambda i: 2 <= i <= 5))
