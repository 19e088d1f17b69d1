"""Format 2: a small root manifest that indexes metadata shards, read only as far as a load needs.

A save of many ranks (docs/FORMAT.md, section 9) writes one *metadata shard* per
group of about ``sqrt(W)`` ranks (their fragments and state trees) and a root
``manifest.json`` holding what every reader needs first: the logical tensors'
dtypes and shapes, for each tensor the shards that hold its fragments, and each
shard's size and digest. A rank that loads reads the root, then only the shards
of the tensors it asks for; each shard is checked against the root's digest
before it is parsed, and a tensor's fragments are checked (coverage, fit) as in
format 1 once they are gathered.

This module is the reading side: :func:`manifest_from_root` turns a parsed
root into a :class:`ucp.manifest.Manifest` whose ``tensors`` and ``states`` are
lazy mappings. Example (``read`` returns a shard's bytes by key)::

    manifest = manifest_from_root(json.loads(root_bytes), read=lambda key: store.read_file(key, ...))
    entry = manifest.tensors["layers.0.mlp.w1"]   # reads the shards holding that tensor, once
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ucp import checksum as _checksum
from ucp.errors import ManifestError
from ucp.manifest_json import SHARDED_FORMAT_VERSION, SHARDED_VERSIONS, checked_int, parse_json
from ucp.state_schema import check_state_tree

SHARD_DIGEST = "xxh3_64"  # shards are always digested, with or without tensor checksums
# A shard holds about sqrt(W) ranks' fragments: ~1 MB at 16k ranks. The limit only stops a hostile root.
MAX_SHARD_BYTES = 256 << 20
_KEY = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*\.json")


def shard_key(key_prefix: str, index: int) -> str:
    """Where the writer puts shard ``index``: beside the save's arrays (``data/<prefix>meta/g00003.json``).

    >>> shard_key("", 3), shard_key("5f2a/", 0)
    ('data/meta/g00003.json', 'data/5f2a/meta/g00000.json')
    """
    return f"data/{key_prefix}meta/g{index:05d}.json"


class ShardRef:
    """One shard as the root describes it: its key, the writer ranks ``[first, stop)``, size and digest."""

    __slots__ = ("key", "first", "stop", "nbytes", "digest")

    def __init__(self, key: str, first: int, stop: int, nbytes: int, digest: str) -> None:
        self.key, self.first, self.stop, self.nbytes, self.digest = key, first, stop, nbytes, digest

    def to_dict(self) -> dict:
        return {"key": self.key, "ranks": [self.first, self.stop], "nbytes": self.nbytes, SHARD_DIGEST: self.digest}


class ShardSource:
    """Reads, checks and keeps the shards of one checkpoint (each at most once)."""

    def __init__(self, shards: list[ShardRef], read: Callable[[str], bytes] | None, source: str) -> None:
        self.shards, self._read, self._source = shards, read, source
        self._parsed: dict[int, dict] = {}

    def shard_of_rank(self, rank: int) -> int:
        """The index of the shard holding writer rank ``rank``'s metadata (shards are consecutive ranges)."""
        low, high = 0, len(self.shards) - 1
        while low < high:
            mid = (low + high + 1) // 2
            if self.shards[mid].first <= rank:
                low = mid
            else:
                high = mid - 1
        return low

    def get(self, index: int) -> dict:
        found = self._parsed.get(index)
        if found is None:
            found = self._parsed[index] = self._load(index)
        return found

    def loaded(self) -> int:
        """How many shards have been read so far (a load should read only the ones it needs)."""
        return len(self._parsed)

    def _load(self, index: int) -> dict:
        ref = self.shards[index]
        if self._read is None:
            raise ManifestError(
                f"{self._source} is a sharded root (format {SHARDED_FORMAT_VERSION}) and was parsed without its "
                "store; open the checkpoint with ucp.commit.read_manifest(store) to read its shards"
            )
        try:
            data = self._read(ref.key)
        except FileNotFoundError:
            raise ManifestError(
                f"metadata shard {ref.key} (ranks {ref.first}..{ref.stop - 1}) named by {self._source} is missing; "
                "the checkpoint is damaged - restore the file or load an older checkpoint"
            ) from None
        found = _checksum.digest(data)
        if len(data) != ref.nbytes or found != ref.digest:
            raise ManifestError(
                f"metadata shard {ref.key} has {len(data)} bytes with {SHARD_DIGEST} {found}, but {self._source} "
                f"recorded {ref.nbytes} bytes with {ref.digest}; the shard is damaged or from another save - "
                "load an older checkpoint"
            )
        shard = parse_json(data, source=ref.key)
        return _check_shard(shard, ref)


