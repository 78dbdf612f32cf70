"""The openb trace replayed on a real control plane: kube-scheduler alone, kube-scheduler with gpu-tailor,
and the simulator on the same nodes, pods and order (issue 20).

Cluster. A scaled openb cluster (``--scale``, default 1/4 of the 1,213 GPU nodes): per GPU model, that
share of the trace's nodes drawn with the seed, each keeping its row's CPU, memory and GPU count, so
the model mix and the CPU and memory per node stay the trace's (read from ``$GPU_TAILOR_TRACE_DIR`` or
``../shared/data``). They are fake Nodes on ``tests/e2e``'s control plane, on the first Kubernetes release it
finds (no kubelet: pods are bound, never run), untainted, ``pods: 1000`` allocatable.

Fractional pods. NVIDIA's device plugin sells a GPU either whole (``nvidia.com/gpu``) or as replicas
(``nvidia.com/gpu.shared`` with ``renameByDefault``), never both on one node, while openb puts whole and
fractional pods on the same nodes. So per model, ``--shared`` of the nodes (default 0.3: fractional
pods carry 28% of the arriving GPU milli once rounded, seed 42, quarter scale) are time-sliced with
``--replicas`` replicas per GPU (default 20, 50 milli each) and the rest sell whole GPUs. A pod asking
``gpu_milli < 1000`` asks for ceil(gpu_milli / 50) replicas (810 milli -> 17 replicas = 850 milli); whole-GPU pods ask
``nvidia.com/gpu: k``; CPU-only pods no GPU. Every count below uses the rounded milli, on both sides.
The simulator side gets the same constraint the resources make in the cluster: fractional pods are
offered only the time-sliced nodes, whole-GPU pods only the others, CPU-only pods all.

Pods. The simulator's protocol (``simulate.trace.arrivals``: openb pods sorted by name, shuffled with
the seed, trimmed or inflated to 1.3 x this cluster's GPU capacity), cut where arrived GPU milli reaches
100.5% of capacity. They are created one at a time, in that order; each is waited for until it is
bound or kube-scheduler marks it Unschedulable, and an unschedulable pod is deleted, as the simulator
drops it. Allocation as the simulator measures it: after each arrival, arrived% = round(arrived milli /
capacity) and alloc% = bound milli / capacity; the number reported is the mean alloc% of the events
whose arrived% is 100.

Runs, all on the same nodes and arrivals, one after the other on one control plane (each from empty
nodes) with gpu-tailor installed from ``manifests/`` as ``tests/e2e`` installs it:
- ``tailor``: kube-scheduler with gpu-tailor as shipped: pods created in the opted-in namespace with no
  schedulerName; the webhook sends every one to ``gpu-tailor-scheduler`` (kube-scheduler v1.28.7 with
  the profile and the extender);
- ``legacy``: the same, but CPU-only pods carry ``gpu-tailor.io/skip=true``, so the cluster's own
  kube-scheduler places them (what a deployment with the webhook's ``cpuOnlyPods: false`` does);
- ``alone``: the control plane's own kube-scheduler (default profile), pods in a namespace the webhook
  ignores, ``schedulerName: default-scheduler``.

The simulator runs the same policies over the same fleet, and models kube-scheduler's part
(``KubeModel``): its count filters (CPU, memory, and GPUs or replicas per node, as the device plugin
advertises them), the profile's scores, and its random choice among equal totals (so every simulator
cell is a mean over ``--sim-seeds``). With gpu-tailor, a node's total is the extender's prioritize
score (``extender_scores``, the extender's own code: by rank of the policy's score, then the fixed
node order, a hash of the node's name) times the manifest's weight, plus MostAllocated with the GPU
resources weighing 10. A fractional pod that no single GPU can hold still passes the extender's
filter where there are enough free replicas (score 0), and its replicas are recorded one at a time,
best fit, as the extender records them. kube-scheduler alone is its default profile: LeastAllocated
plus BalancedAllocation on CPU and memory, over the first feasible nodes its adaptive
``percentageOfNodesToScore`` finds.

    python benchmarks/cluster_replay.py [--scale 0.25] [--seed 42] [--shared 0.3] [--replicas 20]
        [--runs tailor,legacy,alone] [--extender-weight N] [--sim-only] [--sim-seeds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpu_tailor.gpumodel.fleet import MILLI  # noqa: E402
from gpu_tailor.gpumodel.labels import POD_OPT_OUT_LABEL  # noqa: E402
from gpu_tailor.simulate.kube import Meter, SimNode, SimPod, sim_pod  # noqa: E402
from gpu_tailor.simulate.kube import run as run_kube  # noqa: E402
from gpu_tailor.simulate.trace import TraceNode, TracePod, arrivals, load_nodes, load_pods  # noqa: E402
from tests.conftest import openb_dir  # noqa: E402
from tests.e2e import services  # noqa: E402
from tests.e2e.cluster import OPTED_IN, PLAIN, ControlPlane, Release, first_release  # noqa: E402
from tests.e2e.kube import Kube, api_path, load_kubeconfig  # noqa: E402
from tests.e2e.services import start_stack  # noqa: E402

TRACE = openb_dir()  # the real trace (tests and benchmarks only): $GPU_TAILOR_TRACE_DIR or ../shared/data
# GPU memory (MiB) for the GFD label; openb names the models only. Nothing here asks for GPU memory.
MEMORY = {"T4": 15360, "P100": 16384, "V100M16": 16384, "V100M32": 32768, "A10": 23028, "G2": 32768, "G3": 81920}


@dataclass(frozen=True)
class Node:
    trace: TraceNode
    shared: bool


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


def trace_pods(replicas: int) -> list[SimPod]:
    return [sim_pod(p, replicas) for p in load_pods(TRACE / "openb_pod_list_default.csv")]


def arrival_order(nodes: list[Node], pods: list[SimPod], seed: int) -> list[SimPod]:
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
        out.append(SimPod(tp.name, tp.shape, base.fractional))
    return out


def kind(pod: SimPod) -> str:
    return pod.kind


def manifest_weight() -> int:
    """The extender's weight in ``manifests/scheduler``."""
    config = yaml.safe_load(yaml.safe_load((REPO / "manifests" / "scheduler" / "configmap.yaml").read_text())
                            ["data"]["config.yaml"])
    weight: int = config["extenders"][0]["weight"]
    return weight


