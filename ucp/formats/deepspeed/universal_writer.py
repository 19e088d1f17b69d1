"""Writer of DeepSpeed universal checkpoints: what DeepSpeed's ``ds_to_universal`` writes, from any source.

Logical tensors stream in: ``<param>/<state>`` (``fp32``, ``exp_avg``,
``exp_avg_sq``, any other) becomes ``zero/<param>/<state>.pt`` at once;
``<param>/step`` becomes ``step.pt``; a model tensor goes straight into the
model-states file (written tensor by tensor, see
:class:`~ucp.formats.deepspeed.pt.StreamingPtWriter`), so memory stays at one
tensor. ``close`` writes the rest and commits (temporary folder + rename, then
``latest_universal`` beside it, as DeepSpeed's tool does):

* ``zero/optimizer_state.pt``: the source's own (from a DeepSpeed source, the
  exact objects, DeepSpeed's ``LossScaler`` included), else one made from the
  param groups;
* ``step.pt`` of every trained parameter, ``fp32.pt`` of every model tensor
  with no master weights (buffers, frozen and tied parameters), as
  ``{"param": t.float()}`` - DeepSpeed's layout; a value that float32 cannot
  hold exactly and that is stored nowhere else is refused;
* the model-states file(s): the source's, with its tensors, else a minimal one
  (``module``, ``param_shapes``, steps...) that DeepSpeed's loader accepts.

``style``: ``"zero12"`` (``{"cat_dim": 0, "param": t}`` files, ``step.pt``,
``mp_rank_00_model_states.pt``), ``"zero3"`` (bare flat tensors, no
``step.pt``, one ``zero_pp_rank_<r>_mp_rank_00_model_states.pt`` per source
rank: what the tool writes for a ZeRO-3 source) or ``"auto"`` (the source's
stage). From a DeepSpeed source the files equal the tool's byte for byte,
except: model-states files hold the same keys and tensors laid out afresh;
ZeRO-3's ``optimizer_state.pt`` does not carry rank 0's flat partitions, which
the tool copies and DeepSpeed never reads.

>>> # with get_format("deepspeed-universal").open_writer("out/global_step3_universal") as w: ...
"""

from __future__ import annotations

import math
import os
import shutil
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Iterable

import torch

from ucp.errors import CheckpointExistsError, FormatError
from ucp.file_io import write_atomic
from ucp.formats.base import TrainingState
from ucp.formats.deepspeed.plain import from_plain
from ucp.formats.deepspeed.pt import StoredTensor, StreamingPtWriter, load_pt, save_pt

__all__ = ["DeepSpeedUniversalWriter", "DS_VERSION"]

# The DeepSpeed release whose universal layout this writer follows; written when the source names none
# (DeepSpeed's loader refuses a checkpoint without a version, and ZeRO-1 ones older than 0.3.17).
DS_VERSION = "0.19.8"
_SPOOL = "mp_rank_00_model_states.pt"
_IN_FLIGHT = 2  # tensors being saved on writer threads while the next one is read


def _check_param_name(name: str) -> None:
    parts = name.split("/")
    if (
        not name
        or any(p in ("", ".", "..") for p in parts)
        or len(parts) > 2
        or os.sep in parts[0]
        or (os.altsep and os.altsep in name)
    ):
        raise FormatError(
            f"logical name {name!r} cannot be written to deepspeed-universal: it keeps one folder "
            "per parameter, named by the parameter (no '/', '.', '..'), with one file per state"
        )


def _as_saved(tensor: torch.Tensor, key: str) -> torch.Tensor:
    """The tensor alone in its storage (torch.save writes whole storages), contiguous; master weights
    flagged ``requires_grad`` as DeepSpeed's are, which changes one byte of the file."""
    out = tensor.detach()
    if (
        not out.is_contiguous()
        or out.storage_offset()
        or out.untyped_storage().nbytes() != out.numel() * out.element_size()
    ):
        out = out.contiguous().clone()
    else:
        out = out.view(out.shape)  # a new tensor object: setting requires_grad never touches the caller's
    return out.requires_grad_(True) if key == "fp32" and out.is_floating_point() else out


