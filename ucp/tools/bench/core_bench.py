"""The checkpoint benchmark: ucp against DCP, safetensors, torch.save, a raw write and a memory copy.

One state (a few large matrices and hundreds of small vectors, float32 and
bfloat16) is saved and loaded by every method in the same run, on each target
directory, repeated and interleaved, and the order of the methods rotates from
one repeat to the next, so that drift in the machine and the cost of going
first hit every method alike. Tables report the median of the repeats with
their min-max range. Saves end with fsync (every method). Before each load the
written files are dropped from the page cache: ``posix_fadvise(DONTNEED)`` on
every file (after an ``fdatasync``), and with ``drop_caches=True`` also
``echo 1 > /proc/sys/vm/drop_caches`` where this process may write it (root);
which one ran is said in the notes. On tmpfs (/dev/shm) the memory *is* the storage: there the
peer is a ``copy_`` of the state into existing host memory. DCP runs with
``thread_count`` equal to the cores. A fresh process's first save and load are
measured against warm ones in the same process (:mod:`ucp.tools.bench.cold_start`).

Example::

    report = run_benchmark(size_gib=0.05, dirs=[Path("/tmp/b")], repeats=1)
    print(report.ratio("save", "ucp", ("dcp",), "/tmp/b"))
"""

from __future__ import annotations

import gc
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ucp.tools.bench.state_recipe import StateRecipe, build_state, drop_from_page_cache, state_nbytes

__all__ = [
    "StateRecipe",
    "build_state",
    "state_nbytes",
    "Timing",
    "BenchReport",
    "TARGETS",
    "run_benchmark",
    "METHODS",
]


def on_tmpfs(path: Path) -> bool:
    """Whether ``path`` lives on a memory file system (tmpfs, ramfs): there a memory copy is the floor."""
    best, kind = "", ""
    try:
        with open("/proc/mounts") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) > 2 and str(path.resolve()).startswith(fields[1]) and len(fields[1]) > len(best):
                    best, kind = fields[1], fields[2]
    except OSError:
        return False
    return kind in ("tmpfs", "ramfs")


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


# --------------------------------------------------------------------------- methods
@dataclass(frozen=True)
class Method:
    """One way to save and load the state. ``load`` fills ``template`` (or returns new tensors)."""

    name: str
    save: Callable[[dict[str, torch.Tensor], Path], None]
    load: Callable[[Path, dict[str, torch.Tensor]], object]


def _raw_save(state: dict[str, torch.Tensor], path: Path) -> None:
    # The floor: the same bytes, one file, no metadata, no checksums.
    with open(path, "wb") as f:
        for tensor in state.values():
            t = tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor
            t.numpy().tofile(f)
        f.flush()
        os.fsync(f.fileno())


def _raw_load(path: Path, template: dict[str, torch.Tensor]) -> None:
    with open(path, "rb") as f:
        for tensor in template.values():
            raw = tensor.view(torch.uint8) if tensor.dim() else tensor.reshape(1).view(torch.uint8)
            f.readinto(memoryview(raw.numpy()).cast("B"))


