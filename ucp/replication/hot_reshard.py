"""Resharding a committed checkpoint from memory into a new layout, peer to peer (collective).

After a failure the survivors hold the last committed checkpoint's arrays in their
replica tiers (:class:`~ucp.replication.replicas.ReplicaManager` keeps every rank's own
arrays and places replicas of them on peers). :func:`reshard_from_memory` runs on
every rank of the re-formed process group:

1. each rank checks the blobs it holds against the replica map's digests (a corrupt
   copy is dropped with a :class:`~ucp.replication.errors.ReplicaWarning`, never offered);
2. the ranks agree on the newest checkpoint any of them holds, and each one plans its
   new state as a load plan (:func:`ucp.load_plan.plan_load`) whose reads
   :func:`ucp.peer_plan.assign_holders` sends to its own arrays, then peers', then
   storage for what no survivor holds;
3. peers send exactly the requested regions (no whole tensors) in rounds of at most
   ``round_bytes`` (:func:`ucp.replication.replica_transfer.exchange`); the rest is read
   from the checkpoint, only those regions.

A held array is read in place: a fragment of a pack is a view of the held bytes, checked
against the manifest's checksums the first time a region of it is asked for (an array saved as
chunk files goes through :class:`ucp.reader.CheckpointReader` over an in-memory store), so every
chunk is checked either way, once. A message packs its regions with one copy each; a rank's own
regions never enter the exchange (a thread copies them while the exchange waits on peers).

    tree, report = reshard_from_memory(tiers, make_target, group=dist.group.WORLD)
"""

from __future__ import annotations

import functools
import math
import os
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ucp.replication.errors import ReplicaError, ReplicaWarning
from ucp.replication.replica_files import CheckpointFiles, split_blob
from ucp.replication.replica_map import ReplicaMap
from ucp.replication.replica_tiers import CheckpointMeta, ReplicaTier
from ucp.replication.replica_transfer import ROUND_BYTES, Transfer, exchange
from ucp.checksum import digest
from ucp.geometry import Box, FlatRange, region_pieces, region_shape
from ucp.manifest import Manifest
from ucp.errors import ChecksumError, UcpError
from ucp.load_plan import LoadPlan, plan_load
from ucp.peer_plan import Fetch, PeerPlan, assign_holders
from ucp.reader import CheckpointReader
from ucp.spec import FragmentMap
from ucp.stores import MemoryStore
from ucp.zarr_array import chunk_key

__all__ = ["HotLoadReport", "reshard_from_memory", "hand_over", "local_view", "held_arrays", "held_manifest"]

PACK_CHUNK = chunk_key((1,), 0)  # a pack array's only chunk file (its fragments' bytes, back to back)


@dataclass(frozen=True)
class HotLoadReport:
    """What one rank's reshard did: the checkpoint, elements by origin, bytes moved, phase seconds."""

    path: str
    step_tree: Any
    elements: dict[str, int]   # own / peer / storage
    sent_bytes: int
    received_bytes: int
    corrupt: tuple[str, ...]   # array keys of this rank's copies that failed their digest
    plan_s: float
    transfer_s: float
    storage_s: float
    in_place_bytes: int = 0    # of received_bytes, received straight into the target tensors


def held_arrays(tiers: Sequence[ReplicaTier], checkpoint: str, rmap: ReplicaMap) -> tuple[dict[str, bytes], list[str]]:
    """The blobs of ``checkpoint`` this rank holds whose digest matches the map, and the keys that did not."""
    good: dict[str, bytes] = {}
    bad: list[str] = []
    for tier in tiers:  # fastest first
        for key in tier.keys(checkpoint):
            if key in good or key not in rmap.arrays:
                continue
            blob = tier.get(checkpoint, key)
            if blob is not None and digest(blob) == rmap.arrays[key].digest:
                good[key] = blob
            else:
                bad.append(key)
                tier.discard(checkpoint, key)  # never offered again
    for key in bad:
        warnings.warn(f"replica of array {key!r} of {rmap.path} fails its checksum; it is dropped and the "
                      "region is taken from another copy or from storage", ReplicaWarning, stacklevel=3)
    return good, sorted(set(bad) - set(good))


