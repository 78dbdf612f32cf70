"""The wheel as a user's ``pip install .`` and the container image get it.

The slow tests build the wheel, install it into a fresh venv with its runtime dependencies only, and check there
that everything ``gpu-tailor webhook`` and ``gpu-tailor extender`` load imports, that the bundled data is in, and that
the dev tools and the optional matplotlib are not. The image is built from the same wheels by
``scripts/build-image.py`` (``tests/test_image.py`` runs it).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# what the wheel build reads
SOURCES = ("pyproject.toml", "README.md", "gpu_tailor")
SERVICE_MODULES = (
    "gpu_tailor.cli",
    "gpu_tailor.serving",
    "gpu_tailor.webhook.__main__",
    "gpu_tailor.webhook.server",
    "gpu_tailor.extender.__main__",
    "gpu_tailor.extender.server",
    "gpu_tailor.kube.watch",
    "gpu_tailor.kube.clusterfile",
    "gpu_tailor.certs.__main__",
    "gpu_tailor.certs.authority",
    # imported inside functions, on the first live list+watch: an import error would show only in a cluster
    "kubernetes_asyncio.client",
    "kubernetes_asyncio.config",
    "kubernetes_asyncio.watch",
)
NOT_RUNTIME = ("matplotlib", "pytest", "mypy")
# what pip prints when it cannot reach the index (its retry warnings), as opposed to a real failure
UNREACHABLE = re.compile(r"NewConnectionError|Failed to establish a new connection|Temporary failure in name "
                         r"resolution|Name or service not known|Network is unreachable|ProxyError|ConnectTimeout")


@dataclass(frozen=True)
class Installed:
    wheel: Path
    python: Path
    scripts: Path
    workdir: Path


def clean_env() -> dict[str, str]:
    """The environment without anything that would put this checkout on the fresh venv's path."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}


def pip(*args: str, cwd: Path) -> None:
    """Run this interpreter's pip; skip only when it failed because the package index is unreachable."""
    cmd = [sys.executable, "-m", "pip", *args]
    env = clean_env() | {"PIP_RETRIES": "2"}  # also reaches the pip that installs the build backend
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode == 0:
        return
    output = proc.stdout + proc.stderr
    hit = UNREACHABLE.search(output)
    if hit and "No matching distribution found" in output:
        line = next(ln for ln in output.splitlines() if hit.group() in ln)
        pytest.skip(f"pip cannot reach the package index: {line.strip()}")
    pytest.fail(f"{' '.join(cmd)} failed ({proc.returncode}):\n{output}")


def sources() -> list[str]:
    """``SOURCES``' files, without bytecode caches."""
    out = []
    for entry in SOURCES:
        path = ROOT / entry
        files = [path] if path.is_file() else [p for p in path.rglob("*")
                                               if p.is_file() and "__pycache__" not in p.parts]
        out += [f.relative_to(ROOT).as_posix() for f in files]
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    work = tmp_path_factory.mktemp("packaging")
    src, dist, venv = work / "src", work / "dist", work / "venv"
    for rel in sources():  # what the wheel build reads, and nothing else of the checkout
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes((ROOT / rel).read_bytes())
    pip("wheel", "--no-deps", "--prefer-binary", "--wheel-dir", str(dist), str(src), cwd=work)
    (wheel,) = dist.glob("gpu_tailor-*.whl")
    # no pip in the venv: the pip running these tests installs into it, so nothing but the wheel and
    # its runtime dependencies is there (not even pip or setuptools, which the image drops as well)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, env=clean_env())
    python = venv / "bin" / "python"
    pip("--python", str(python), "install", "--prefer-binary", "--no-compile", str(wheel), cwd=work)
    yield Installed(wheel, python, venv / "bin", work)


def run_in(inst: Installed, *cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=inst.workdir, env=clean_env(), capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_wheel_carries_the_bundled_nodes_and_no_trace(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    data = ROOT / "gpu_tailor" / "data"
    nodes = {f"gpu_tailor/data/nodes/{p.name}" for p in (data / "nodes").glob("*.json")}
    assert nodes
    assert nodes | {"gpu_tailor/py.typed"} <= names
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "manifests/"))]
    assert not [n for n in names if n.endswith((".csv", ".csv.gz", ".parquet"))], "the package ships no data set"


@pytest.mark.slow
def test_the_fresh_install_replays_the_generated_default(installed: Installed) -> None:
    proc = run_in(installed, str(installed.scripts / "gpu-tailor"), "simulate", "--policy", "bestfit")
    assert proc.returncode == 0, proc.stderr
    row = next(line.split() for line in proc.stdout.splitlines() if line.startswith("generated"))
    assert row[1] == "bestfit" and 85 < float(row[4]) <= 100  # alloc@100%


@pytest.mark.slow
def test_every_module_the_services_load_imports_from_the_fresh_venv(installed: Installed) -> None:
    check = ("import importlib, pathlib, sys\n"
             f"for name in {SERVICE_MODULES!r}:\n"
             "    importlib.import_module(name)\n"
             "import gpu_tailor\n"
             "print(pathlib.Path(gpu_tailor.__file__).resolve().is_relative_to(pathlib.Path(sys.prefix).resolve()))\n")
    proc = run_in(installed, str(installed.python), "-I", "-c", check)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True", "gpu_tailor was imported from outside the fresh venv"


@pytest.mark.slow
def test_dev_tools_and_matplotlib_are_not_runtime_dependencies(installed: Installed) -> None:
    check = f"import importlib.util\nprint([m for m in {NOT_RUNTIME!r} if importlib.util.find_spec(m)])"
    proc = run_in(installed, str(installed.python), "-I", "-c", check)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.slow
@pytest.mark.parametrize("command", ["webhook", "extender"])
def test_the_console_script_serves_help(installed: Installed, command: str) -> None:
    proc = run_in(installed, str(installed.scripts / "gpu-tailor"), command, "--help")
    assert proc.returncode == 0, proc.stderr
    assert f"usage: gpu-tailor {command}" in proc.stdout and "--listen" in proc.stdout


@pytest.mark.slow
def test_simulate_plot_names_the_extra_where_matplotlib_is_missing(installed: Installed) -> None:
    proc = run_in(installed, str(installed.scripts / "gpu-tailor"), "simulate", "--plot", "out.png")
    assert proc.returncode == 2
    assert "--plot needs matplotlib: pip install 'gpu-tailor[plot]'" in proc.stderr
