"""The files beside the weights that ``from_pretrained`` needs: config, generation config, tokenizer.

A Hugging Face model folder is weights plus small files that say how to build the model and
its tokenizer. A conversion to a safetensors folder copies them (:func:`side_files` finds
them), and ``ucp convert --program`` fills a UCL program's parameters from ``config.json``
(:func:`config_params`). Only the names below are copied: they are data (JSON, text,
SentencePiece models); ``*.py`` files of remote-code models are never copied.

>>> import json, os, tempfile
>>> d = tempfile.mkdtemp()
>>> with open(os.path.join(d, "config.json"), "w") as fh:
...     json.dump({"hidden_size": 16, "tie_word_embeddings": True, "model_type": "llama"}, fh)
>>> sorted(side_files(d))
['config.json']
>>> config_params(os.path.join(d, "config.json"), ["hidden_size", "tie_word_embeddings", "vocab_size"])
{'hidden_size': 16, 'tie_word_embeddings': 1}
"""

from __future__ import annotations

import json
import os
from typing import Iterable

from ucp.errors import FormatError

__all__ = ["SIDE_FILES", "side_files", "config_beside", "config_params"]

CONFIG_NAME = "config.json"
SIDE_FILES = (
    CONFIG_NAME,
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.json",
    "chat_template.jinja",
    "preprocessor_config.json",
    "processor_config.json",
)
MAX_CONFIG_BYTES = 16 << 20


def side_files(folder: str | os.PathLike) -> dict[str, str]:
    """``{name: path}`` of the Hugging Face side files in ``folder`` (none for a file or a remote path)."""
    folder = os.fspath(folder)
    if "://" in folder or not os.path.isdir(folder):
        return {}
    return {name: path for name in SIDE_FILES if os.path.isfile(path := os.path.join(folder, name))}


def config_beside(src: str | os.PathLike) -> str | None:
    """The ``config.json`` beside a checkpoint: in it (a folder), else in the folder that holds it."""
    src = os.fspath(src).rstrip("/")
    if "://" in src:
        return None
    for folder in (
        (src, os.path.dirname(os.path.abspath(src))) if os.path.isdir(src) else (os.path.dirname(os.path.abspath(src)),)
    ):
        path = os.path.join(folder, CONFIG_NAME)
        if os.path.isfile(path):
            return path
    return None


def config_params(path: str, names: Iterable[str]) -> dict[str, int]:
    """The integer fields of a ``config.json`` among ``names`` (booleans as 0/1, as UCL reads them)."""
    if os.path.getsize(path) > MAX_CONFIG_BYTES:
        raise FormatError(f"{path} is larger than {MAX_CONFIG_BYTES >> 20} MiB; not a model config")
    try:
        with open(path, encoding="utf-8") as fh:
            config = json.load(fh)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise FormatError(f"{path} is not valid JSON ({err})") from None
    if not isinstance(config, dict):
        raise FormatError(f"{path} is not a JSON object; not a model config")
    out = {}
    for name in names:
        value = config.get(name)
        if isinstance(value, bool):
            out[name] = int(value)
        elif isinstance(value, int):
            out[name] = value
    return out
