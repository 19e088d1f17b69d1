"""The I/O tuning of a store: one frozen value instead of module globals.

Every number here changes speed and memory, never what a load returns
(``pack_align`` is recorded implicitly in each pack's offsets, which readers
take from the manifest; ``metadata_shard_min_ranks`` picks one manifest or a
sharded one, and readers read both). A save or load takes one ``StoreOptions``; tests pick
an I/O path by passing one instead of patching private globals::

    >>> opts = StoreOptions.parse("chunk_bytes=64,pack_max_bytes=0")
    >>> opts.chunk_bytes, opts.pack_max_bytes, opts.io_threads
    (64, 0, 0)
    >>> StoreOptions.from_dict(opts.to_dict()) == opts
    True
    >>> str(opts)
    'chunk_bytes=64,pack_max_bytes=0'
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from ucp.errors import InvalidArgumentError

__all__ = ["StoreOptions", "DEFAULT_OPTIONS"]


@dataclass(frozen=True, kw_only=True)
class StoreOptions:
    """How a store moves bytes (defaults: measured on local NVMe and tmpfs, docs/BENCHMARKS.md)."""

    # Arrays of one chunk up to this size are written and read as plain files, without
    # tensorstore: opening a tensorstore costs ~0.3 ms, which dominates for the thousands
    # of biases and norms of a model. -1 sends every array through the chunked path.
    small_array_bytes: int = 4 << 20
    # Target bytes per chunk: large, so a partial read touches few chunk files, and
    # bounded, so a read buffer (one chunk) stays small next to a shard.
    chunk_bytes: int = 32 << 20
    # Threads that write, read and fsync packs and chunk files: I/O overlaps, and hashing with it.
    # 0: from the machine (``threads``): a thread per core hashes and copies at memory speed, at
    # least 4 keep a disk's queue full, at most 16.
    io_threads: int = 0
    # Plain chunk writes go in pieces this big, each hashed right before it is written.
    write_piece_bytes: int = 1 << 20
    # Fragments up to this size (by default: all) go into a few large pack files per rank,
    # each closed once it holds pack_target_bytes (docs/FORMAT.md, "Packs"): a rank writes
    # and fsyncs a few files instead of one or more per fragment. 0 gives every fragment its own array.
    pack_max_bytes: int = 1 << 40
    pack_target_bytes: int = 1 << 30
    pack_align: int = 64
    # Writes kept in flight: enough to keep the disk busy with many small tensors, few enough
    # that buffers of writes stay bounded (every in-flight byte counts, copied or not).
    max_inflight: int = 64
    max_inflight_bytes: int = 64 << 20
    # Chunks read ahead within one copy; whole-fragment reads in flight at once (0: twice ``threads``).
    prefetch_chunks: int = 2
    reads_in_flight: int = 0
    # Bytes of packs a reader keeps (least recently used dropped first; the newest is always
    # kept). A rank loading under another layout takes each tensor's pieces from several source
    # ranks' packs in turn: with one pack kept, every switch re-read a whole pack (~16 MiB) for
    # one small tensor. Four packs of the writer's 16 MiB target fit.
    pack_cache_bytes: int = 64 << 20
    # Rows of a partial copy go through the read buffer in slabs of about this many bytes.
    slab_bytes: int = 64 << 20
    # A local store writes and reads chunk files itself (docs/FORMAT.md, section 8); False
    # sends its multi-chunk arrays through tensorstore, as on object stores.
    direct_writes: bool = True
    direct_reads: bool = True
    # Packs on a disk bypass the page cache (O_DIRECT through a page-aligned bounce buffer, hashed
    # there): half the CPU of a buffered write, which a loaded host pays in wall time. Never on a
    # memory file system (tmpfs has no device; the bounce copy would be all cost), and off where
    # the file system refuses O_DIRECT. A load right after such a save reads from the device.
    unbuffered_packs: bool = True
    # A save with a process group of at least this many ranks writes sharded metadata
    # (docs/FORMAT.md, section 9: a small root manifest and one shard per ~sqrt(W) ranks),
    # so no rank gathers every fragment and a loading rank reads only the shards it needs.
    metadata_shard_min_ranks: int = 64

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "bool":
                if not isinstance(value, bool):
                    raise InvalidArgumentError(f"StoreOptions.{f.name} must be True or False, got {value!r}")
                continue
            low = (
                -1
                if f.name == "small_array_bytes"
                else 0
                if f.name in ("pack_max_bytes", "prefetch_chunks", "io_threads", "reads_in_flight")
                else 1
            )
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidArgumentError(f"StoreOptions.{f.name} must be an integer >= {low}, got {value!r}")

    @property
    def threads(self) -> int:
        """The I/O threads: ``io_threads``, or for 0 one per core of this process, between 4 and 16.

        >>> StoreOptions(io_threads=3).threads
        3
        """
        if self.io_threads:
            return self.io_threads
        try:
            cores = len(os.sched_getaffinity(0))  # the cores this process may run on (a container's share)
        except AttributeError:  # not on Linux
            cores = os.cpu_count() or 1
        return min(16, max(4, cores))

    @property
    def reads_at_once(self) -> int:
        """Reads kept in flight: ``reads_in_flight``, or for 0 two per I/O thread."""
        return self.reads_in_flight or 2 * self.threads

    def with_(self, **changes: Any) -> "StoreOptions":
        """A copy with some fields changed (checked like the constructor)."""
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "StoreOptions":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidArgumentError(
                f"unknown store option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        return cls(**data)

    @classmethod
    def parse(cls, text: str) -> "StoreOptions":
        """``"chunk_bytes=64,direct_reads=false"`` (the fields that differ from the defaults)."""
        types = {f.name: f.type for f in fields(cls)}
        values: dict = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, sep, raw = item.partition("=")
            name = name.strip()
            if not sep or name not in types:
                raise InvalidArgumentError(
                    f"store option {item!r} is not NAME=VALUE with a known NAME ({', '.join(sorted(types))})"
                )
            raw = raw.strip()
            if types[name] == "bool":
                if raw.lower() not in ("true", "false"):
                    raise InvalidArgumentError(f"store option {name} must be true or false, got {raw!r}")
                values[name] = raw.lower() == "true"
            else:
                try:
                    values[name] = int(raw)
                except ValueError:
                    raise InvalidArgumentError(f"store option {name} must be an integer, got {raw!r}") from None
        return cls(**values)

    def __str__(self) -> str:
        default = DEFAULT_OPTIONS.to_dict()
        return ",".join(
            f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in self.to_dict().items() if v != default[k]
        )


DEFAULT_OPTIONS = StoreOptions()
