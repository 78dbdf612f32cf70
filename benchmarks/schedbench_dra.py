"""What DRA pools cost kube-scheduler with gpu-tailor's extender: schedbench (``../shared/schedbench``) on a cluster
of device-plugin nodes only, then on the same cluster with a share of its nodes moved to NVIDIA's DRA driver.

schedbench times 2,000 one-GPU pods (``nvidia.com/gpu: 1``) through kube-scheduler on 1,000 fake 8xH100 nodes, with
a no-op Python extender (B) and with ``gpu-tailor extender`` as the chart runs it (E: filter and prioritize; the
extender binds nothing). This script drives schedbench's own pieces (its control plane, scheduler configs, node
setup, pod driver and no-op extender) in two layouts:

- ``dp``: every node sells its GPUs through the device plugin (schedbench as it is);
- ``dra``: ``--dra-share`` of the nodes (default half) publish their 8 H100s as ``gpu.nvidia.com`` ResourceSlices
  in the driver's shape instead (no ``nvidia.com/gpu`` allocatable, no GPU labels), and the driver's DeviceClass
  serves ``nvidia.com/gpu`` from them (``extendedResourceName``, KEP-5004, beta in 1.36): kube-scheduler's
  DynamicResources plugin allocates a device for each pod it places there, and the extender, watching slices,
  claims and classes, ranks those nodes by the allocator's predicted pick with the same policy.

Each layout runs B and E in turn (``--rounds`` times); the figure is E/B per layout (the extender against doing
nothing, in the same stretch of time) and the DRA layout's E/B against the device-plugin layout's. Claims are
deleted between runs (no controller-manager runs to collect those of deleted pods).

    K8S_BIN_DIR=~/.cache/gpu-tailor-k8s/v1.36.3/bin python benchmarks/schedbench_dra.py [--rounds 2]
        [--nodes 1000] [--pods 2000] [--dra-share 0.5] [--out DIR]

Needs Kubernetes 1.36 or later (DRA-served extended resources) and ``../shared/schedbench``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.gpumodel.dra_slices import device_classes, hgx  # noqa: E402

SCHEDBENCH = REPO.parent / "shared" / "schedbench"
CONTROL_PLANE = REPO.parent / "shared" / "control-plane" / "control-plane.sh"
EXT_PORT = 18888
GT = Path(sys.executable).parent / "gpu-tailor"
NS, NODE_PREFIX = "bench", "bench-node-"  # schedbench's namespace and node names (its driver.py)


def sh(*cmd: str, env: dict[str, str] | None = None, quiet: bool = False) -> None:
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL if quiet else None)


def wait_http(url: str, seconds: float = 60) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not answer 200 within {seconds:.0f}s")


def dra_nodes(nodes: int, share: float) -> list[str]:
    return [f"{NODE_PREFIX}{i:04d}" for i in range(round(nodes * share))]


async def to_dra(kubeconfig: str, names: list[str]) -> None:
    """Move ``names`` to NVIDIA's DRA driver: their GPU allocatable and labels gone, a ResourceSlice each, and the
    driver's DeviceClasses (``gpu.nvidia.com`` serving ``nvidia.com/gpu``)."""
    from kubernetes_asyncio import client, config

    await config.load_kube_config(kubeconfig)
    async with client.ApiClient() as api:
        core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
        gate = asyncio.Semaphore(32)

        async def one(name: str) -> None:
            async with gate:
                node = await core.read_node(name)
                labels = {k: None for k in node.metadata.labels or {} if k.startswith("nvidia.com/")}
                await core.patch_node(name, {"metadata": {"labels": labels}})
                gpu = {"nvidia.com/gpu": None}
                await core.patch_node_status(name, {"status": {"allocatable": gpu, "capacity": gpu}})
                await resource.create_resource_slice(hgx(name))

        await asyncio.gather(*(one(n) for n in names))
        for cls in device_classes():
            await resource.create_device_class(cls)


async def claims(kubeconfig: str, namespace: str, label: str | None) -> int:
    """The ResourceClaims kube-scheduler made for run ``label``'s pods (one per pod it placed on a DRA node); with
    ``label`` None, every claim in ``namespace`` is deleted instead, its finalizer taken off first (no
    controller-manager runs to release the devices of deleted pods' claims), and their count returned."""
    from kubernetes_asyncio import client, config

    await config.load_kube_config(kubeconfig)
    async with client.ApiClient() as api:
        resource = client.ResourceV1Api(api)
        items = (await resource.list_namespaced_resource_claim(namespace)).items
        if label is not None:
            prefix = f"p-{label.lower()}-"  # schedbench's pod names
            return sum(1 for c in items if any(o.name.startswith(prefix) for o in c.metadata.owner_references or []))
        gate = asyncio.Semaphore(32)

        async def gone(name: str) -> None:
            async with gate:
                await resource.patch_namespaced_resource_claim(name, namespace, {"metadata": {"finalizers": None}})
                await resource.delete_namespaced_resource_claim(name, namespace)

        await asyncio.gather(*(gone(c.metadata.name) for c in items))
        left = (await resource.list_namespaced_resource_claim(namespace)).items
        if left:
            raise SystemExit(f"{len(left)} ResourceClaims of earlier runs are still there")
        return len(items)


