"""Conversion benchmark: ``ucp convert`` against each framework's own tools, same data, one run, side by side.

::

    python -m ucp.tools.bench.convert_bench --size-gib 1.0 --dir /tmp/cbench
    python -m ucp.tools.bench.convert_bench --case dcp-to-safetensors --json

Each *case* makes one source checkpoint, then runs ours and the peer on it,
each in a fresh interpreter (the source dropped from the page cache before
each), and reports wall time (the whole process: what a user waits for), peak
RSS of that process (``ru_maxrss`` from ``wait4``: interpreter and libraries
included, as a user sees it), and the ratios peer/ours for time and ours/peer
for memory, against the targets (>= 3x faster, <= 0.5x peak RSS). The two
outputs are compared with ``ucp diff`` (bitwise), so both did the same work.

Cases live in :data:`CASES`, one :class:`Case` each; another format's rows
(DeepSpeed ZeRO-2 -> ``deepspeed-universal`` against ``ds_to_universal``) are one
more entry there, with its own ``make``/``ours``/``peer`` functions.

``dcp-to-safetensors``: an LLM-shaped bfloat16 model (hidden 2048, Llama-style
layers, untied embedding and head) sharded by DTensor ``Shard(0)`` over
``--world`` gloo processes and saved with ``dcp.save`` - the DCP an FSDP2 job
writes. Ours: ``ucp convert SRC DST --to safetensors``. Peer: what the PyTorch
docs offer, ``dcp_to_torch_save`` then ``torch.load(mmap=True)`` and
``safetensors.torch.save_file`` of the flattened state.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ucp.integrations.launch import free_port

REPO = Path(__file__).resolve().parents[3]
HIDDEN, FFN, VOCAB = 2048, 5632, 32000
TARGET_SPEEDUP, TARGET_RSS = 3.0, 0.5


@dataclass(frozen=True)
class Case:
    """One comparison: how to make its source, and the two command lines (ours, the peer) to time.

    Each command prints JSON with ``seconds``, the time of the work itself (after the interpreter and
    torch are loaded), on its last line of output.
    """

    name: str
    description: str
    make: Callable[[Path, float, int], Path]  # (work dir, size GiB, world) -> source path
    ours: Callable[[Path, Path], list[str]]  # (source, destination) -> argv
    peer: Callable[[Path, Path], list[str]]
    output: str = "out.safetensors"  # the name of each tool's output in the work directory


# ----------------------------------------------------------------------------- dcp -> safetensors
def _shapes(size_gib: float) -> dict[str, tuple[int, ...]]:
    """LLM-shaped tensors of about ``size_gib`` GiB of bfloat16 (a small model below 0.5 GiB, for smoke runs)."""
    hidden, ffn, vocab = (HIDDEN, FFN, VOCAB) if size_gib >= 0.5 else (256, 704, 1000)
    per_layer = 4 * hidden * hidden + 3 * hidden * ffn + 2 * hidden
    fixed = 2 * vocab * hidden + hidden
    layers = max(1, round((size_gib * 2**30 / 2 - fixed) / per_layer))
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            shapes[f"{p}self_attn.{name}.weight"] = (hidden, hidden)
        shapes[f"{p}mlp.gate_proj.weight"] = (ffn, hidden)
        shapes[f"{p}mlp.up_proj.weight"] = (ffn, hidden)
        shapes[f"{p}mlp.down_proj.weight"] = (hidden, ffn)
        shapes[f"{p}input_layernorm.weight"] = (hidden,)
        shapes[f"{p}post_attention_layernorm.weight"] = (hidden,)
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def _dcp_rank(rank: int, world: int, port: int, out: str, size_gib: float) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        gen = torch.Generator().manual_seed(rank)
        state = {}
        for name, shape in _shapes(size_gib).items():
            rows = -(-shape[0] // world)  # FSDP2's torch.chunk split: the last ranks may hold fewer rows
            local_rows = max(0, min(shape[0], (rank + 1) * rows) - rank * rows)
            local = torch.randn((local_rows,) + shape[1:], generator=gen).to(torch.bfloat16)
            state[name] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=torch.Size(shape),
                                             stride=torch.empty(shape, device="meta").stride())
        dcp.save({"model": state}, checkpoint_id=out)
    finally:
        dist.destroy_process_group()


def _make_dcp(work: Path, size_gib: float, world: int) -> Path:

    import torch.multiprocessing as mp

    out = work / "source-dcp"
    port = free_port()
    mp.spawn(_dcp_rank, args=(world, port, str(out), size_gib), nprocs=world, join=True)
    return out


def _peer_dcp_to_safetensors(src: str, dst: str) -> None:
    """The peer pipeline: DCP -> one torch.save file -> safetensors (the PyTorch-documented route)."""
    import torch
    from safetensors.torch import save_file

    started = time.perf_counter()  # like ucp convert's own clock: after torch, before DCP is imported
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    middle = dst + ".pt"
    dcp_to_torch_save(src, middle)
    state = torch.load(middle, mmap=True, weights_only=True)
    flat: dict = {}

    def walk(node, prefix):
        for key, value in node.items():
            name = f"{prefix}{key}"
            if isinstance(value, dict):
                walk(value, name + ".")
            else:
                flat[name] = value

    walk(state["model"], "")
    save_file(flat, dst)
    os.remove(middle)
    print(json.dumps({"seconds": time.perf_counter() - started}))


def _python(*args: str) -> list[str]:
    return [sys.executable, *args]


CASES: dict[str, Case] = {
    "dcp-to-safetensors": Case(
        name="dcp-to-safetensors",
        description="DCP (DTensor Shard(0) over --world gloo ranks) -> one safetensors file",
        make=_make_dcp,
        ours=lambda src, dst: _python("-m", "ucp.tools", "convert", str(src), str(dst), "--to", "safetensors", "--json"),
        peer=lambda src, dst: _python("-m", "ucp.tools.bench.convert_bench", "--peer-step", "dcp-to-safetensors",
                                      str(src), str(dst)),
    ),
    # convert-ds: the DeepSpeed rows go here (a Case making a ZeRO-2 folder; ours: `ucp convert --to
    # deepspeed-universal`; peer: DeepSpeed's ds_to_universal).
}
PEER_STEPS: dict[str, Callable[[str, str], None]] = {"dcp-to-safetensors": _peer_dcp_to_safetensors}


# ----------------------------------------------------------------------------- measuring
@dataclass(frozen=True)
class Run:
    tool: str
    seconds: float  # wall time of the whole process
    work_seconds: float  # what the process reports for the work itself
    peak_rss: int
    returncode: int
    stderr: str


def _drop_cache(path: Path) -> None:
    from ucp.tools.bench.state_recipe import drop_from_page_cache

    drop_from_page_cache(path)


def _measure(tool: str, argv: list[str], source: Path) -> Run:
    """Run ``argv`` in a fresh interpreter; its wall time, reported work time and peak RSS (from ``wait4``)."""
    import tempfile

    _drop_cache(source)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        child = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        lines = out.read().decode(errors="replace").strip().splitlines()
        stderr = err.read().decode(errors="replace")[-2000:]
    work = float("nan")
    if child.returncode == 0 and lines:
        text = "\n".join(lines)
        work = json.loads(text[text.rindex("\n{") + 1:] if "\n{" in text else text)["seconds"]
    return Run(tool, seconds, work, usage.ru_maxrss * 1024, child.returncode, stderr)


def run_case(case: Case, *, work: Path, size_gib: float, world: int) -> dict:
    """Make the source, run ours and the peer once each, compare their outputs; a JSON-able report."""
    import ucp

    source = case.make(work, size_gib, world)
    size = sum(p.stat().st_size for p in source.rglob("*") if p.is_file()) if source.is_dir() else source.stat().st_size
    ours_out, peer_out = work / f"ours-{case.output}", work / f"peer-{case.output}"
    ours = _measure("ucp convert", case.ours(source, ours_out), source)
    peer = _measure("peer", case.peer(source, peer_out), source)
    for run in (ours, peer):
        if run.returncode != 0:
            raise RuntimeError(f"{case.name}: {run.tool} failed ({run.returncode}):\n{run.stderr}")
    equal = ucp.diff(ours_out, peer_out, compare_state=False).equal
    return {
        "case": case.name, "description": case.description, "source_bytes": size, "world": world,
        "ours": {"seconds": ours.seconds, "work_seconds": ours.work_seconds, "peak_rss": ours.peak_rss},
        "peer": {"seconds": peer.seconds, "work_seconds": peer.work_seconds, "peak_rss": peer.peak_rss},
        "speedup": peer.seconds / ours.seconds, "work_speedup": peer.work_seconds / ours.work_seconds,
        "rss_ratio": ours.peak_rss / peer.peak_rss,
        "outputs_equal": equal,
    }


def _print(reports: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="ucp convert vs the frameworks' tools (one run each, fresh process, cold page cache)")
    for column in ("case", "source", "tool", "wall s", "work s", "peak RSS MiB"):
        table.add_column(column, justify="left" if column in ("case", "tool") else "right")
    ratios = Table(title="ratios (peer / ours for time, ours / peer for memory)")
    for column in ("case", "speedup (wall)", "speedup (work)", "peak RSS ratio", f"targets >= {TARGET_SPEEDUP:g}x, "
                   f"<= {TARGET_RSS:g}x", "same output"):
        ratios.add_column(column, justify="left" if column == "case" else "right")
    for r in reports:
        for tool, key in (("ucp convert", "ours"), ("peer", "peer")):
            run = r[key]
            table.add_row(r["case"], f"{r['source_bytes'] / 2**30:.2f} GiB", tool, f"{run['seconds']:.1f}",
                          f"{run['work_seconds']:.1f}", f"{run['peak_rss'] / 2**20:.0f}")
        speed = "met" if r["speedup"] >= TARGET_SPEEDUP else "not met"
        memory = "met" if r["rss_ratio"] <= TARGET_RSS else "not met"
        ratios.add_row(r["case"], f"{r['speedup']:.2f}x", f"{r['work_speedup']:.2f}x", f"{r['rss_ratio']:.2f}x",
                       f"time {speed}, memory {memory}", "yes" if r["outputs_equal"] else "NO")
    console = Console(width=120)
    console.print(table)
    console.print(ratios)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ucp.tools.bench.convert_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gib", type=float, default=1.0, help="source size in GiB (default 1.0)")
    parser.add_argument("--dir", default=None, help="work directory (default: a new one under the temp dir)")
    parser.add_argument("--world", type=int, default=2, help="ranks that write the source (default 2)")
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="cases to run (default: all)")
    parser.add_argument("--json", action="store_true", help="print the reports as JSON")
    parser.add_argument("--peer-step", nargs=3, metavar=("CASE", "SRC", "DST"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.peer_step:
        name, src, dst = args.peer_step
        PEER_STEPS[name](src, dst)
        return 0
    if not args.size_gib > 0 or args.world < 1:
        parser.error("--size-gib must be > 0 and --world >= 1")
    import tempfile

    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="ucp-convert-bench-"))
    reports = []
    for name in args.case or sorted(CASES):
        work = base / name
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        try:
            reports.append(run_case(CASES[name], work=work, size_gib=args.size_gib, world=args.world))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(reports, indent=1))
    else:
        _print(reports)
    return 0


if __name__ == "__main__":
    sys.exit(main())
