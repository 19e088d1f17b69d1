"""Streaming log input: files, directories, globs, ``.gz`` and stdin, in constant memory.

Files are read in 1 MiB binary blocks and split into lines in C; a block
that is clean UTF-8 text (the usual case) costs no per-line Python work
here. A gigabyte-long "line" (a core dump pasted into a log) is truncated to
the cap and costs no more memory than a block.
Binary garbage is skipped, over-long lines are truncated and undecodable
UTF-8 falls back to Latin-1; each repair is counted in :class:`InputCounters`.

Example::

    counters = InputCounters()
    for name, lineno, text in iter_lines(["/var/log/kern.log*"], counters=counters):
        ...
"""

from __future__ import annotations

import glob
import gzip
import io
import os
import sys
from collections.abc import Iterable, Iterator

from ucp.reliability.logs.errors import LogInputError
from ucp.reliability.logs.records import InputCounters

MAX_LINE_BYTES = 8192
_CHUNK = 1 << 16
_BLOCK = 1 << 20  # bytes read at a time; lines are split out of whole blocks
_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
# Control bytes other than tab/CR/LF/ESC: their presence marks a line as binary, not text.
_CONTROL = bytes(b for b in range(32) if b not in (9, 10, 13, 27)) + b"\x7f"


def expand_paths(paths: Iterable[str]) -> list[str]:
    """Files named by ``paths``: plain files, directories (recursively, sorted), globs, ``-``.

    >>> expand_paths(["-"])
    ['-']
    """
    found: list[str] = []
    for path in paths:
        if path == "-":
            found.append("-")
        elif os.path.isdir(path):
            for root, dirs, names in os.walk(path):
                dirs.sort()
                found.extend(os.path.join(root, n) for n in sorted(names) if not n.startswith("."))
        elif os.path.isfile(path):
            _refuse_binary(path)
            found.append(path)
        else:
            matches = sorted(p for p in glob.glob(path, recursive=True) if os.path.isfile(p))
            if not matches:
                raise LogInputError(f"no log files match {path!r}: not a file, directory or glob")
            for match in matches:
                _refuse_binary(match)
            found.extend(matches)
    return found


# Formats that are never logs: zip (torch.save, .npz, jars), pickle, ELF, gzip'd tar is read as text after gunzip.
_BINARY_MAGIC = (b"PK\x03\x04", b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05", b"\x7fELF", b"\x93NUMPY",
                 b"\x89HDF", b"\x89PNG")


def looks_binary(path: str) -> bool:
    """Whether a named file is binary data, not a log: a known binary format, or a first line of binary bytes."""
    try:
        stream = _open_binary(path)
        try:
            head = stream.read(8192)
        finally:
            stream.close()
    except (OSError, EOFError, gzip.BadGzipFile):
        return False  # unreadable files are reported where they are read
    if not head:
        return False
    if head.startswith(_BINARY_MAGIC):
        return True
    # a log may hold binary lines (skipped and counted), but it does not start with one
    return _is_binary(head.split(b"\n", 1)[0])


def _refuse_binary(path: str) -> None:
    if looks_binary(path):
        raise LogInputError(f"{path!r} is binary data, not a text log (e.g. a checkpoint or an archive); "
                            "pass log files (plain text or .gz)")


def is_compressed(path: str) -> bool:
    """Whether ``path`` is gzip (by name or magic bytes): such files are read whole, never split."""
    if path.endswith(".gz"):
        return True
    try:
        with open(path, "rb") as handle:
            return handle.read(2) == b"\x1f\x8b"
    except OSError:
        return False


def _open_binary(path: str):
    if path == "-":
        return sys.stdin.buffer
    raw = open(path, "rb")  # noqa: SIM115 - closed by the caller
    if path.endswith(".gz") or raw.peek(2)[:2] == b"\x1f\x8b":
        return io.BufferedReader(gzip.GzipFile(fileobj=raw), buffer_size=_CHUNK)
    return raw


def _seek_line_start(stream, start: int) -> int:
    """Position ``stream`` at the first line that starts at or after byte ``start``; returns that offset."""
    if start <= 0:
        return 0
    stream.seek(start - 1)
    skipped = 0
    while True:  # the line that straddles ``start`` belongs to the previous range
        chunk = stream.read(_CHUNK)
        if not chunk:
            return start - 1 + skipped
        nl = chunk.find(b"\n")
        if nl >= 0:
            offset = start - 1 + skipped + nl + 1
            stream.seek(offset)
            return offset
        skipped += len(chunk)


