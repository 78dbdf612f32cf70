"""End-to-end fixtures: one real control plane per session with gpu-tailor installed from manifests/.

The control plane comes from ``../shared/k8s/control-plane.sh`` (or ``$GPU_TAILOR_K8S_DIR``); where it is
absent (a user's machine) every e2e test is skipped and says why. Select or drop them with ``-m e2e``.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator

import pytest

from tests.e2e.cluster import ControlPlane, k8s_dir
from tests.e2e.kube import Kube, load_kubeconfig
from tests.e2e.pods import Pods
from tests.e2e.services import Stack, start_stack


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    script = k8s_dir() / "control-plane.sh"
    if not script.is_file():
        pytest.skip(f"no Kubernetes control plane to test against: {script} is absent "
                    "(set GPU_TAILOR_K8S_DIR to a folder holding control-plane.sh)")
    workdir = tmp_path_factory.mktemp("e2e")
    cp = ControlPlane(script, workdir / "k8s")
    try:
        cp.up()
        kube = Kube(load_kubeconfig(cp.kubeconfig), workdir / "admin")
        try:
            stack = start_stack(cp, kube, workdir)
        except Exception as exc:
            exc.add_note(f"logs: control plane {cp.logs}, gpu-tailor {workdir / 'logs'}")
            raise
        try:
            yield stack
        finally:
            stack.stop()
    finally:
        cp.down()


@pytest.fixture
def cluster(stack: Stack) -> Stack:
    """The session's stack, with every service running (a test that failed mid-restart leaves none down)."""
    for service in stack.services:
        if not service.alive:
            service.restart()
    return stack


@pytest.fixture
def pods(cluster: Stack) -> Iterator[Pods]:
    tracker = Pods(cluster.kube)
    yield tracker
    tracker.cleanup()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[
        None, pytest.TestReport, pytest.TestReport]:
    """A failed e2e test shows the services' log tails and where the control plane's logs are."""
    report = yield
    stack = getattr(item, "funcargs", {}).get("stack")
    if report.failed and isinstance(stack, Stack):
        report.sections.append(("gpu-tailor e2e logs", stack.context()))
    return report
