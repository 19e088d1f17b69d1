"""A process that saves and loads on local disk imports neither fsspec nor tensorstore (nor ml_dtypes).

They cost ~0.5 s to import; a fresh process (every process after a failure) would pay that on its
first save or load.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

PROBE = r"""
import json, sys, torch, ucp
path = sys.argv[1]
state = {"w": torch.randn(600, 700), "b": torch.ones(5, dtype=torch.bfloat16), "step": 3}
ucp.save(state, path)
loaded = ucp.load(path)
assert torch.equal(loaded["w"], state["w"]) and torch.equal(loaded["b"], state["b"]) and loaded["step"] == 3
assert ucp.verify(path).ok
print(json.dumps(sorted(m for m in ("fsspec", "tensorstore", "ml_dtypes", "zarr") if m in sys.modules)))
"""


def test_a_local_save_and_load_import_neither_fsspec_nor_tensorstore(tmp_path):
    out = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "c")], cwd=REPO, capture_output=True,
                         text=True, timeout=300, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
