"""DeepSpeed universal checkpoints (format ``deepspeed-universal``): the reader, and the registry entry.

A universal checkpoint is what DeepSpeed's ``ds_to_universal`` writes and what
an engine started with ``"checkpoint": {"load_universal": true}`` reads::

    ROOT/latest_universal                 the tag, e.g. global_step3_universal
    ROOT/<tag>/zero/<param>/fp32.pt       {"cat_dim": 0, "param": tensor} (ZeRO-3: the bare flat tensor)
    ROOT/<tag>/zero/<param>/exp_avg.pt    ... one file per optimizer state; step.pt holds the step
    ROOT/<tag>/zero/optimizer_state.pt    the optimizer's global state and param groups
    ROOT/<tag>/*model_states.pt           the engine's model-states file(s), copied

The reader yields the model's tensors (from the model-states ``module``; a
ZeRO-3 placeholder or a pipeline's missing module from ``fp32.pt``),
``<param>/fp32`` and every other ``<param>/<state>`` of the trained
parameters, and ``<param>/step`` when the step is a tensor. Files are read
memory-mapped through the restricted unpickler. The writer lives in
:mod:`ucp.formats.deepspeed.universal_writer`.

>>> # with get_format("deepspeed-universal").open_reader("ckpt/") as reader: ...
"""

from __future__ import annotations

import math
import os
from functools import partial
from typing import Any, Iterator

import torch

from ucp.errors import FormatError
from ucp.formats.base import Format, TensorInfo, TrainingState, register_format
from ucp.formats.deepspeed.flat import read_dense
from ucp.formats.deepspeed.optim import zero_stage_of
from ucp.formats.deepspeed.pt import load_pt, load_pt_mapped
from ucp.formats.deepspeed.universal_writer import DeepSpeedUniversalWriter
from ucp.formats.tensor_geometry import tag_folder
from ucp.formats.deepspeed.zero import MODEL3_RE, MODEL_RE, json_value, plain_state, zero3_frozen_reader

__all__ = ["DeepSpeedUniversalReader", "resolve_universal_dir"]

STATE_FILES = ("fp32", "exp_avg", "exp_avg_sq")


def resolve_universal_dir(path: str) -> str:
    """The folder holding ``zero/``: ``path``, or ``path/<tag>`` named by its ``latest_universal``."""
    if os.path.isfile(os.path.join(path, "zero", "optimizer_state.pt")):
        return path
    latest = os.path.join(path, "latest_universal")
    if os.path.isfile(latest):
        step_dir = tag_folder(path, "latest_universal")
        if os.path.isfile(os.path.join(step_dir, "zero", "optimizer_state.pt")):
            return step_dir
        raise FormatError(
            f"{latest} names tag {os.path.basename(step_dir)!r} but {step_dir}/zero/optimizer_state.pt does not exist"
        )
    raise FormatError(
        f"{path} is not a DeepSpeed universal checkpoint: no zero/optimizer_state.pt and no latest_universal"
    )


def _param_of(obj: Any, where: str) -> Any:
    if isinstance(obj, dict):
        if "param" not in obj:
            raise FormatError(f"{where} holds no 'param'")
        return obj["param"]
    return obj