def _torch_save(state: dict[str, torch.Tensor], path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def _torch_load(path: Path, template: dict[str, torch.Tensor]) -> object:
    return torch.load(path, map_location="cpu", weights_only=True)


def _safetensors_save(state: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    save_file(state, str(path))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _safetensors_load(path: Path, template: dict[str, torch.Tensor]) -> object:
    from safetensors.torch import load_file

    return load_file(str(path))


def _dcp_save(state: dict[str, torch.Tensor], path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    # Tuned: one writer thread per core (the default is 1); sync_files=True (fsync), no group.
    writer = dcp.FileSystemWriter(str(path), thread_count=os.cpu_count() or 1)
    dcp.save(state, storage_writer=writer, no_dist=True)


def _dcp_load(path: Path, template: dict[str, torch.Tensor]) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.load(template, storage_reader=dcp.FileSystemReader(str(path)), no_dist=True)


def _ucp_save(checksums: bool, **options: object) -> Callable[[dict[str, torch.Tensor], Path], None]:
    def save(state: dict[str, torch.Tensor], path: Path) -> None:
        import ucp
        from ucp.stores import StoreOptions

        ucp.save(state, path, checksums=checksums, store_options=StoreOptions(**options) if options else None)

    return save


def _ucp_load(path: Path, template: dict[str, torch.Tensor]) -> object:
    import ucp

    return ucp.load(path, into=template)


METHODS: dict[str, Method] = {
    "raw": Method("raw", _raw_save, _raw_load),
    "torch.save": Method("torch.save", _torch_save, _torch_load),
    "safetensors": Method("safetensors", _safetensors_save, _safetensors_load),
    "dcp": Method("dcp", _dcp_save, _dcp_load),
    "ucp": Method("ucp", _ucp_save(True), _ucp_load),
    "ucp-nocrc": Method("ucp-nocrc", _ucp_save(False), _ucp_load),
    # ucp with its packs written through the page cache (unbuffered_packs=False): what O_DIRECT saves.
    "ucp-buffered": Method("ucp-buffered", _ucp_save(True, unbuffered_packs=False), _ucp_load),
}


# --------------------------------------------------------------------------- results
@dataclass(frozen=True)
class Timing:
    """One repeat of one method; ``*_cpu_s``: CPU seconds of this process (all threads, user + system),
    which a loaded host inflates far less than wall time."""

    method: str
    directory: str
    save_s: float
    load_s: float | None
    save_cpu_s: float | None = None
    load_cpu_s: float | None = None


@dataclass(frozen=True)
class Target:
    """A goal: ``metric`` of ``ours`` over the best (lowest) of ``peers`` must be at most ``limit``.

    ``where``: "disk", "memory" (tmpfs) or "any" - the directories it applies to.
    """

    label: str
    metric: str
    ours: str
    peers: tuple[str, ...]
    limit: float
    where: str = "any"


SAVE_PEERS = ("dcp", "safetensors", "torch.save")
TARGETS = (
    Target("save vs best of DCP/safetensors/torch.save", "save", "ucp", SAVE_PEERS, 0.8, "disk"),
    Target("cold load vs DCP", "load", "ucp", ("dcp",), 0.8, "disk"),
    Target("save vs copy_ into host memory", "save", "ucp", ("memcpy",), 2.0, "memory"),
    Target("load vs copy_ into host memory", "load", "ucp", ("memcpy",), 2.0, "memory"),
    Target("save vs DCP", "save", "ucp", ("dcp",), float("inf")),
    Target("save vs safetensors", "save", "ucp", ("safetensors",), float("inf")),
    Target("save vs torch.save", "save", "ucp", ("torch.save",), float("inf")),
    Target("load vs DCP", "load", "ucp", ("dcp",), float("inf"), "memory"),
    Target("load vs safetensors", "load", "ucp", ("safetensors",), float("inf")),
    Target("load vs torch.load", "load", "ucp", ("torch.save",), float("inf")),
    Target("save vs raw write", "save", "ucp", ("raw",), float("inf")),
    Target("first save in a fresh process / warm", "save", "ucp-first", ("ucp-warm",), 1.3),
    Target("first load in a fresh process / warm", "load", "ucp-first", ("ucp-warm",), 1.3),
    Target("checksum cost (save)", "save", "ucp", ("ucp-nocrc",), 1.10),
    Target("async blocking / sync save", "save", "ucp-async-blocking", ("ucp",), 0.15),
    Target("async blocking / memcpy of the state", "save", "ucp-async-blocking", ("memcpy",), float("inf")),
)


@dataclass
class BenchReport:
    """Everything measured in one run; ``ratio`` compares two methods on one directory."""

    state_bytes: int
    tensors: int
    repeats: int
    statistic: str = "median"  # what tables and ratios use: "median" of the repeats, or "min" (best)
    timings: list[Timing] = field(default_factory=list)
    extra_rss_fraction: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    memory_dirs: list[str] = field(default_factory=list)  # the directories on tmpfs

    def values(self, metric: str, method: str, directory: str) -> list[float]:
        return [getattr(t, f"{metric}_s") for t in self.timings
                if t.method == method and t.directory == directory and getattr(t, f"{metric}_s") is not None]

    def value(self, metric: str, method: str, directory: str, statistic: str | None = None) -> float | None:
        """``statistic`` (default: the report's: "median", "min" or "max") of one method's repeats."""
        values = self.values(metric, method, directory)
        if not values:
            return None
        how = statistic or self.statistic
        return min(values) if how == "min" else max(values) if how == "max" else statistics.median(values)

    def ratio(self, metric: str, ours: str, peers: str | Sequence[str], directory: str) -> float | None:
        """``ours`` over the best of ``peers`` (those measured) on ``directory``."""
        a = self.value(metric, ours, directory)
        found = [v for v in (self.value(metric, p, directory) for p in ((peers,) if isinstance(peers, str) else peers))
                 if v]
        return None if a is None or not found else a / min(found)

    def applies(self, target: "Target", directory: str) -> bool:
        kind = "memory" if directory in self.memory_dirs else "disk"
        return target.where in ("any", kind)

    def directories(self) -> list[str]:
        return list(dict.fromkeys(t.directory for t in self.timings))

    def methods(self) -> list[str]:
        return list(dict.fromkeys(t.method for t in self.timings))

    def to_dict(self) -> dict:
        out = asdict(self)
        for statistic in ("min", "median", "max"):
            out[statistic] = {
                d: {
                    m: {"save_s": self.value("save", m, d, statistic), "load_s": self.value("load", m, d, statistic)}
                    for m in self.methods()
                }
                for d in self.directories()
            }
        out["cpu_median"] = {
            d: {
                m: {"save_cpu_s": self.value("save_cpu", m, d, "median"), "load_cpu_s": self.value("load_cpu", m, d, "median")}
                for m in self.methods()
            }
            for d in self.directories()
        }
        out["ratios"] = {
            d: {
                t.label: {
                    "ratio": self.ratio(t.metric, t.ours, t.peers, d),
                    "target": None if math.isinf(t.limit) else t.limit,
                }
                for t in TARGETS if self.applies(t, d)
            }
            for d in self.directories()
        }
        return out


# --------------------------------------------------------------------------- running
def _time(fn: Callable[..., object], *args: object) -> tuple[float, object]:
    wall, _, out = _timed(fn, *args)
    return wall, out


def _timed(fn: Callable[..., object], *args: object) -> tuple[float, float, object]:
    """(wall seconds, CPU seconds of the whole process, result)."""
    gc.collect()
    cpu = time.process_time()
    start = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - start, time.process_time() - cpu, out


def _torch_copy(state: dict[str, torch.Tensor], template: dict[str, torch.Tensor]) -> None:
    for key, tensor in state.items():
        template[key].copy_(tensor)


def _numpy_copy(state: dict[str, torch.Tensor], template: dict[str, torch.Tensor]) -> None:
    # torch's copy_ runs on its intra-op thread pool, which stalls when other processes keep
    # the cores busy; numpy copies on one thread. The memcpy floor is the faster of the two.
    import numpy as np

    for key, tensor in state.items():
        dst, src = template[key], tensor
        if tensor.dtype == torch.bfloat16:
            dst, src = dst.view(torch.int16), src.view(torch.int16)
        np.copyto(dst.numpy(), src.numpy())


def _measure_async(state: dict[str, torch.Tensor], path: Path, saver) -> tuple[float, float]:
    """(seconds the caller blocked, seconds until the save was durable)."""
    gc.collect()
    start = time.perf_counter()
    handle = saver.save(state, path)
    blocked = time.perf_counter() - start
    handle.wait()
    return blocked, time.perf_counter() - start


def ucp_available() -> bool:
    try:
        import ucp
    except ImportError:
        return False
    return callable(getattr(ucp, "save", None)) and callable(getattr(ucp, "load", None))


def run_benchmark(
    *,
    size_gib: float = 1.0,
    dirs: Sequence[Path],
    repeats: int = 5,
    methods: Sequence[str] | None = None,
    measure_rss: bool = True,
    cold_start: bool = True,
    drop_caches: bool = False,
    statistic: str = "median",
    progress: Callable[[str], None] | None = None,
    kind: str = "matrices",
    async_save: bool = True,
) -> BenchReport:
    """Run every method on every directory ``repeats`` times, interleaved and rotated; see the module docstring.

    ``kind`` picks the state (:class:`StateRecipe`: "matrices", or "adam" for a mixed-precision training state).
    """
    recipe = StateRecipe(size_gib=size_gib, kind=kind)
    state = build_state(recipe)
    template = {k: torch.empty_like(v) for k, v in state.items()}
    if statistic not in ("min", "median"):
        raise ValueError(f"statistic must be 'min' or 'median', got {statistic!r}")
    report = BenchReport(state_bytes=state_nbytes(state), tensors=len(state), repeats=repeats, statistic=statistic)
    have_ucp = ucp_available()
    names = list(methods or METHODS)
    if not have_ucp:
        names = [n for n in names if not n.startswith("ucp")]
        report.notes.append("ucp.save/ucp.load not importable: ucp rows skipped")
    saver = None
    if have_ucp and "ucp" in names and async_save:
        from ucp.async_saver import AsyncSaver

        saver = AsyncSaver()
    say = progress or (lambda _msg: None)
    dropped = set()
    for directory in dirs:
        directory.mkdir(parents=True, exist_ok=True)
        if on_tmpfs(directory):
            report.memory_dirs.append(str(directory))
        work = Path(tempfile.mkdtemp(prefix="ucp-bench-", dir=directory))
        try:
            for rep in range(repeats):
                # Rotated: each method goes first (right after the previous repeat's cleanup) in turn.
                order = names[rep % len(names):] + names[: rep % len(names)]
                for name in order:
                    method = METHODS[name]
                    target = work / f"{name}-{rep}"
                    say(f"{directory} · {name} · save {rep + 1}/{repeats}")
                    save_s, save_cpu, _ = _timed(method.save, state, target)
                    dropped.add(drop_from_page_cache(target, everything=drop_caches))
                    say(f"{directory} · {name} · load {rep + 1}/{repeats}")
                    load_s, load_cpu, loaded = _timed(method.load, target, template)
                    del loaded
                    report.timings.append(Timing(name, str(directory), save_s, load_s, save_cpu, load_cpu))
                    _remove(target)
                # The floor of any snapshot: copying the state into memory that already exists.
                copies = (_timed(_torch_copy, state, template), _timed(_numpy_copy, state, template))
                copy_s, copy_cpu, _ = min(copies, key=lambda found: found[0])
                report.timings.append(Timing("memcpy", str(directory), copy_s, copy_s, copy_cpu, copy_cpu))
                if saver is not None:
                    target = work / f"ucp-async-{rep}"
                    say(f"{directory} · ucp async · save {rep + 1}/{repeats}")
                    blocked, total = _measure_async(state, target, saver)
                    report.timings.append(Timing("ucp-async-blocking", str(directory), blocked, None))
                    report.timings.append(Timing("ucp-async-total", str(directory), total, None))
                    _remove(target)
            if cold_start and have_ucp and "ucp" in names:
                from ucp.tools.bench.cold_start import measure_cold_start

                say(f"{directory} · ucp first save/load in fresh processes")
                for first, warm in measure_cold_start(size_gib=size_gib, directory=work, runs=min(repeats, 3), kind=kind):
                    report.timings.append(Timing("ucp-first", str(directory), *first))
                    report.timings.append(Timing("ucp-warm", str(directory), *warm))
                note = "ucp-first/ucp-warm: ucp's bytecode compiled before the fresh processes, as an installation has it"
                if note not in report.notes:
                    report.notes.append(note)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    del state, template
    gc.collect()
    if measure_rss:
        rss_dir = Path(dirs[0])
        for name in [n for n in ("ucp", "dcp", "torch.save", "raw") if n in names]:
            say(f"peak RSS of a {name} save (fresh process)")
            report.extra_rss_fraction[name] = measure_extra_rss(name, size_gib=size_gib, directory=rss_dir)
    report.notes.append(
        "saves fsync every file; before each load the written files were dropped from the page cache by "
        + " / ".join(sorted(dropped)) + " (meaningless on tmpfs, where the memory is the storage); "
        "method order rotates every repeat; DCP runs with thread_count = cores"
    )
    return report


def measure_extra_rss(method: str, *, size_gib: float, directory: Path) -> float:
    """Extra peak RSS of one save, as a fraction of the state size, in a fresh interpreter."""
    repo_root = Path(__file__).resolve().parents[3]
    cmd = [sys.executable, "-m", "ucp.tools.bench.rss_probe", method, str(size_gib), str(directory)]
    out = subprocess.run(cmd, cwd=repo_root, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"rss probe for {method} failed:\n{out.stderr[-2000:]}")
    return float(json.loads(out.stdout.strip().splitlines()[-1])["extra_fraction"])