class _HeldFragments:
    """The held arrays of one checkpoint, read in place: the fragments of a pack are views of the
    held bytes (no copy into another store, no decode), each checked against the manifest's
    checksums once, the first time a region of it is asked for.

    An array written as chunk files (saved with ``pack_max_bytes=0``) is read through a
    :class:`~ucp.reader.CheckpointReader` over an in-memory store holding those arrays only.
    """

    def __init__(self, manifest: Manifest, rmap: ReplicaMap, blobs: dict[str, bytes]) -> None:
        self.manifest = manifest
        self.rmap, self.blobs = rmap, blobs
        packed = {f.key for entry in manifest.tensors.values() for f in entry.fragments if f.pack_offset is not None}
        self.packs: dict[str, memoryview] = {}  # pack key -> its chunk's bytes (a view of the blob)
        for key in packed & blobs.keys():
            self.packs[key] = dict(split_blob(rmap.arrays[key], blobs[key]))[PACK_CHUNK]
        self.fragments: dict[tuple[str, int], torch.Tensor] = {}  # checked, in storage shape
        self.pieces: dict[tuple[str, int], list] = {}  # a flat fragment's boxes
        self._chunked: tuple[MemoryStore, CheckpointReader] | None = None
        self._opening = threading.Lock()  # chunk-file reads: the exchange and the own-copies thread

    def fragment(self, logical: str, index: int) -> torch.Tensor:
        """Fragment ``index`` of ``logical`` whole (an array this rank holds), checked once."""
        data = self.fragments.get((logical, index))
        if data is None:
            frag = self.manifest.tensors[logical].fragments[index]
            if frag.key in self.packs:
                data = self._packed(logical, frag)
            else:
                with self._opening:  # one reader for two threads (the exchange, the own copies)
                    data = self._reader().read_fragment(logical, frag)
            self.fragments[(logical, index)] = data
        return data

    def read(self, logical: str, index: int, box: Box) -> torch.Tensor:
        """``box`` (inside fragment ``index`` of ``logical``) as a view of the held fragment."""
        entry = self.manifest.tensors[logical]
        frag = entry.fragments[index]
        data = self.fragment(logical, index)
        if isinstance(frag.region, Box):
            return data[box.relative_to(frag.region).slices()] if box.ndim else data
        if (logical, index) not in self.pieces:
            self.pieces[(logical, index)] = region_pieces(frag.region, entry.shape)
        piece = next(p for p in self.pieces[(logical, index)] if p.box.contains(box))
        return data.view(-1)[piece.span.start:piece.span.stop].view(piece.box.sizes)[box.relative_to(piece.box).slices()]

    def _packed(self, logical: str, frag) -> torch.Tensor:
        dtype = _dtype(self.manifest.tensors[logical].dtype)
        shape = region_shape(frag.region)
        raw = self.packs[frag.key][frag.pack_offset:frag.pack_offset + frag.nbytes]
        if len(raw) != frag.nbytes:
            raise ChecksumError(f"tensor {logical!r}: the held copy of array {frag.key!r} ends before byte "
                                f"{frag.pack_offset + frag.nbytes} of fragment {frag.key!r} of rank {frag.rank}; "
                                "the copy is damaged: take the region from another copy or from storage")
        if frag.checksums:
            row = math.prod(shape[1:]) * dtype.itemsize if shape else dtype.itemsize
            step = frag.chunk_rows * row or len(raw) or 1
            for i, at in enumerate(range(0, max(len(raw), 1), step)):
                found = digest(raw[at:at + step])
                if i >= len(frag.checksums) or found != frag.checksums[i]:
                    raise ChecksumError(
                        f"checksum mismatch in tensor {logical!r}: the held copy of array {frag.key!r} bytes "
                        f"{frag.pack_offset + at}..{frag.pack_offset + min(at + step, len(raw))} (fragment of rank "
                        f"{frag.rank}, chunk {i}) has {found}, expected "
                        f"{frag.checksums[i] if i < len(frag.checksums) else 'no checksum'}; the copy is corrupt: "
                        "restore from storage (ucp.load) or an older checkpoint")
        # a read-only buffer (torch warns, once per process; nothing writes to it). No
        # warnings.catch_warnings here: adding a filter per fragment cost ~1 ms each (0.46 s at 1 GiB)
        flat = torch.frombuffer(raw, dtype=dtype) if frag.nbytes else torch.empty(0, dtype=dtype)
        return flat.view(shape)

    def _reader(self) -> CheckpointReader:
        if self._chunked is None:
            url = f"memory://ucp-hot-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            store = MemoryStore(url)
            for key, blob in self.blobs.items():
                if key not in self.packs:
                    for name, data in split_blob(self.rmap.arrays[key], blob):
                        store.write_bytes(f"data/{key}/{name}", bytes(data))
            self._chunked = (store, CheckpointReader(url, opened=(store, self.manifest)))
        return self._chunked[1]

    def close(self) -> None:
        self.fragments.clear()
        if self._chunked is not None:
            store, reader = self._chunked
            reader.close()
            try:
                store.fs.rm(store.root, recursive=True)
            except FileNotFoundError:
                pass


