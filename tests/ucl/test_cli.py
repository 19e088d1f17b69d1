"""``ucp ucl check|compile|presets``: exit codes, text and JSON output."""

from __future__ import annotations

import json

import pytest

from ucp.tools.cli import main

PROGRAM = "ucl 1\ntensor emb.weight -> emb.weight\n  split dim 0 over tp\ntensor fc.weight -> fc.weight\n  split dim 1 over tp\n"


@pytest.fixture
def files(tmp_path):
    prog = tmp_path / "m.ucl"
    prog.write_text(PROGRAM)
    shapes = tmp_path / "shapes.json"
    shapes.write_text(json.dumps({"emb.weight": [12, 3], "fc.weight": {"shape": [3, 10], "dtype": "bfloat16"}}))
    return prog, shapes


def test_check_passes_with_exit_0(files, capsys):
    prog, shapes = files
    assert main(["ucl", "check", str(prog), "--layout", "tp=2,pp=2,dp=2", "--shapes", str(shapes)]) == 0
    assert "covers every element of 2 logical tensors exactly once on tp=2,pp=2,dp=2 (8 ranks" in capsys.readouterr().out


def test_check_reports_findings_with_exit_1_and_json(files, capsys):
    prog, shapes = files
    assert main(["ucl", "check", str(prog), "--layout", "tp=4", "--shapes", str(shapes), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["ranks"] == 4
    assert {f["kind"] for f in report["findings"]} == {"shape"}
    assert report["findings"][0]["message"] == (
        "rank 0: local shapes imply 'fc.weight' (3, 12), the checkpoint has (3, 10) (declare 'size dim D = ...')")


def test_parse_errors_exit_2_with_location(files, tmp_path, capsys):
    _, shapes = files
    bad = tmp_path / "bad.ucl"
    bad.write_text("ucl 1\ntensor a -> b\n  split dim 0 by tp\n")
    assert main(["ucl", "check", str(bad), "--layout", "tp=2", "--shapes", str(shapes)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:3:15: expected 'over' after 'split dim 0', found 'by'" in err


def test_bad_layout_and_bad_shapes_exit_2(files, tmp_path, capsys):
    prog, shapes = files
    assert main(["ucl", "check", str(prog), "--layout", "tp=two", "--shapes", str(shapes)]) == 2
    assert "bad layout value 'two' for tp" in capsys.readouterr().err
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"w": "big"}))
    assert main(["ucl", "check", str(prog), "--layout", "tp=2", "--shapes", str(broken)]) == 2
    assert "tensor 'w': expected a shape like [4, 8], got 'big'" in capsys.readouterr().err


def test_compile_prints_the_fragment_map(files, capsys):
    prog, shapes = files
    assert main(["ucl", "compile", str(prog), "--layout", "tp=2,dp=2", "--rank", "3", "--shapes", str(shapes)]) == 0
    fmap = json.loads(capsys.readouterr().out)
    fc = fmap["tensors"]["fc.weight"]
    assert (fmap["rank"], fc["shape"], fc["dtype"], fc["replica"], fc["replicas"]) == (3, [3, 5], "bfloat16", 1, 2)
    assert fc["pieces"] == [{"logical": "fc.weight", "local": {"box": {"offsets": [0, 0], "sizes": [3, 5]}},
                             "target": {"box": {"offsets": [0, 5], "sizes": [3, 5]}}}]


def test_presets_with_parameters_check_on_a_preset(tmp_path, capsys, models):
    shapes = tmp_path / "s.json"
    tensors = models.megatron(layers=2, hidden=8, heads=4, kv_heads=2, vocab=50, ffn=8, states=("exp_avg",))
    shapes.write_text(json.dumps({n: list(t.shape) for n, t in tensors.items()}))
    argv = ["ucl", "check", "megatron-gpt", "--layout", "tp=2,pp=2,dp=2", "--shapes", str(shapes),
            "--param", "num_layers=2,hidden_size=8,ffn_hidden_size=8", "--param", "heads=4,kv_heads=2",
            "--param", "vocab_size=50",
            "--param", "vocab_multiple=4", "--param", "states=exp_avg"]  # a one-item list parameter
    assert main(argv) == 0
    wrong = [a if a != "vocab_size=50" else "vocab_size=49" for a in argv]  # the true size disagrees
    assert main(wrong) == 1
    assert main(["ucl", "presets", "--json"]) == 0
    assert "megatron-gpt" in capsys.readouterr().out.splitlines()[-1]
    # tp=4 over 2 key/value groups: a layout Megatron refuses, reported with its rule
    refused = [a if a != "tp=2,pp=2,dp=2" else "tp=4" for a in argv] + ["--json"]
    assert main(refused) == 1
    (finding,) = json.loads(capsys.readouterr().out)["findings"]
    assert (finding["kind"], finding["message"]) == ("layout", (
        "megatron-gpt.ucl:36: Megatron requires num_query_groups (2) to be divisible by the tensor parallel size (4): "
        "each tp rank holds whole key/value groups, none is replicated across tp ranks"))


def test_check_against_a_real_checkpoint(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    ucp = pytest.importorskip("ucp.api")
    path = str(tmp_path / "ckpt")
    state = {"emb.weight": torch.randn(12, 3), "fc.weight": torch.randn(3, 10)}
    ucp.save(state, path)  # one rank, whole tensors: the manifest holds the logical shapes
    prog = tmp_path / "m.ucl"
    prog.write_text(PROGRAM)
    assert main(["ucl", "check", str(prog), "--layout", "tp=2,dp=3", "--against", path]) == 0
    assert main(["ucl", "check", str(prog), "--layout", "tp=3", "--against", path, "--json"]) == 1
    assert "(3, 12), the checkpoint has (3, 10)" in capsys.readouterr().out
    assert main(["ucl", "check", str(prog), "--layout", "tp=2", "--against", str(tmp_path / "nope")]) == 2


BINARY = bytes(range(256)) * 4


def test_binary_input_is_an_input_error_not_a_failed_check(files, tmp_path, capsys):
    # a UnicodeDecodeError escaped before, and exit 1 means "the check failed"
    prog, shapes = files
    program = tmp_path / "blob.ucl"
    program.write_bytes(BINARY)
    assert main(["ucl", "check", str(program), "--layout", "tp=2", "--shapes", str(shapes)]) == 2
    assert capsys.readouterr().err == (f"ucp ucl check: error: UCL program file {str(program)!r} is not UTF-8 text "
                                       "(byte 128 is 0x80): pass a .ucl text file\n")
    blob = tmp_path / "blob.json"
    blob.write_bytes(BINARY)
    assert main(["ucl", "check", str(prog), "--layout", "tp=2", "--shapes", str(blob)]) == 2
    assert capsys.readouterr().err == f"ucp ucl check: error: {blob} is not a JSON text file (byte 128 is not UTF-8)\n"


@pytest.mark.parametrize("content, message", [
    ("[" * 100000 + "]" * 100000, "cannot be read as a shapes file: RecursionError"),
    ('{"w": [1e400]}', "tensor 'w': expected a shape like [4, 8], got [inf]"),
    ('{"w": [' + "9" * 30 + "]}", "tensor 'w': expected a shape like [4, 8], got [999999999999999999999999999999]"),
    ('{"w": {"shape": [2], "dtype": 5}}', "tensor 'w': expected a dtype name like \"float32\", got 5"),
])
def test_hostile_shapes_files_exit_2(files, tmp_path, capsys, content, message):
    prog, _ = files
    shapes = tmp_path / "hostile.json"
    shapes.write_text(content)
    assert main(["ucl", "check", str(prog), "--layout", "tp=2", "--shapes", str(shapes)]) == 2
    assert message in capsys.readouterr().err


def test_a_fifo_or_a_directory_is_not_read_as_a_program(files, tmp_path, capsys):
    import os

    _, shapes = files
    fifo = tmp_path / "pipe.ucl"
    os.mkfifo(fifo)  # reading it would block forever
    assert main(["ucl", "check", str(fifo), "--layout", "tp=2", "--shapes", str(shapes)]) == 2
    assert "is not a regular file: pass a .ucl text file" in capsys.readouterr().err
    assert main(["ucl", "check", str(prog_dir := tmp_path / "d.ucl"), "--layout", "tp=2", "--shapes", str(shapes)]) == 2
    assert f"UCL program file {str(prog_dir)!r} does not exist" in capsys.readouterr().err


def test_a_layout_too_large_to_walk_exits_2_at_once(files, capsys):
    prog, shapes = files
    assert main(["ucl", "check", str(prog), "--layout", "dp=1000000000", "--shapes", str(shapes)]) == 2
    assert "layout dp=1000000000 is larger than the 1048576 this library supports" in capsys.readouterr().err