def sim_nodes(nodes: list[Node], step: int) -> list[SimNode]:
    """The nodes as the simulator's kube-scheduler model takes them, under their control-plane names."""
    return [SimNode(TraceNode(node_name(n), n.trace.cpu, n.trace.mem, n.trace.gpus, n.trace.model),
                    MILLI // step if n.shared else 0) for n in nodes]


def simulate(nodes: list[Node], seq: list[SimPod], all_pods: list[SimPod], policy: str, seed: int, step: int,
             weight: int, cpu_spread: bool = False, follow: list[str | None] | None = None) -> Meter:
    """One policy over the fleet with kube-scheduler modelled (``gpu_tailor.simulate.kube.run``, what ``gpu-tailor
    simulate --scheduler`` runs): ``kube-default`` is kube-scheduler alone, any other policy runs in the extender
    under gpu-tailor-scheduler's profile at ``weight``. ``follow``: a real run's node per arrival (see ``run``)."""
    scheduler = "kube-default" if policy == "kube-default" else "gpu-tailor"
    return run_kube(sim_nodes(nodes, step), seq, scheduler, seed, policy=policy, mix=all_pods, weight=weight,
                    cpu_spread=cpu_spread, follow=follow)


def node_name(n: Node) -> str:
    return f"{n.trace.name.lower()}-{'ts' if n.shared else 'whole'}"


def node_object(n: Node, replicas: int) -> tuple[dict[str, Any], dict[str, Any]]:
    t = n.trace
    name = node_name(n)
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


def pod_object(pod: SimPod, i: int, scheduler: str | None, replicas: int, skip: bool = False) -> dict[str, Any]:
    """The pod as created (``replicas`` per GPU on the time-sliced nodes); ``skip``: labelled so that the webhook
    leaves it alone."""
    s = pod.shape
    requests: dict[str, str] = {}
    if s.cpu:
        requests["cpu"] = f"{s.cpu}m"
    if s.mem:
        requests["memory"] = f"{s.mem}Mi"
    limits: dict[str, str] = {}
    if pod.fractional:
        limits["nvidia.com/gpu.shared"] = str(s.milli * replicas // MILLI)
    elif s.gpus:
        limits["nvidia.com/gpu"] = str(s.gpus)
    requests |= limits
    resources: dict[str, Any] = {"requests": requests} | ({"limits": limits} if limits else {})
    meta_labels = {"replay": "openb"} | ({POD_OPT_OUT_LABEL: "true"} if skip else {})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"r{i:05d}", "labels": meta_labels},
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


async def replay_real(api: Api, namespace: str, scheduler: str | None, seq: list[SimPod], capacity: int, replicas: int,
                      label: str, verbose: bool = True, skip_cpu_only: bool = False) -> tuple[Meter, float]:
    listed = await api.call("GET", f"/api/v1/namespaces/{namespace}/pods")
    outcomes = Outcomes()
    watch = asyncio.create_task(outcomes.run(api, namespace, listed["metadata"]["resourceVersion"]))
    meter = Meter(capacity)
    t0 = time.monotonic()
    try:
        for i, pod in enumerate(seq):
            obj = pod_object(pod, i, scheduler, replicas, skip=skip_cpu_only and not pod.shape.gpus)
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
            meter.event(pod, node, node is not None and node.endswith("-ts"))
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


RUNS = ("tailor", "legacy", "alone")  # the order they run in on one control plane


async def real_runs(kube: Kube, nodes: list[Node], seq: list[SimPod], replicas: int, fixture_nodes: list[str],
                    runs: list[str], fresh_extender: Callable[[], None]) -> dict[str, tuple[Meter, float]]:
    """The runs one after another; before each GPU run the extender is restarted (``fresh_extender``),
    so that it starts with no pod mix learnt, as the simulator does, not with the last run's."""
    capacity = sum(n.trace.gpus for n in nodes) * MILLI
    url = f"https://{kube.host}:{kube.port}"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=kube.ctx, limit=16)) as session:
        api = Api(session, url)
        for name in fixture_nodes:  # the e2e stack's fixture nodes are no part of the openb cluster
            await api.call("DELETE", f"/api/v1/nodes/{name}")
        t0 = time.monotonic()
        await install_nodes(api, nodes, replicas)
        print(f"({len(nodes)} nodes created in {time.monotonic() - t0:.0f} s)", flush=True)
        out: dict[str, tuple[Meter, float]] = {}
        for run in (r for r in RUNS if r in runs):
            # one run at a time, each on empty nodes: the extender counts every namespace's pods
            if run != "alone" and out:
                await asyncio.to_thread(fresh_extender)
            if run == "tailor":  # as deployed: no schedulerName, the webhook sends every pod to gpu-tailor
                out[run] = await replay_real(api, OPTED_IN, None, seq, capacity, replicas, "gpu-tailor")
            elif run == "legacy":  # CPU-only pods opt out of the webhook and go to the cluster's scheduler
                out[run] = await replay_real(api, OPTED_IN, None, seq, capacity, replicas,
                                             "gpu-tailor, CPU-only pods skip", skip_cpu_only=True)
            else:
                out[run] = await replay_real(api, PLAIN, "default-scheduler", seq, capacity, replicas,
                                             "kube-scheduler alone")
            await clear(api, PLAIN if run == "alone" else OPTED_IN)
    return out


