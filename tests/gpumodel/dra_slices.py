"""ResourceSlices in the shape NVIDIA's DRA driver (gpu.nvidia.com) publishes them (``gpumodel/dra.py`` cites the
sources), written by hand for three nodes: an 8xH100 HGX node, an A100 40GB node in static MIG mode, and a node
of four T4s (whose sharing, on DRA, is the claim's config). Also used by tests/e2e to publish them for real."""

from __future__ import annotations

from typing import Any

GIB = 2**30
H100, A100, T4 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "Tesla T4"


def gpu(minor: int, product: str, memory_gib: int, uuid: str) -> dict[str, Any]:
    return {"name": f"gpu-{minor}",
            "attributes": {"type": {"string": "gpu"}, "uuid": {"string": uuid}, "productName": {"string": product},
                           "brand": {"string": "Nvidia"}, "architecture": {"string": "Hopper"},
                           "driverVersion": {"version": "570.124.6"}, "cudaComputeCapability": {"version": "9.0.0"}},
            "capacity": {"memory": {"value": f"{memory_gib}Gi"}}}


def mig(parent: int, profile: str, gi: int, start: int, memory_gib: int, parent_uuid: str,
        product: str = A100) -> dict[str, Any]:
    slices = int(profile.split("g.")[0])
    return {"name": f"gpu-{parent}-mig-{profile.replace('.', '')}-{gi}-{start}",
            "attributes": {"type": {"string": "mig"}, "parentUUID": {"string": parent_uuid},
                           "profile": {"string": profile}, "productName": {"string": product},
                           "architecture": {"string": "Ampere" if product == A100 else "Hopper"}},
            "capacity": {"memory": {"value": f"{memory_gib}Gi"}, "multiprocessors": {"value": str(14 * slices)},
                         **{f"memorySlice{start + i}": {"value": "1"} for i in range(slices)}}}


def resource_slice(node: str, devices: list[dict[str, Any]], generation: int = 1, count: int = 1,
                   part: int = 0) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-gpu.nvidia.com-{part}"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
                     "devices": devices}}


def hgx(node: str = "dra-h100-hgx-0") -> dict[str, Any]:
    return resource_slice(node, [gpu(i, H100, 80, f"GPU-h100-{i}") for i in range(8)])


def a100_mig(node: str = "dra-a100-mig-0") -> dict[str, Any]:
    """Two A100 40GB GPUs, cut differently: GPU 0 into 1g.5gb x 7, GPU 1 into 3g.20gb + 2g.10gb + 1g.5gb x 2."""
    zero = [mig(0, "1g.5gb", 19, i, 5, "GPU-a100-0") for i in range(7)]
    one = [mig(1, "3g.20gb", 9, 4, 20, "GPU-a100-1"), mig(1, "2g.10gb", 14, 0, 10, "GPU-a100-1"),
           mig(1, "1g.5gb", 19, 2, 5, "GPU-a100-1"), mig(1, "1g.5gb", 19, 3, 5, "GPU-a100-1")]
    return resource_slice(node, zero + one)


def h100_mig(node: str = "dra-h100-mig-0") -> dict[str, Any]:
    """Two H100 80GB GPUs in MIG mode: GPU 0 as 2g.20gb + 1g.10gb x 2 (and room left), GPU 1 as 3g.40gb. A 20Gi
    ask has two MIG devices that hold it here, 2g.20gb the smaller."""
    zero = [mig(0, "2g.20gb", 14, 0, 20, "GPU-h100m-0", H100), mig(0, "1g.10gb", 19, 2, 10, "GPU-h100m-0", H100),
            mig(0, "1g.10gb", 19, 3, 10, "GPU-h100m-0", H100)]
    one = [mig(1, "3g.40gb", 9, 4, 40, "GPU-h100m-1", H100)]
    return resource_slice(node, zero + one)


def t4(node: str = "dra-t4-0") -> dict[str, Any]:
    return resource_slice(node, [gpu(i, T4, 15, f"GPU-t4-{i}") for i in range(4)])


