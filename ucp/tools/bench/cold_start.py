"""A fresh process's first ucp save and load against warm ones in the same process.

Recovery runs in new processes: whatever the first save or load pays once (imports,
thread pools, first-touch page faults of the library's own buffers) lands there.
``python -m ucp.tools.bench.cold_start SIZE_GIB DIR`` builds the state *before* importing
ucp, then times: the first save, the first load (page cache dropped), and the third
save and load (warm); prints JSON. :func:`measure_cold_start` runs it in fresh
interpreters, after compiling ucp's bytecode (as an installation has it).

Example::

    for (first_save, first_load), (warm_save, warm_load) in measure_cold_start(size_gib=0.1, directory=Path("/tmp")):
        print(first_save / warm_save)
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _one(state: dict, template: dict, path: Path) -> tuple[float, float]:
    import ucp

    from ucp.tools.bench.state_recipe import drop_from_page_cache

    start = time.perf_counter()
    ucp.save(state, path)
    saved = time.perf_counter() - start
    drop_from_page_cache(path)
    start = time.perf_counter()
    ucp.load(path, into=template)
    loaded = time.perf_counter() - start
    shutil.rmtree(path)
    return saved, loaded


def main(argv: list[str]) -> int:
    import torch

    from ucp.tools.bench.state_recipe import StateRecipe, build_state

    size_gib, directory = float(argv[0]), Path(argv[1])
    state = build_state(StateRecipe(size_gib=size_gib, kind=argv[2] if len(argv) > 2 else "matrices"))
    template = {k: torch.empty_like(v) for k, v in state.items()}
    for t in template.values():  # the caller's memory exists already, as in training
        t.zero_()
    work = Path(tempfile.mkdtemp(prefix="ucp-cold-", dir=directory))
    try:
        first = _one(state, template, work / "first")  # ucp itself is imported in here
        _one(state, template, work / "second")
        warm = _one(state, template, work / "third")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"first": first, "warm": warm}))
    return 0


def measure_cold_start(
    *, size_gib: float, directory: Path, runs: int = 3, kind: str = "matrices"
) -> list[tuple[tuple, tuple]]:
    """``runs`` fresh interpreters: ``[((first save s, first load s), (warm save s, warm load s)), ...]``.

    ucp's bytecode is compiled first (:func:`compile_bytecode`), as installing a package does.
    """
    repo_root = Path(__file__).resolve().parents[3]
    compile_bytecode()
    out = []
    for _ in range(runs):
        done = subprocess.run([sys.executable, "-m", "ucp.tools.bench.cold_start", str(size_gib), str(directory), kind],
                              cwd=repo_root, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"cold-start probe failed:\n{done.stderr[-2000:]}")
        found = json.loads(done.stdout.strip().splitlines()[-1])
        out.append((tuple(found["first"]), tuple(found["warm"])))
    return out


def compile_bytecode() -> bool:
    """Compile ucp's modules to bytecode where it is missing; whether every module has it now.

    ``pip install`` does this, so an installed ucp never compiles its source in a fresh
    process. A source checkout run with ``PYTHONDONTWRITEBYTECODE=1`` would: ~0.2 s of the
    first save that an installation never pays (measured: 44 modules, 0.19 s).
    """
    import compileall

    import ucp

    package = Path(ucp.__file__).resolve().parent
    try:
        return bool(compileall.compile_dir(str(package), quiet=2, workers=1))
    except OSError:  # a read-only installation: its bytecode was compiled when it was installed
        return False


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