def local_view(tensor: torch.Tensor, fmap: FragmentMap, fetch: Fetch) -> torch.Tensor:
    """The view of ``tensor`` (local tensor ``fetch.dest_key``) that holds ``fetch.overlap``.

    The reader's rule: a local box holds the target box; a local flat run holds the target's
    storage (1-d for a flat range, the box's sizes for a box), where ``fetch.dst`` is the run.
    """
    piece = fmap.tensors[fetch.dest_key].pieces[fetch.piece]
    local, target = piece.local, piece.target
    if isinstance(local, Box):
        storage = tensor[local.slices()] if local.ndim else tensor
    else:
        storage = tensor.view(-1)[local.start:local.stop].view(region_shape(target))
    if isinstance(target, FlatRange):
        span = fetch.dst.span
        block = storage.view(-1)[span.start:span.stop].view(fetch.dst.box.sizes)
        return block[fetch.overlap.relative_to(fetch.dst.box).slices()]
    return storage[fetch.overlap.relative_to(target).slices()] if target.ndim else storage


def _raw(t: torch.Tensor):
    """The bytes of a contiguous tensor, in place (any dtype: bf16 has no numpy type, uint8 does)."""
    return t.reshape(-1).view(torch.uint8).numpy().data


def _copy_bytes(dest: torch.Tensor, source: torch.Tensor) -> None:
    """Copy between a typed tensor and a 1-d uint8 run holding its elements' bytes, either way:
    one copy, straight between the two (a misaligned run goes through an aligned copy)."""
    if dest.dtype == torch.uint8 and source.dtype != torch.uint8:  # packing a region into a message
        if dest.storage_offset() % source.itemsize == 0:
            dest.view(source.dtype).view(source.shape).copy_(source)
        else:
            dest.copy_(source.contiguous().reshape(-1).view(torch.uint8))
        return
    raw = source if source.storage_offset() % dest.itemsize == 0 else source.clone()
    dest.copy_(raw.view(dest.dtype).reshape(dest.shape))


def _gather(obj: Any, group) -> list:
    out: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def _agree(problem: str | None, group) -> None:
    _raise_first(_gather(problem, group), dist.get_rank(group))


def _raise_first(problems: list[str | None], rank: int) -> None:
    for r, text in enumerate(problems):
        if text:
            raise ReplicaError(text if r == rank else f"resharding from memory failed on rank {r}: {text}")


def _newest(tiers: Sequence[ReplicaTier], group, complete: Collection[str] | None = None) -> tuple[str, CheckpointMeta]:
    """The newest checkpoint any rank holds (by its replication generation), and its meta.

    ``complete``: the checkpoint paths this rank saw replicated on every rank (None: every held
    one counts); a checkpoint no rank lists is passed over, so a half-replicated one is never used.
    """
    mine = {}
    for tier in tiers:
        for ck in tier.checkpoints():
            meta = tier.get_meta(ck)
            if meta is not None and (complete is None or meta.path in complete):
                mine[ck] = meta.generation
    everyone = _gather(mine, group)
    known = {ck: gen for part in everyone for ck, gen in part.items()}
    if not known:
        raise ReplicaError("no surviving rank holds a completely replicated checkpoint in memory; restore from storage")
    ck = max(known, key=lambda c: (known[c], c))
    source = next(r for r, part in enumerate(everyone) if ck in part)
    box = [next(m for m in (t.get_meta(ck) for t in tiers) if m is not None) if dist.get_rank(group) == source else None]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, source) if group is not None else source, group=group)
    return ck, box[0]


