"""The DRA inventory against real API servers (issue 27, first layer): on a release that serves
``resource.k8s.io/v1`` (1.34 and later) the hand-written NVIDIA-shaped ResourceSlices are accepted as they are, and
``gpumodel.dra`` reads what the API server hands back; an older release does not serve the API at all, so DRA is
off there."""

from __future__ import annotations

import pytest

from gpu_tailor.gpumodel.dra import DeviceType, read_slices
from gpu_tailor.gpumodel.dra_usage import smallest_holding
from tests.e2e.cluster import Release
from tests.e2e.kube import ApiError, api_path
from tests.e2e.services import Stack
from tests.gpumodel.dra_slices import GIB, a100_mig, hgx, t4

pytestmark = pytest.mark.e2e

GROUP = "resource.k8s.io/v1"


def test_nvidia_shaped_slices_are_accepted_and_read_back(cluster: Stack, release: Release) -> None:
    if release.minor < 34:
        with pytest.raises(ApiError) as absent:
            cluster.kube.get(f"/apis/{GROUP}")
        assert absent.value.status == 404  # no resource.k8s.io/v1 on this release: DRA is off
        return
    sent = [hgx(), a100_mig(), t4()]
    try:
        for s in sent:
            cluster.kube.create(api_path("resourceslices", group=GROUP), s)
        listed = [s for s in cluster.kube.list(api_path("resourceslices", group=GROUP))
                  if s["spec"]["driver"] == "gpu.nvidia.com"]
        inv = read_slices(listed)
        assert inv.problems == []
        assert {n: len(inv.on_node(n)[0].devices) for n in inv.nodes()} == {
            "dra-h100-hgx-0": 8, "dra-a100-mig-0": 11, "dra-t4-0": 4}
        mig = inv.on_node("dra-a100-mig-0")
        best = smallest_holding(mig, 20 * GIB)
        assert best is not None and (best.type, best.profile) == (DeviceType.MIG, "3g.20gb")
    finally:
        for s in sent:
            path = api_path("resourceslices", name=s["metadata"]["name"], group=GROUP)
            if cluster.kube.exists(path):
                cluster.kube.delete(path)
