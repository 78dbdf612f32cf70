"""The openb trace replayed on a real control plane: kube-scheduler alone, kube-scheduler with gpu-tailor,
and the simulator on the same nodes, pods and order (issue 20).

Cluster. A scaled openb cluster (``--scale``, default 1/4 of the 1,213 GPU nodes): per GPU model, that
share of the trace's nodes drawn with the seed, each keeping its row's CPU, memory and GPU count, so
the model mix and the CPU and memory per node stay the trace's. They are fake Nodes on
``../shared/k8s`` (no kubelet: pods are bound, never run), untainted, ``pods: 1000`` allocatable.

Fractional pods. NVIDIA's device plugin sells a GPU either whole (``nvidia.com/gpu``) or as replicas
(``nvidia.com/gpu.shared`` with ``renameByDefault``), never both on one node, while openb puts whole and
fractional pods on the same nodes. So per model, ``--shared`` of the nodes (default 0.3: fractional
pods carry 28% of the arriving GPU milli once rounded, seed 42, quarter scale) are time-sliced with
``--replicas`` replicas per GPU (default 20, 50 milli each) and the rest sell whole GPUs. A pod asking
``gpu_milli < 1000`` asks for ceil(gpu_milli / 50) replicas (810 milli -> 17 replicas = 850 milli); whole-GPU pods ask
``nvidia.com/gpu: k``; CPU-only pods no GPU. Every count below uses the rounded milli, on both sides.
The simulator side gets the same constraint the resources make in the cluster: fractional pods are
offered only the time-sliced nodes, whole-GPU pods only the others, CPU-only pods all.
One thing differs and favours the cluster: kube-scheduler counts replicas per node and the device
plugin may hand a pod replicas of several GPUs, while the simulator needs the whole share on one GPU.

Pods. The simulator's protocol (``simulate.trace.arrivals``: openb pods sorted by name, shuffled with
the seed, trimmed or inflated to 1.3 x this cluster's GPU capacity), cut where arrived GPU milli reaches
100.5% of capacity. They are created one at a time, in that order; each is waited for until it is
bound or kube-scheduler marks it Unschedulable, and an unschedulable pod is deleted, as the simulator
drops it. Allocation as the simulator measures it: after each arrival, arrived% = round(arrived milli /
capacity) and alloc% = bound milli / capacity; the number reported is the mean alloc% of the events
whose arrived% is 100.

Runs, all on the same nodes and arrivals:
- kube-scheduler alone: the control plane's own kube-scheduler (default profile), pods in a
  namespace the webhook ignores, ``schedulerName: default-scheduler``;
- kube-scheduler with gpu-tailor (``--runs shipped``): pods created in the opted-in namespace with no
  schedulerName, through the webhook, which sends GPU pods to ``gpu-tailor-scheduler`` (kube-scheduler
  v1.28.7 with ``manifests/scheduler``'s profile and the extender, as ``tests/e2e`` runs them) and
  leaves CPU-only pods to the cluster's kube-scheduler;
- the same with CPU-only pods too through gpu-tailor (``--runs cpu``): they name
  ``gpu-tailor-scheduler``, and its configuration loses ``managedResources``, so that kube-scheduler
  sends every pod to the extender (with the list, it asks the extender about GPU pods only);
- the simulator: ``gpumodel.policies`` over the same fleet (``tailor``, and ``random`` and ``fgd``
  for reference), ties to a random node rank as ``gpu-tailor simulate`` does; beside the shipped run,
  ``tailor`` with CPU-only pods placed as kube-scheduler's LeastAllocated would place them.

    python benchmarks/cluster_replay.py [--scale 0.25] [--seed 42] [--shared 0.3] [--replicas 20]
        [--runs shipped,cpu] [--extender-weight N] [--sim-only]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpu_tailor.gpumodel.fleet import MILLI, Shape  # noqa: E402
from gpu_tailor.gpumodel.policies import POLICIES, FgdPolicy, Mix, Policy  # noqa: E402
from gpu_tailor.simulate.trace import TraceNode, TracePod, arrivals, build_fleet, load_nodes, load_pods  # noqa: E402
from tests.e2e import services  # noqa: E402
from tests.e2e.cluster import OPTED_IN, PLAIN, ControlPlane, k8s_dir  # noqa: E402
from tests.e2e.kube import Kube, api_path, load_kubeconfig  # noqa: E402
from tests.e2e.services import SCHEDULER_NAME, start_stack  # noqa: E402

TRACE = REPO / "gpu_tailor" / "data" / "trace"
# GPU memory (MiB) for the GFD label; openb names the models only. Nothing here asks for GPU memory.
MEMORY = {"T4": 15360, "P100": 16384, "V100M16": 16384, "V100M32": 32768, "A10": 23028, "G2": 32768, "G3": 81920}


@dataclass(frozen=True)
class Node:
    trace: TraceNode
    shared: bool


@dataclass(frozen=True)
class Pod:
    name: str
    shape: Shape  # GPU milli rounded to the replica size for fractional pods
    replicas: int  # 0 unless fractional


def scaled_nodes(scale: float, shared: float, seed: int) -> list[Node]:
    """``scale`` of each model's trace nodes (at least one), ``shared`` of those (rounded) time-sliced."""
    by_model: dict[str, list[TraceNode]] = {}
    for n in load_nodes(TRACE / "openb_node_list_gpu_node.csv"):
        by_model.setdefault(n.model, []).append(n)
    rng = random.Random(seed)
    out = []
    for model in sorted(by_model):
        picked = rng.sample(by_model[model], max(1, round(len(by_model[model]) * scale)))
        k = round(len(picked) * shared)
        out += [Node(n, i < k) for i, n in enumerate(picked)]
    return out


