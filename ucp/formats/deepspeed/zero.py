"""Reader for DeepSpeed ZeRO-1/2/3 checkpoints (``<dir>/latest`` + ``global_stepN/``), format ``deepspeed-zero``.

A ZeRO checkpoint is one model-states file (``mp_rank_00_model_states.pt``; one
per data-parallel rank under ZeRO-3) and one optimizer file per data-parallel
rank holding that rank's flat partition of every param group. The reader
presents it as logical tensors:

* every entry of the model's state dict (parameters, frozen parameters,
  persistent buffers, tied aliases) under its own name, in the model's dtype.
  Under ZeRO-3 the 16-bit weights are not in the files; DeepSpeed's own weights
  are its fp32 masters rounded to the model dtype, and that is what is read;
* ``<param>/fp32`` (the master weights) and ``<param>/exp_avg``,
  ``<param>/exp_avg_sq`` (any per-element state the optimizer keeps) of every
  trained parameter; ``<param>/step`` when the optimizer keeps its step as a
  tensor (``torch.optim.AdamW``).

Region reads touch only the data-parallel partitions that overlap; the
``.pt`` files are memory-mapped through the restricted unpickler (nothing in a
file runs, DeepSpeed is never imported). The non-tensor state: ``step`` (the
engine's ``global_steps``), the param groups with their hyper-parameters and
the names of their parameters, and in ``extra`` the tied parameters, buffers,
frozen parameters, and ``extra["deepspeed"]``: everything DeepSpeed's files
hold besides tensors, exactly (see :mod:`ucp.formats.deepspeed.plain`), which
the ``deepspeed-universal`` writer uses to write what DeepSpeed's own
``ds_to_universal`` writes.

>>> # with get_format("deepspeed-zero").open_reader("ckpt/") as reader:
>>> #     fp32 = {t.name: t.read() for t in reader.tensors() if t.name.endswith("/fp32")}
"""

from __future__ import annotations

import math
import os
from functools import partial
import re
from typing import Any, Callable, Iterator

import torch

from ucp.errors import FormatError
from ucp.formats.base import Format, TensorInfo, TrainingState, register_format
from ucp.formats.deepspeed.flat import read_dense, read_region
from ucp.formats.deepspeed.optim import FP32, ZeroOptimizerFiles
from ucp.formats.deepspeed.plain import to_plain
from ucp.formats.deepspeed.pt import load_pt_mapped
from ucp.formats.tensor_geometry import tag_folder
from ucp.geometry import FlatRange, Region

__all__ = [
    "DeepSpeedZeroReader",
    "resolve_step_dir",
    "checkpoint_files",
    "plain_state",
    "json_value",
    "zero3_frozen_reader",
]

OPTIM_RE = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
MODEL3_RE = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt$")
MODEL_RE = re.compile(r"^mp_rank_(\d+)_model_states\.pt$")
LAYER_RE = re.compile(r"^layer_(\d+)(?:-model_(\d+))?-model_states\.pt$")
EXPERT_RE = re.compile(r"^(?:layer_\d+_)?expert_\d+_mp_rank_\d+_model_states\.pt$")


def resolve_step_dir(path: str) -> str:
    """The folder holding the rank files: ``path`` itself, or ``path/<tag>`` with the tag its ``latest`` names."""
    latest = os.path.join(path, "latest")
    if os.path.isfile(latest) and not any(OPTIM_RE.match(n) or MODEL_RE.match(n) for n in os.listdir(path)):
        step_dir = tag_folder(path, "latest")
        if not os.path.isdir(step_dir):
            raise FormatError(f"{latest} names tag {os.path.basename(step_dir)!r} but {step_dir} is not a folder")
        return step_dir
    return path


def checkpoint_files(step_dir: str) -> dict[str, dict]:
    """The rank files of a DeepSpeed step folder by kind: optim[(dp, mp)], model[mp], model3[(dp, mp)], layer[(i, mp)]."""
    found: dict[str, dict] = {"optim": {}, "model": {}, "model3": {}, "layer": {}, "expert": {}}
    for name in sorted(os.listdir(step_dir)):
        full = os.path.join(step_dir, name)
        if m := OPTIM_RE.match(name):
            found["optim"][(int(m[1]), int(m[2]))] = full
        elif m := MODEL3_RE.match(name):
            found["model3"][(int(m[1]), int(m[2]))] = full
        elif m := MODEL_RE.match(name):
            found["model"][int(m[1])] = full
        elif m := LAYER_RE.match(name):
            found["layer"][(int(m[1]), int(m[2] or 0))] = full
        elif EXPERT_RE.match(name):
            found["expert"][name] = full
    return found


