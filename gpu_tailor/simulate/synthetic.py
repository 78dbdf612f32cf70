"""The default of ``gpu-tailor simulate``: a cluster and a workload the project generates, openb-like in what
decides fragmentation, made from a handful of figures and never from the trace's rows.

Where the figures come from. ``describe`` computes them from an openb-format node list and pod list; the
constants below are what it gives on the Alibaba openb trace (``openb_node_list_gpu_node.csv`` and
``openb_pod_list_default.csv`` of ``cluster-trace-gpu-v2023``, CC BY 4.0; Weng et al., "Beware of
Fragmentation", USENIX ATC '23), and ``tests/simulate/test_synthetic.py`` recomputes them from the trace
wherever it is present, so they cannot drift from their source. What they are:

- ``NODE_TYPES``: the cluster's node configurations (GPU model, GPUs, CPU and memory per node) and how many
  nodes have each, as the FGD paper's Table 1 tells them (1,213 nodes, 6,212 GPUs).
- ``POD_CLASSES``: the share of pods that ask for no GPU, for part of one GPU, and for 1, 2, 4 or 8 whole GPUs.
- ``SHARE_MILLI``: for pods that ask for part of a GPU, how often each GPU share (in thousandths) is asked.
- per class, CPU and memory as 20 quantiles (the midpoints of 20 equally likely bands); a pod draws one band
  and takes that band's CPU and memory together, so large CPU asks come with large memory asks as in the trace.

What the generator does not keep: which share goes with which CPU inside a class (they are drawn apart), pod
names, and time. openb's default workload restricts no pod to a GPU model, nor does this one.
"""

from __future__ import annotations

import csv
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpu_tailor.gpumodel.fleet import MILLI, Shape
from gpu_tailor.simulate.trace import TraceNode, TracePod

BANDS = 20
DEFAULT_SEED = 2023  # the workload's own seed; the replay's --seeds shuffle it as they shuffle a trace
WORKLOAD = "generated"


@dataclass(frozen=True, slots=True)
class NodeType:
    model: str
    gpus: int
    cpu: int  # millicores
    mem: int  # MiB
    count: int


@dataclass(frozen=True, slots=True)
class PodClass:
    name: str  # "cpu", "share", "1gpu", "2gpu" ...
    per10k: int  # of all pods, in ten-thousandths
    gpus: int
    cpu: tuple[int, ...]  # BANDS quantiles, millicores
    mem: tuple[int, ...]  # BANDS quantiles, MiB


@dataclass(frozen=True, slots=True)
class Figures:
    nodes: tuple[NodeType, ...]
    classes: tuple[PodClass, ...]
    share_milli: tuple[tuple[int, int], ...]  # (thousandths of a GPU, ten-thousandths of the sharing pods)
    pods: int


# -- the figures, as ``describe`` gives them on openb (node list of GPU nodes, default workload) --

NODE_TYPES = (
    NodeType("A10", 1, 128000, 1048576, 2),
    NodeType("G2", 8, 96000, 393216, 549),
    NodeType("G3", 8, 128000, 786432, 39),
    NodeType("P100", 1, 8000, 61440, 3),
    NodeType("P100", 2, 8000, 61440, 2),
    NodeType("P100", 2, 16000, 122880, 107),
    NodeType("P100", 2, 64000, 262144, 22),
    NodeType("T4", 2, 104000, 524288, 387),
    NodeType("T4", 4, 96000, 393216, 17),
    NodeType("V100M16", 1, 8000, 32768, 19),
    NodeType("V100M16", 4, 32000, 131072, 28),
    NodeType("V100M16", 8, 64000, 262144, 7),
    NodeType("V100M16", 8, 82000, 344064, 1),
    NodeType("V100M32", 4, 48000, 376832, 9),
    NodeType("V100M32", 8, 96000, 786432, 21),
)