def hand_over(tiers: Sequence[ReplicaTier], *, active: int, group=None, round_bytes: int = ROUND_BYTES,
              complete: Collection[str] | None = None) -> int:
    """Ranks ``active`` and up (about to leave the job) send the arrays of the newest held checkpoint
    that no rank below ``active`` holds to one that does not (spread over them), which keeps them
    in its first tier; a collective. Returns the bytes this rank received.

    For a stack whose new fragment maps exist only once the training ranks have formed a group
    of their own (DTensor meshes span the default group), so the leaving ranks cannot take part
    in the reshard itself. Only copies whose digest matches are handed over (:func:`held_arrays`).
    """
    world = dist.get_world_size(group)
    ck, meta = _newest(tiers, group, complete)
    rmap = ReplicaMap.from_json(meta.replica_map, source=f"replica map of {meta.path}")
    blobs, _ = held_arrays(tiers, ck, rmap)
    everyone = _gather({key: len(blob) for key, blob in blobs.items()}, group)
    staying = {key for part in everyone[:active] for key in part}
    transfers: list[Transfer] = []
    for source in range(active, world):
        for key, nbytes in sorted(everyone[source].items()):
            if key not in staying:
                staying.add(key)  # one copy is enough
                transfers.append(Transfer(source, len(transfers) % active, key, nbytes))
    received = [0]

    def deliver(t: Transfer, blob) -> None:
        if tiers[0].get_meta(ck) is None:
            tiers[0].put_meta(ck, meta)
        tiers[0].put(ck, t.key, bytes(blob))
        received[0] += t.nbytes

    problems = exchange(transfers, load=lambda t: blobs[t.key], deliver=deliver, group=group,
                        round_bytes=round_bytes)
    _agree("; ".join(problems) or None, group)
    return received[0]


def held_manifest(meta: CheckpointMeta) -> Manifest:
    """The manifest of a checkpoint held in memory, parsed (its metadata shards, if any, are read
    from the checkpoint when first used)."""
    return Manifest.from_json(meta.manifest, source=f"{meta.path}/manifest.json (held in memory)",
                              checkpoint=meta.path, read_shard=CheckpointFiles(meta.path).read_shard)


