"""Convert a checkpoint from any readable format into any writable one, tensor by tensor, in bounded memory.

::

    import ucp
    ucp.convert("dcp/step_100", "hf/", dst_format="safetensors", memory_budget="4GiB")

The source's format is detected unless named; its reader lists the logical
tensors (no bytes read), the destination's writer is opened with that list and
the training state, and each tensor is read and written in turn. A tensor
larger than a quarter of the budget is read and written in row blocks
(:func:`ucp.formats.base.blocks`) when the writer takes tensors in parts (all
writers here do), so peak memory stays near the budget whatever the tensor
sizes: the piece being written, the next one being read in a background thread
(reading overlaps writing), and what the writer buffers (at most one more
block). A writer that needs whole tensors raises the bound to the budget plus
the largest tensor. Any error - a damaged source, a full disk - aborts the
writer: nothing appears at the destination, and an existing checkpoint there
(``overwrite=True``) stays as it was.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator, Mapping

from ucp.errors import UcpError

__all__ = ["convert", "ConvertResult", "ConversionError", "guess_format", "release_freed_memory"]

# Extensions that name a single-file format when --to is not given.
_SUFFIX_FORMATS = {".safetensors": "safetensors", ".pt": "torch", ".pth": "torch", ".bin": "torch", ".ckpt": "torch"}


class ConversionError(UcpError, ValueError):
    """The conversion asked for cannot be done as given (options that do not fit the formats)."""


@dataclass(frozen=True)
class ConvertResult:
    """What a conversion did."""

    src: str
    dst: str
    src_format: str
    dst_format: str
    tensors: int
    bytes: int
    largest_tensor: int
    memory_budget: int
    block_bytes: int
    seconds: float
    only: str | None = None
    left_out: tuple[str, ...] = ()  # tensors of the source not written (``only``)
    files: tuple[str, ...] = ()  # side files copied (config.json, tokenizer files)
    files_left_out: tuple[str, ...] = ()  # side files of the source the output format has no room for
    program: str | None = None  # the UCL program and its parameter values, in short form
    non_model_tensors: int = 0  # written tensors outside the model part (optimizer state, other roots)

    def to_dict(self) -> dict:
        return asdict(self)


def guess_format(dst: str) -> str:
    """The output format a destination path suggests: by extension, else ``ucp``.

    >>> guess_format("out/model.safetensors"), guess_format("x.pt"), guess_format("ckpt/step_5")
    ('safetensors', 'torch', 'ucp')
    """
    return _SUFFIX_FORMATS.get(os.path.splitext(os.fspath(dst).rstrip("/"))[1].lower(), "ucp")


def convert(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    src_format: str | None = None,
    dst_format: str | None = None,
    program: str | None = None,
    layout: str | None = None,
    memory_budget: int | str = "2GiB",
    overwrite: bool = False,
    options: Mapping[str, Any] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    only: str | None = None,
    hf_files: str | os.PathLike | None = None,
    params: Mapping[str, Any] | None = None,
) -> ConvertResult:
    """Convert the checkpoint at ``src`` into ``dst_format`` at ``dst`` (see the module doc).

    ``dst_format`` defaults to what ``dst`` suggests (``.safetensors``, ``.pt``...; else
    ``ucp``). ``program``/``layout`` (ucp output only) record a UCL program and the
    layout it shards for, and cut fragments along that layout's shards.
    ``options`` go to the writer (e.g. ``{"shard_size": "2GB"}`` for safetensors).
    ``progress(done_bytes, total_bytes, tensor_name)`` is called after each piece.

    ``only`` writes one part of the source, weights only (no training state): ``"model"``
    for the model's tensors, or a root such as ``"ema"`` whose prefix is stripped
    (:mod:`ucp.formats.selection`); ``left_out`` in the result names what was not written.
    A safetensors folder output gets the Hugging Face side files ``from_pretrained`` needs
    (config.json, generation config, tokenizer files) from ``hf_files`` (a folder), by
    default from ``src`` itself when it is such a folder. ``params`` are values for the
    program's parameters; those not given come from a ``config.json`` beside ``src`` (in
    it, or in the folder holding it) when there is one.

    >>> import torch, tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> torch.save({"w": torch.ones(3)}, os.path.join(d, "m.pt"))
    >>> r = convert(os.path.join(d, "m.pt"), os.path.join(d, "m.safetensors"))
    >>> r.src_format, r.dst_format, r.tensors
    ('torch', 'safetensors', 1)
    """
    from ucp.formats import TrainingState, detect_format, get_format, parse_size
    from ucp.formats.hf_files import SIDE_FILES, side_files
    from ucp.formats.readahead import read_ahead
    from ucp.formats.base import block_bytes_for
    from ucp.formats.selection import select_tensors
    from ucp.spec import LogicalTensor

    src, dst = os.fspath(src), os.fspath(dst)
    budget = parse_size(memory_budget)
    block = block_bytes_for(budget)
    fmt_out = get_format(dst_format or guess_format(dst))
    if fmt_out.open_writer is None:
        raise ConversionError(f"format {fmt_out.name!r} can be read but not written here")
    if (program is not None or layout is not None or params) and fmt_out.name != "ucp":
        raise ConversionError(
            f"--program/--layout describe how a ucp checkpoint is sharded; they do not apply to --to {fmt_out.name}"
        )
    if os.path.abspath(src.rstrip("/")) == os.path.abspath(dst.rstrip("/")):
        raise ConversionError(f"source and destination are the same path ({src}); write the result elsewhere")
    fmt_in = get_format(src_format) if src_format else detect_format(src)
    writer_options = dict(options or {})
    bound = None
    if program is not None:
        bound = bind_program(program, params, src)
    if fmt_out.name == "ucp" and (program is not None or layout is not None):
        writer_options.update(program=bound, layout=layout)
    files = side_files(hf_files) if hf_files is not None else side_files(src)
    if hf_files is not None and not files:
        raise ConversionError(f"{hf_files} holds none of the Hugging Face side files ({', '.join(SIDE_FILES[:3])}...)")
    started = time.perf_counter()
    with fmt_in.open_reader(src) as reader:
        infos, left_out = select_tensors(reader.tensors(), only, where=src)
        _check_names(infos, src)
        _check_repeats(infos, src, budget)
        state = reader.state() if only is None else TrainingState()
        total = sum(i.nbytes for i in infos)
        writer = fmt_out.open_writer(
            dst,
            tensors=[LogicalTensor(i.name, i.shape, i.dtype) for i in infos],
            overwrite=overwrite,
            block_bytes=block,
            state=state,
            **writer_options,
        )
        done = 0
        try:
            copied = _copy_side_files(writer, files, explicit=hf_files is not None, fmt=fmt_out.name)
            parts = hasattr(writer, "add_region")
            for info, box, piece in read_ahead(_pieces(infos, block if parts else None)):
                if box is None:
                    writer.add(info.name, piece)
                else:
                    writer.add_region(info.name, box, piece)  # type: ignore[attr-defined]  # optional: hasattr above
                done += piece.numel() * piece.element_size()
                del piece
                if done and info.nbytes >= 1 << 20:
                    release_freed_memory()
                if progress is not None:
                    progress(done, total, info.name)
            writer.set_state(state)
        except BaseException:
            writer.abort()
            raise
        writer.close()
    return ConvertResult(
        src=src,
        dst=dst,
        src_format=fmt_in.name,
        dst_format=fmt_out.name,
        tensors=len(infos),
        bytes=total,
        largest_tensor=max((i.nbytes for i in infos), default=0),
        memory_budget=budget,
        block_bytes=block,
        seconds=time.perf_counter() - started,
        only=only,
        left_out=left_out,
        files=copied,
        files_left_out=tuple(sorted(set(files) - set(copied))),
        program=None if bound is None else str(bound),
        non_model_tensors=sum("/" in i.name for i in infos),
    )


def bind_program(program: Any, params: Mapping[str, Any] | None, src: str) -> Any:
    """The UCL program with ``params``, the rest filled from a ``config.json`` beside ``src``; all must be set.

    Raises :class:`ucp.ucl.errors.UnboundNameError` listing every parameter still without a value.
    """
    from ucp.ucl.bind import load_program
    from ucp.ucl.errors import UnboundNameError
    from ucp.formats.hf_files import config_beside, config_params

    bound = load_program(program, **dict(params or {}))
    config = config_beside(src)
    if config is not None:
        unset = [n for n in bound.program.params if n not in bound.params]
        bound = load_program(bound, **config_params(config, unset))
    missing = bound.unset_params()
    if missing:
        where = f"{config} does not give them" if config else f"no config.json beside {src}"
        raise UnboundNameError(
            f"{bound.name}: {len(missing)} program parameter(s) without a value: {', '.join(missing)} ({where}); "
            "give each as params={NAME: VALUE} (--param NAME=VALUE on the command line), or put the model's "
            "config.json beside the source"
        )
    return bound


def _copy_side_files(writer: Any, files: Mapping[str, str], *, explicit: bool, fmt: str) -> tuple[str, ...]:
    """Copy the side files into the output when it is a folder that takes them (asked for: it must)."""
    if not files:
        return ()
    if not getattr(writer, "takes_files", False):
        if explicit:
            raise ConversionError(
                f"side files ({', '.join(files)}) go into a folder output; {fmt} output "
                f"{writer.path} has no room for them (write a safetensors folder)"
            )
        return ()
    for name, path in files.items():
        writer.add_file(name, path)
    return tuple(files)


def _pieces(infos: list, block: int | None) -> Iterator[tuple[Any, Any, Any]]:
    """``(info, box, tensor)`` for each block of each tensor (``box`` None: the whole tensor, to ``add``)."""
    from ucp.formats import blocks

    for info in infos:
        if block is not None and info.nbytes > block:
            for box in blocks(info.shape, info.dtype, block):
                yield info, box, info.read(box)
        else:
            yield info, None, info.read()


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's ``malloc_trim``, or None elsewhere."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> None:
    """Give freed heap pages back to the OS (glibc), so block after block does not grow the heap.

    glibc raises its mmap threshold once a large block is freed; later blocks of that size then
    come from the heap, and the heap keeps the freed pages (measured: +8 MiB per 8 MiB block).
    ``malloc_trim`` returns them; elsewhere this does nothing.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _check_repeats(infos: list, src: str, budget: int) -> None:
    """Refuse a view that repeats its storage (``expand()``) into more bytes than the memory budget: every
    format written here stores each element, so a few stored bytes could become terabytes on disk."""
    for info in infos:
        if info.stored is not None and info.stored.nbytes < info.nbytes > budget:
            raise ConversionError(
                f"{src}: tensor {info.name!r} is a view of {info.stored.nbytes} stored bytes presented as "
                f"{info.dtype}{list(info.shape)} ({info.nbytes} bytes, as expand() saves it); converting writes "
                f"every element: pass --memory-budget {info.nbytes} (or more) to allow it, or save it contiguous "
                "at the source"
            )


def _check_names(infos: list, src: str) -> None:
    seen: set[str] = set()
    for info in infos:
        if info.name in seen:
            raise ConversionError(f"{src}: two tensors are both named {info.name!r}")
        seen.add(info.name)
