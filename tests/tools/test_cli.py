"""The commands' edges: errors a person can act on (exit 2), --plot with and without matplotlib, the
kubectl plugin's name and the live source's kubeconfig handling."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpu_tailor.cli import kubectl_main, main
from tests.conftest import FIXTURES

DUMP = str(FIXTURES / "cluster" / "control-plane-dump.json")


@pytest.mark.parametrize(("argv", "message"), [
    pytest.param(["explain", "-f", "/nonexistent.yaml", "--cluster-file", DUMP], "/nonexistent.yaml: No such file",
                 id="no manifest"),
    pytest.param(["explain", "-f", "MANIFEST", "--cluster-file", "/nonexistent.json"], "/nonexistent.json",
                 id="no dump"),
    pytest.param(["capacity", "--cluster-file", DUMP, "--cpu", "lots"], "--cpu/--memory", id="bad --cpu"),
    pytest.param(["explain", "-f", "MANIFEST", "--kubeconfig", "/nonexistent-kubeconfig"], "kubeconfig",
                 id="no kubeconfig"),
])
def test_errors_exit_2_and_say_why(argv: list[str], message: str, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    manifest = tmp_path / "svc.yaml"
    manifest.write_text("kind: Pod\nmetadata: {name: p}\nspec: {containers: []}\n")
    assert main([str(manifest) if a == "MANIFEST" else a for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpu-tailor {argv[0]}: ") and message in err


def test_plot_without_matplotlib_says_which_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("matplotlib", "matplotlib.pyplot"):
        monkeypatch.setitem(sys.modules, name, None)
    png = tmp_path / "pools.png"
    assert kubectl_main(["capacity", "--cluster-file", DUMP, "--plot", str(png)]) == 2
    assert capsys.readouterr().err.strip() == ("kubectl gpu-tailor capacity: --plot needs matplotlib: "
                                               "pip install 'gpu-tailor[plot]'")
    assert not png.exists()


def test_plot_draws_the_pools(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "pools.png"
    assert main(["capacity", "--cluster-file", DUMP, "--plot", str(png)]) == 0
    assert png.read_bytes().startswith(b"\x89PNG") and f"plot: {png}" in capsys.readouterr().out


def test_the_plugin_is_installed_under_kubectls_name() -> None:
    import tomllib

    scripts = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]["scripts"]
    # kubectl looks up `kubectl gpu-tailor` as kubectl-gpu_tailor on PATH
    assert scripts["kubectl-gpu_tailor"] == "gpu_tailor.cli:kubectl_main"


def test_the_live_source_reads_kubectls_kubeconfig_and_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """$KUBECONFIG is used when no --kubeconfig is given, and --context picks a context of it: here one whose
    server refuses connections, so the error names that context."""
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text("""apiVersion: v1
kind: Config
current-context: a
contexts:
- {name: a, context: {cluster: c, user: u, namespace: team-a}}
- {name: b, context: {cluster: c, user: u}}
clusters:
- {name: c, cluster: {server: "http://127.0.0.1:9"}}
users:
- {name: u, user: {token: t}}
""")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    assert kubectl_main(["capacity", "--context", "b"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kubectl gpu-tailor capacity: kubeconfig {kubeconfig}, context b: listing nodes and pods")