def trace_pods(replicas: int) -> list[Pod]:
    step = MILLI // replicas
    out = []
    for p in load_pods(TRACE / "openb_pod_list_default.csv"):
        s = p.shape
        if s.gpus and s.milli < MILLI:
            units = math.ceil(s.milli / step)
            out.append(Pod(p.name, Shape(s.cpu, s.mem, 1, units * step, s.models), units))
        else:
            out.append(Pod(p.name, s, 0))
    return out


def arrival_order(nodes: list[Node], pods: list[Pod], seed: int) -> list[Pod]:
    """The simulator's arrival sequence for this cluster, up to 100.5% of its GPU capacity arrived."""
    capacity = sum(n.trace.gpus for n in nodes) * MILLI
    by_name = {p.name: p for p in pods}
    seq = arrivals([TracePod(p.name, p.shape) for p in pods], seed, capacity, 1.3)
    out, arrived = [], 0
    for tp in seq:
        arrived += tp.shape.gpu_milli
        if arrived * 100 / capacity >= 100.5:
            break
        base = by_name.get(tp.name) or by_name[tp.name.split("-tuned-")[0]]
        out.append(Pod(tp.name, tp.shape, base.replicas))
    return out


class Meter:
    """alloc% at 100% arrived, as ``simulate.trace.replay`` computes its curve."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.arrived, self.used = capacity, 0, 0
        self.sum = 0.0
        self.n = 0
        self.failed = Counter[str]()

    def event(self, pod: Pod, placed: bool) -> None:
        self.arrived += pod.shape.gpu_milli
        if placed:
            self.used += pod.shape.gpu_milli
        else:
            self.failed[kind(pod)] += 1
        if math.floor(self.arrived * 100 / self.capacity + 0.5) == 100:
            self.sum += self.used * 100 / self.capacity
            self.n += 1

    @property
    def alloc(self) -> float:
        return self.sum / self.n if self.n else float("nan")


def kind(pod: Pod) -> str:
    s = pod.shape
    return "cpu" if not s.gpus else "frac" if pod.replicas else "1gpu" if s.gpus == 1 else "multi"


# ----- the simulator on the same nodes and arrivals -----
def simulate(nodes: list[Node], seq: list[Pod], all_pods: list[Pod], policy: str, seed: int,
             cpu_spread: bool = False) -> Meter:
    """One policy over the fleet; ``cpu_spread``: CPU-only pods go where kube-scheduler's default profile
    puts them (LeastAllocated over CPU and memory; the webhook leaves them to that scheduler)."""
    fleet = build_fleet([n.trace for n in nodes], "none", seed)
    rows = fleet.rows()
    cpu_cap, mem_cap = fleet.cpu[rows].copy(), fleet.mem[rows].copy()
    shared_rows = rows[[n.shared for n in nodes]]
    whole_rows = rows[[not n.shared for n in nodes]]
    mix = Mix()
    for p in all_pods:
        mix.observe(p.shape)
    engine: Policy = FgdPolicy(fleet, seed, mix=mix) if policy == "fgd" else POLICIES[policy](fleet, seed)
    meter = Meter(fleet.capacity_milli())
    for pod in seq:
        shape = pod.shape
        engine.observe(shape)
        if cpu_spread and not shape.gpus:
            free_cpu, free_mem = fleet.cpu[rows], fleet.mem[rows]
            fits = (free_cpu >= shape.cpu) & (free_mem >= shape.mem)
            if fits.any():
                free = (free_cpu - shape.cpu) / cpu_cap + (free_mem - shape.mem) / mem_cap
                at = int(rows[np.argmax(np.where(fits, free, -np.inf))])
                fleet.take(at, shape, ())
                engine.placed(at, shape)
            meter.event(pod, bool(fits.any()))
            continue
        choice = engine.choose(shape, rows if not shape.gpus else shared_rows if pod.replicas else whole_rows)
        if choice is not None:
            fleet.take(choice.node, shape, choice.gpus)
            engine.placed(choice.node, shape)
        meter.event(pod, choice is not None)
    return meter


# ----- the real control plane -----
def node_object(n: Node, replicas: int) -> tuple[dict[str, Any], dict[str, Any]]:
    t = n.trace
    name = f"{t.name.lower()}-{'ts' if n.shared else 'whole'}"
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              "nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": str(t.gpus),
              "nvidia.com/gpu.product": f"{t.model}-SHARED" if n.shared else t.model,
              "nvidia.com/gpu.memory": str(MEMORY.get(t.model, 16384)), "nvidia.com/mig.capable": "false"}
    alloc = {"cpu": f"{t.cpu}m", "memory": f"{t.mem}Mi", "pods": "1000", "ephemeral-storage": "100Gi"}
    if n.shared:
        labels |= {"nvidia.com/gpu.replicas": str(replicas), "nvidia.com/gpu.sharing-strategy": "time-slicing"}
        alloc["nvidia.com/gpu.shared"] = str(t.gpus * replicas)
    else:
        labels |= {"nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.sharing-strategy": "none"}
        alloc["nvidia.com/gpu"] = str(t.gpus)
    obj = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}, "spec": {}}
    status = {"capacity": alloc, "allocatable": alloc,
              "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                              "message": "fake node", "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                              "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    return obj, status


def pod_object(pod: Pod, i: int, scheduler: str | None) -> dict[str, Any]:
    s = pod.shape
    requests: dict[str, str] = {}
    if s.cpu:
        requests["cpu"] = f"{s.cpu}m"
    if s.mem:
        requests["memory"] = f"{s.mem}Mi"
    limits: dict[str, str] = {}
    if pod.replicas:
        limits["nvidia.com/gpu.shared"] = str(pod.replicas)
    elif s.gpus:
        limits["nvidia.com/gpu"] = str(s.gpus)
    requests |= limits
    resources: dict[str, Any] = {"requests": requests} | ({"limits": limits} if limits else {})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"r{i:05d}", "labels": {"replay": "openb"}},
            "spec": ({"schedulerName": scheduler} if scheduler else {}) | {
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "main", "image": "busybox", "resources": resources}]}}


class Api:
    def __init__(self, session: aiohttp.ClientSession, server: str) -> None:
        self.s, self.server = session, server

    async def call(self, method: str, path: str, body: Any = None, ctype: str = "application/json") -> Any:
        data = json.dumps(body).encode() if body is not None else None
        async with self.s.request(method, self.server + path, data=data, headers={"Content-Type": ctype}) as r:
            out = await r.read()
            if r.status >= 300:
                raise RuntimeError(f"{method} {path}: HTTP {r.status}: {out[:400]!r}")
            return json.loads(out) if out else None


async def install_nodes(api: Api, nodes: list[Node], replicas: int) -> None:
    sem = asyncio.Semaphore(8)

    async def one(n: Node) -> None:
        obj, status = node_object(n, replicas)
        name = obj["metadata"]["name"]
        async with sem:
            await api.call("POST", "/api/v1/nodes", obj)
            await api.call("PATCH", f"/api/v1/nodes/{name}/status", {"status": status}, "application/merge-patch+json")
            # the API server taints new nodes not-ready; no node lifecycle controller runs to clear it
            await api.call("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": None}}, "application/merge-patch+json")

    await asyncio.gather(*(one(n) for n in nodes))


class Outcomes:
    """One watch on the namespace's pods: each pod's first outcome, bound (its node) or Unschedulable."""

    def __init__(self) -> None:
        self.waiting: dict[str, asyncio.Future[str | None]] = {}
        self.reasons = Counter[str]()  # why pods were unschedulable, per kind of pod
        self.kinds: dict[str, str] = {}

    def expect(self, name: str) -> asyncio.Future[str | None]:
        fut: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self.waiting[name] = fut
        return fut

    async def run(self, api: Api, namespace: str, rv: str) -> None:
        url = f"{api.server}/api/v1/namespaces/{namespace}/pods?watch=1&resourceVersion={rv}"
        async with api.s.get(url, timeout=aiohttp.ClientTimeout(total=None)) as resp:
            async for line in resp.content:
                ev = json.loads(line)
                obj = ev.get("object") or {}
                name = (obj.get("metadata") or {}).get("name")
                fut = self.waiting.get(name)
                if fut is None or fut.done():
                    continue
                node = (obj.get("spec") or {}).get("nodeName")
                cond = [c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == "PodScheduled"]
                if node:
                    fut.set_result(node)
                elif cond and cond[0].get("status") == "False" and cond[0].get("reason") == "Unschedulable":
                    fut.set_result(None)
                    self.reasons[f"{self.kinds.get(name)}: {cond[0].get('message', '')[:300]}"] += 1


async def replay_real(api: Api, namespace: str, scheduler: str | None, seq: list[Pod], capacity: int,
                      label: str, verbose: bool = True, cpu_scheduler: str | None = None) -> tuple[Meter, float]:
    listed = await api.call("GET", f"/api/v1/namespaces/{namespace}/pods")
    outcomes = Outcomes()
    watch = asyncio.create_task(outcomes.run(api, namespace, listed["metadata"]["resourceVersion"]))
    meter = Meter(capacity)
    t0 = time.monotonic()
    try:
        for i, pod in enumerate(seq):
            obj = pod_object(pod, i, scheduler or (cpu_scheduler if not pod.shape.gpus else None))
            fut = outcomes.expect(obj["metadata"]["name"])
            outcomes.kinds[obj["metadata"]["name"]] = kind(pod)
            await api.call("POST", f"/api/v1/namespaces/{namespace}/pods", obj)
            try:
                node = await asyncio.wait_for(fut, 60)
            except TimeoutError:
                node = None
                print(f"  {label}: {obj['metadata']['name']} neither bound nor unschedulable after 60 s", flush=True)
            if node is None:  # dropped, as the simulator drops it: no retry later
                await api.call("DELETE", f"/api/v1/namespaces/{namespace}/pods/{obj['metadata']['name']}"
                               "?gracePeriodSeconds=0")
            meter.event(pod, node is not None)
            if (i + 1) % 250 == 0:
                print(f"  {label}: {i + 1}/{len(seq)} pods, {time.monotonic() - t0:.0f} s", flush=True)
    finally:
        watch.cancel()
    if verbose:
        for why, n in outcomes.reasons.most_common(8):
            print(f"  {label}: {n} x {why}")
    return meter, time.monotonic() - t0


async def clear(api: Api, namespace: str) -> None:
    """Every pod of the namespace gone (force: no kubelet), and the API lists none."""
    await api.call("DELETE", f"/api/v1/namespaces/{namespace}/pods?gracePeriodSeconds=0")
    deadline = time.monotonic() + 120
    while (await api.call("GET", f"/api/v1/namespaces/{namespace}/pods?limit=1"))["items"]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"pods of {namespace} still listed 120 s after the delete")
        await asyncio.sleep(0.2)


async def real_runs(kube: Kube, nodes: list[Node], seq: list[Pod], replicas: int, fixture_nodes: list[str],
                    cpu_to_extender: bool) -> dict[str, tuple[Meter, float]]:
    capacity = sum(n.trace.gpus for n in nodes) * MILLI
    url = f"https://{kube.host}:{kube.port}"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=kube.ctx, limit=16)) as session:
        api = Api(session, url)
        for name in fixture_nodes:  # the e2e stack's fixture nodes are no part of the openb cluster
            await api.call("DELETE", f"/api/v1/nodes/{name}")
        t0 = time.monotonic()
        await install_nodes(api, nodes, replicas)
        print(f"({len(nodes)} nodes created in {time.monotonic() - t0:.0f} s)", flush=True)
        out = {}
        if cpu_to_extender:  # CPU-only pods name gpu-tailor-scheduler, whose extender then takes every pod
            out["gpu-tailor"] = await replay_real(api, OPTED_IN, None, seq, capacity, "gpu-tailor, CPU pods too",
                                                  cpu_scheduler=SCHEDULER_NAME)
            return out
        # gpu-tailor first: the extender counts every namespace's pods, so it starts from empty nodes.
        # No schedulerName: the webhook sends GPU pods to gpu-tailor-scheduler and leaves CPU-only pods to
        # the cluster's kube-scheduler, as in a deployment.
        out["gpu-tailor"] = await replay_real(api, OPTED_IN, None, seq, capacity, "gpu-tailor")
        await clear(api, OPTED_IN)
        out["default"] = await replay_real(api, PLAIN, "default-scheduler", seq, capacity, "kube-scheduler alone")
    return out


def on_control_plane(nodes: list[Node], seq: list[Pod], replicas: int, cpu_to_extender: bool,
                     weight: int | None) -> dict[str, tuple[Meter, float]]:
    """A fresh control plane with gpu-tailor as tests/e2e runs it; with ``cpu_to_extender`` the scheduler's
    configuration loses ``managedResources`` (kube-scheduler then sends every pod to the extender)."""
    started = time.monotonic()
    original = services.scheduler_config

    def all_pods_to_extender(*a: Any) -> dict[str, Any]:
        config = original(*a)
        for ext in config["extenders"]:
            if cpu_to_extender:
                ext.pop("managedResources", None)
            if weight is not None:
                ext["weight"] = weight
        return config

    with tempfile.TemporaryDirectory(prefix="gpu-tailor-replay-") as tmp:
        workdir = Path(tmp)
        cp = ControlPlane(k8s_dir() / "control-plane.sh", workdir / "k8s")
        stack = None
        try:
            services.scheduler_config = all_pods_to_extender
            cp.up()
            kube = Kube(load_kubeconfig(cp.kubeconfig), workdir / "admin")
            stack = start_stack(cp, kube, workdir)
            fixtures = [n["metadata"]["name"] for n in kube.list(api_path("nodes"))]
            print(f"(control plane and gpu-tailor up in {time.monotonic() - started:.0f} s)", flush=True)
            return asyncio.run(real_runs(kube, nodes, seq, replicas, fixtures, cpu_to_extender))
        finally:
            services.scheduler_config = original
            if stack is not None:
                stack.stop()
            cp.down()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=0.25, help="share of each model's openb nodes")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--shared", type=float, default=0.3, help="share of each model's nodes time-sliced")
    parser.add_argument("--replicas", type=int, default=20, help="time-sliced replicas per GPU")
    parser.add_argument("--runs", default="shipped,cpu", help="shipped: CPU-only pods left to the cluster's "
                        "kube-scheduler, and kube-scheduler alone; cpu: CPU-only pods through gpu-tailor-scheduler")
    parser.add_argument("--extender-weight", type=int, help="instead of manifests/scheduler's weight")
    parser.add_argument("--sim-only", action="store_true", help="the simulator columns only, no control plane")
    args = parser.parse_args()
    started = time.monotonic()
    nodes = scaled_nodes(args.scale, args.shared, args.seed)
    pods = trace_pods(args.replicas)
    seq = arrival_order(nodes, pods, args.seed)
    gpus = sum(n.trace.gpus for n in nodes)
    models = Counter(n.trace.model for n in nodes)
    print(f"{len(nodes)} nodes ({sum(n.shared for n in nodes)} time-sliced x{args.replicas}), {gpus} GPUs: "
          + ", ".join(f"{m} {c}" for m, c in sorted(models.items())))
    print(f"{len(seq)} pods arriving (seed {args.seed}): " + ", ".join(
        f"{k} {c}" for k, c in sorted(Counter(kind(p) for p in seq).items())))
    sims = {p: simulate(nodes, seq, pods, p, args.seed) for p in ("tailor", "fgd", "random")}
    spread = simulate(nodes, seq, pods, "tailor", args.seed, cpu_spread=True)
    shipped: dict[str, tuple[Meter, float]] = {}
    variant: dict[str, tuple[Meter, float]] = {}
    if not args.sim_only:
        if not (k8s_dir() / "control-plane.sh").is_file():
            print(f"no control plane: {k8s_dir() / 'control-plane.sh'} is absent", file=sys.stderr)
            return 2
        runs = args.runs.split(",")
        if "shipped" in runs:
            shipped = on_control_plane(nodes, seq, args.replicas, False, args.extender_weight)
        if "cpu" in runs:
            variant = on_control_plane(nodes, seq, args.replicas, True, args.extender_weight)

    def cell(m: tuple[Meter, float] | Meter | None) -> str:
        if m is None:
            return "-"
        meter = m if isinstance(m, Meter) else m[0]
        failed = ", ".join(f"{k} {meter.failed[k]}" for k in ("frac", "1gpu", "multi", "cpu") if meter.failed[k])
        return f"{meter.alloc:.2f} (failed: {failed or 'none'})"

    alone = shipped.get("default")
    print()
    print("| CPU-only pods placed by | kube-scheduler alone | kube-scheduler + gpu-tailor | simulator (tailor) |")
    print("|---|---|---|---|")
    print(f"| the cluster's kube-scheduler (the webhook leaves them to it) | {cell(alone)} | "
          f"{cell(shipped.get('gpu-tailor'))} | {cell(spread)} |")
    print(f"| gpu-tailor (schedulerName gpu-tailor-scheduler, no managedResources) | {cell(alone)} | "
          f"{cell(variant.get('gpu-tailor'))} | {cell(sims['tailor'])} |")
    timed = [*shipped.items(), *(("cpu-variant", v) for v in variant.values())]
    print("allocation % at 100% of GPU capacity arrived; failed: pods dropped, by kind. Seconds per real run: "
          + ", ".join(f"{k} {v[1]:.0f}" for k, v in timed))
    print(f"simulator, same nodes and arrivals: fgd {sims['fgd'].alloc:.2f}, random {sims['random'].alloc:.2f} "
          f"(tailor - random = {sims['tailor'].alloc - sims['random'].alloc:.2f})")
    print(f"(whole run {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