def json_value(value: Any) -> Any:
    """A hyper-parameter as plain JSON (tuples as lists, tensors as numbers); others dropped by the caller."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if isinstance(value, (tuple, list)):
        return [json_value(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: json_value(v) for k, v in value.items()}
    return repr(value)


def plain_state(obj: Any, tensor: Callable[[torch.Tensor, str], Any]) -> Any:
    """``to_plain`` whose tensors become ``{"@tensor": tensor(t, path)}``."""
    return to_plain(obj, tensor=tensor)


def _scalar_or_fail(where: str) -> Callable[[torch.Tensor, str], Any]:
    def ref(t: torch.Tensor, path: str) -> Any:
        if t.dim() == 0:
            return {"scalar": t.item(), "dtype": str(t.dtype).removeprefix("torch.")}
        raise FormatError(f"{where}: unexpected tensor at {path} in DeepSpeed's non-tensor state")

    return ref


def zero3_frozen_reader(
    name: str, states: dict[int, dict], files: dict[int, str]
) -> Callable[[Region | None], torch.Tensor]:
    """Reads frozen parameter ``name`` of a ZeRO-3 checkpoint from every rank's ``frozen_param_fragments``
    (``states``: data-parallel rank -> its model-states dict; ``files`` names them in errors)."""
    first = states[min(states)]
    shape = tuple(int(s) for s in first["frozen_param_shapes"][name])
    numel = math.prod(shape)
    per_rank = -(-numel // len(states))

    def fetch(rank: int, count: int) -> Callable[[], torch.Tensor]:
        def get() -> torch.Tensor:
            frag = (states[rank].get("frozen_param_fragments") or {}).get(name)
            if not isinstance(frag, torch.Tensor) or frag.numel() < count:
                raise FormatError(f"{files[rank]}: the frozen fragment of {name} is missing or short")
            return frag.reshape(-1)[:count]

        return get

    runs = [
        (FlatRange(r * per_rank, min((r + 1) * per_rank, numel)), fetch(r, min(per_rank, numel - r * per_rank)))
        for r in sorted(states)
        if r * per_rank < numel
    ]
    dtype = first["module"][name].dtype
    return lambda region: read_region(shape, dtype, runs, region)


class DeepSpeedZeroReader:
    """An opened DeepSpeed ZeRO checkpoint (see the module doc). Use as a context manager."""

    format = "deepspeed-zero"

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self.step_dir = resolve_step_dir(self.path)
        files = checkpoint_files(self.step_dir)
        if files["expert"]:
            raise FormatError(
                f"{self.step_dir}: mixture-of-experts files ({next(iter(files['expert']))}) are not "
                "supported; convert the folder with DeepSpeed's ds_to_universal first"
            )
        if not files["optim"]:
            raise FormatError(f"{self.step_dir} holds no *_optim_states.pt: not a DeepSpeed ZeRO checkpoint")
        self.files = files
        mp_ranks = sorted({mp for _, mp in files["optim"]})
        self._check_parallelism(mp_ranks)
        self.units: dict[int, ZeroOptimizerFiles] = {}
        self.model_states: dict[str, dict] = {}
        self._mapped: dict[str, bool] = {}
        for mp in mp_ranks:
            model_file = self._model_file(mp)
            states = self._load(model_file)
            if not isinstance(states, dict) or "param_shapes" not in states:
                raise FormatError(f"{model_file} has no param_shapes: not a DeepSpeed model-states file")
            self.model_states[model_file] = states
            optim = {dp: f for (dp, m), f in files["optim"].items() if m == mp}
            self.units[mp] = ZeroOptimizerFiles(optim, states["param_shapes"] or [])
        self.stage = self.units[mp_ranks[0]].stage
        self.dp = self.units[mp_ranks[0]].dp
        if self.stage == 3:
            for _, f in sorted(files["model3"].items()):
                if f not in self.model_states:
                    self.model_states[f] = self._load(f)
        self._owner: dict[str, ZeroOptimizerFiles] = {}
        for unit in self.units.values():
            for name in unit.names():
                self._owner.setdefault(name, unit)  # a pipeline's tied weights live in several stages: the first

    def _load(self, path: str) -> Any:
        obj, self._mapped[path] = load_pt_mapped(path)
        return obj

    # --- layout ---------------------------------------------------------------------------------------
    def _check_parallelism(self, mp_ranks: list[int]) -> None:
        if len(mp_ranks) > 1 and not self.files["layer"]:
            raise FormatError(
                f"{self.step_dir}: tensor-parallel DeepSpeed checkpoints (mp_rank_00..{mp_ranks[-1]:02d}) are not "
                "read directly: how each tensor is split is known only to the model code; convert the folder with "
                "DeepSpeed's ds_to_universal (Megatron-DeepSpeed records the split patterns) and read that, or "
                "write a UCL program for the model"
            )

    def _model_file(self, mp: int) -> str:
        if mp in self.files["model"]:
            return self.files["model"][mp]
        if (0, mp) in self.files["model3"]:
            return self.files["model3"][(0, mp)]
        raise FormatError(
            f"{self.step_dir}: no model-states file for model-parallel rank {mp} (mp_rank_{mp:02d}_model_states.pt)"
        )

    @property
    def main_states(self) -> dict:
        return next(iter(self.model_states.values()))

    # --- tensors --------------------------------------------------------------------------------------
    def _model_tensors(self) -> Iterator[TensorInfo]:
        states = self.main_states
        module = states.get("module") or {}
        buffers = set(states.get("buffer_names") or ())
        frozen = dict(states.get("frozen_param_shapes") or {})
        shared = dict(states.get("shared_params") or {})
        for name, tensor in module.items():
            if not isinstance(tensor, torch.Tensor):
                raise FormatError(f"{self._model_file(0)}: module entry {name!r} is not a tensor")
            dtype = str(tensor.dtype).removeprefix("torch.")
            if self.stage <= 2 or name in buffers:
                mapped = self._mapped[next(iter(self.model_states))]
                yield TensorInfo(name, dtype, tuple(tensor.shape), partial(read_dense, tensor, mapped=mapped))
                continue
            owner = shared.get(name, name)
            if owner in self._owner:
                shape = self._owner[owner].shapes[owner]
                yield TensorInfo(name, dtype, shape, self._cast_master(owner, tensor.dtype))
            elif owner in frozen:
                yield TensorInfo(name, dtype, tuple(int(s) for s in frozen[owner]), self._zero3_frozen(owner))
            else:
                raise FormatError(
                    f"{self._model_file(0)}: module entry {name!r} is a ZeRO-3 placeholder of no known "
                    "parameter (not trained, not frozen, not a buffer, not tied)"
                )

    def _cast_master(self, name: str, dtype: torch.dtype) -> Callable[[Region | None], torch.Tensor]:
        unit = self._owner[name]
        return lambda region: unit.read(name, FP32, region).to(dtype)

    def _zero3_frozen(self, name: str) -> Callable[[Region | None], torch.Tensor]:
        ranks = {dp: f for (dp, mp), f in self.files["model3"].items() if mp == 0}
        return zero3_frozen_reader(name, {r: self.model_states[f] for r, f in ranks.items()}, ranks)

    def _optimizer_tensors(self) -> Iterator[TensorInfo]:
        seen: set[str] = set()
        for unit in self.units.values():
            keys = [FP32] + unit.state_keys()
            steps = unit.group_values("step")
            for name in unit.names():
                if name in seen:
                    continue
                seen.add(name)
                shape = unit.shapes[name]
                for key in keys:
                    dtype = str(unit.dtype(name, key)).removeprefix("torch.")
                    yield TensorInfo(f"{name}/{key}", dtype, shape, partial(unit.read, name, key))
                step = steps[unit.group_of[name]]
                if isinstance(step, torch.Tensor):
                    yield TensorInfo(
                        f"{name}/step",
                        str(step.dtype).removeprefix("torch."),
                        tuple(step.shape),
                        partial(read_dense, step),
                    )

    def tensors(self) -> Iterator[TensorInfo]:
        yield from self._model_tensors()
        yield from self._optimizer_tensors()

    # --- state ----------------------------------------------------------------------------------------
    def _param_groups(self) -> tuple[dict, ...]:
        unit = next(iter(self.units.values()))
        osd = unit.osd(0)
        if self.stage <= 2:
            groups = osd.get("base_optimizer_state") or {}
            groups = groups.get("param_groups") if isinstance(groups, dict) else None
            members = [[[n for n, _ in unit.groups[g]]] for g in range(len(unit.groups))]
        else:
            groups = (osd.get("optimizer_state_dict") or {}).get("param_groups")
            members = [[[n for n, _ in unit.groups[i]] for i in g.get("params", [])] for g in groups or []]
        out = []
        for g, hyper in enumerate(groups or [{} for _ in unit.groups]):
            names = [n for chunk in members[g] for n in chunk] if g < len(members) else []
            for other in list(self.units.values())[1:]:  # pipeline stages: the same groups, more parameters
                names += [n for n, _ in other.groups[g]] if g < len(other.groups) and self.stage <= 2 else []
            entry = {k: json_value(v) for k, v in hyper.items() if k != "params"}
            entry["params"] = list(dict.fromkeys(names))
            out.append(entry)
        return tuple(out)

    def _universal_optimizer_state(self) -> Any:
        """What ds_to_universal writes to ``zero/optimizer_state.pt``, less rank 0's flat partitions."""
        unit = next(iter(self.units.values()))
        osd = unit.osd(0)
        where = unit.files[0]
        if self.stage <= 2:
            sharded = ("base_optimizer_state", "param_slice_mappings", "single_partition_of_fp32_groups")
            out = {k: v for k, v in osd.items() if k not in sharded}
            if "group_paddings" in out:  # DeepSpeed's own reader strips the padding and says so
                out["group_paddings"] = [0] * len(out["group_paddings"])
            if isinstance(out.get("partition_count"), list):
                out["partition_count"] = [self.dp] * len(out["partition_count"])
            base = osd.get("base_optimizer_state")
            out["param_groups"] = base.get("param_groups") if isinstance(base, dict) else []
        else:
            inner = dict(osd.get("optimizer_state_dict") or {})
            inner["state"] = {
                i: {k: v for k, v in s.items() if not isinstance(v, torch.Tensor) or v.dim() == 0}
                for i, s in (inner.get("state") or {}).items()
            }
            out = {k: v for k, v in osd.items() if k not in ("fp32_flat_groups", "optimizer_state_dict")}
            out["optimizer_state_dict"] = inner
            out["param_groups"] = inner.get("param_groups")
        return plain_state(out, _scalar_or_fail(where))

    def _model_states_plain(self) -> dict[str, Any]:
        out = {}
        for path, states in self.model_states.items():
            rank = int(m[1]) if (m := MODEL3_RE.match(os.path.basename(path))) else 0

            def ref(t: torch.Tensor, where: str, rank: int = rank, path: str = path) -> Any:
                parts = where.split("/")
                if t.dim() == 0:
                    return {"scalar": t.item(), "dtype": str(t.dtype).removeprefix("torch.")}
                if parts[0] == "module" and len(parts) == 2:
                    if self.stage <= 2 or t.numel() > 0:
                        return {"name": parts[1]}
                    return {"empty": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
                if parts[0] == "frozen_param_fragments" and len(parts) == 2:
                    if self.stage <= 2:
                        return {"name": parts[1]}
                    return {"fragment_of": parts[1], "rank": rank, "dp": self.dp}
                raise FormatError(f"{path}: unexpected tensor at {where}")

            out[os.path.basename(path)] = plain_state(states, ref)
        return out

    def state(self) -> TrainingState:
        states = self.main_states
        unit = next(iter(self.units.values()))
        steps = [s for u in self.units.values() for s in u.group_values("step")]
        extra = {
            "format": self.format,
            "zero_stage": self.stage,
            "dp": self.dp,
            "ds_version": states.get("ds_version"),
            "tied": dict(states.get("shared_params") or {}),
            "buffers": list(states.get("buffer_names") or []),
            "frozen": list((states.get("frozen_param_shapes") or {}).keys()),
            "deepspeed": {
                "model_states": self._model_states_plain(),
                "optimizer_state": self._universal_optimizer_state(),
                "group_steps": [s if isinstance(s, int) else None for s in unit.group_values("step")],
            },
        }
        step = states.get("global_steps")
        if not isinstance(step, int):
            step = next((int(s) for s in steps if isinstance(s, int)), None)
        return TrainingState(step=step, param_groups=self._param_groups(), rng={}, extra=extra)

    def opened_partitions(self) -> dict[int, list[int]]:
        """Per model-parallel rank, the data-parallel ranks whose optimizer files were opened so far."""
        return {mp: unit.opened() for mp, unit in self.units.items()}

    def close(self) -> None:
        # Drops the mapped optimizer files; a TensorInfo read later maps them again.
        for unit in self.units.values():
            unit.close()

    def __enter__(self) -> "DeepSpeedZeroReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _detect(path: str) -> bool:
    if not os.path.isdir(path):
        return False
    step_dir = resolve_step_dir(path)
    files = checkpoint_files(step_dir)
    return bool(files["optim"]) and bool(files["model"] or files["model3"]) and not files["layer"]


FORMAT = register_format(
    Format(
        name="deepspeed-zero",
        description="DeepSpeed ZeRO-1/2/3 checkpoint (latest + global_stepN/ with *_model_states.pt, *_optim_states.pt)",
        detect=_detect,
        open_reader=DeepSpeedZeroReader,
    )
)
