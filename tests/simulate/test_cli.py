"""``gpu-tailor simulate`` without the optional ``plot`` extra: matplotlib is needed for ``--plot`` only."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpu_tailor.cli import main
from gpu_tailor.simulate import cli as simulate_cli
from tests.simulate.test_trace import small_trace


@pytest.fixture
def no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import matplotlib`` fail as it does where only the runtime dependencies are installed."""
    for name in ("matplotlib", "matplotlib.pyplot"):
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.usefixtures("no_matplotlib")
def test_plot_without_matplotlib_says_which_extra_before_replaying(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def no_replay(*args: object, **kwargs: object) -> None:
        raise AssertionError("the trace was loaded before --plot was checked")

    monkeypatch.setattr(simulate_cli, "load_nodes", no_replay)
    png = tmp_path / "alloc.png"
    assert main(["simulate", "--plot", str(png)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "gpu-tailor simulate: --plot needs matplotlib: pip install 'gpu-tailor[plot]'"
    assert not png.exists()


@pytest.mark.usefixtures("no_matplotlib")
def test_simulate_without_plot_needs_no_matplotlib_and_writes_no_picture(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    nodes_csv, pods_csv = small_trace(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = set(tmp_path.iterdir())
    assert main(["simulate", "--nodes", str(nodes_csv), "--pods", str(pods_csv), "--policy", "bestfit"]) == 0
    out = capsys.readouterr().out
    assert "alloc@100%" in out and "plot:" not in out
    assert set(tmp_path.iterdir()) == before
