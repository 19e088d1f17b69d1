"""The ``ucp`` command for scripts and CI: one ``--json [PATH]`` meaning, strict JSON, whole tables,
``--version``, flag-worded hints, exit codes, and progress that shows off a terminal."""

from __future__ import annotations

import importlib
import inspect
import json
import os
from pathlib import Path

import pytest
import torch

import ucp
from ucp.tools import cli
from ucp.tools.cli import SUBCOMMANDS, main

LOGHUB = Path(__file__).resolve().parent.parent / ".." / "shared" / "data" / "loghub"
LONG = "model.layers.0.a_very_long_module_name_that_a_table_at_eighty_columns_would_cut_or_fold.weight_of_it"


def strict(text: str):
    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    state = {"model": {LONG: torch.arange(6.0).view(2, 3), "b": torch.ones(2)}, "step": 3}
    ucp.save(state, root / "ckpt")
    torch.save({"w": torch.ones(3)}, root / "m.pt")
    lines = (LOGHUB / "Linux_2k.log").read_text(encoding="utf-8", errors="replace").splitlines()[:200]
    (root / "linux200.log").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


COMMANDS = {
    "convert --list": lambda r: ["convert", "--list"],
    "convert": lambda r: ["convert", str(r / "m.pt"), str(r / "out_{n}.safetensors"), "--check"],
    "diff": lambda r: ["diff", str(r / "ckpt"), str(r / "m.pt")],
    "inspect": lambda r: ["inspect", str(r / "ckpt")],
    "inspect foreign": lambda r: ["inspect", str(r / "m.pt")],
    "verify": lambda r: ["verify", str(r / "ckpt")],
    "verify foreign": lambda r: ["verify", str(r / "m.pt")],
    "verify not a checkpoint": lambda r: ["verify", str(r / "nothing")],
    "ettr": lambda r: ["ettr", "--nodes", "8", "--mttf-hours", "10", "--save-min", "1"],
    "ucl presets": lambda r: ["ucl", "presets"],
    "ucl check": lambda r: ["ucl", "check", "hf-llama", "--layout", "tp=2", "--param", "vocab_size=8,hidden_size=4",
                            "--param", "intermediate_size=8,num_hidden_layers=1,num_attention_heads=2"],
    "ucl check error": lambda r: ["ucl", "check", "--against", str(r / "ckpt"), "--layout", "tp=1"],
    "ucl compile": lambda r: ["ucl", "compile", "hf-llama", "--layout", "tp=2", "--param", "vocab_size=8,hidden_size=4",
                              "--param", "intermediate_size=8,num_hidden_layers=1,num_attention_heads=2"],
    "convert error": lambda r: ["convert", str(r / "m.pt")],
    # A Weibull fit of shape ~440 with MTTF inf on these lines: the JSON once held Infinity and NaN.
    "logs analyze": lambda r: ["logs", "analyze", str(r / "linux200.log"), "--quiet"],
    "logs templates": lambda r: ["logs", "templates", str(r / "linux200.log")],
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_json_dash_is_strict_json_on_stdout_and_nothing_else(name, files, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = [a.replace("{n}", name.replace(" ", "_")) for a in COMMANDS[name](files)]
    code = main([*argv, "--json", "-"])
    out = capsys.readouterr().out
    assert code in (0, 1, 2), code
    strict(out)  # the whole of stdout is one strict JSON document
    assert not os.path.exists(tmp_path / "-")


def test_logs_analyze_writes_null_where_a_fit_is_infinite(files, tmp_path):
    assert main(["logs", "analyze", str(files / "linux200.log"), "--quiet", "--json", str(tmp_path / "r.json")]) == 0
    text = (tmp_path / "r.json").read_text()
    assert "Infinity" not in text and "NaN" not in text
    strict(text)


def test_json_path_writes_the_file_and_the_table_still_prints(files, tmp_path, capsys):
    assert main(["inspect", str(files / "ckpt"), "--json", str(tmp_path / "s.json")]) == 0
    assert strict((tmp_path / "s.json").read_text())["step"] == 3
    assert LONG in capsys.readouterr().out


def test_bare_json_still_means_stdout(files, capsys):
    assert main(["inspect", str(files / "ckpt"), "--json"]) == 0
    assert strict(capsys.readouterr().out)["step"] == 3


def test_tables_off_a_terminal_keep_whole_names_on_one_line(files, capsys):
    assert main(["inspect", str(files / "ckpt")]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "a_very_long" in line]
    assert len(lines) == 1 and LONG in lines[0]


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"ucp {cli._version()}"
    assert cli._version()[0].isdigit()


@pytest.mark.parametrize("name, message", [
    ("o.safetensors", "{dst} already exists; choose another destination or pass --overwrite"),
    ("o_ucp", "a checkpoint already exists at {dst}; pass --overwrite to replace it or save to a new path"),
])
def test_overwrite_hint_names_the_flag(name, message, files, tmp_path, capsys):
    dst = tmp_path / name
    assert main(["convert", str(files / "m.pt"), str(dst)]) == 0
    capsys.readouterr()
    assert main(["convert", str(files / "m.pt"), str(dst)]) == 2
    assert capsys.readouterr().err == f"ucp convert: error: {message.format(dst=dst)}\n"


def test_ettr_refuses_a_job_that_cannot_make_progress(capsys):
    code = main(["ettr", "--nodes", "10000", "--failures-per-1000-node-days", "50", "--save-min", "30",
                 "--restart-min", "60"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err == (
        "ucp ettr: error: this job cannot make progress: it fails every 2.88 min on average (job MTTF), and each "
        "failure costs 60 min of restart and queue plus the work since the last checkpoint, so E[ETTR] is 0 at "
        "every checkpoint interval and no interval is optimal; shorten the restart (--restart-min, --queue-min), "
        "use fewer nodes, or lower the failure rate\n")


def test_ucl_errors_name_every_missing_parameter_at_once(capsys):
    assert main(["ucl", "check", "hf-llama", "--layout", "tp=2"]) == 2
    assert ("the program's parameters without a value: vocab_size, hidden_size, intermediate_size, "
            "num_hidden_layers, num_attention_heads (give each a value: ucl.load_program(..., NAME=VALUE), or "
            "--param NAME=VALUE to ucp ucl check / ucp convert)\n") in capsys.readouterr().err


def test_progress_shows_as_lines_off_a_terminal(files, tmp_path, monkeypatch, capsys):
    from ucp.tools import progress_bar

    monkeypatch.setattr(progress_bar, "LINE_EVERY_S", 0.0)
    assert main(["convert", str(files / "ckpt"), str(tmp_path / "c.pt")]) == 0
    err = capsys.readouterr().err
    assert "converting: " in err and " of " in err and "%)" in err


def test_progress_lines_come_every_few_seconds():
    import io

    from ucp.tools.progress_bar import ProgressLines

    ticks = iter([0.0, 1.0, 2.0, 5.5, 6.0, 11.0])
    out = io.StringIO()
    progress = ProgressLines("reading logs", stream=out, every=5.0, clock=lambda: next(ticks), unit="partitions")
    for done in range(1, 6):
        progress(done, 10)
    assert out.getvalue() == ("reading logs: 3 of 10 (30%) partitions, 6 s\n"
                              "reading logs: 5 of 10 (50%) partitions, 11 s\n")


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_every_subcommand_has_main_returning_an_exit_code(name, capsys):
    module = importlib.import_module(SUBCOMMANDS[name])
    signature = inspect.signature(module.main)
    assert signature.parameters["argv"].default is None and signature.return_annotation in ("int", int)
    with pytest.raises(SystemExit) as exit_:
        module.main(["--help"])
    assert exit_.value.code == 0
    assert "--json" in capsys.readouterr().out or name in ("logs", "place")  # their actions carry it
