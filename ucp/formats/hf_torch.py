"""Hugging Face PyTorch-weights folders (``pytorch_model.bin``, or shards and their index), in.

Many models on the Hub and most older fine-tunes are saved by ``save_pretrained(...,
safe_serialization=False)``: a folder holding ``pytorch_model.bin`` (one ``torch.save`` file of a
flat state dict), or shards ``pytorch_model-00001-of-0000N.bin`` listed by
``pytorch_model.bin.index.json`` (``{"metadata": {...}, "weight_map": {name: shard file}}``).
Each file is read by :class:`ucp.formats.torch_file.TorchFileReader` (the restricted unpickler:
nothing in a file runs; tensors are read lazily by region), and the folder is checked on open:
every name of the weight map must be in the shard it names, every shard tensor must be in the
weight map, and a name may live in one shard only - a mismatch is a :class:`FormatError`, never a
tensor silently missing or picked from the wrong file. Writing goes out as ``safetensors``
(what ``from_pretrained`` prefers) or ``torch``.

>>> import json, os, tempfile, torch
>>> folder = tempfile.mkdtemp()
>>> torch.save({"lm_head.weight": torch.eye(2)}, os.path.join(folder, "pytorch_model.bin"))
>>> with HfTorchReader(folder) as r:
...     [(t.name, t.shape) for t in r.tensors()]
[('lm_head.weight', (2, 2))]
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterator

from ucp.errors import FormatError
from ucp.formats.base import Format, TensorInfo, TrainingState, register_format
from ucp.formats.torch_file import TorchFileReader

__all__ = ["HfTorchReader", "FORMAT"]

SINGLE_NAME = "pytorch_model.bin"
INDEX_NAME = "pytorch_model.bin.index.json"
MAX_INDEX_BYTES = 64 << 20  # a weight map of a 1T-parameter model is a few MB


def _load_index(path: str) -> dict[str, str]:
    """The index's weight map, checked to be ``{name: plain file name in this folder}``."""
    if os.path.getsize(path) > MAX_INDEX_BYTES:
        raise FormatError(f"{path} is larger than {MAX_INDEX_BYTES >> 20} MiB; not a weight index")
    try:
        with open(path, encoding="utf-8") as fh:
            index = json.load(fh)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise FormatError(f"{path} is not valid JSON ({err}); the index is damaged") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise FormatError(f'{path} has no weight_map (expected {{"weight_map": {{name: shard file}}}})')
    for name, file in weight_map.items():
        if not isinstance(file, str) or os.path.basename(file) != file or file in ("", ".", ".."):
            raise FormatError(f"{path}: weight_map puts {name!r} in {file!r}, which is not a file name in the folder")
    return weight_map


class HfTorchReader:
    """A ``pytorch_model.bin`` folder (one file or index + shards) opened for region reads."""

    format = "hf-torch"

    def __init__(self, path: str) -> None:
        self.path = os.fspath(path)
        index_path = os.path.join(self.path, INDEX_NAME)
        weight_map = _load_index(index_path) if os.path.isfile(index_path) else None
        files = sorted(set(weight_map.values())) if weight_map is not None else [SINGLE_NAME]
        if weight_map is not None:  # a shard the index forgot would be dropped without a word: refuse instead
            stray = sorted(
                n
                for n in os.listdir(self.path)
                if n.startswith("pytorch_model") and n.endswith(".bin") and n not in files
            )
            if stray:
                raise FormatError(
                    f"{self.path}: {stray[0]} is not named by {INDEX_NAME}; the index does not match the shards"
                )
        self._readers: list[TorchFileReader] = []
        self._where: dict[str, TorchFileReader] = {}
        try:
            for file in files:
                full = os.path.join(self.path, file)
                if not os.path.isfile(full):
                    raise FormatError(f"{self.path}: shard {file!r} named by {INDEX_NAME} is missing")
                reader = TorchFileReader(full)
                self._readers.append(reader)
                for info in reader.tensors():
                    if info.name in self._where:
                        raise FormatError(
                            f"{self.path}: tensor {info.name!r} is in both "
                            f"{os.path.basename(self._where[info.name].path)} and {file}"
                        )
                    if weight_map is not None and weight_map.get(info.name) != file:
                        raise FormatError(
                            f"{self.path}: {file} holds {info.name!r}, which {INDEX_NAME} "
                            f"{'puts in ' + repr(weight_map[info.name]) if info.name in weight_map else 'does not list'}; "
                            "the index does not match the shards"
                        )
                    self._where[info.name] = reader
            missing = sorted(set(weight_map or ()) - set(self._where))
            if missing:
                raise FormatError(
                    f"{self.path}: {INDEX_NAME} lists {len(missing)} tensors no shard holds "
                    f"(first: {missing[0]!r}); the index does not match the shards"
                )
        except BaseException:
            self.close()
            raise

    def tensors(self) -> Iterator[TensorInfo]:
        for reader in self._readers:
            yield from reader.tensors()

    def state(self) -> TrainingState:
        # HF weight files hold weights only; a shard's own non-tensor entries (rare) come from the first.
        return self._readers[0].state() if self._readers else TrainingState()

    def close(self) -> None:
        for reader in self._readers:
            reader.close()

    def __enter__(self) -> "HfTorchReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def detect(path: str) -> bool:
    return os.path.isdir(path) and (
        os.path.isfile(os.path.join(path, INDEX_NAME)) or os.path.isfile(os.path.join(path, SINGLE_NAME))
    )


FORMAT = register_format(
    Format(
        name="hf-torch",
        description="Hugging Face PyTorch weights folder (pytorch_model.bin, or shards + pytorch_model.bin.index.json)",
        detect=detect,
        open_reader=HfTorchReader,
        open_writer=None,
    )
)