def _is_binary(raw: bytes) -> bool:
    if b"\x00" in raw:
        return True
    stripped = raw.translate(None, _CONTROL)
    return len(raw) - len(stripped) > max(2, len(raw) // 20)


def _decode(raw: bytes, counters: InputCounters) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        pass
    if _is_binary(raw):
        return None
    text = raw.decode("latin-1")
    # Latin-1 decodes anything; random bytes show up as a flood of symbols and C1 controls.
    odd = sum(1 for ch in text if ord(ch) >= 0x80)
    if odd > len(text) // 3:
        return None
    counters.encoding_fallback += 1
    return text


def _clean(raw: bytes, counters: InputCounters) -> str | None:
    """One line's bytes (newline removed) as text, or None when it is binary or blank (counted)."""
    if len(raw) >= MAX_LINE_BYTES:
        counters.truncated += 1
        raw = raw[:MAX_LINE_BYTES]
    if raw.isascii():
        if len(raw.translate(None, _CONTROL)) != len(raw) and _is_binary(raw):
            counters.binary_skipped += 1
            return None
        text = raw.decode("ascii")
    else:
        text = _decode(raw, counters)
        if text is None:
            counters.binary_skipped += 1
            return None
    text = text.rstrip("\r\n")
    if not text.strip():
        counters.empty += 1
        return None
    return text


def shape_key(text: str) -> bytes:
    """The key under which lines that differ only in their ASCII digits share one parse.

    >>> shape_key("pid=1234 on gpu-07") == shape_key("pid=9876 on gpu-31")
    True
    """
    return text.encode("utf-8", "surrogatepass").translate(_DIGITS_TO_ZERO)


def _slow_block(lines: list[bytes], counters: InputCounters) -> tuple[list, list]:
    texts = [_clean(raw, counters) for raw in lines]
    return texts, [None if t is None else shape_key(t) for t in texts]


def _fast_block(block: bytes, counters: InputCounters) -> tuple[list, list]:
    # The common case costs a few C-level passes over the whole block, nothing per line:
    # no control bytes, no CR, valid UTF-8, every line under the cap.
    if b"\r" not in block and len(block.translate(None, _CONTROL)) == len(block):
        try:
            text = block.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:
            keys = block.translate(_DIGITS_TO_ZERO).split(b"\n")
            if max(map(len, keys)) < MAX_LINE_BYTES:
                # Blank lines stay in, as "" (their key is b""): the consumer counts them.
                return text.split("\n"), keys
    return _slow_block(block.split(b"\n"), counters)


def _range_chunks(stream, start: int, end: int | None) -> Iterator[bytes]:
    """The bytes of the lines that start in [start, end): a range owns the line it cuts at its end."""
    position = _seek_line_start(stream, start)
    if end is not None and position >= end:
        return  # no line starts inside the range
    while end is None or position < end:
        chunk = stream.read(_BLOCK if end is None else min(_BLOCK, end - position))
        if not chunk:
            return
        position += len(chunk)
        yield chunk
    stream.seek(end - 1)
    if stream.read(1) == b"\n":
        return  # the range ends on a line boundary
    stream.seek(end)
    while True:  # the rest of the line that straddles ``end``
        chunk = stream.read(_CHUNK)
        if not chunk:
            return
        nl = chunk.find(b"\n")
        if nl >= 0:
            yield chunk[:nl + 1]
            return
        yield chunk


def iter_line_blocks(path: str, counters: InputCounters, *, start: int = 0,
                     end: int | None = None) -> Iterator[tuple[int, list, list]]:
    """``(first line number, texts, shape keys)`` per block of one file, read in big binary blocks.

    A text is None where a line was skipped (binary or blank, counted) and may be
    ``""`` or blank in a clean block (the consumer counts it as empty). Over-long
    lines are truncated to :data:`MAX_LINE_BYTES` and counted; memory stays bounded
    by the block size however long a line is. With ``start``/``end`` (plain files
    only) the lines that start in bytes [start, end) are read, numbered from 1.
    """
    stream = _open_binary(path)
    lineno = 0
    carry = b""
    dropping = False  # inside an over-long line: skip bytes until its newline
    try:
        chunks = _range_chunks(stream, start, end) if start or end is not None else iter(
            lambda: stream.read(_BLOCK), b"")
        for chunk in chunks:
            if dropping:
                nl = chunk.find(b"\n")
                if nl < 0:
                    continue
                chunk, dropping = chunk[nl + 1:], False
            cut = chunk.rfind(b"\n")
            if cut < 0:
                carry += chunk
                if len(carry) >= MAX_LINE_BYTES:  # a line longer than the cap: keep its head only
                    texts, keys = _slow_block([carry], counters)
                    lineno += 1
                    yield lineno, texts, keys
                    carry, dropping = b"", True
                continue
            block, carry = carry + chunk[:cut], chunk[cut + 1:]
            texts, keys = _fast_block(block, counters)
            yield lineno + 1, texts, keys
            lineno += len(texts)
        if carry:
            texts, keys = _fast_block(carry, counters)
            yield lineno + 1, texts, keys
            lineno += len(texts)
    except (OSError, EOFError, gzip.BadGzipFile) as err:
        counters.unreadable_files.append(f"{path}: {err}")
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
        counters.lines += lineno


def iter_blocks(paths: Iterable[str], *, counters: InputCounters) -> Iterator[tuple[str, int, list, list]]:
    """``(file, first line number, texts, shape keys)`` over every file ``paths`` names, streamed."""
    for path in expand_paths(paths):
        counters.files += 1
        try:
            for first, texts, keys in iter_line_blocks(path, counters):
                yield path, first, texts, keys
        except PermissionError as err:
            counters.unreadable_files.append(f"{path}: {err}")


def iter_lines(paths: Iterable[str], *, counters: InputCounters) -> Iterator[tuple[str, int, str]]:
    """(file, 1-based line number, text) over every file ``paths`` names, streamed; blank lines skipped."""
    for path, first, texts, _ in iter_blocks(paths, counters=counters):
        for lineno, text in enumerate(texts, start=first):
            if text is None:
                continue
            if not text.strip():
                counters.empty += 1
                continue
            yield path, lineno, text
