"""Shared by the DeepSpeed format tests: the fixture folders, DeepSpeed's universal output, deep comparison."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ucp.formats import detect_format, get_format
from ucp.formats.base import TrainingState
from ucp.formats.deepspeed.plain import foreign_of
from ucp.formats.deepspeed.pt import load_pt
from ucp.unpickle import InertObject

REPO = Path(__file__).resolve().parents[3]
OURS = REPO / "tests" / "fixtures" / "deepspeed"
SHARED = REPO / ".." / "shared" / "fixtures" / "deepspeed"
OUR_CASES = ["zero1-dp2", "zero2-dp3", "zero3-dp4", "zero2-bf16-dp2", "zero3-bf16-dp2", "zero1-fp16-dp2",
             "pipe-pp2-dp2"]
SHARED_CASES = ["zero1-dp2", "zero2-dp2", "zero3-dp2"]
ALL = [OURS / c for c in OUR_CASES] + [SHARED / c for c in SHARED_CASES]
IDS = [f"ours-{c}" for c in OUR_CASES] + [f"shared-{c}" for c in SHARED_CASES]


def universal_dir(root: Path) -> Path:
    """DeepSpeed's own ds_to_universal output beside a fixture."""
    return root / (root / "latest_universal").read_text().strip()


def universal_tensor(root: Path, param: str, key: str):
    obj = load_pt(universal_dir(root) / "zero" / param / f"{key}.pt")
    return obj["param"] if isinstance(obj, dict) else obj


def convert(src: Path, dst: Path, *, style: str = "auto") -> None:
    """Reader of ``src``'s format -> deepspeed-universal writer, the state through JSON (as a converter stores it)."""
    with detect_format(src).open_reader(src) as reader:
        state = TrainingState.from_dict(json.loads(json.dumps(reader.state().to_dict())))
        writer = get_format("deepspeed-universal").open_writer(dst, style=style)
        for info in reader.tensors():
            writer.add(info.name, info.read())
        writer.set_state(state)
        writer.close()


def files_under(root: Path) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def same_structure(a, b, where: str = "") -> None:
    """Same keys (in order), types and values; tensors bitwise (dtype, shape, bytes); stand-ins by what they hold."""
    assert type(a) is type(b) or (isinstance(a, InertObject) and isinstance(b, InertObject)), (where, type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), (where, list(a), list(b))
        for k in a:
            same_structure(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same_structure(x, y, f"{where}/{i}")
    elif isinstance(a, InertObject):
        fa, fb = foreign_of(a), foreign_of(b)
        assert (fa.origin, fa.new, fa.args, fa.state) == (fb.origin, fb.new, fb.args, fb.state), where
    else:
        assert a == b, (where, a, b)
