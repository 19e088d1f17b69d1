"""``ucp convert`` and ``ucp diff`` from the command line: exit codes, JSON, and damaged or hostile inputs."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import ucp
from ucp.tools.cli import main


def _sources(root) -> dict[str, str]:
    """One small checkpoint in every format, all holding the same tensors."""
    sd = {"w": torch.randn(20, 8), "b": torch.randn(8).bfloat16()}
    torch.save(sd, root / "m.pt")
    save_file(sd, root / "m.safetensors")
    ucp.save(sd, root / "u")
    ucp.convert(root / "m.pt", root / "d", dst_format="dcp")
    return {"torch": str(root / "m.pt"), "safetensors": str(root / "m.safetensors"), "ucp": str(root / "u"),
            "dcp": str(root / "d")}


def _entries(folder) -> set[str]:
    return set(os.listdir(folder))


def test_convert_between_every_pair_and_check(tmp_path, capsys):
    sources = _sources(tmp_path)
    for name, src in sources.items():
        for target in ("ucp", "dcp", "safetensors", "torch"):
            dst = tmp_path / f"{name}-to-{target}"
            assert main(["convert", src, str(dst), "--to", target, "--check", "--json"]) == 0
            out = json.loads(capsys.readouterr().out)
            assert (out["src_format"], out["dst_format"], out["tensors"]) == (name, target, 2)
            assert out["check"]["equal"] is True


def test_format_from_extension_and_summary_line(tmp_path, capsys):
    sources = _sources(tmp_path)
    assert main(["convert", sources["dcp"], str(tmp_path / "x.safetensors")]) == 0
    assert capsys.readouterr().out.startswith(f"converted {sources['dcp']} (dcp) -> {tmp_path / 'x.safetensors'} "
                                              "(safetensors): 2 tensors")
    assert main(["diff", sources["dcp"], str(tmp_path / "x.safetensors"), "--tensors-only"]) == 0
    assert "EQUAL" in capsys.readouterr().out


def test_diff_exit_codes(tmp_path, capsys):
    torch.save({"w": torch.zeros(2)}, tmp_path / "a.pt")
    torch.save({"w": torch.tensor([0.0, 0.5])}, tmp_path / "b.pt")
    assert main(["diff", str(tmp_path / "a.pt"), str(tmp_path / "b.pt"), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["differences"][0]["kind"] == "values" and report["differences"][0]["max_abs_diff"] == 0.5
    assert main(["diff", str(tmp_path / "a.pt"), str(tmp_path / "b.pt"), "--atol", "0.5"]) == 0
    assert main(["diff", str(tmp_path / "a.pt"), str(tmp_path / "missing")]) == 2
    assert "no file or directory at" in capsys.readouterr().err


def test_usage_errors_exit_2(tmp_path, capsys):
    sources = _sources(tmp_path)
    assert main(["convert", sources["torch"]]) == 2
    assert "SRC and DST are required" in capsys.readouterr().err
    assert main(["convert", sources["torch"], str(tmp_path / "o"), "--to", "nope"]) == 2
    assert "unknown checkpoint format 'nope'; known formats: dcp, deepspeed-pipeline, " in capsys.readouterr().err
    assert main(["convert", sources["torch"], str(tmp_path / "o"), "--to", "dcp", "--layout", "tp=2"]) == 2
    assert "--program/--layout describe how a ucp checkpoint is sharded" in capsys.readouterr().err
    assert main(["convert", sources["torch"], sources["ucp"]]) == 2
    assert "a checkpoint already exists at" in capsys.readouterr().err
    assert main(["convert", sources["torch"], str(tmp_path / "o"), "--memory-budget", "lots"]) == 2
    assert "cannot read 'lots' as a size" in capsys.readouterr().err
    assert main(["convert", "--list", "--json"]) == 0
    assert set(json.loads(capsys.readouterr().out)) >= {"ucp", "dcp", "safetensors", "torch"}


def test_overwrite_replaces_only_after_success(tmp_path):
    sources = _sources(tmp_path)
    dst = tmp_path / "out.safetensors"
    assert main(["convert", sources["torch"], str(dst)]) == 0
    (tmp_path / "bad.pt").write_bytes(b"PK\x03\x04 not really")
    before = dst.read_bytes()
    assert main(["convert", str(tmp_path / "bad.pt"), str(dst), "--from", "torch", "--overwrite"]) == 2
    assert dst.read_bytes() == before


def _damage(fmt: str, src: str, root) -> str:
    bad = root / f"bad-{fmt}"
    if os.path.isdir(src):
        shutil.copytree(src, bad)
    else:
        shutil.copy(src, bad)
    if fmt == "torch":
        bad.write_bytes(bad.read_bytes()[:300])
    elif fmt == "safetensors":
        bad.write_bytes(bad.read_bytes()[:-16])
    elif fmt == "dcp":
        data = next(p for p in bad.iterdir() if p.suffix == ".distcp")
        data.write_bytes(data.read_bytes()[:50])
    else:  # ucp: flip bytes of a tensor's data; the checksum catches it while converting
        chunk = next(p for p in (bad / "data").rglob("*") if p.is_file() and p.name.startswith("c"))
        raw = bytearray(chunk.read_bytes())
        raw[0] ^= 0xFF
        chunk.write_bytes(bytes(raw))
    return str(bad)


@pytest.mark.parametrize("fmt, message", [
    ("torch", "is not a readable torch.save file"),
    ("safetensors", "of the data, but the file holds only"),
    ("dcp", "(truncated)"),
    ("ucp", "checksum mismatch in tensor"),
])
@pytest.mark.parametrize("target", ["ucp", "safetensors", "dcp", "torch"])
def test_damaged_input_exits_2_and_writes_nothing(tmp_path, capsys, fmt, message, target):
    src = _damage(fmt, _sources(tmp_path)[fmt], tmp_path)
    before = _entries(tmp_path)
    assert main(["convert", src, str(tmp_path / "out"), "--from", fmt, "--to", target]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ucp convert: error: ") and message in err
    assert _entries(tmp_path) == before  # no destination, no staging left behind


def test_hostile_pickle_is_refused_and_nothing_runs(tmp_path, capsys):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"w": torch.ones(2), "evil": Evil()}, tmp_path / "evil.pt")
    assert main(["convert", str(tmp_path / "evil.pt"), str(tmp_path / "out")]) == 2
    assert ("the pickle calls posix.system, which can run code; refused (nothing was executed)"
            in capsys.readouterr().err)
    (tmp_path / "legacy.pt").write_bytes(pickle.dumps(Evil(), protocol=2))
    assert main(["convert", str(tmp_path / "legacy.pt"), str(tmp_path / "out"), "--from", "torch"]) == 2
    assert not marker.exists() and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_convert_benchmark_runs_end_to_end(tmp_path, capsys):
    from ucp.tools.bench import convert_bench

    assert convert_bench.main(["--size-gib", "0.02", "--world", "1", "--dir", str(tmp_path), "--json"]) == 0
    (report,) = json.loads(capsys.readouterr().out)
    assert report["case"] == "dcp-to-safetensors" and report["outputs_equal"] is True
    assert report["ours"]["peak_rss"] > 0 and report["speedup"] > 0


def test_inspect_and_verify_take_every_format(tmp_path, capsys):
    sources = _sources(tmp_path)
    for fmt, path in sources.items():
        assert main(["inspect", path, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        names = {t["name"] for t in out["tensors"]}
        assert names == {"w", "b"}, fmt
        assert main(["verify", path]) == 0
        assert capsys.readouterr().out.startswith("OK "), fmt
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(Path(sources["safetensors"]).read_bytes()[:-16])
    assert main(["verify", str(bad), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["format"] == "safetensors" and report["problems"][0]["kind"] == "FormatError"
    assert main(["inspect", str(bad)]) == 2
    assert "but the file holds only" in capsys.readouterr().err