def run_one(args: argparse.Namespace, env: dict[str, str], out: Path, cfg: str, label: str, first: bool,
            layout: str) -> dict[str, Any]:
    k = env["K8S_HOME"]
    sh("bash", str(CONTROL_PLANE), "down", env=env, quiet=True)
    up_env = {**env, "KEEP_DATA": "0" if first else "1", "START_KCM": "0"}
    sh("bash", str(CONTROL_PLANE), "up", str(out / "configs" / f"{cfg}.yaml"), env=up_env, quiet=True)
    driver = [sys.executable, str(SCHEDBENCH / "driver.py")]
    if first:
        sh(*driver, "setup", "--nodes", str(args.nodes), env=env)
    if layout == "dra":
        sh(*driver, "cleanup", env=env, quiet=True)  # pods first, then the claims they held
        asyncio.run(claims(f"{k}/kubeconfig", NS, None))
    log = open(out / f"ext-{label}.out", "w")  # noqa: SIM115  # the extender's log, closed with the process
    if cfg == "B":
        ext = subprocess.Popen([sys.executable, str(SCHEDBENCH / "extender.py")], stdout=log, stderr=log,
                               env={**env, "EXT_PORT": str(EXT_PORT), "EXT_LOG": str(out / f"ext-{label}.csv")})
        wait_http(f"http://127.0.0.1:{EXT_PORT}/healthz")
        ext_args = ["--extender-url", f"http://127.0.0.1:{EXT_PORT}", "--extender-pid", str(ext.pid)]
    else:
        ext = subprocess.Popen([str(GT), "extender", "--listen", f"127.0.0.1:{EXT_PORT}", "--kubeconfig",
                                f"{k}/kubeconfig"], stdout=log, stderr=log, env=env)
        wait_http(f"http://127.0.0.1:{EXT_PORT}/readyz")
        ext_args = ["--extender-pid", str(ext.pid)]
    try:
        sh(*driver, "run", "--label", label, "--config", cfg, "--nodes", str(args.nodes), "--pods", str(args.pods),
           "--out", str(out / "results.jsonl"), *ext_args, env=env)
        on_dra = asyncio.run(claims(f"{k}/kubeconfig", NS, label)) if layout == "dra" else 0
    finally:
        ext.terminate()
        ext.wait(30)
        log.close()
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    row: dict[str, Any] = next(r for r in reversed(rows) if r["label"] == label)
    row["on_dra"] = on_dra
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--pods", type=int, default=2000)
    p.add_argument("--dra-share", type=float, default=0.5)
    p.add_argument("--out", type=Path, default=REPO / "schedbench-results" / time.strftime("dra-%Y%m%d-%H%M%S"))
    args = p.parse_args()
    if not 0 < args.dra_share <= 1:
        raise SystemExit("--dra-share: a share of the nodes, above 0 and at most 1")
    out: Path = args.out
    (out / "configs").mkdir(parents=True, exist_ok=True)
    k8s_home = os.environ.get("K8S_HOME", f"{os.environ.get('TMPDIR', '/tmp')}/gpu-tailor-schedbench-dra")
    env = {**os.environ, "K8S_HOME": k8s_home}
    version = subprocess.run(["bash", str(CONTROL_PLANE), "version"], env=env, capture_output=True, text=True,
                             check=True).stdout.strip()
    if tuple(int(x) for x in version.lstrip("v").split(".")[:2]) < (1, 36):
        raise SystemExit(f"the control plane is {version}: DRA-served nvidia.com/gpu needs 1.36 or later")
    sh("bash", str(SCHEDBENCH / "run.sh"), env={**env, "CONFIGS_ONLY": "1", "OUTDIR": str(out)}, quiet=True)
    results: dict[str, list[dict[str, Any]]] = {"dp": [], "dra": []}
    first = True
    try:
        for layout in ("dp", "dra"):
            if layout == "dra":
                names = dra_nodes(args.nodes, args.dra_share)
                asyncio.run(to_dra(f"{k8s_home}/kubeconfig", names))
            for r in range(1, args.rounds + 1):
                for cfg in ("B", "E"):
                    label = f"{layout}-{cfg}{r}"
                    print(f"===== {label} =====", flush=True)
                    results[layout].append(run_one(args, env, out, cfg, label, first, layout))
                    first = False
    finally:
        sh("bash", str(CONTROL_PLANE), "down", env={**env, "WIPE": "1"}, quiet=True)

    print(f"\nschedbench on {version}: {args.nodes} nodes, {args.pods} pods per run; dra: "
          f"{round(args.nodes * args.dra_share)} of the nodes on NVIDIA's DRA driver")
    print(f"{'layout':8} {'run':8} {'pods/s':>7} {'on DRA':>7} {'ext cores':>9}")
    for layout, rows in results.items():
        for row in rows:
            cores = (row.get("cpu") or {}).get("extender", {}).get("cores")
            print(f"{layout:8} {row['label']:8} {row.get('pods_per_s') or 0:7.1f} {row['on_dra']:7d} "
                  f"{cores if cores is not None else '-':>9}")
    ratio = {}
    for layout, rows in results.items():
        mean = {cfg: statistics.mean(r.get("pods_per_s") or 0 for r in rows if r["config"] == cfg) for cfg in "BE"}
        ratio[layout] = mean["E"] / mean["B"]
        print(f"{layout}: B {mean['B']:.1f} pods/s, E {mean['E']:.1f} pods/s, E/B {ratio[layout]:.3f}")
    print(f"E/B with DRA pools minus E/B with device-plugin pools only: {ratio['dra'] - ratio['dp']:+.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
