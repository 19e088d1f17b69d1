"""`ucp bench` runs every method on the same state and reports ratios (a smoke run, never timed)."""

import json

from tools.cli import main

METHODS = {"raw", "torch.save", "dcp", "ucp", "ucp-nocrc", "memcpy", "ucp-async-blocking", "ucp-async-total"}


def test_bench_smoke_json(tmp_path, capsys):
    code = main(["bench", "--size-gib", "0.002", "--dirs", str(tmp_path / "b"), "--repeats", "1", "--no-rss", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["state_bytes"] >= 0.002 * 2**30 * 0.9 and report["tensors"] > 100
    assert {t["method"] for t in report["timings"]} == METHODS
    for timing in report["timings"]:
        assert timing["save_s"] > 0, timing
        if timing["method"] in {"raw", "torch.save", "dcp", "ucp", "ucp-nocrc"}:
            assert timing["load_s"] > 0, timing


def test_bench_rejects_bad_size(capsys):
    assert main(["bench", "--size-gib", "0"]) == 2
    assert "--size-gib must be a positive number" in capsys.readouterr().err
