"""What the node agent keeps knowing of the UUIDs NVML named before (``collect.remembered``): enough to place a device
of a GPU lost since, and nothing that could place a device on the wrong GPU or grow without end."""

from __future__ import annotations

from gpu_tailor.agent.collect import remembered
from gpu_tailor.agent.nvml import Gpu, Reading


def reading(*gpus: Gpu) -> Reading:
    return Reading(gpus)


def test_a_lost_gpus_uuid_is_kept_while_a_device_names_it() -> None:
    before = {"GPU-a": 0, "GPU-b": 1}
    lost = reading(Gpu(0, "GPU-a"), Gpu(1, "", healthy=False))
    assert remembered(before, lost, {"GPU-a", "GPU-b"}) == {"GPU-a": 0, "GPU-b": 1}
    # no device of the kubelet names it any more (the pod ended, the plugin stopped selling it): forgotten
    assert remembered(before, lost, {"GPU-a"}) == {"GPU-a": 0}


def test_an_index_a_readable_gpu_holds_now_is_not_remembered_for_another_uuid() -> None:
    """After a driver reload the GPU that was 2 is 1 now: the lost GPU's old index is not trusted for its UUID; MIG
    devices cut away from a readable GPU are forgotten too."""
    before = {"GPU-a": 0, "GPU-b": 1, "GPU-c": 2, "MIG-x": 0}
    moved = reading(Gpu(0, "GPU-a", mig=("MIG-y",)), Gpu(1, "GPU-c"))
    assert remembered(before, moved, {"GPU-a", "GPU-b", "GPU-c", "MIG-x", "MIG-y"}) == {
        "GPU-a": 0, "GPU-c": 1, "MIG-y": 0}
