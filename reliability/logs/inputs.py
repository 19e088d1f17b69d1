"""Streaming log input: files, directories, globs, ``.gz`` and stdin, in constant memory.

Lines are read as bytes with a length cap, so a file with a gigabyte-long
"line" (a core dump pasted into a log) costs no more memory than the cap.
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

from reliability.logs.errors import LogInputError
from reliability.logs.records import InputCounters

MAX_LINE_BYTES = 8192
_CHUNK = 1 << 16
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
            found.append(path)
        else:
            matches = sorted(p for p in glob.glob(path, recursive=True) if os.path.isfile(p))
            if not matches:
                raise LogInputError(f"no log files match {path!r}: not a file, directory or glob")
            found.extend(matches)
    return found


def _open_binary(path: str):
    if path == "-":
        return sys.stdin.buffer
    raw = open(path, "rb")  # noqa: SIM115 - closed by the caller
    if path.endswith(".gz") or raw.peek(2)[:2] == b"\x1f\x8b":
        return io.BufferedReader(gzip.GzipFile(fileobj=raw), buffer_size=_CHUNK)
    return raw


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


def iter_file_lines(path: str, counters: InputCounters) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) of one file; bad lines are counted and skipped or repaired."""
    stream = _open_binary(path)
    lineno = 0
    try:
        readline = stream.readline
        control = _CONTROL
        while True:
            raw = readline(MAX_LINE_BYTES)
            if not raw:
                break
            lineno += 1
            if raw[-1:] != b"\n" and len(raw) == MAX_LINE_BYTES:
                # Drain the rest of the over-long line without keeping it.
                counters.truncated += 1
                while True:
                    rest = readline(_CHUNK)
                    if not rest or rest[-1:] == b"\n":
                        break
            if raw.isascii():
                if len(raw.translate(None, control)) != len(raw) and _is_binary(raw):
                    counters.binary_skipped += 1
                    continue
                text = raw.decode("ascii")
            else:
                text = _decode(raw, counters)
                if text is None:
                    counters.binary_skipped += 1
                    continue
            text = text.rstrip("\r\n")
            if not text.strip():
                counters.empty += 1
                continue
            yield lineno, text
    except (OSError, EOFError, gzip.BadGzipFile) as err:
        counters.unreadable_files.append(f"{path}: {err}")
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
        counters.lines += lineno


def iter_lines(paths: Iterable[str], *, counters: InputCounters) -> Iterator[tuple[str, int, str]]:
    """(file, 1-based line number, text) over every file ``paths`` names, streamed."""
    for path in expand_paths(paths):
        counters.files += 1
        try:
            for lineno, text in iter_file_lines(path, counters):
                yield path, lineno, text
        except PermissionError as err:
            counters.unreadable_files.append(f"{path}: {err}")