POD_CLASSES = (
    PodClass("cpu", 1335, 0,
             cpu=(8000, 8000, 8000, 11400, 12500, 12500, 12500, 12500, 12500, 12500, 15400, 15400, 15400, 16500,
                  16500, 32000, 32000, 32000, 32000, 32000),
             mem=(30517, 30517, 30517, 31250, 49152, 49152, 49152, 49152, 49152, 51200, 51200, 51200, 51200, 57344,
                  57344, 57344, 57344, 57344, 57344, 57344)),
    PodClass("share", 3776, 1,
             cpu=(3152, 3152, 3152, 3152, 3152, 3152, 3152, 4000, 4000, 4000, 4000, 4152, 6000, 8000, 8000, 8000,
                  11908, 11908, 11908, 11908),
             mem=(5600, 5600, 5600, 5600, 5600, 5600, 5600, 6144, 10600, 15258, 22888, 22888, 30517, 30517, 30517,
                  30517, 47104, 47104, 47104, 47104)),
    PodClass("1gpu", 4798, 1,
             cpu=(3152, 3152, 3152, 8000, 9400, 9810, 11300, 11300, 11300, 11300, 11400, 11400, 11400, 11908, 12000,
                  12000, 15400, 16000, 18708, 18708),
             mem=(5600, 5600, 8192, 16384, 24576, 31250, 33792, 41560, 47104, 48128, 48128, 49152, 49152, 49152,
                  49152, 49152, 58368, 64512, 65536, 93184)),
    PodClass("2gpu", 20, 2,
             cpu=(6000, 6000, 6000, 6000, 14000, 16200, 16200, 16200, 16200, 16200, 16200, 16200, 16200, 16200,
                  17400, 17400, 30200, 30200, 30200, 30200),
             mem=(43008, 43008, 60000, 60000, 65536, 65536, 65536, 66560, 66560, 66560, 66560, 66560, 66560, 66560,
                  66560, 66560, 160768, 160768, 160768, 160768)),
    PodClass("4gpu", 18, 4,
             cpu=(32000, 32000, 32000, 32000, 32200, 32200, 32200, 32200, 32200, 32200, 32200, 32200, 32200, 32200,
                  32200, 32200, 60200, 60200, 60200, 60200),
             mem=(131072, 131072, 131072, 131072, 132096, 132096, 132096, 132096, 132096, 132096, 132096, 132096,
                  132096, 132096, 132096, 132096, 320512, 320512, 320512, 320512)),
    PodClass("8gpu", 54, 8,
             cpu=(64000, 64200, 64200, 64200, 64200, 64200, 64200, 64200, 64200, 64200, 88000, 88000, 88000, 88000,
                  88000, 88000, 88000, 88000, 120000, 120200),
             mem=(262144, 263168, 263168, 263168, 263168, 263168, 263168, 263168, 263168, 263168, 327680, 327680,
                  327680, 327680, 327680, 327680, 327680, 327680, 640000, 737280)),
)

SHARE_MILLI = ((50, 23), (110, 78), (140, 3), (160, 240), (220, 201), (230, 455), (270, 13), (290, 3), (320, 1066),
               (330, 23), (350, 19), (370, 153), (440, 6), (460, 416), (470, 2437), (480, 62), (550, 234), (590, 244),
               (650, 822), (810, 3502))

TRACE_PODS = 8152

FIGURES = Figures(NODE_TYPES, POD_CLASSES, SHARE_MILLI, TRACE_PODS)


def pod_class(shape: Shape) -> str:
    if not shape.gpus:
        return "cpu"
    return "share" if shape.milli < MILLI else f"{shape.gpus}gpu"


def _bands(values: Sequence[int]) -> tuple[int, ...]:
    """The value at the middle of each of BANDS equally likely bands (nearest rank)."""
    ordered = sorted(values)
    n = len(ordered)
    return tuple(ordered[min(n - 1, int((2 * b + 1) * n / (2 * BANDS)))] for b in range(BANDS))


def _per10k(counts: Counter[str] | Counter[int], total: int) -> dict[str | int, int]:
    return {k: round(10_000 * v / total) for k, v in counts.items()}