class DeepSpeedUniversalWriter:
    """A DeepSpeed universal checkpoint being written at ``path`` (see the module doc)."""

    format = "deepspeed-universal"

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        tensors: Iterable[Any] | None = None,
        overwrite: bool = False,
        state: TrainingState | None = None,
        style: str = "auto",
        block_bytes: int | None = None,
    ) -> None:
        # block_bytes: this writer takes whole tensors only (no add_region); every file it writes is one tensor.
        if style not in ("auto", "zero12", "zero3"):
            raise ValueError(f"style must be 'auto', 'zero12' or 'zero3', got {style!r}")
        for info in tensors or ():  # refuse what cannot be written before writing anything
            _check_param_name(getattr(info, "name", info))
        self.path = os.path.abspath(os.fspath(path)).rstrip(os.sep)
        if os.path.exists(self.path) and not overwrite:
            raise CheckpointExistsError(f"{self.path} exists; pass overwrite=True to replace it")
        self.style = style
        self.overwrite = overwrite
        parent, base = os.path.split(self.path)
        os.makedirs(parent, exist_ok=True)
        self._tmp = os.path.join(parent, f".{base}.ucp-tmp-{uuid.uuid4().hex[:8]}")
        os.makedirs(os.path.join(self._tmp, "zero"))
        self._spool = StreamingPtWriter(os.path.join(self._tmp, _SPOOL))
        self._model: dict[str, StoredTensor] = {}
        self._written: dict[str, list[str]] = {}  # param -> states written
        self._steps: dict[str, torch.Tensor] = {}
        self._state = state if state is not None else TrainingState()
        self._closed = False
        self._pool = ThreadPoolExecutor(max_workers=_IN_FLIGHT, thread_name_prefix="ucp-ds-universal")
        self._pending: list[Future] = []

    def __enter__(self) -> "DeepSpeedUniversalWriter":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    # --- streaming ------------------------------------------------------------------------------------
    def add(self, name: str, tensor: torch.Tensor) -> None:
        _check_param_name(name)
        if "/" not in name:
            if name in self._model:
                raise FormatError(f"logical tensor {name!r} was added twice")
            self._model[name] = self._spool.add(tensor)
            return
        param, key = name.split("/")
        if key == "step":
            self._steps[param] = tensor.detach().clone()
            return
        if key in self._written.get(param, ()):
            raise FormatError(f"logical tensor {name!r} was added twice")
        folder = os.path.join(self._tmp, "zero", param)
        os.makedirs(folder, exist_ok=True)
        self._save_soon({"cat_dim": 0, "param": _as_saved(tensor, key)}, os.path.join(folder, f"{key}.pt"))
        self._written.setdefault(param, []).append(key)

    def _save_soon(self, obj: Any, path: str) -> None:
        """Save on a writer thread, so the next tensor is read while this one is written (at most
        ``_IN_FLIGHT`` tensors wait: the caller's copy is dropped once ``add`` returns, ours once saved)."""
        while len(self._pending) >= _IN_FLIGHT:
            self._pending.pop(0).result()
        self._pending.append(self._pool.submit(save_pt, obj, path))

    def _drain(self) -> None:
        while self._pending:
            self._pending.pop(0).result()

    def set_state(self, state: TrainingState) -> None:
        self._state = state

    # --- close ----------------------------------------------------------------------------------------
    def _style(self) -> str:
        if self.style != "auto":
            return self.style
        return "zero3" if self._state.extra.get("zero_stage") == 3 else "zero12"

    def _deepspeed(self) -> dict:
        ds = self._state.extra.get("deepspeed")
        return ds if isinstance(ds, dict) else {}

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._drain()
            style = self._style()
            model, kept = self._write_model_states(self._model_state_specs(style))
            self._write_masters(model)
            trained = [p for p, keys in self._written.items() if "fp32" in keys]
            if style == "zero3":
                self._flatten_states()
            else:
                self._write_fallbacks(model, kept)
                self._write_steps(trained)
            del model
            save_pt(self._optimizer_state(trained), os.path.join(self._tmp, "zero", "optimizer_state.pt"))
            self._commit()
        except BaseException:
            self.abort()
            raise
        finally:
            self._pool.shutdown(wait=True)
        self._closed = True

    def abort(self) -> None:
        if not self._closed:
            for future in self._pending:
                future.cancel()
            self._pool.shutdown(wait=True)
            self._pending.clear()
            self._spool.abort()
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._closed = True

    def _model_state_specs(self, style: str) -> dict[str, Any]:
        specs = self._deepspeed().get("model_states")
        if isinstance(specs, dict) and specs:
            return specs
        if style == "zero3":
            raise FormatError(
                "deepspeed-universal style 'zero3' needs the ZeRO-3 model-states files of a DeepSpeed "
                "source; use style 'zero12', which DeepSpeed's ZeRO-3 engines load as well"
            )
        return {_SPOOL: None}

    def _synthesized_model_states(self) -> dict:
        trained = [p for p in self._written if p in self._model]
        shapes = []
        for group in self._state.param_groups or ({"params": trained},):
            shapes.append({n: torch.Size(self._model[n].shape) for n in group.get("params", []) if n in trained})
        return {
            "module": {n: {"@tensor": {"name": n}} for n in self._model},
            "buffer_names": list(self._state.extra.get("buffers") or []),
            "optimizer": None,
            "param_shapes": shapes,
            "frozen_param_shapes": None,
            "shared_params": dict(self._state.extra.get("tied") or {}),
            "frozen_param_fragments": None,
            "lr_scheduler": None,
            "data_sampler": None,
            "random_ltd": None,
            "skipped_steps": 0,
            "global_steps": self._state.step or 0,
            "global_samples": 0,
            "dp_world_size": 1,
            "mp_world_size": 1,
            "ds_version": self._state.extra.get("ds_version") or DS_VERSION,
        }

    def _resolver(self, writer: StreamingPtWriter, model: dict | None, referenced: set[str]):
        """Turns the ``$tensor`` references of a model-states spec into tensors written by ``writer``."""

        def resolve(ref: Any) -> Any:
            if not isinstance(ref, dict):
                raise FormatError(f"bad tensor reference {ref!r} in the DeepSpeed state")
            if "scalar" in ref:
                return torch.tensor(ref["scalar"], dtype=getattr(torch, ref["dtype"]))
            if "empty" in ref:
                return writer.add(torch.empty(ref["shape"], dtype=getattr(torch, ref["empty"])))
            name = ref.get("name") or ref.get("fragment_of")
            if name not in self._model:
                raise FormatError(
                    f"the DeepSpeed model states refer to tensor {name!r}, which was not given; "
                    "convert every model tensor of the source"
                )
            referenced.add(name)
            if model is None:  # already in the file being finished
                return self._model[name]
            tensor = model[name]
            if "fragment_of" in ref:  # a ZeRO-3 rank's padded piece of a frozen parameter
                per_rank = math.ceil(tensor.numel() / ref["dp"])
                piece = tensor.reshape(-1)[ref["rank"] * per_rank : (ref["rank"] + 1) * per_rank]
                tensor = torch.cat([piece, piece.new_zeros(per_rank - piece.numel())])
            return writer.add(tensor)

        return resolve

    def _write_model_states(self, specs: dict[str, Any]) -> tuple[dict[str, torch.Tensor], set[str]]:
        """Write the model-states file(s); returns every model tensor (memory-mapped back) and those they hold."""
        referenced: set[str] = set()
        if list(specs) == [_SPOOL]:  # the model tensors are in that file already: add the structure
            spec = specs[_SPOOL] if specs[_SPOOL] is not None else self._synthesized_model_states()
            self._spool.finish(from_plain(spec, tensor=self._resolver(self._spool, None, referenced)))
            lost = [n for n in self._model if n not in referenced]
            if lost:
                raise FormatError(
                    f"model tensor {lost[0]!r} is not part of the source's DeepSpeed model states "
                    f"({len(lost)} such); deepspeed-universal would drop it"
                )
            written = load_pt(os.path.join(self._tmp, _SPOOL))
            module = dict(written.get("module") or {})
            fragments = dict(written.get("frozen_param_fragments") or {})
            return {n: module[n] if n in module else fragments[n] for n in self._model}, referenced
        spool_path = os.path.join(self._tmp, ".model-tensors.pt")
        self._spool.finish(dict(self._model))
        os.replace(os.path.join(self._tmp, _SPOOL), spool_path)
        model = load_pt(spool_path)
        os.remove(spool_path)  # the mapping keeps the bytes readable until it goes
        for fname, spec in specs.items():
            if os.path.basename(fname) != fname or not fname.endswith("model_states.pt"):
                raise FormatError(f"model-states file name {fname!r} is not a DeepSpeed model-states file name")
            writer = StreamingPtWriter(os.path.join(self._tmp, fname))
            writer.finish(from_plain(spec, tensor=self._resolver(writer, model, referenced)))
        return model, referenced

    def _write_masters(self, model: dict[str, torch.Tensor]) -> None:
        """Optimizer states came without ``<param>/fp32`` (an fp32 run keeps no separate master): the weights are."""
        for param, keys in self._written.items():
            if "fp32" in keys:
                continue
            if param not in model:
                raise FormatError(
                    f"optimizer states of {param!r} were given without its master weights or its "
                    f"weights ({param}/fp32 or {param}); DeepSpeed's loader needs fp32.pt"
                )
            save_pt(
                {"cat_dim": 0, "param": _as_saved(model[param].float(), "fp32")},
                os.path.join(self._tmp, "zero", param, "fp32.pt"),
            )
            keys.insert(0, "fp32")

    def _write_fallbacks(self, model: dict[str, torch.Tensor], kept: set[str]) -> None:
        """``fp32.pt`` = ``{"param": t.float()}`` for model tensors without master weights, as DeepSpeed's tool.

        A tensor the model-states files do not hold (a pipeline's buffer: DeepSpeed's tool drops those) is
        kept here too, and refused if float32 would change it.
        """
        for name, tensor in model.items():
            if name in self._written:
                continue
            as_float = tensor.float()
            if name not in kept and not torch.equal(as_float.to(tensor.dtype), tensor):
                raise FormatError(
                    f"model tensor {name!r} ({str(tensor.dtype).removeprefix('torch.')}) holds values "
                    "float32 cannot represent, and deepspeed-universal would keep it only as fp32.pt; "
                    "convert to ucp or dcp instead"
                )
            folder = os.path.join(self._tmp, "zero", name)
            os.makedirs(folder, exist_ok=True)
            save_pt({"param": as_float}, os.path.join(folder, "fp32.pt"))

    def _write_steps(self, trained: list[str]) -> None:
        group_steps = self._deepspeed().get("group_steps") or []
        group_of = {n: g for g, group in enumerate(self._state.param_groups) for n in group.get("params", [])}
        for param in trained:
            step: Any = self._steps.get(param)
            if step is None:
                g = group_of.get(param)
                step = group_steps[g] if g is not None and g < len(group_steps) else None
            if step is not None:
                save_pt(step, os.path.join(self._tmp, "zero", param, "step.pt"))

    def _flatten_states(self) -> None:
        for param, keys in self._written.items():
            for key in keys:
                path = os.path.join(self._tmp, "zero", param, f"{key}.pt")
                flat = load_pt(path, mmap=False)["param"].reshape(-1)  # read whole: the file is rewritten
                save_pt(_as_saved(flat, key), path)

    def _optimizer_state(self, trained: list[str]) -> Any:
        source = self._deepspeed().get("optimizer_state")
        if isinstance(source, dict):
            return from_plain(
                source, tensor=lambda ref: torch.tensor(ref["scalar"], dtype=getattr(torch, ref["dtype"]))
            )
        groups = []
        for g, group in enumerate(self._state.param_groups or ({},)):
            entry = {
                k: tuple(v) if k == "betas" and isinstance(v, list) else v for k, v in group.items() if k != "params"
            }
            entry["params"] = [g]
            groups.append(entry)
        steps = [self._steps[p] for p in trained if p in self._steps]
        step = steps[0] if steps else self._state.step
        return {
            "ds_version": self._state.extra.get("ds_version") or DS_VERSION,
            "param_groups": groups,
            # what a ZeRO-3 engine reads of it: the step and the param groups
            "optimizer_state_dict": {"state": {0: {"step": step}}, "param_groups": groups},
        }

    def _commit(self) -> None:
        if os.path.exists(self.path):
            if not self.overwrite:
                raise CheckpointExistsError(f"{self.path} appeared while writing; nothing was replaced")
            aside = f"{self._tmp}-old"
            os.rename(self.path, aside)
            os.rename(self._tmp, self.path)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.rename(self._tmp, self.path)
        parent, base = os.path.split(self.path)
        write_atomic(os.path.join(parent, "latest_universal"), base.encode())