def reshard_from_memory(tiers: Sequence[ReplicaTier],
                        make_target: Callable[[dict], tuple[FragmentMap, dict[str, torch.Tensor]]], *,
                        group=None, round_bytes: int = ROUND_BYTES, alone_bytes: int | None = None,
                        complete: Collection[str] | None = None,
                        parsed: Mapping[str, tuple[bytes, Manifest]] | None = None,
                        ) -> tuple[Any, dict[str, torch.Tensor], FragmentMap, HotLoadReport]:
    """Fill this rank's new state from the newest checkpoint held in memory (collective; module doc).

    ``make_target(logical)`` returns this rank's load-direction fragment map and zeroed
    local tensors (``logical``: name -> LogicalTensor, from the held manifest); ``complete``: the
    checkpoint paths this rank knows are replicated everywhere (see :func:`_newest`); ``parsed``:
    manifests parsed ahead of a failure (path -> (manifest bytes, :func:`held_manifest`)), used
    where their bytes are the held ones; ``alone_bytes``: a region at least this large is a message
    of its own, sent from the held bytes and received into its target in place where both are
    contiguous (default :data:`ALONE_BYTES`). Returns the checkpoint's JSON tree for this rank, the
    filled tensors, the map and a report.
    """
    began = time.perf_counter()
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    ck, meta = _newest(tiers, group, complete)
    ready = (parsed or {}).get(meta.path)
    manifest = ready[1] if ready is not None and ready[0] == meta.manifest else held_manifest(meta)
    rmap = ReplicaMap.from_json(meta.replica_map, source=f"replica map of {meta.path}")
    blobs, corrupt = held_arrays(tiers, ck, rmap)
    index = {(name, frag.key, frag.region): i for name, entry in manifest.tensors.items()
             for i, frag in enumerate(entry.fragments)}  # as every rank numbers them
    logical = {n: _logical(manifest, n) for n in manifest.tensors}
    fmap, into = make_target(logical)
    load_plan, problem = _plan_reads(manifest, fmap, meta.path)
    # one round: who holds what, and whether every rank could plan (all refuse together, so none
    # is left waiting in a collective)
    everyone = _gather((sorted(blobs), problem), group)
    _raise_first([text for _, text in everyone], rank)
    assert load_plan is not None
    holders: dict[str, list[int]] = {}
    for r, (keys, _) in enumerate(everyone):
        for key in keys:
            holders.setdefault(key, []).append(r)
    plan: PeerPlan = assign_holders(load_plan, holders, rank, world)
    # Sources learn what to send: every rank's fetches, in one list all ranks agree on.
    asks = [(f.holder, f.logical, index[(f.logical, f.item.fragment.key, f.item.fragment.region)],
             f.overlap.offsets, f.overlap.sizes) for f in plan.fetches]
    everyone = _gather(asks, group)
    planned = time.perf_counter()

    memory = _HeldFragments(manifest, rmap, blobs)
    transfers, parts = _coalesce(everyone, logical, round_bytes, ALONE_BYTES if alone_bytes is None else alone_bytes)
    mine = {(rank, i): f for i, f in enumerate(plan.fetches)}
    delivered: set = set()

    def regions(t: Transfer):
        for i, (_, name, frag, o, z), nbytes in parts[t.key]:
            yield i, nbytes, (lambda name=name, frag=frag, o=o, z=z: memory.read(name, frag, Box(tuple(o), tuple(z))))

    def load(t: Transfer):
        """The transfer's regions back to back in one buffer (a lone contiguous region is sent in place)."""
        items = list(regions(t))
        if len(items) == 1:
            region = items[0][2]()
            if region.is_contiguous():
                return _raw(region)
            items = [(items[0][0], items[0][1], lambda region=region: region)]
        buffer = torch.empty(t.nbytes, dtype=torch.uint8)
        at = 0
        for _, nbytes, region in items:
            _copy_bytes(buffer[at:at + nbytes], region())
            at += nbytes
        return _raw(buffer)

    in_place = [0]

    def receive_into(t: Transfer) -> torch.Tensor | None:
        """A lone region whose target view is contiguous is received straight into it (no buffer)."""
        if len(parts[t.key]) != 1 or not t.nbytes:
            return None
        view = local_view(into[mine[(rank, parts[t.key][0][0])].dest_key], fmap, mine[(rank, parts[t.key][0][0])])
        if not view.is_contiguous() or view.numel() * view.element_size() != t.nbytes:
            return None
        return view.reshape(-1).view(torch.uint8)

    def deliver(t: Transfer, blob) -> None:
        if blob is None:  # received in place (receive_into)
            delivered.update((rank, i) for i, _, _ in regions(t))
            in_place[0] += t.nbytes
            return
        received = torch.frombuffer(blob, dtype=torch.uint8) if t.nbytes else torch.empty(0, dtype=torch.uint8)
        at = 0
        for i, nbytes, _ in regions(t):
            f = mine[(rank, i)]
            _copy_bytes(local_view(into[f.dest_key], fmap, f), received[at:at + nbytes])
            delivered.add((rank, i))
            at += nbytes

    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "The given buffer is not writable", UserWarning)  # held bytes: read only
            # a rank's own regions never enter the exchange: a thread copies them straight from its
            # memory while the exchange waits on peers (copies and gloo's waits release the GIL), so
            # neither its peers nor its own copies wait for the other
            own: list[str] = []

            def copy_own() -> None:
                for t in transfers:
                    if t.source == t.dest == rank:
                        try:
                            for i, _, region in regions(t):
                                f = mine[(rank, i)]
                                local_view(into[f.dest_key], fmap, f).copy_(region())
                                delivered.add((rank, i))
                        except Exception as err:  # noqa: BLE001 - reported and agreed on below, never lost
                            own.append(f"cannot read array {t.key!r} held by rank {rank} itself: "
                                       f"{type(err).__name__}: {err}")

            worker = threading.Thread(target=copy_own, name="ucp-hot-own-copies", daemon=True)
            worker.start()
            try:
                problems = exchange([t for t in transfers if t.source != t.dest], load=load, deliver=deliver,
                                    group=group, round_bytes=round_bytes, receive_into=receive_into)
            finally:
                worker.join()
            problems += own
    finally:
        memory.close()
    transferred = time.perf_counter()
    missing = sorted(set(mine) - delivered)
    if missing:
        problems.append(f"{len(missing)} planned region(s) never arrived (first: fetch {missing[0][1]})")
    _agree("; ".join(problems) or None, group)
    if plan.reads:
        with CheckpointReader(meta.path) as reader:  # only what no survivor holds
            for f in plan.reads:
                local_view(into[f.dest_key], fmap, f).copy_(reader.read_tensor(f.logical, f.overlap))
    done = time.perf_counter()
    tree_rank = rank if rank in manifest.states else min(manifest.states, default=0)
    sent = sum(t.nbytes for t in transfers if t.source == rank != t.dest)
    received = sum(t.nbytes for t in transfers if t.dest == rank != t.source)
    report = HotLoadReport(meta.path, manifest.states.get(tree_rank), plan.elements(), sent, received,
                           tuple(corrupt), planned - began, transferred - planned, done - transferred,
                           in_place[0])
    return manifest.states.get(tree_rank), into, fmap, report