def describe(nodes: Iterable[TraceNode], pods: Sequence[TracePod]) -> Figures:
    """The figures the generator is made of, computed from a cluster and a workload."""
    types = Counter((n.model, n.gpus, n.cpu, n.mem) for n in nodes)
    node_types = tuple(NodeType(m, g, c, mem, k) for (m, g, c, mem), k in sorted(types.items()))
    by_class: dict[str, list[Shape]] = {}
    for p in pods:
        by_class.setdefault(pod_class(p.shape), []).append(p.shape)
    classes = tuple(
        PodClass(name, round(10_000 * len(shapes) / len(pods)), shapes[0].gpus, _bands([s.cpu for s in shapes]),
                 _bands([s.mem for s in shapes]))
        for name, shapes in sorted(by_class.items(), key=lambda kv: (kv[1][0].gpus, kv[0] != "share")))
    sharing = Counter(s.milli for s in by_class.get("share", []))
    total = sum(sharing.values())
    share_milli = tuple((m, round(10_000 * k / total)) for m, k in sorted(sharing.items()) if round(10_000 * k / total))
    return Figures(node_types, classes, share_milli, len(pods))


def _counts(weights: Sequence[int], total: int) -> list[int]:
    """``total`` split by ``weights`` in whole numbers that add up (largest remainders), so a class's share
    of the generated pods is its figure and not a draw's luck."""
    scale = sum(weights)
    exact = [total * w / scale for w in weights]
    out = [int(x) for x in exact]
    for i in sorted(range(len(weights)), key=lambda i: out[i] - exact[i])[: total - sum(out)]:
        out[i] += 1
    return out


def cluster(figures: Figures | None = None) -> list[TraceNode]:
    """The generated cluster: every node type of ``figures``, as many nodes as it counts."""
    figures = figures or FIGURES
    out: list[TraceNode] = []
    for t in figures.nodes:
        first = len(out)
        out.extend(TraceNode(f"gen-node-{first + i:04d}", t.cpu, t.mem, t.gpus, t.model) for i in range(t.count))
    return out


def workload(figures: Figures | None = None, seed: int = DEFAULT_SEED, pods: int | None = None) -> list[TracePod]:
    """The generated workload: ``pods`` pods (the trace's count by default) in the shares of ``figures``; the
    class and GPU-share counts are exact, each pod's CPU and memory band is drawn with ``seed``."""
    figures = figures or FIGURES
    rng = random.Random(seed)
    total = figures.pods if pods is None else pods
    if total < 1:
        raise ValueError(f"a workload needs at least one pod, not {total}")
    shapes: list[Shape] = []
    for cls, n in zip(figures.classes, _counts([c.per10k for c in figures.classes], total), strict=True):
        if cls.name == "share":
            millis = [m for (m, _), k in zip(figures.share_milli, _counts([w for _, w in figures.share_milli], n),
                                              strict=True) for _ in range(k)]
        else:
            millis = [MILLI if cls.gpus else 0] * n
        for milli in millis:
            band = rng.randrange(BANDS)
            shapes.append(Shape(cls.cpu[band], cls.mem[band], cls.gpus, milli))
    rng.shuffle(shapes)
    return [TracePod(f"gen-pod-{i:05d}", s) for i, s in enumerate(shapes)]


NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec")


def write_csv(folder: Path, nodes: Sequence[TraceNode], pods: Sequence[TracePod]) -> tuple[Path, Path]:
    """The cluster and workload as openb-format CSVs (``--nodes`` and ``--pods`` read them back)."""
    folder.mkdir(parents=True, exist_ok=True)
    nodes_csv, pods_csv = folder / f"{WORKLOAD}_node_list.csv", folder / f"{WORKLOAD}_pod_list.csv"
    with nodes_csv.open("w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(NODE_COLUMNS)
        w.writerows((n.name, n.cpu, n.mem, n.gpus, n.model) for n in nodes)
    with pods_csv.open("w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(POD_COLUMNS)
        w.writerows((p.name, p.shape.cpu, p.shape.mem, p.shape.gpus, p.shape.milli, "|".join(sorted(p.shape.models)))
                    for p in pods)
    return nodes_csv, pods_csv
