"""`ucp bench` runs every method on the same state and reports ratios (a smoke run, never timed)."""

import json

from ucp.tools.cli import main

METHODS = {"raw", "torch.save", "safetensors", "dcp", "ucp", "ucp-nocrc", "ucp-buffered", "memcpy",
           "ucp-async-blocking", "ucp-async-total"}


def test_bench_smoke_json(tmp_path, capsys):
    code = main(["bench", "--size-gib", "0.002", "--dirs", str(tmp_path / "b"), "--repeats", "1", "--no-rss", "--no-cold-start",
                 "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["state_bytes"] >= 0.002 * 2**30 * 0.9 and report["tensors"] > 100
    assert {t["method"] for t in report["timings"]} == METHODS
    for timing in report["timings"]:
        assert timing["save_s"] > 0, timing
        if timing["method"] in {"raw", "torch.save", "safetensors", "dcp", "ucp", "ucp-nocrc", "ucp-buffered"}:
            assert timing["load_s"] > 0, timing
            assert timing["save_cpu_s"] >= 0 and timing["load_cpu_s"] >= 0, timing  # CPU seconds beside wall


def test_bench_rejects_bad_size(capsys):
    assert main(["bench", "--size-gib", "0"]) == 2
    assert "--size-gib must be a positive number" in capsys.readouterr().err


def test_cold_start_probe_times_a_first_and_a_warm_save_and_load(tmp_path, capsys):
    from ucp.tools.bench.cold_start import main as probe

    assert probe(["0.001", str(tmp_path)]) == 0
    found = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(found["first"]) == len(found["warm"]) == 2 and min(found["first"] + found["warm"]) > 0
    assert list(tmp_path.iterdir()) == []  # nothing left behind


def test_the_order_of_the_methods_rotates_every_repeat(tmp_path):
    from ucp.tools.bench.core_bench import run_benchmark

    report = run_benchmark(size_gib=0.0005, dirs=[tmp_path / "b"], repeats=3, methods=["raw", "torch.save", "ucp"],
                           measure_rss=False, cold_start=False)
    firsts = [t.method for t in report.timings if t.method in ("raw", "torch.save", "ucp")][::3]
    assert firsts == ["raw", "torch.save", "ucp"]


def test_the_fresh_process_probes_find_ucp_compiled_as_an_installation_has_it():
    # Without it a checkout run with PYTHONDONTWRITEBYTECODE=1 compiles ucp in every fresh
    # process, and the first save pays for what an installed ucp never does.
    import importlib.util
    from pathlib import Path

    import ucp
    from ucp.tools.bench.cold_start import compile_bytecode

    assert compile_bytecode()
    package = Path(ucp.__file__).resolve().parent
    for module in ("api.py", "writer.py", "stores/local.py"):
        assert Path(importlib.util.cache_from_source(str(package / module))).is_file(), module


def test_io_floor_times_every_case_against_a_memory_copy_and_leaves_nothing(tmp_path, capsys):
    from ucp.tools.bench.io_floor import main as floor

    assert floor([str(tmp_path), "--gib", "0.002", "--repeats", "2", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    cases = {row["case"]: row for row in found["summary"]}
    assert {"copyto", "pwrite new", "pwrite existing", "pread", "write hashed"} <= set(cases)
    assert all(len(reps) == 2 for reps in found["repeats"].values()) and cases["copyto"]["wall_x_copyto"] == 1.0
    assert list(tmp_path.iterdir()) == []
