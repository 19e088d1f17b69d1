"""Reader for DeepSpeed pipeline checkpoints (``layer_XX-model_states.pt`` files), format ``deepspeed-pipeline``.

A ``PipelineModule`` saves each layer's state dict in its own file,
``layer_<index>[-model_<tp>]-model_states.pt``, keys relative to the layer;
every stage keeps an ``mp_rank_<stage>_model_states.pt`` without a module and,
with ZeRO (stage 1, or the bf16 optimizer), one optimizer file per
data-parallel rank and stage. The logical name of a layer's tensor is the
name DeepSpeed's engine gives it (``PipelineModule.named_parameters``):
``<index>.<key>``, and ``tied_modules.<tie>.<key>`` for a ``TiedLayerSpec``
layer, recognised by the names the stages' ``param_shapes`` and
``buffer_names`` list (a tied module saved by several layers is read from the
first). The optimizer states are read as for :mod:`ucp.formats.deepspeed.zero`,
every stage's partitions together; a tied weight trained in several stages is
read from the first stage that holds it.

>>> # with get_format("deepspeed-pipeline").open_reader("ckpt/") as reader: ...
"""

from __future__ import annotations

import os
from functools import partial
from typing import Iterator

from ucp.errors import FormatError
from ucp.formats.base import Format, TensorInfo, register_format
from ucp.formats.deepspeed.flat import read_dense
from ucp.formats.deepspeed.pt import load_pt_mapped
from ucp.formats.deepspeed.zero import DeepSpeedZeroReader, checkpoint_files, resolve_step_dir

__all__ = ["DeepSpeedPipelineReader", "layer_names"]


def layer_names(index: int, keys: list[str], known: set[str]) -> list[str]:
    """The engine's names for the tensors ``keys`` of layer ``index``, given the names the stages list.

    >>> layer_names(3, ["weight"], {"3.weight"})
    ['3.weight']
    >>> layer_names(0, ["weight", "pos"], {"tied_modules.embed.weight", "tied_modules.embed.pos", "1.bias"})
    ['tied_modules.embed.weight', 'tied_modules.embed.pos']
    """
    plain = [f"{index}.{k}" for k in keys]
    if not known or all(n in known for n in plain):
        return plain
    prefixes = {
        n[: n.index(".", len("tied_modules.")) + 1]
        for n in known
        if n.startswith("tied_modules.") and "." in n[len("tied_modules.") :]
    }
    matches = [p for p in sorted(prefixes) if all(p + k in known for k in keys)]
    if len(matches) == 1:
        return [matches[0] + k for k in keys]
    if len(matches) > 1:
        raise FormatError(
            f"layer {index}'s tensors {keys} fit several tied modules ({', '.join(matches)}); "
            "which one the layer file holds cannot be told from the checkpoint"
        )
    return plain


class DeepSpeedPipelineReader(DeepSpeedZeroReader):
    """An opened DeepSpeed pipeline checkpoint (see the module doc). Use as a context manager."""

    format = "deepspeed-pipeline"

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__(path)
        if any(tp for _, tp in self.files["layer"]):
            raise FormatError(
                f"{self.step_dir}: tensor-parallel pipeline layers (layer_XX-model_01-...) are not read "
                "directly; convert the folder with DeepSpeed's ds_to_universal first"
            )

    def _known_names(self) -> set[str]:
        known: set[str] = set()
        for states in self.model_states.values():
            known.update(n for group in states.get("param_shapes") or [] for n in group)
            known.update(states.get("buffer_names") or [])
            known.update((states.get("frozen_param_shapes") or {}).keys())
        return known

    def _model_tensors(self) -> Iterator[TensorInfo]:
        known = self._known_names()
        seen: dict[str, tuple] = {}
        for (index, _), path in sorted(self.files["layer"].items()):
            state, mapped = load_pt_mapped(path)
            if not isinstance(state, dict):
                raise FormatError(f"{path} is not a layer state dict")
            keys = list(state)
            for name, key in zip(layer_names(index, keys, known), keys, strict=True):
                tensor = state[key]
                if name in seen:  # a tied module saved by another layer too: the first copy
                    if seen[name] != tuple(tensor.shape):
                        raise FormatError(
                            f"{path}: {key} has shape {tuple(tensor.shape)} but {name} has "
                            f"{seen[name]} in an earlier layer file"
                        )
                    continue
                seen[name] = tuple(tensor.shape)
                yield TensorInfo(
                    name,
                    str(tensor.dtype).removeprefix("torch."),
                    tuple(tensor.shape),
                    partial(read_dense, tensor, mapped=mapped),
                )


def _detect(path: str) -> bool:
    if not os.path.isdir(path):
        return False
    files = checkpoint_files(resolve_step_dir(path))
    return bool(files["layer"]) and bool(files["optim"]) and bool(files["model"])


FORMAT = register_format(
    Format(
        name="deepspeed-pipeline",
        description="DeepSpeed pipeline checkpoint (layer_XX-model_states.pt per layer, ZeRO optimizer files per stage)",
        detect=_detect,
        open_reader=DeepSpeedPipelineReader,
    )
)