def shared_gpu(minor: int, product: str, memory_gib: int, uuid: str) -> dict[str, Any]:
    """A GPU published as shareable (``allowMultipleAllocations``, KEP-5075): claims consume its ``memory``, any
    amount in MiB steps. NVIDIA's driver does not publish this yet; it is what a pool that shares looks like."""
    device = gpu(minor, product, memory_gib, uuid)
    device["allowMultipleAllocations"] = True
    device["capacity"]["memory"]["requestPolicy"] = {"default": f"{memory_gib}Gi",
                                                     "validRange": {"min": "1Mi", "step": "1Mi"}}
    return device


def shared_t4(node: str = "dra-t4-shared-0") -> dict[str, Any]:
    return resource_slice(node, [shared_gpu(i, T4, 15, f"GPU-t4s-{i}") for i in range(2)])


def device_classes() -> list[dict[str, Any]]:
    """The DeviceClasses of NVIDIA's chart for whole GPUs (serving ``nvidia.com/gpu``, KEP-5004) and MIG devices."""
    def cls(name: str, kind: str, extended: str | None) -> dict[str, Any]:
        spec: dict[str, Any] = {"selectors": [{"cel": {"expression": (
            f"device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == '{kind}'")}}]}
        if extended:
            spec["extendedResourceName"] = extended
        return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}
    return [cls("gpu.nvidia.com", "gpu", "nvidia.com/gpu"), cls("mig.nvidia.com", "mig", None)]


def plain_node(name: str) -> dict[str, Any]:
    """A GPU node as it looks with NVIDIA's DRA driver and no device plugin: no GPU labels, no nvidia.com/*
    allocatable, the GPU operator's taint."""
    alloc = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule", "value": "present"}]},
            "status": {"capacity": alloc, "allocatable": alloc,
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "message": "ready", "lastHeartbeatTime": "2026-11-25T00:00:00Z",
                                       "lastTransitionTime": "2026-11-25T00:00:00Z"}]}}


# H100 80GB MIG placements (NVIDIA's MIG user guide): profile -> (GI profile ID, memory GiB, memory slices, starts)
H100_PLACEMENTS = {"1g.10gb": (19, 10, 1, range(7)), "2g.20gb": (14, 20, 2, (0, 2, 4)),
                   "3g.40gb": (9, 40, 4, (0, 4)), "4g.40gb": (5, 40, 4, (0,)), "7g.80gb": (0, 80, 8, (0,))}


def dynamic_h100(node: str = "dra-h100-dyn-0", gpus: int = 1, split: bool = True) -> list[dict[str, Any]]:
    """H100s under the driver's DynamicMIG (KEP-4815): per GPU a counter set ``gpu-<minor>-counter-set`` (memory,
    multiprocessors and one ``memory-slice-<i>`` per memory slice), the whole GPU consuming all of it, and every MIG
    profile at every placement consuming its memory and slices. ``split``: the counters in a slice of their own and
    the devices in another (1.35 and later), else one slice."""
    sets, devices = [], []
    for g in range(gpus):
        name = f"gpu-{g}-counter-set"
        slices = {f"memory-slice-{i}": {"value": "1"} for i in range(8)}
        sets.append({"name": name, "counters": {"memory": {"value": "80Gi"}, "multiprocessors": {"value": "132"},
                                                **slices}})
        whole = gpu(g, H100, 80, f"GPU-h100d-{g}")
        whole["consumesCounters"] = [{"counterSet": name, "counters": {
            "memory": {"value": "80Gi"}, "multiprocessors": {"value": "132"}, **slices}}]
        devices.append(whole)
        for profile, (gi, memory, size, starts) in H100_PLACEMENTS.items():
            for start in starts:
                device = mig(g, profile, gi, start, memory, f"GPU-h100d-{g}", H100)
                device["consumesCounters"] = [{"counterSet": name, "counters": {
                    "memory": {"value": f"{memory}Gi"},
                    **{f"memory-slice-{start + i}": {"value": "1"} for i in range(size)}}}]
                devices.append(device)
    if not split:
        one = resource_slice(node, devices)
        one["spec"]["sharedCounters"] = sets
        return [one]
    counters = resource_slice(node, [], count=2, part=0)
    del counters["spec"]["devices"]
    counters["spec"]["sharedCounters"] = sets
    return [counters, resource_slice(node, devices, count=2, part=1)]
