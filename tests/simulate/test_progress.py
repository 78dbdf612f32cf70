"""``simulate``'s progress bar (tqdm): on stderr while a person watches, absent when stdout is not a terminal."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpu_tailor.cli import main
from tests.simulate.test_trace import small_trace


@pytest.mark.parametrize("tty", [True, False], ids=["terminal", "pipe"])
def test_bar_only_on_a_terminal(tty: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    nodes_csv, pods_csv = small_trace(tmp_path)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: tty)
    assert main(["simulate", "--nodes", str(nodes_csv), "--pods", str(pods_csv), "--policy", "bestfit",
                 "--seeds", "1,2"]) == 0
    captured = capsys.readouterr()
    assert "alloc@100%" in captured.out and "replaying" not in captured.out
    if tty:
        assert "replaying" in captured.err and "2/2" in captured.err
    else:
        assert captured.err == ""
