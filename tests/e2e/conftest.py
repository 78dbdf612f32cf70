"""End-to-end fixtures: one real control plane per Kubernetes release with gpu-tailor installed from manifests/.

Every e2e test runs once per release ``find_releases`` finds (its id names the version, ``[v1.28.7]``), the
releases one after the other; where none is found (a user's machine) every e2e test is skipped and says why.
Select or drop them with ``-m e2e``.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator

import pytest

from tests.e2e.cluster import Release, find_releases, release_params
from tests.e2e.pods import Pods
from tests.e2e.services import Stack, control_plane_with_gpu_tailor

PARAMS, IDS = release_params()


@pytest.fixture(scope="session", params=PARAMS, ids=IDS)
def release(request: pytest.FixtureRequest) -> Release:
    """One Kubernetes release; pytest runs every test that needs it for each release, one release at a time."""
    if request.param is None:
        pytest.skip(f"no Kubernetes control plane to test against: {find_releases()[1]}")
    found: Release = request.param
    return found


@pytest.fixture(scope="session")
def stack(release: Release, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with control_plane_with_gpu_tailor(release, tmp_path_factory.mktemp(f"e2e-{release.version}")) as running:
        yield running


@pytest.fixture
def cluster(stack: Stack) -> Stack:
    """The session's stack, with every service running (a test that failed mid-restart leaves none down)."""
    for service in stack.services:
        if not service.alive:
            service.restart()
    return stack


@pytest.fixture
def pods(cluster: Stack) -> Iterator[Pods]:
    tracker = Pods(cluster.kube, cluster.extender)
    yield tracker
    tracker.cleanup()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist with ``--dist loadgroup`` (``scripts/test.sh``), every test of one release goes to one
    worker: each worker then starts the control planes of one release only, and the releases run side by side.
    First of this hook's implementations: xdist's reads the groups to name the tests by, and a group marked after
    it is never seen (both workers then start both releases' control planes)."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "release" in callspec.params:
            found = callspec.params["release"]
            item.add_marker(pytest.mark.xdist_group(found.version if isinstance(found, Release) else "no-release"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[
        None, pytest.TestReport, pytest.TestReport]:
    """A failed e2e test shows the services' log tails and where the control plane's logs are."""
    report = yield
    stack = getattr(item, "funcargs", {}).get("stack")
    if report.failed and isinstance(stack, Stack):
        report.sections.append(("gpu-tailor e2e logs", stack.context()))
    return report
