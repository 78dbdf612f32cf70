"""Shared test helpers: the real wire fixtures captured from a Kubernetes v1.28.7 control plane."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures"


def load_fixture(*parts: str) -> Any:
    return json.loads(FIXTURES.joinpath(*parts).read_text())


def node_fixture(name: str) -> dict[str, Any]:
    node: dict[str, Any] = load_fixture("nodes", f"{name}.json")
    return node


def review_fixture(letter: str) -> dict[str, Any]:
    matches = sorted((FIXTURES / "admission").glob(f"{letter}-*.json"))
    assert len(matches) == 1, f"no single admission fixture for {letter!r}"
    review: dict[str, Any] = json.loads(matches[0].read_text())
    return review


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def openb_dir() -> Path:
    """Where the real openb trace is for tests and benchmarks: $GPU_TAILOR_TRACE_DIR, else ../shared/data beside
    the repository (the project ships no trace; ``gpu-tailor trace fetch DIR`` downloads one)."""
    env = os.environ.get("GPU_TAILOR_TRACE_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[1].parent / "shared" / "data"


def openb(name: str) -> Path:
    """One file of the real trace; the calling test is skipped, saying why, where the trace is absent."""
    import pytest

    path = openb_dir() / name
    if not path.is_file():
        pytest.skip(f"the real openb trace is not here: {path} is absent (set GPU_TAILOR_TRACE_DIR to a folder that "
                    "`gpu-tailor trace fetch` filled)")
    return path


TOOLS = Path(__file__).resolve().parents[1] / ".tools" / "bin"  # scripts/k8s-tools.py puts helm and kubectl here


def release_kubectl() -> str:
    """A kubectl to render kustomize with: the oldest Kubernetes release's the e2e suite finds, else the one
    ``scripts/k8s-tools.py`` fetched; the calling test is skipped, saying why, where there is neither."""
    import pytest

    from tests.e2e.cluster import find_releases

    found, why = find_releases()
    if found:
        return str(found[0].bin / "kubectl")
    if (TOOLS / "kubectl").is_file():
        return str(TOOLS / "kubectl")
    pytest.skip(f"no kubectl to render kustomize with: {why}; nor {TOOLS / 'kubectl'} (python scripts/k8s-tools.py)")


def helm() -> str:
    """The helm ``scripts/k8s-tools.py`` fetched; the calling test is skipped, saying why, where it is absent."""
    import pytest

    if not (TOOLS / "helm").is_file():
        pytest.skip(f"no helm: {TOOLS / 'helm'} is absent (python scripts/k8s-tools.py fetches it)")
    return str(TOOLS / "helm")


def cluster_replay() -> ModuleType:
    """``benchmarks/cluster_replay.py`` as a module: the openb cut, its arrivals and pod objects, for the tests that
    replay openb as that benchmark does."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "cluster_replay.py"
    spec = importlib.util.spec_from_file_location("cluster_replay", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


RELEASE_ID = re.compile(r"\[(v\d+\.\d+\.\d+)(?:-[^\]]*)?\]$")  # an e2e test's id: [v1.28.7] or [v1.36.3-a]


def pytest_xdist_make_scheduler(config: Any, log: Any) -> Any:
    """``--dist loadgroup`` (``scripts/test.sh``): every e2e test of one Kubernetes release in one work unit, so that
    one worker starts that release's control planes and the releases run side by side. xdist groups by a suffix it
    writes into each test's node id, which pytest 9 no longer reads back; the release is taken from the test's id
    instead (tests/e2e/conftest.py marks the same groups for an xdist that can)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling  # type: ignore[import-untyped]

    class ByRelease(LoadGroupScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            found = RELEASE_ID.search(nodeid)
            return found.group(1) if found else str(super()._split_scope(nodeid))

    return ByRelease(config, log)