def _plan_reads(manifest: Manifest, fmap: FragmentMap, path: str) -> tuple[LoadPlan | None, str | None]:
    """The load plan that fills ``fmap``, or why the checkpoint cannot (a missing tensor, a region no
    fragment covers)."""
    try:
        load_plan = plan_load(manifest, fmap)
    except UcpError as err:
        return None, str(err)
    gaps = load_plan.gaps()
    if not gaps:
        return load_plan, None
    request = load_plan.requests[min(gaps)]
    return None, (f"checkpoint {path} does not cover {request.region} of {request.logical!r} ({gaps[min(gaps)]} "
            "elements have no fragment); it cannot fill this layout: resume from another checkpoint")


ALONE_BYTES = 1 << 20  # an ask this large is a message of its own: sent and received in place


def _coalesce(everyone: list, logical: dict, round_bytes: int,
              alone_bytes: int = ALONE_BYTES) -> tuple[list[Transfer], dict]:
    """The transfers of every rank's asks: an ask of ``alone_bytes`` or more alone (its region is
    sent from the held bytes in place where contiguous, and received straight into its target),
    the smaller ones of each (source, destination) pair back to back, at most ``round_bytes``
    per message (packed with one copy each side)."""
    transfers: list[Transfer] = []
    parts: dict[str, list] = {}
    pairs: dict[tuple[int, int], list] = {}
    for dest, items in enumerate(everyone):
        for i, ask in enumerate(items):
            nbytes = math.prod(ask[4]) * _itemsize(logical[ask[1]].dtype)
            pairs.setdefault((ask[0], dest), []).append((i, ask, nbytes))
    for (source, dest), items in sorted(pairs.items()):
        for item in items:
            if item[2] >= alone_bytes:
                key = f"{source}>{dest}#{len(transfers)}"
                transfers.append(Transfer(source, dest, key, item[2]))
                parts[key] = [item]
        items = [item for item in items if item[2] < alone_bytes]
        batch, size = [], 0
        for item in items + [None]:
            if (item is None and batch) or (item is not None and batch and size + item[2] > round_bytes):
                key = f"{source}>{dest}#{len(transfers)}"
                transfers.append(Transfer(source, dest, key, size))
                parts[key] = batch
                batch, size = [], 0
            if item is not None:
                batch.append(item)
                size += item[2]
    return transfers, parts


def _logical(manifest: Manifest, name: str):
    from ucp.spec import LogicalTensor

    dtype, shape = manifest.header(name)
    return LogicalTensor(name, tuple(shape), dtype)


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


@functools.cache
def _itemsize(name: str) -> int:
    return _dtype(name).itemsize
