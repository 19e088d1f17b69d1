"""Reader for Megatron-LM legacy checkpoints (``iter_NNNNNNN/mp_rank_XX[_YYY]/model_optim_rng.pt``), format ``megatron``.

Megatron's ``--ckpt-format torch`` writes one file per tensor-parallel and
pipeline rank (``latest_checkpointed_iteration.txt`` names the iteration). The
reader merges the shards into logical tensors with a UCL program - by default
the ``megatron-gpt`` preset, its parameters taken from the checkpoint's own
``args`` (layers, heads, query groups, vocabulary, tied embeddings) - so a
fused QKV comes out as ``linear_q``/``linear_k``/``linear_v``, a SwiGLU
``linear_fc1`` as ``gate``/``up``, the padded vocabulary cut to its true size,
and layer numbers made global across pipeline stages. Region reads open only
the rank files whose shards overlap.

The optimizer (Megatron's mixed-precision optimizer, not the distributed one)
is keyed by parameter index; the index is mapped to the parameter as
Megatron's ``_get_param_groups`` builds the groups (``named_parameters`` order,
no weight decay for biases and 1-d tensors), checked against every state's
shape: ``<param>/fp32``, ``<param>/exp_avg``, ``<param>/exp_avg_sq``,
``<param>/step``. ``args`` (an ``argparse.Namespace``) is read as plain data.

>>> # with get_format("megatron").open_reader("checkpoints/gpt") as reader: ...
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, Callable, Iterator

import torch

from ucp.errors import FormatError
from ucp.formats.base import Format, TensorInfo, TrainingState, register_format
from ucp.formats.deepspeed.plain import to_plain
from ucp.formats.deepspeed.pt import load_pt
from ucp.formats.deepspeed.zero import json_value
from ucp.geometry import Box, Region
from ucp.layout import Layout

__all__ = ["MegatronReader", "program_params"]

TRACKER = "latest_checkpointed_iteration.txt"
RANK_DIR = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?(?:_(\d{3}))?$")
STATES = ("fp32", "exp_avg", "exp_avg_sq")


def _iteration_dir(path: str) -> str:
    tracker = os.path.join(path, TRACKER)
    if os.path.isfile(tracker):
        with open(tracker) as f:
            text = f.read().strip()
        name = "release" if text == "release" else f"iter_{int(text):07d}" if text.isdigit() else None
        if name is None or not os.path.isdir(os.path.join(path, name)):
            raise FormatError(f"{tracker} holds {text!r}, which names no iteration folder in {path}")
        return os.path.join(path, name)
    if any(RANK_DIR.match(n) for n in os.listdir(path)):
        return path
    raise FormatError(f"{path} is not a Megatron-LM checkpoint: no {TRACKER} and no mp_rank_XX folders")


def program_params(args: Any) -> dict:
    """The ``megatron-gpt`` preset's parameters from a checkpoint's ``args``."""

    def arg(name: str, default: Any = None) -> Any:
        return getattr(args, name, default)

    heads = arg("num_attention_heads")
    if not arg("num_layers") or not heads or not arg("hidden_size") or not arg("ffn_hidden_size"):
        raise FormatError(
            "the checkpoint's args lack num_layers/num_attention_heads/hidden_size/ffn_hidden_size; "
            "pass program= explicitly"
        )
    if arg("decoder_first_pipeline_num_layers") or arg("decoder_last_pipeline_num_layers"):
        raise FormatError(
            "uneven pipeline stages (decoder_first/last_pipeline_num_layers) need an explicit "
            "program with stage_layers_list"
        )
    padded = arg("padded_vocab_size")
    sizes = {"hidden_size": arg("hidden_size"), "ffn_hidden_size": arg("ffn_hidden_size")}
    sizes.update({k: arg(k) for k in ("kv_channels", "moe_ffn_hidden_size") if arg(k)})  # else the preset derives them
    return {
        "num_layers": arg("num_layers"),
        "heads": heads,
        "kv_heads": arg("num_query_groups") if arg("group_query_attention") else heads,
        "vocab_size": arg("vocab_size") or padded,
        "vocab_multiple": arg("make_vocab_size_divisible_by", 128),
        "tie_embeddings": 0 if arg("untie_embeddings_and_output_weights", False) else 1,
        "num_experts": arg("num_experts") or 0,
        **sizes,
    }


class MegatronReader:
    """An opened Megatron-LM legacy checkpoint (see the module doc). Use as a context manager."""

    format = "megatron"

    def __init__(self, path: str | os.PathLike, *, program: Any = None) -> None:
        from ucp import ucl

        self.path = os.fspath(path)
        self.iter_dir = _iteration_dir(self.path)
        ranks: dict[tuple[int, int], str] = {}
        for name in sorted(os.listdir(self.iter_dir)):
            m = RANK_DIR.match(name)
            if not m:
                continue
            if m[3] is not None:
                raise FormatError(f"{self.iter_dir}/{name}: expert-parallel Megatron checkpoints are not supported")
            if os.path.isfile(os.path.join(self.iter_dir, name, "distrib_optim.pt")):
                raise FormatError(
                    f"{self.iter_dir}/{name}/distrib_optim.pt: the distributed optimizer's flat "
                    "buffers are not supported; load and save without --use-distributed-optimizer "
                    "in Megatron first"
                )
            ranks[(int(m[1]), int(m[2] or 0))] = os.path.join(self.iter_dir, name, "model_optim_rng.pt")
        if not ranks:
            raise FormatError(f"{self.iter_dir} holds no mp_rank_XX folders")
        tp, pp = max(t for t, _ in ranks) + 1, max(p for _, p in ranks) + 1
        missing = [(t, p) for t in range(tp) for p in range(pp) if (t, p) not in ranks]
        if missing:
            raise FormatError(f"{self.iter_dir}: the files of tensor/pipeline rank(s) {missing} are missing")
        self.layout = Layout(tp=tp, pp=pp)
        self.files = {self.layout.rank_of(tp=t, pp=p): f for (t, p), f in ranks.items()}
        self._open: dict[int, dict] = {}
        self._local_cache: dict[int, dict[str, torch.Tensor]] = {}
        first = self._state(0)
        self.args = first.get("args")
        self.program = ucl.load_program(program or "megatron-gpt", **({} if program else program_params(self.args)))
        self._pieces: dict[str, list[tuple[int, str, Region, Region]]] = {}
        self._logical_of: dict[tuple[int, str], list[str]] = {}
        self.logical: dict[str, Any] = {}
        for rank in sorted(self.files):
            self._map_rank(rank)

    # --- files ------------------------------------------------------------------------------------------
    def _state(self, rank: int) -> dict:
        if rank not in self._open:
            state = load_pt(self.files[rank], allow=("_io.BytesIO",))  # Transformer Engine's _extra_state
            if not isinstance(state, dict) or "model" not in state and "model0" not in state:
                raise FormatError(f"{self.files[rank]} holds no 'model': not a Megatron checkpoint file")
            self._open[rank] = state
        return self._open[rank]

    def _local(self, rank: int) -> dict[str, torch.Tensor]:
        """The rank's model tensors under the program's local keys (model/<name>, optim/<state>/model/<name>)."""
        state = self._state(rank)
        chunks = [k for k in state if re.fullmatch(r"model\d*", k)]
        local: dict[str, torch.Tensor] = {}
        for chunk in chunks:
            prefix = "model" if chunk == "model" else f"model{chunk[5:]}"
            for key, value in (state[chunk] or {}).items():
                if isinstance(value, torch.Tensor):
                    local[f"{prefix}/{key}"] = value
        local.update(self._optimizer_local(rank, local))
        return local

    def _optimizer_local(self, rank: int, model: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        opt = self._state(rank).get("optimizer")
        if not opt:
            return {}
        inner = opt.get("optimizer", opt)
        groups, state = inner.get("param_groups") or [], inner.get("state") or {}
        masters = opt.get("fp32_from_fp16_params")
        params = [k for k, t in model.items() if not k.rsplit(".", 1)[-1].startswith("_")]
        by_group = _megatron_groups(params, model, groups, self.files[rank])
        out: dict[str, torch.Tensor] = {}
        for g, (group, names) in enumerate(zip(groups, by_group, strict=True)):
            for j, (index, name) in enumerate(zip(group["params"], names, strict=True)):
                entry = state.get(index, {})
                for key in ("exp_avg", "exp_avg_sq"):
                    if key in entry:
                        _check_shape(entry[key], model[name], f"{self.files[rank]}: state {index} {key}")
                        out[f"optim/{key}/{name}"] = entry[key]
                if isinstance(entry.get("step"), torch.Tensor):
                    out[f"optim/step/{name}"] = entry["step"]
                if masters is not None:
                    _check_shape(masters[g][j], model[name], f"{self.files[rank]}: fp32 master {g}.{j}")
                    out[f"optim/fp32/{name}"] = masters[g][j]
        return out

    def _map_rank(self, rank: int) -> None:
        from ucp import ucl

        local = self._local(rank)
        has_fp32 = any(k.startswith("optim/fp32/") for k in local)
        params = {} if has_fp32 else {"states": ["exp_avg", "exp_avg_sq"]}
        shapes = {k: (tuple(t.shape), str(t.dtype).removeprefix("torch.")) for k, t in local.items()}
        try:
            fmap = ucl.spec_for_save(self.program, self.layout, rank, shapes, params=params)
        except ucl.UclError as err:
            raise FormatError(
                f"{self.files[rank]}: the {self.program} program does not describe this file: {err}"
            ) from None
        for key, spec in fmap.tensors.items():
            for piece in spec.pieces:
                self._pieces.setdefault(piece.logical, []).append((rank, key, piece.local, piece.target))
                if piece.logical not in self._logical_of.setdefault((rank, key), []):
                    self._logical_of[(rank, key)].append(piece.logical)
        for name, info in fmap.logical.items():
            self.logical.setdefault(name, info)

    # --- tensors ------------------------------------------------------------------------------------------
    def _reader(self, name: str) -> Callable[[Region | None], torch.Tensor]:
        info = self.logical[name]
        seen: set = set()
        runs = []
        for rank, key, local, target in self._pieces[name]:
            if (str(target)) in seen:  # a replica (the tied output layer of the last stage)
                continue
            seen.add(str(target))
            runs.append((rank, key, local, target))
        covered = sum(math.prod(t.sizes) if isinstance(t, Box) else t.numel for *_, t in runs)
        if covered != math.prod(info.shape):
            raise FormatError(
                f"{self.iter_dir}: the shards cover {covered} of the {math.prod(info.shape)} elements of {name}"
            )
        dtype = getattr(torch, info.dtype)

        def read(region: Region | None) -> torch.Tensor:
            target_box = Box.full(info.shape) if region is None else region
            if not isinstance(target_box, Box):
                whole = read(None)
                return whole.reshape(-1)[target_box.start : target_box.stop].clone()
            out = torch.empty(target_box.sizes, dtype=dtype)
            for rank, key, local, target in runs:
                # Megatron's files hold whole parameter shards: the program maps them box to box.
                assert isinstance(local, Box) and isinstance(target, Box), "box pieces only"
                overlap = target.intersect(target_box)
                if overlap is None:
                    continue
                source = self._local_tensor(rank, key)
                src_box = local.shifted(tuple(o - t for o, t in zip(overlap.offsets, target.offsets, strict=True)))
                src_box = Box(src_box.offsets, overlap.sizes)
                out[overlap.relative_to(target_box).slices()] = source[src_box.slices()]
            return out

        return read

    def _local_tensor(self, rank: int, key: str) -> torch.Tensor:
        return self._rank_tensors(rank)[key]

    def _rank_tensors(self, rank: int) -> dict[str, torch.Tensor]:
        if rank not in self._local_cache:
            self._local_cache[rank] = self._local(rank)
        return self._local_cache[rank]

    def tensors(self) -> Iterator[TensorInfo]:
        for name, info in self.logical.items():
            yield TensorInfo(name, info.dtype, tuple(info.shape), self._reader(name))

    def state(self) -> TrainingState:
        first = self._state(0)

        def tensor_ref(t: torch.Tensor, where: str) -> Any:
            return {
                "dtype": str(t.dtype).removeprefix("torch."),
                "shape": list(t.shape),
                "values": t.reshape(-1).tolist(),
            }

        rng = {
            f"tp{c.tp}_pp{c.pp}": to_plain(self._state(r).get("rng_state"), tensor=tensor_ref)
            for r in sorted(self.files)
            for c in [self.layout.coords(r)]
        }
        extra = {
            "format": self.format,
            "tp": self.layout.tp,
            "pp": self.layout.pp,
            "program": str(self.program),
            "megatron": {
                k: to_plain(v, tensor=tensor_ref)
                for k, v in first.items()
                if k not in ("model", "optimizer", "rng_state") and not re.fullmatch(r"model\d+", k)
            },
        }
        iteration = first.get("iteration")
        return TrainingState(
            step=iteration if isinstance(iteration, int) else None,
            param_groups=self._param_groups(),
            rng=rng,
            extra=extra,
        )

    def _param_groups(self) -> tuple[dict, ...]:
        """Every rank's groups, matched by their hyper-parameters (each rank numbers its groups in the order
        its own first parameters meet them), with the logical names of their parameters."""
        merged: dict[str, dict] = {}
        for rank in sorted(self.files):
            opt = self._state(rank).get("optimizer") or {}
            groups = opt.get("optimizer", opt).get("param_groups") or []
            model = {k: t for k, t in self._rank_tensors(rank).items() if k.startswith("model")}
            params = [k for k in model if not k.rsplit(".", 1)[-1].startswith("_")]
            for group, keys in zip(groups, _megatron_groups(params, model, groups, self.files[rank]), strict=True):
                hyper = {k: json_value(v) for k, v in group.items() if k != "params"}
                entry = merged.setdefault(repr(sorted(hyper.items())), {**hyper, "params": []})
                for key in keys:
                    entry["params"] += [n for n in self._logical_of.get((rank, key), ()) if n not in entry["params"]]
        return tuple(merged.values())

    def close(self) -> None:
        self._open.clear()
        self._local_cache.clear()

    def __enter__(self) -> "MegatronReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _check_shape(tensor: Any, param: torch.Tensor, where: str) -> None:
    if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != tuple(param.shape):
        raise FormatError(
            f"{where} has shape {tuple(getattr(tensor, 'shape', ()))} but its parameter "
            f"{tuple(param.shape)}: the optimizer's parameter order is not Megatron's default "
            "(named_parameters, no weight decay for biases and 1-d tensors)"
        )


def _megatron_groups(
    params: list[str], model: dict[str, torch.Tensor], groups: list[dict], where: str
) -> list[list[str]]:
    """The parameters of each optimizer group, as Megatron's ``_get_param_groups`` orders them."""
    wanted = []
    for group in groups:
        wd = group.get("wd_mult", 1.0 if group.get("weight_decay", 0.0) else 0.0)
        wanted.append(wd != 0.0)
    out: list[list[str]] = [[] for _ in groups]
    for name in params:
        no_wd = name.endswith(".bias") or model[name].dim() == 1
        matches = [g for g, decay in enumerate(wanted) if decay != no_wd and len(out[g]) < len(groups[g]["params"])]
        if not matches:
            raise FormatError(
                f"{where}: parameter {name.partition('/')[2]} fits no optimizer param group; the groups "
                "are not Megatron's default (decay / no decay)"
            )
        out[matches[0]].append(name)
    for g, group in enumerate(groups):
        if len(out[g]) != len(group["params"]):
            raise FormatError(
                f"{where}: optimizer group {g} lists {len(group['params'])} parameters, the model "
                f"gives it {len(out[g])}"
            )
    return out


def _detect(path: str) -> bool:
    if not os.path.isdir(path):
        return False
    if os.path.isfile(os.path.join(path, TRACKER)):
        return True
    return any(
        RANK_DIR.match(n) and os.path.isfile(os.path.join(path, n, "model_optim_rng.pt")) for n in os.listdir(path)
    )


FORMAT = register_format(
    Format(
        name="megatron",
        description="Megatron-LM legacy checkpoint (latest_checkpointed_iteration.txt, iter_N/mp_rank_XX[_YYY]/"
        "model_optim_rng.pt), merged with the megatron-gpt UCL preset",
        detect=_detect,
        open_reader=MegatronReader,
    )
)