class DeepSpeedUniversalReader:
    """An opened DeepSpeed universal checkpoint (see the module doc). Use as a context manager."""

    format = "deepspeed-universal"

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self.step_dir = resolve_universal_dir(self.path)
        self.zero_dir = os.path.join(self.step_dir, "zero")
        self.optimizer_state = load_pt(os.path.join(self.zero_dir, "optimizer_state.pt"))
        if not isinstance(self.optimizer_state, dict):
            raise FormatError(f"{self.zero_dir}/optimizer_state.pt is not a dict")
        self.stage = zero_stage_of(self.optimizer_state, f"{self.zero_dir}/optimizer_state.pt")
        names = sorted(os.listdir(self.step_dir))
        files = [n for n in names if MODEL_RE.match(n)] or [n for n in names if MODEL3_RE.match(n)]
        self.model_states = {n: load_pt(os.path.join(self.step_dir, n)) for n in files}
        self.params = sorted(n for n in os.listdir(self.zero_dir) if os.path.isdir(os.path.join(self.zero_dir, n)))
        self._files: dict[str, Any] = {}
        self._mapped: dict[str, bool] = {}
        first: dict = next(iter(self.model_states.values()), {})
        self.shapes = {
            name: tuple(int(s) for s in shape)
            for ms in self.model_states.values()
            for group in ms.get("param_shapes") or []
            for name, shape in group.items()
        }
        self.shapes.update(
            {n: tuple(int(s) for s in shape) for n, shape in (first.get("frozen_param_shapes") or {}).items()}
        )

    def _file(self, param: str, key: str) -> Any:
        path = os.path.join(self.zero_dir, param, f"{key}.pt")
        if path not in self._files:
            self._files[path], self._mapped[path] = load_pt_mapped(path)
        return self._files[path]

    def _read(self, param: str, key: str, region: Any) -> torch.Tensor:
        tensor = self._tensor(param, key)
        out = read_dense(tensor, region, mapped=self._mapped[os.path.join(self.zero_dir, param, f"{key}.pt")])
        self._files.pop(os.path.join(self.zero_dir, param, f"{key}.pt"), None)  # one read per file in a conversion
        return out

    def _read_as(self, param: str, dtype: torch.dtype, region: Any) -> torch.Tensor:
        """The fp32 master of ``param`` cast to the module's ``dtype``."""
        return self._read(param, "fp32", region).to(dtype)

    def _tensor(self, param: str, key: str) -> torch.Tensor:
        where = os.path.join(self.zero_dir, param, f"{key}.pt")
        tensor = _param_of(self._file(param, key), where)
        if not isinstance(tensor, torch.Tensor):
            raise FormatError(f"{where} holds no tensor")
        shape = self.shapes.get(param)
        if shape is not None and tensor.dim() == 1 and tuple(tensor.shape) != shape:  # ZeRO-3: flat
            if tensor.numel() != math.prod(shape):
                raise FormatError(f"{where} holds {tensor.numel()} elements; the parameter {param} has shape {shape}")
            tensor = tensor.view(shape)
        return tensor

    def _rank_states(self) -> tuple[dict[int, dict], dict[int, str]]:
        ranks = {int(m[1]): n for n in self.model_states if (m := MODEL3_RE.match(n))}
        return {r: self.model_states[n] for r, n in ranks.items()}, {
            r: os.path.join(self.step_dir, n) for r, n in ranks.items()
        }

    def _trained(self, param: str) -> bool:
        """DeepSpeed's tool writes only ``{"param": t}`` for an untrained tensor (buffer, frozen, tied alias)."""
        fp32 = self._file(param, "fp32")
        states = any(os.path.isfile(os.path.join(self.zero_dir, param, f"{k}.pt")) for k in STATE_FILES[1:])
        return states or not isinstance(fp32, dict) or "cat_dim" in fp32

    def _state_keys(self, param: str) -> list[str]:
        found = [n[:-3] for n in sorted(os.listdir(os.path.join(self.zero_dir, param))) if n.endswith(".pt")]
        ordered = [k for k in STATE_FILES if k in found]
        return ordered + [k for k in found if k not in STATE_FILES and k != "step"]

    def tensors(self) -> Iterator[TensorInfo]:
        module_names: set[str] = set()
        for ms in self.model_states.values():
            shared = dict(ms.get("shared_params") or {})
            frozen = set((ms.get("frozen_param_shapes") or {}).keys())
            for name, tensor in (ms.get("module") or {}).items():
                if name in module_names:
                    continue
                module_names.add(name)
                dtype = str(tensor.dtype).removeprefix("torch.")
                if tensor.numel() or name not in self.shapes and shared.get(name) not in self.shapes:
                    yield TensorInfo(name, dtype, tuple(tensor.shape), partial(read_dense, tensor))
                    continue
                owner = shared.get(name, name)
                if not os.path.isfile(os.path.join(self.zero_dir, owner, "fp32.pt")) and owner in frozen:
                    # ZeRO-3: a frozen parameter lives only in the ranks' model-states files
                    yield TensorInfo(name, dtype, self.shapes[owner], zero3_frozen_reader(owner, *self._rank_states()))
                    continue
                yield TensorInfo(name, dtype, self.shapes[owner], partial(self._read_as, owner, tensor.dtype))
        for param in self.params:
            if not os.path.isfile(os.path.join(self.zero_dir, param, "fp32.pt")):
                raise FormatError(f"{self.zero_dir}/{param} has no fp32.pt")
            trained = self._trained(param)
            if param not in module_names:  # a pipeline's (no module in its model states): only fp32 exists
                t = self._tensor(param, "fp32")
                yield TensorInfo(param, "float32", tuple(t.shape), partial(self._read, param, "fp32"))
            if not trained:
                continue
            for key in self._state_keys(param):
                t = self._tensor(param, key)
                yield TensorInfo(
                    f"{param}/{key}",
                    str(t.dtype).removeprefix("torch."),
                    tuple(t.shape),
                    partial(self._read, param, key),
                )
            if os.path.isfile(os.path.join(self.zero_dir, param, "step.pt")):
                step = self._file(param, "step")
                if isinstance(step, torch.Tensor):
                    yield TensorInfo(
                        f"{param}/step",
                        str(step.dtype).removeprefix("torch."),
                        tuple(step.shape),
                        partial(read_dense, step),
                    )

    def _group_members(self) -> list[list[str]]:
        per_file = [[list(group) for group in ms.get("param_shapes") or []] for ms in self.model_states.values()]
        if self.stage == 3:
            groups = (self.optimizer_state.get("optimizer_state_dict") or {}).get("param_groups") or []
            subs = per_file[0] if per_file else []
            return [[n for i in g.get("params", []) if i < len(subs) for n in subs[i]] for g in groups]
        count = max((len(f) for f in per_file), default=0)
        return [list(dict.fromkeys(n for f in per_file if g < len(f) for n in f[g])) for g in range(count)]

    def state(self) -> TrainingState:
        first: dict = next(iter(self.model_states.values()), {})
        members = self._group_members()
        groups = []
        for g, hyper in enumerate(self.optimizer_state.get("param_groups") or []):
            entry = {k: json_value(v) for k, v in hyper.items() if k != "params"}
            entry["params"] = members[g] if g < len(members) else []
            groups.append(entry)
        steps = []
        for names in members:
            trained = [n for n in names if os.path.isfile(os.path.join(self.zero_dir, n, "step.pt"))]
            value = self._file(trained[0], "step") if trained else None
            steps.append(value if isinstance(value, int) else None)

        def ref(t: torch.Tensor, where: str) -> Any:
            parts = where.split("/")
            if t.dim() == 0:
                return {"scalar": t.item(), "dtype": str(t.dtype).removeprefix("torch.")}
            if parts[0] in ("module", "frozen_param_fragments") and len(parts) == 2 and t.numel():
                return {"name": parts[1]}
            if parts[0] == "module" and len(parts) == 2:
                return {"empty": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
            raise FormatError(f"{self.step_dir}: unexpected tensor at {where}")

        def opt_ref(t: torch.Tensor, where: str) -> Any:
            if t.dim() == 0:
                return {"scalar": t.item(), "dtype": str(t.dtype).removeprefix("torch.")}
            raise FormatError(f"{self.zero_dir}/optimizer_state.pt: unexpected tensor at {where}")

        opt = dict(self.optimizer_state)
        opt.pop("fp32_flat_groups", None)  # rank 0's flat partitions, which DeepSpeed's ZeRO-3 tool copies
        inner = opt.get("optimizer_state_dict")
        if isinstance(inner, dict):
            inner = dict(inner)
            inner["state"] = {
                i: {k: v for k, v in s.items() if not isinstance(v, torch.Tensor) or v.dim() == 0}
                for i, s in (inner.get("state") or {}).items()
            }
            opt["optimizer_state_dict"] = inner
        extra = {
            "format": self.format,
            "zero_stage": self.stage,
            "ds_version": opt.get("ds_version"),
            "tied": dict(first.get("shared_params") or {}),
            "buffers": list(first.get("buffer_names") or []),
            "frozen": list((first.get("frozen_param_shapes") or {}).keys()),
            "deepspeed": {
                "model_states": {n: plain_state(ms, ref) for n, ms in self.model_states.items()},
                "optimizer_state": plain_state(opt, opt_ref),
                "group_steps": steps,
            },
        }
        step = first.get("global_steps")
        return TrainingState(step=step if isinstance(step, int) else None, param_groups=tuple(groups), extra=extra)

    def close(self) -> None:
        self._files.clear()  # a TensorInfo read later maps its file again

    def __enter__(self) -> "DeepSpeedUniversalReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _detect(path: str) -> bool:
    try:
        resolve_universal_dir(path)
    except FormatError:
        return False
    return True


FORMAT = register_format(
    Format(
        name="deepspeed-universal",
        description="DeepSpeed universal checkpoint (zero/<param>/{fp32,exp_avg,exp_avg_sq,step}.pt, optimizer_state.pt)",
        detect=_detect,
        open_reader=DeepSpeedUniversalReader,
        open_writer=DeepSpeedUniversalWriter,
    )
)
