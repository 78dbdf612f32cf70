"""The command line: subcommands and the no-cluster inventory print."""

from __future__ import annotations

import re
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


@pytest.mark.parametrize(("argv", "fragment"), [
    (["--certs-secret", "gpu-tailor/x", "--tls-cert", "c", "--tls-key", "k"], "alternatives"),
    (["--certs-secret", "gpu-tailor/x", "--cluster-file", "dump.json"], "needs the API server"),
    (["--certs-secret", "gpu-tailor/x", "--cert-days", "30", "--renew-before", "30"], "must be more than"),
    (["--tls-cert", "c"], "give --tls-cert and --tls-key, or --certs-secret"),
    (["--certs-secret", "no-namespace", "--kubeconfig", "/nonexistent"], "expected NAMESPACE/NAME"),
    (["--certs-secret", "gpu-tailor/x", "--ip", "not-an-ip", "--kubeconfig", "/nonexistent"], "not-an-ip"),
], ids=["both-tls-sources", "secret-offline", "renew-every-check", "half-a-pair", "secret-without-namespace",
        "bad-ip"])
def test_webhook_certificate_flags_are_checked_before_anything_starts(
        argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["webhook", *argv]) == 2
    assert fragment in capsys.readouterr().err


@pytest.mark.parametrize("cmd", ["webhook", "extender"])
def test_help_names_every_config_key(cmd: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Each ``--config`` key of the service's model, nested ones included, is named in its ``--help``."""
    from pydantic import BaseModel

    from gpu_tailor.extender.__main__ import Settings
    from gpu_tailor.webhook.config import AdmissionPolicy
    from tests.test_reference import keys

    with pytest.raises(SystemExit):
        main([cmd, "--help"])
    said = " ".join(capsys.readouterr().out.split())
    config = said.rsplit("--config FILE", 1)[1].split(" --", 1)[0]  # the --config flag's own help
    model: type[BaseModel] = AdmissionPolicy if cmd == "webhook" else Settings
    missing = [k for k in keys(model) if not re.search(rf"\b{re.escape(k.rsplit('.', 1)[-1])}\b", config)]
    assert not missing, f"gpu-tailor {cmd} --help does not name {missing}"
