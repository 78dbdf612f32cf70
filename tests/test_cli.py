"""The command line: subcommands and the no-cluster inventory print."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpu_tailor.cli import build_parser, main


def test_help_lists_the_four_subcommands() -> None:
    out = subprocess.run([sys.executable, "-m", "gpu_tailor", "--help"], capture_output=True, text=True, check=True)
    for cmd in ("webhook", "extender", "certs", "simulate"):
        assert cmd in out.stdout


@pytest.mark.parametrize("cmd", ["webhook", "extender", "certs", "simulate"])
def test_each_subcommand_has_help(cmd: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([cmd, "--help"])
    assert exc.value.code == 0
    assert "--" in capsys.readouterr().out


def test_inventory_print(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--inventory"]) == 0
    out = capsys.readouterr().out
    assert "h100-degraded-0" in out and "3 of 8 GPUs missing" in out
    assert "16 x shared:time-slicing:4 as nvidia.com/gpu.shared" in out


def test_unknown_subcommand_is_an_error() -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["frobnicate"])
    assert exc.value.code == 2