def on_control_plane(nodes: list[Node], seq: list[SimPod], replicas: int, runs: list[str],
                     weight: int | None, release: Release) -> dict[str, tuple[Meter, float]]:
    """A fresh control plane of ``release`` with gpu-tailor as tests/e2e runs it from ``manifests/``
    (``weight``: the extender's, instead of the manifest's)."""
    started = time.monotonic()
    original = services.scheduler_config

    def with_weight(*a: Any) -> dict[str, Any]:
        config = original(*a)
        for ext in config["extenders"]:
            if weight is not None:
                ext["weight"] = weight
        return config

    with tempfile.TemporaryDirectory(prefix="gpu-tailor-replay-") as tmp:
        workdir = Path(tmp)
        cp = ControlPlane(release, workdir / "k8s")
        stack = None
        try:
            services.scheduler_config = with_weight
            cp.up()
            kube = Kube(load_kubeconfig(cp.kubeconfig), workdir / "admin")
            stack = start_stack(cp, kube, workdir)
            fixtures = [n["metadata"]["name"] for n in kube.list(api_path("nodes"))]
            print(f"(control plane and gpu-tailor up in {time.monotonic() - started:.0f} s)", flush=True)
            return asyncio.run(real_runs(kube, nodes, seq, replicas, fixtures, runs, stack.extender.restart))
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
    parser.add_argument("--runs", default=",".join(RUNS), help="tailor: every pod through gpu-tailor, as "
                        "deployed; legacy: CPU-only pods left to the cluster's kube-scheduler; alone: "
                        "kube-scheduler alone")
    parser.add_argument("--extender-weight", type=int, help="instead of manifests/scheduler's weight")
    parser.add_argument("--dump", type=Path, help="write each run's node per arrival (JSON) to this file")
    parser.add_argument("--sim-only", action="store_true", help="the simulator columns only, no control plane")
    parser.add_argument("--sim-seeds", type=int, default=5,
                        help="seeds for the simulator's kube-scheduler model (it breaks ties at random)")
    args = parser.parse_args()
    started = time.monotonic()
    nodes = scaled_nodes(args.scale, args.shared, args.seed)
    pods = trace_pods(args.replicas)
    seq = arrival_order(nodes, pods, args.seed)
    step = MILLI // args.replicas
    weight = args.extender_weight or manifest_weight()
    gpus = sum(n.trace.gpus for n in nodes)
    models = Counter(n.trace.model for n in nodes)
    print(f"{len(nodes)} nodes ({sum(n.shared for n in nodes)} time-sliced x{args.replicas}), {gpus} GPUs: "
          + ", ".join(f"{m} {c}" for m, c in sorted(models.items())))
    print(f"{len(seq)} pods arriving (seed {args.seed}): " + ", ".join(
        f"{k} {c}" for k, c in sorted(Counter(kind(p) for p in seq).items())))

    def sim(policy: str, cpu_spread: bool = False) -> list[Meter]:
        """The simulator on ``--sim-seeds`` seeds: kube-scheduler breaks ties at random."""
        return [simulate(nodes, seq, pods, policy, args.seed + k, step, weight, cpu_spread)
                for k in range(args.sim_seeds)]

    sims = {p: sim(p) for p in ("tailor", "fgd", "random", "kube-default")}
    spread = sim("tailor", cpu_spread=True)
    real: dict[str, tuple[Meter, float]] = {}
    if not args.sim_only:
        real = on_control_plane(nodes, seq, args.replicas, args.runs.split(","), args.extender_weight,
                                first_release())

    if args.dump:
        simulated = {k: v[0].where for k, v in sims.items()} | {"legacy": spread[0].where}
        args.dump.write_text(json.dumps({"real": {k: v[0].where for k, v in real.items()}, "sim": simulated}))

    def cell(meters: list[Meter] | tuple[Meter, float] | None) -> str:
        if meters is None:
            return "-"
        ms = [meters[0]] if isinstance(meters, tuple) else meters
        failed = ", ".join(f"{k} {sum(m.failed[k] for m in ms) / len(ms):g}" for k in ("frac", "1gpu", "multi", "cpu")
                           if any(m.failed[k] for m in ms))
        allocs = [m.alloc for m in ms]
        spread_note = f" ({min(allocs):.2f}-{max(allocs):.2f}, {len(ms)} seeds)" if len(ms) > 1 else ""
        return f"{sum(allocs) / len(allocs):.2f}{spread_note} (failed: {failed or 'none'})"

    def mean(meters: list[Meter] | tuple[Meter, float]) -> float:
        ms = [meters[0]] if isinstance(meters, tuple) else meters
        return sum(m.alloc for m in ms) / len(ms)

    print()
    print("| | real kube-scheduler | simulator |")
    print("|---|---|---|")
    print(f"| kube-scheduler alone (default profile) | {cell(real.get('alone'))} | {cell(sims['kube-default'])} |")
    print(f"| kube-scheduler + gpu-tailor, as shipped | {cell(real.get('tailor'))} | {cell(sims['tailor'])} |")
    print(f"| ... CPU-only pods left to kube-scheduler alone | {cell(real.get('legacy'))} | {cell(spread)} |")
    print("allocation % at 100% of GPU capacity arrived; failed: pods dropped, by kind (mean over seeds). "
          "Seconds per real run: " + ", ".join(f"{k} {v[1]:.0f}" for k, v in real.items()))
    def on_shared(meters: list[Meter] | tuple[Meter, float] | None) -> str:
        ms = [] if meters is None else [meters[0]] if isinstance(meters, tuple) else meters
        return f"{sum(m.on_shared['cpu'] for m in ms) / len(ms):g}" if ms else "-"

    print("CPU-only pods on time-sliced nodes, real / simulator: "
          f"alone {on_shared(real.get('alone'))} / {on_shared(sims['kube-default'])}, "
          f"as shipped {on_shared(real.get('tailor'))} / {on_shared(sims['tailor'])}, "
          f"CPU-only pods left to kube-scheduler {on_shared(real.get('legacy'))} / {on_shared(spread)}")
    lead_sim = mean(sims["tailor"]) - mean(sims["kube-default"])
    print(f"simulator: fgd {cell(sims['fgd'])}, random {cell(sims['random'])}; tailor - random = "
          f"{mean(sims['tailor']) - mean(sims['random']):.2f}, tailor - kube-scheduler alone = {lead_sim:.2f}")
    for run, spread_cpu in (("tailor", False), ("legacy", True)):
        if run in real:  # the model stepped along the real run: does it rate each real choice best?
            followed = simulate(nodes, seq, pods, "tailor", args.seed, step, weight, spread_cpu, real[run][0].where)
            checked = len(seq) if run == "tailor" else sum(1 for p in seq if p.shape.gpus)
            print(f"real run {run}: {checked - len(followed.disagree)} of {checked} pods placed (or dropped) "
                  f"where the simulator, stepped along it, rates best; the others: {followed.disagree[:5]}")
    if "tailor" in real and "alone" in real:
        print(f"real: gpu-tailor - kube-scheduler alone = {mean(real['tailor']) - mean(real['alone']):.2f}; "
              f"real - simulator with gpu-tailor = {mean(real['tailor']) - mean(sims['tailor']):.2f}")
    print(f"(whole run {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
