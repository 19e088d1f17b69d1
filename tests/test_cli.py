"""The `ucp` dispatcher: every subcommand has --help, bad usage exits 2."""

import subprocess
import sys

import pytest

from ucp.tools.cli import SUBCOMMANDS, main


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_subcommand_has_help(name, capsys):
    with pytest.raises(SystemExit) as info:
        main([name, "--help"])
    assert info.value.code == 0
    assert f"ucp {name}" in capsys.readouterr().out


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_unknown_command_exits_2():
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "ucp.tools", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "verify" in out.stdout
