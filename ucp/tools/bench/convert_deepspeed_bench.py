"""Benchmark: a >= 1 GiB DeepSpeed ZeRO-2 checkpoint to a universal checkpoint, ours against DeepSpeed's own tool.

The checkpoint is written by real DeepSpeed (2 ranks on gloo,
``ucp/tools/fixtures/gen_deepspeed.py``), then converted, on the same data in the
same run, each in its own subprocess:

* ours: ``ucp convert SRC DST --to deepspeed-universal`` (``ucp.convert``: one
  tensor at a time, memory-mapped partitions);
* DeepSpeed's: ``deepspeed.checkpoint.ds_to_universal`` as its command line
  runs it (default workers: 4 extract, 2 merge processes).

Wall time and peak memory (the largest total PSS of the process and its
children, sampled every 50 ms; PSS counts a page shared by forked workers
once) are printed side by side with the ratios, and the outputs are checked
to hold the same tensors. Needs the ``deepspeed`` extra.

    python -m ucp.tools.bench.convert_deepspeed_bench --workdir /tmp/dsbench          # ~1.2 GiB
    python -m ucp.tools.bench.convert_deepspeed_bench --workdir /tmp/dsbench --json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace

import psutil

__all__ = ["Measurement", "measure", "run_deepspeed_bench", "main"]


@dataclass(frozen=True)
class Measurement:
    """One command: wall seconds and peak memory (bytes, PSS of its process tree)."""

    name: str
    seconds: float
    peak_bytes: int


def _tree_pss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            info = p.memory_full_info()
            total += getattr(info, "pss", info.rss)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def measure(name: str, argv: list[str], *, env: dict | None = None) -> Measurement:
    """Run ``argv``; its wall time and the peak PSS of its process tree. Raises if it fails."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ps = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        try:
            peak = max(peak, _tree_pss(ps))
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    seconds = time.perf_counter() - started
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed (exit {proc.returncode}):\n{err[-3000:]}")
    return Measurement(name, seconds, peak)


def _folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def _ours_argv(src: str, dst: str) -> list[str]:
    try:
        import ucp.tools.convert_cli  # noqa: F401  (the `ucp convert` command)
    except ImportError:  # before the conversion command exists: the same reader -> writer stream
        code = ("import sys; from ucp.formats import detect_format, get_format\n"
                "r = detect_format(sys.argv[1]).open_reader(sys.argv[1]); s = r.state()\n"
                "w = get_format('deepspeed-universal').open_writer(sys.argv[2], state=s)\n"
                "for i in r.tensors(): w.add(i.name, i.read())\n"
                "w.set_state(s); w.close()")
        return [sys.executable, "-c", code, src, dst]
    return [sys.executable, "-m", "ucp.tools", "convert", src, dst, "--to", "deepspeed-universal"]


def _same_tensors(ours: str, theirs: str) -> int:
    """Every fp32/exp_avg/exp_avg_sq file of DeepSpeed's output equals ours; returns how many were compared."""
    import torch

    from ucp.formats.deepspeed.pt import load_pt

    count = 0
    for param in sorted(os.listdir(os.path.join(theirs, "zero"))):
        folder = os.path.join(theirs, "zero", param)
        if not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            a, b = load_pt(os.path.join(folder, name)), load_pt(os.path.join(ours, "zero", param, name))
            a, b = (x["param"] if isinstance(x, dict) else x for x in (a, b))
            if not (torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b):
                raise AssertionError(f"{param}/{name} differs between ds_to_universal and ours")
            count += 1
    return count


def run_deepspeed_bench(workdir: str, *, hidden: int = 2048, layers: int = 4, vocab: int = 4096,
                        keep: bool = False) -> dict:
    """Generate the checkpoint (reused if present), convert it both ways, compare; returns the table's data."""
    from ucp.tools.fixtures.gen_deepspeed import CASES, generate

    case = replace(CASES["zero2-dp3"], name="bench-zero2-dp2", dp=2, hidden=hidden, layers=layers, vocab=vocab,
                   steps=1, optimizer="torch", frozen=False)
    root = os.path.join(workdir, case.name)
    step_dir = os.path.join(root, f"global_step{case.steps}")
    if not os.path.isdir(step_dir):
        generate(case, workdir, universal=False)
    size = _folder_bytes(step_dir)
    theirs = os.path.join(workdir, "theirs", "global_step1_universal")
    ours = os.path.join(workdir, "ours", "global_step1_universal")
    for out in (theirs, ours):
        shutil.rmtree(os.path.dirname(out), ignore_errors=True)
        os.makedirs(os.path.dirname(out))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *filter(None, [os.environ.get("PYTHONPATH")])])}
    ds = measure("ds_to_universal", [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
                                     "--input_folder", step_dir, "--output_folder", theirs], env=env)
    us = measure("ucp convert", _ours_argv(step_dir, ours), env=env)
    compared = _same_tensors(ours, theirs)
    if not keep:
        for out in (theirs, ours):
            shutil.rmtree(os.path.dirname(out), ignore_errors=True)
    return {"checkpoint_bytes": size, "case": asdict(case), "files_compared": compared,
            "ours": asdict(us), "deepspeed": asdict(ds),
            "speedup": ds.seconds / us.seconds, "memory_ratio": us.peak_bytes / ds.peak_bytes}


def _table(result: dict) -> str:
    gib = 1 << 30
    ours, ds = result["ours"], result["deepspeed"]
    lines = [f"ZeRO-2 checkpoint, dp=2, {result['checkpoint_bytes'] / gib:.2f} GiB "
             f"({result['files_compared']} tensor files compared: equal)",
             "| tool | seconds | peak memory (PSS) |", "| --- | --- | --- |",
             f"| ucp convert --to deepspeed-universal | {ours['seconds']:.1f} | {ours['peak_bytes'] / gib:.2f} GiB |",
             f"| deepspeed ds_to_universal | {ds['seconds']:.1f} | {ds['peak_bytes'] / gib:.2f} GiB |",
             f"| ratio (ours / DeepSpeed) | {1 / result['speedup']:.2f} ({result['speedup']:.1f}x faster) "
             f"| {result['memory_ratio']:.2f} |"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, help="where the checkpoint and both outputs go")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--keep", action="store_true", help="keep both universal outputs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        result = run_deepspeed_bench(args.workdir, hidden=args.hidden, layers=args.layers, vocab=args.vocab,
                                     keep=args.keep)
    except ImportError as err:
        print(f"needs the deepspeed extra (pip install -e '.[deepspeed]'): {err}", file=sys.stderr)
        return 2
    except AssertionError as err:
        print(f"check failed: {err}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=1) if args.json else _table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