def _check_shard(shard: Any, ref: ShardRef) -> dict:
    where = f"metadata shard {ref.key}"
    if not isinstance(shard, dict):
        raise ManifestError(f"{where}: expected a JSON object at the top level")
    if shard.get("format_version") not in SHARDED_VERSIONS or shard.get("ranks") != [ref.first, ref.stop]:
        raise ManifestError(
            f"{where} does not describe ranks {ref.first}..{ref.stop - 1} of a sharded "
            f"(format {' or '.join(map(str, SHARDED_VERSIONS))}) checkpoint; the checkpoint is damaged"
        )
    tensors, states = shard.get("tensors"), shard.get("states")
    if not isinstance(tensors, dict) or not all(isinstance(v, list) for v in tensors.values()):
        raise ManifestError(f"{where}: field 'tensors' must map tensor names to lists of fragments")
    if not isinstance(states, dict):
        raise ManifestError(f"{where}: field 'states' must be an object")
    for fragments in tensors.values():
        for frag in fragments:
            rank = frag.get("rank") if isinstance(frag, dict) else None
            if type(rank) is not int or not ref.first <= rank < ref.stop:
                raise ManifestError(
                    f"{where} holds a fragment of rank {rank!r}, outside its ranks "
                    f"{ref.first}..{ref.stop - 1}; the checkpoint is damaged"
                )
    return shard


class ShardedTensors(Mapping):
    """Logical tensor name -> :class:`~ucp.manifest.TensorEntry`, each built from its shards on first use."""

    def __init__(
        self,
        index: dict[str, tuple[str, tuple[int, ...], tuple[int, ...]]],
        shards: ShardSource,
        parse_entry: Callable[[str, dict, str], Any],
        problems: list | None = None,
    ) -> None:
        self._index, self._shards, self._parse_entry = index, shards, parse_entry
        self._entries: dict[str, Any] = {}
        self._problems = problems

    @property
    def shards_read(self) -> int:
        """How many metadata shards this checkpoint's reads have needed so far."""
        return self._shards.loaded()

    def header(self, name: str) -> tuple[str, tuple[int, ...]]:
        """``(dtype, shape)`` of a tensor, from the root alone (KeyError if absent)."""
        dtype, shape, _ = self._index[name]
        return dtype, shape

    def __getitem__(self, name: str):
        found = self._entries.get(name)
        if found is None:
            dtype, shape, holders = self._index[name]
            fragments: list = []
            for index in holders:
                shard = self._shards.get(index)
                frags = shard["tensors"].get(name)
                if frags is None:
                    raise ManifestError(
                        f"metadata shard {self._shards.shards[index].key} holds no fragments of "
                        f"tensor {name!r}, which the root says it does; the checkpoint is damaged"
                    )
                fragments.extend(frags)
            source = ", ".join(self._shards.shards[i].key for i in holders) or "manifest.json"
            found = self._entries[name] = self._parse_entry(
                name, {"dtype": dtype, "shape": list(shape), "fragments": fragments}, source
            )
        return found

    def items(self):  # with problems: a damaged entry is recorded and skipped (ucp verify)
        if self._problems is None:
            return super().items()
        return list(self._good_items())

    def _good_items(self) -> Iterator[tuple[str, Any]]:
        problems = self._problems
        assert problems is not None, "items() reads with problems only when recording them"
        for name in self._index:
            try:
                yield name, self[name]
            except ManifestError as err:
                problems.append((name, err))

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def pack_extents(self, rank: int) -> dict[str, int]:
        """Pack key -> bytes its fragments reach, for every pack in the shard of writer ``rank``."""
        extents: dict[str, int] = {}
        for fragments in self._shards.get(self._shards.shard_of_rank(rank))["tensors"].values():
            for frag in fragments:
                offset, nbytes = frag.get("pack_offset"), frag.get("nbytes")
                if type(offset) is int and type(nbytes) is int:
                    extents[frag["key"]] = max(extents.get(frag["key"], 0), offset + nbytes)
        return extents


class ShardedStates(Mapping):
    """Writer rank -> state tree, read from the rank's shard on first use (``$same_as`` within a shard)."""

    def __init__(self, world_size: int, shards: ShardSource, checkpoint: str) -> None:
        self._world, self._shards, self._checkpoint = world_size, shards, checkpoint
        self._trees: dict[int, Any] = {}

    def __getitem__(self, rank: int) -> Any:
        if not isinstance(rank, int) or not 0 <= rank < self._world:
            raise KeyError(rank)
        if rank not in self._trees:
            index = self._shards.shard_of_rank(rank)
            ref = self._shards.shards[index]
            states = self._shards.get(index)["states"]
            tree = states.get(str(rank))
            if isinstance(tree, dict) and set(tree) == {"$same_as"}:
                other = tree["$same_as"]
                if type(other) is not int or not ref.first <= other < rank or str(other) not in states:
                    raise ManifestError(
                        f"metadata shard {ref.key}: states[{rank}] refers to {other!r}, which is not "
                        "a lower rank's tree in the shard; the checkpoint is damaged"
                    )
                return self[other]
            if str(rank) not in states:
                raise ManifestError(
                    f"metadata shard {ref.key} has no state tree of rank {rank}; the checkpoint is damaged"
                )
            check_state_tree(tree, where=f"state tree of {self._checkpoint}" + (f" (rank {rank})" if rank else ""))
            self._trees[rank] = tree
        return self._trees[rank]

    def __iter__(self) -> Iterator[int]:
        return iter(range(self._world))

    def __len__(self) -> int:
        return self._world

    def __contains__(self, rank: object) -> bool:
        return isinstance(rank, int) and 0 <= rank < self._world


def parse_shard_refs(data: Any, source: str, world_size: int) -> list[ShardRef]:
    """The root's ``shards`` list: consecutive rank ranges covering ``0..world_size-1``, safe relative keys."""
    if not isinstance(data, list) or not data:
        raise ManifestError(f"{source}: field 'shards' must be a non-empty list")
    refs, expected = [], 0
    for i, item in enumerate(data):
        where = f"{source}: shards[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("ranks"), list) or len(item["ranks"]) != 2:
            raise ManifestError(
                f"{where} must be an object with 'key', 'ranks' [first, stop], 'nbytes', '{SHARD_DIGEST}'"
            )
        key, digest = item.get("key"), item.get(SHARD_DIGEST)
        if not isinstance(key, str) or len(key) > 300 or not _KEY.fullmatch(key) or ".." in key.split("/"):
            raise ManifestError(f"{where}: field 'key' must be a relative path to a .json file, got {key!r:.80}")
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{16}", digest):
            raise ManifestError(f"{where}: field '{SHARD_DIGEST}' must be 16 lowercase hex digits")
        first = checked_int(item["ranks"][0], f"{where}: ranks[0]")
        stop = checked_int(item["ranks"][1], f"{where}: ranks[1]", high=world_size)
        if first != expected or stop <= first:
            raise ManifestError(
                f"{where} covers ranks {first}..{stop - 1}; shards must cover ranks "
                f"0..{world_size - 1} in order, from rank {expected}"
            )
        refs.append(
            ShardRef(
                key,
                first,
                stop,
                checked_int(item.get("nbytes"), f"{where}: field 'nbytes'", high=MAX_SHARD_BYTES),
                digest,
            )
        )
        expected = stop
    if expected != world_size:
        raise ManifestError(f"{source}: shards cover ranks 0..{expected - 1} of world_size {world_size}")
    return refs
