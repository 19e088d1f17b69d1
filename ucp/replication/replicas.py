"""ReplicaManager: copies of each rank's checkpoint arrays in peers' memory or disk, and recovery from them.

After a checkpoint commits, :meth:`ReplicaManager.replicate` (collective) has every
rank check its own arrays against the manifest's checksums and send them over
torch.distributed to the peers a placement policy chooses (default: Gemini's
groups, :class:`~ucp.replication.policies.GroupPlacement`); each rank keeps what it
receives in its tiers (:mod:`ucp.replication.replica_tiers`), and ``replicas.json``
(:mod:`ucp.replication.replica_map`) is written beside the manifest.

After a restart (lost ranks replaced by new processes, or the store damaged or
gone), :meth:`ReplicaManager.recover` (collective) finds every array whose files
in the checkpoint are missing or damaged, has its writer rank receive it from the
fastest surviving copy whose checksum matches (its own tier, then a peer's
memory, then a peer's disk; a corrupt copy is skipped with a
:class:`~ucp.replication.errors.ReplicaWarning` and dropped), writes it back, rewrites
a lost manifest last, and re-replicates what the lost ranks held. Arrays that are
intact in the checkpoint are left for ``ucp.load`` to read there. An array with no
copy anywhere raises :class:`~ucp.replication.errors.ReplicaLostError` naming it, on
every rank, and nothing is committed: never zeros.

``CheckpointManager(replicas=ReplicaManager(...))`` calls both, so ``restore``
reads the recovered checkpoint like any other.

Example (every rank runs it; gloo here, NCCL the same)::

    replicas = ReplicaManager(tiers=[MemoryTier(capacity_bytes=8 << 30)], replicas=2)
    manager = CheckpointManager("ckpt", process_group=group, replicas=replicas)
    step = manager.restore(into=state)      # recovers from peers first when ranks were lost
    manager.save(step, state)              # commits, then replicates
"""

from __future__ import annotations

import math
import os
import socket
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from ucp.replication.cluster import ClusterSpec
from ucp.replication.errors import PlacementInputError, ReplicaError, ReplicaLostError, ReplicaWarning
from ucp.replication.io_cost import live_io_model
from ucp.replication.placement import PlacementPolicy
from ucp.replication.policies import GroupPlacement
from ucp.replication.replica_files import CheckpointFiles, array_owners, array_tensors, fragment_bytes
from ucp.replication.replica_map import REPLICA_MAP_NAME, Holder, ReplicaMap
from ucp.replication.replica_plan import RankInfo, plan_replication
from ucp.replication.replica_tiers import CheckpointMeta, ReplicaTier
from ucp.replication.replica_trust import map_problem
from ucp.replication.replica_transfer import ROUND_BYTES, Transfer, exchange
from ucp.checksum import digest
from ucp.errors import CheckpointNotFoundError, ManifestError, UcpError
from ucp.manifest import MANIFEST_NAME, Manifest

_SPEED = {"memory": 0, "disk": 1}  # lower is faster: the order replicas are read in


@dataclass(frozen=True)
class RecoveryReport:
    """What :meth:`ReplicaManager.recover` did to one checkpoint."""

    path: str
    checkpoint: str | None  # the manifest digest recovered, None when no rank held replicas of it
    arrays: int  # arrays in the checkpoint
    repaired: tuple[tuple[str, int, str], ...]  # (array key, rank read from, tier) for each array written back
    corrupt_replicas: tuple[tuple[str, int], ...]  # (array key, rank) copies skipped on a checksum mismatch
    manifest_restored: bool  # the store had no manifest: it was rebuilt from a replica, last
    rereplicated: int  # copies sent afterwards to restore the placement
    seconds: float


class ReplicaManager:
    """Peer replicas of checkpoint arrays across the ranks of a process group (see the module docstring).

    ``tiers``: this rank's replica tiers, fastest first (a :class:`MemoryTier`, a
    :class:`DiskTier` or both). ``replicas``: peer copies per array on average
    (the policy's budget). ``node``/``rack``: where this rank runs (default: the
    ``UCP_NODE`` environment variable or the host name; ``UCP_RACK``).
    ``keep``: checkpoints kept in the tiers (older ones are evicted after each
    replication; keep it at most the retention's count, or recovery may bring back
    a pruned checkpoint). ``verify_store``: recovery also compares the digest of
    every file in the store, not only its presence and size.

    What the policy sees of each node, as in the simulator: its free bytes per tier,
    its forecast (``risk``: node name -> P(fails in the next interval)), its ``speed``
    (relative read rate, default the ``UCP_NODE_SPEED`` environment variable or 1; a
    node on a shared uplink might say 0.25), and read times from ``io``: ``"measured"``
    (default: the shipped I/O cost model, :class:`~ucp.replication.io_cost.IoCostModel`,
    fitted on first use), ``"constant"`` (``cluster``'s bandwidths) or a fitted model.
    ``cluster``: the network's bandwidths and timings (default :class:`ClusterSpec`'s).
    """

    def __init__(self, *, tiers: Sequence[ReplicaTier], policy: PlacementPolicy | None = None, replicas: int = 2,
                 process_group: Any = None, node: str | None = None, rack: int | None = None, keep: int = 1,
                 verify_store: bool = False, round_bytes: int = ROUND_BYTES,
                 storage_options: dict | None = None, risk: Callable[[str], float] | None = None,
                 speed: float | None = None, io: Any = "measured", cluster: ClusterSpec | None = None) -> None:
        if not tiers:
            raise PlacementInputError("ReplicaManager needs at least one tier (MemoryTier or DiskTier)")
        if len({t.tier for t in tiers}) != len(tiers):
            raise PlacementInputError("ReplicaManager: at most one tier of each kind (memory, disk)")
        if keep < 1 or replicas < 0:
            raise PlacementInputError(f"ReplicaManager: keep must be >= 1 and replicas >= 0, got {keep}, {replicas}")
        self.tiers = tuple(tiers)
        self.policy = policy or GroupPlacement()
        self.replicas = replicas
        self.process_group = process_group
        self.node = node or os.environ.get("UCP_NODE") or socket.gethostname()
        env_rack = os.environ.get("UCP_RACK")
        self.rack = rack if rack is not None else (int(env_rack) if env_rack else None)
        self.keep = keep
        self.verify_store = verify_store
        self.round_bytes = round_bytes
        self.storage_options = storage_options
        self.risk = risk  # node name -> P(fails in the next interval), e.g. from LogRisk; None: 0
        self.speed = _node_speed(speed)
        self.io = live_io_model(io)
        self.cluster = cluster
        self._forecasts: dict[str, tuple[float, ...]] = {}  # path -> every rank's forecast at its last placement

    # ------------------------------------------------------------ replicate
    def replicate(self, path: str | os.PathLike) -> ReplicaMap:
        """Send every rank's arrays of the committed checkpoint at ``path`` to the placed peers (collective).

        Returns the replica map, also written as ``replicas.json`` beside the manifest.
        """
        return self._replicate(os.fspath(path))[0]

    def replace_if_forecasts_changed(self, path: str | os.PathLike, *, tolerance: float = 0.5) -> bool:
        """Place the checkpoint at ``path`` again when some rank's forecast moved (collective).

        A forecast counts as moved when it differs from the one the last placement used by more
        than ``tolerance`` times the larger of the two (or there was no placement here yet). The
        new placement reuses copies where it can and drops the copies it no longer places, so the
        replicas follow the risk within the same budget. Returns whether it placed again.
        """
        path = os.fspath(path)
        now = tuple(self._gather(self._forecast()))
        before = self._forecasts.get(path)
        moved = before is None or any(abs(a - b) > tolerance * max(a, b, 1e-12) for a, b in zip(now, before))
        if moved:
            self._replicate(path, prune=True)
        return moved

    def _forecast(self) -> float:
        return float(self.risk(self.node)) if self.risk is not None else 0.0

    def _replicate(self, path: str, *, prune: bool = False) -> tuple[ReplicaMap, int]:
        """The map and the number of copies sent to peers (``prune``: drop held copies no longer placed)."""
        files = CheckpointFiles(path, storage_options=self.storage_options)
        manifest_bytes = self._bcast(files.read(MANIFEST_NAME) if self._rank() == 0 else None, 0)
        if manifest_bytes is None:
            raise CheckpointNotFoundError(f"{path} has no {MANIFEST_NAME}: replicate a checkpoint after it commits")
        ck = digest(manifest_bytes)
        manifest = Manifest.from_json(manifest_bytes, source=files.path + "/" + MANIFEST_NAME, checkpoint=path,
                                      read_shard=files.read_shard)
        known = self._agreed_map(ck)
        if known is not None:  # read back from a tier: checked against the manifest before it is used
            self._agree(map_problem(manifest_bytes, known, ck, files, source=f"replica map of {path} in a tier"))
        else:
            known = self._hash_own_arrays(path, files, manifest, ck)
        infos = self._gather(self._info(ck))
        self._forecasts[path] = tuple(i.failure_probability for i in infos)
        plan = None
        if self._rank() == 0:
            plan = plan_replication(known.arrays, infos, policy=self.policy, replicas=self.replicas, io=self.io,
                                    spec=self.cluster)
        holders, transfers = self._bcast(plan, 0)
        planned = known.with_holders(holders)
        self._put_meta(ck, CheckpointMeta(path, planned.generation, manifest_bytes, planned.to_json().encode()))
        problems: list[str] = []

        def deliver(t: Transfer, blob: bytes) -> None:
            if digest(blob) != planned.arrays[t.key].digest:
                problems.append(f"array {t.key!r} arrived from rank {t.source} with another checksum")
                return
            try:
                self._tier(t.tier).put(ck, t.key, blob)
            except (UcpError, OSError) as err:
                problems.append(str(err))

        problems += exchange(transfers, load=lambda t: self._blob(ck, files, planned, t.key), deliver=deliver,
                             group=self.process_group, round_bytes=self.round_bytes)
        self._agree("; ".join(problems) or None)
        if prune:  # copies the new placement does not keep: the budget follows the forecasts
            for tier in self.tiers:
                for key in tier.keys(ck):
                    if key in planned.arrays and Holder(self._rank(), tier.tier) not in planned.arrays[key].holders:
                        tier.discard(ck, key)
        self._evict_beyond_keep()
        final = planned.with_holders(self._actual_holders(ck, planned))
        self._put_meta(ck, CheckpointMeta(path, final.generation, manifest_bytes, final.to_json().encode()))
        if self._rank() == 0:
            files.write(REPLICA_MAP_NAME, final.to_json().encode())
        self._barrier()
        return final, sum(t.source != t.dest for t in transfers)

    def _hash_own_arrays(self, path: str, files: CheckpointFiles, manifest: Manifest, ck: str) -> ReplicaMap:
        """Each rank checks its arrays against the manifest and records their files; the records meet on every rank."""
        from ucp.reader import CheckpointReader

        rank, world = self._rank(), self._world()
        mine, error = {}, None
        try:
            owners = {k: o for k, o in array_owners(manifest).items() if o % world == rank}
            with CheckpointReader(path, verify=True, storage_options=self.storage_options) as reader:
                for name, entry in manifest.tensors.items():
                    for frag in entry.fragments:
                        if frag.key in owners:
                            reader.check_fragment(name, frag)  # a corrupt primary is never replicated
            raw = fragment_bytes(manifest)
            for key, owner in owners.items():
                mine[key] = files.read_array(key, owner=owner, raw=raw[key])[0]
        except (UcpError, OSError) as err:
            error = f"{type(err).__name__}: {err}"
        self._agree(error)
        records = {k: r for part in self._gather(mine) for k, r in part.items()}
        generation = self._bcast(time.time_ns(), 0)
        nodes = tuple(self._gather(self.node))
        return ReplicaMap(checkpoint=ck, path=path, generation=generation, policy=self.policy.name, nodes=nodes,
                          arrays=records)

    def _blob(self, ck: str, files: CheckpointFiles, rmap: ReplicaMap, key: str) -> bytes:
        for tier in self.tiers:
            blob = tier.get(ck, key)
            if blob is not None and digest(blob) == rmap.arrays[key].digest:
                return blob
        return files.read_blob(rmap.arrays[key])

    # -------------------------------------------------------------- recover
    def recover(self, path: str | os.PathLike, *, rereplicate: bool = True) -> RecoveryReport:
        """Repair the checkpoint at ``path`` from the surviving replicas (collective); see the module docstring."""
        started = time.perf_counter()
        path = os.fspath(path)
        files = CheckpointFiles(path, storage_options=self.storage_options)
        inventories = self._gather(self._inventory())
        store_manifest = self._bcast(files.read(MANIFEST_NAME) if self._rank() == 0 else None, 0)
        held = {ck: gen for inv in inventories for ck, (p, gen, _) in inv.items() if _norm(p) == _norm(path)}
        if store_manifest is not None:
            ck = digest(store_manifest)
            if ck not in held:  # no replicas of this checkpoint: ucp.load reads the store as it is
                return RecoveryReport(path, None, 0, (), (), False, 0, time.perf_counter() - started)
        elif not held:
            raise CheckpointNotFoundError(f"{path} has no {MANIFEST_NAME} and no rank holds a replica of it; "
                                          "nothing to recover - restore an older checkpoint")
        else:
            ck = max(held, key=lambda c: (held[c], c))
        source = next(r for r, inv in enumerate(inventories) if ck in inv)
        meta = self._bcast(self._meta(ck) if self._rank() == source else None, source)
        rmap = ReplicaMap.from_json(meta.replica_map, source=f"replica map of {path} on rank {source}")
        self._agree(map_problem(meta.manifest, rmap, ck, files, source=f"replica map of {path} on rank {source}"))
        damaged = self._scan(files, rmap, whole=store_manifest is None)
        repaired, corrupt = self._repair(ck, path, files, rmap, meta.manifest, damaged, inventories)
        self._barrier()  # every array is in place before the manifest makes the checkpoint exist
        if store_manifest is None and self._rank() == 0:
            files.write(MANIFEST_NAME, meta.manifest)
        self._barrier()
        sent = self._replicate(path)[1] if rereplicate else 0
        return RecoveryReport(path, ck, len(rmap.arrays), repaired, corrupt, store_manifest is None, sent,
                              time.perf_counter() - started)

    def recover_all(self, directory: str | os.PathLike, *, lost: str = "raise") -> list[RecoveryReport]:
        """:meth:`recover` every checkpoint directly under ``directory`` that some rank holds replicas of.

        ``lost="warn"``: a checkpoint with an array no copy holds any more is left as it is, with a
        :class:`ReplicaWarning` naming it, and the others are still recovered (a restore then falls
        back past it to an older good checkpoint instead of failing the same way on every restart).
        """
        if lost not in ("raise", "warn"):
            raise ValueError(f"lost must be 'raise' or 'warn', not {lost!r}")
        directory = _norm(os.fspath(directory))
        paths = sorted({p for inv in self._gather(self._inventory()) for p, _, _ in inv.values()
                        if _norm(p).rsplit("/", 1)[0] == directory})
        reports = []
        for path in paths:
            try:
                reports.append(self.recover(path))
            except ReplicaLostError as err:  # raised on every rank alike: all ranks go on together
                if lost == "raise":
                    raise
                warnings.warn(f"{err}; the checkpoint is left as it is", ReplicaWarning, stacklevel=2)
        return reports

    def _scan(self, files: CheckpointFiles, rmap: ReplicaMap, *, whole: bool) -> dict[str, str]:
        """Array key -> why the store's copy is unusable; ranks split the scan."""
        if whole:
            return {k: f"{files.path} has no {MANIFEST_NAME}" for k in rmap.arrays}
        rank, world = self._rank(), self._world()
        mine, error = {}, None
        try:
            for i, (key, rec) in enumerate(rmap.arrays.items()):
                if i % world == rank:
                    problem = files.damage(rec, digests=self.verify_store)
                    if problem:
                        mine[key] = problem
        except OSError as err:
            error = f"{type(err).__name__}: {err}"
        self._agree(error)
        return {k: v for part in self._gather(mine) for k, v in sorted(part.items())}

    def _repair(self, ck, path, files, rmap, manifest_bytes, damaged, inventories):
        """Rounds: each damaged array is read from its next best copy until one passes its checksum."""
        world = self._world()
        candidates = {key: [(r, inv[ck][2][key]) for r, inv in enumerate(inventories) if ck in inv and key in inv[ck][2]]
                      for key in damaged}
        repaired, corrupt, lost = [], [], []
        pending = sorted(damaged)
        while pending:
            load: dict[int, int] = {}  # reads given to each source this round: spread them over the holders
            transfers = []
            for key in pending:
                options = candidates[key]
                if not options:
                    lost.append(key)
                    continue
                writer = rmap.arrays[key].owner % world
                best = min(range(len(options)), key=lambda i: (options[i][0] != writer, _SPEED.get(options[i][1], 9),
                                                               load.get(options[i][0], 0), options[i][0]))
                rank, tier = options.pop(best)
                load[rank] = load.get(rank, 0) + 1
                transfers.append(Transfer(rank, rmap.arrays[key].owner % world, key, rmap.arrays[key].nbytes, tier))
            failed: list[tuple[str, int]] = []
            errors: list[str] = []

            def deliver(t: Transfer, blob: bytes) -> None:
                rec = rmap.arrays[t.key]
                found = digest(blob)
                if found != rec.digest:
                    warnings.warn(f"replica of array {t.key!r} of {path} on rank {t.source} ({t.tier} tier) fails its "
                                  f"checksum (xxh3_64 {found}, the replica map says {rec.digest}); reading the next "
                                  "copy", ReplicaWarning, stacklevel=4)
                    failed.append((t.key, t.source))  # noqa: B023 - exchange() below calls it in this iteration
                    return
                try:
                    files.write_array(rec, blob)
                except OSError as err:
                    errors.append(f"cannot write array {t.key!r} into {path}: {err}")  # noqa: B023 - as above

            exchange(transfers, load=lambda t: self._held_blob(ck, t), deliver=deliver, group=self.process_group,
                     round_bytes=self.round_bytes)  # a copy that cannot be read arrives as zeros: next copy
            self._agree("; ".join(errors) or None)
            bad = sorted({item for part in self._gather(failed) for item in part})
            for key, rank in bad:
                if rank == self._rank():
                    for tier in self.tiers:
                        tier.discard(ck, key)  # a copy that failed its checksum is never offered again
            corrupt += bad
            retry = {key for key, _ in bad}
            repaired += [(t.key, t.source, t.tier) for t in transfers if t.key not in retry]
            pending = sorted(retry)
        if lost:
            raise ReplicaLostError(_lost_message(path, sorted(lost), damaged, corrupt, rmap, manifest_bytes))
        return tuple(sorted(repaired)), tuple(corrupt)

    def _held_blob(self, ck: str, t: Transfer) -> bytes:
        blob = self._tier(t.tier).get(ck, t.key)
        # Vanished since the inventory: send filler of the right length, which fails the receiver's checksum.
        return blob if blob is not None and len(blob) == t.nbytes else bytes(t.nbytes)

    # ------------------------------------------------------------- internals
    def _tier(self, name: str) -> ReplicaTier:
        return next(t for t in self.tiers if t.tier == name)

    def _meta(self, ck: str) -> CheckpointMeta | None:
        return next((m for m in (t.get_meta(ck) for t in self.tiers) if m is not None), None)

    def _put_meta(self, ck: str, meta: CheckpointMeta) -> None:
        for tier in self.tiers:
            tier.put_meta(ck, meta)

    def _inventory(self) -> dict[str, tuple[str, int, dict[str, str]]]:
        """Checkpoint id -> (path, generation, {array key: fastest tier holding it}) over this rank's tiers."""
        out: dict[str, tuple[str, int, dict[str, str]]] = {}
        for tier in reversed(self.tiers):  # the fastest tier's entry wins
            for ck in tier.checkpoints():
                meta = tier.get_meta(ck)
                keys = out.get(ck, (meta.path, meta.generation, {}))[2]
                keys.update({key: tier.tier for key in tier.keys(ck)})
                out[ck] = (meta.path, meta.generation, keys)
        return out

    def _info(self, ck: str) -> RankInfo:
        held = self._inventory().get(ck, ("", 0, {}))[2]
        free = {t.tier: t.capacity_bytes - t.checkpoint_bytes(ck) for t in self.tiers}
        return RankInfo(rank=self._rank(), node=self.node, rack=self.rack, free=free, held=held,
                        failure_probability=self._forecast(), speed=self.speed)

    def _agreed_map(self, ck: str) -> ReplicaMap | None:
        """The replica map of ``ck`` if any rank holds one (re-replication reuses its records: no rehash)."""
        metas = self._gather(self._meta(ck) is not None)
        if not any(metas):
            return None
        source = metas.index(True)
        meta = self._bcast(self._meta(ck) if self._rank() == source else None, source)
        return ReplicaMap.from_json(meta.replica_map, source=f"replica map of {meta.path} on rank {source}")

    def _actual_holders(self, ck: str, rmap: ReplicaMap) -> dict[str, tuple[Holder, ...]]:
        holders: dict[str, list] = {key: [] for key in rmap.arrays}
        for rank, inv in enumerate(self._gather(self._inventory())):
            for key, tier in inv.get(ck, ("", 0, {}))[2].items():
                holders.setdefault(key, []).append(Holder(rank, tier))
        return {k: tuple(v) for k, v in holders.items()}

    def _evict_beyond_keep(self) -> None:
        for tier in self.tiers:
            for ck in tier.checkpoints()[:-self.keep]:
                tier.evict(ck)

    # -- collectives (a single process works without a process group)
    def _distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized()

    def _rank(self) -> int:
        return dist.get_rank(self.process_group) if self._distributed() else 0

    def _world(self) -> int:
        return dist.get_world_size(self.process_group) if self._distributed() else 1

    def _gather(self, obj: Any) -> list[Any]:
        if not self._distributed():
            return [obj]
        out: list[Any] = [None] * self._world()
        dist.all_gather_object(out, obj, group=self.process_group)
        return out

    def _bcast(self, obj: Any, src: int) -> Any:
        if not self._distributed():
            return obj
        box = [obj]
        group_src = src if self.process_group is None else dist.get_global_rank(self.process_group, src)
        dist.broadcast_object_list(box, src=group_src, group=self.process_group)
        return box[0]

    def _barrier(self) -> None:
        if self._distributed():
            dist.barrier(group=self.process_group)

    def _agree(self, problem: str | None) -> None:
        """Raise on every rank when any rank had a problem (no rank is left waiting in a collective)."""
        found = self._gather(problem)
        for rank, text in enumerate(found):
            if text:
                raise ReplicaError(text if rank == self._rank() else f"replication failed on rank {rank}: {text}")


def _lost_message(path, lost, damaged, corrupt, rmap, manifest_bytes) -> str:
    try:
        tensors = array_tensors(Manifest.from_json(manifest_bytes))
    except ManifestError:  # sharded metadata whose shards are lost too: name the arrays without their tensors
        tensors = {}
    bad = {}
    for key, rank in corrupt:
        bad.setdefault(key, []).append(rank)
    parts = []
    for key in lost[:10]:
        names = ", ".join(repr(n) for n in sorted(set(tensors.get(key, [])))[:3])
        why = (f"every replica failed its checksum (ranks {', '.join(map(str, bad[key]))})" if key in bad
               else "no surviving rank holds a replica")
        parts.append(f"array {key!r} (tensor {names}, written by rank {rmap.arrays[key].owner}): {damaged[key]} "
                     f"and {why}")
    more = f" (and {len(lost) - 10} more)" if len(lost) > 10 else ""
    return (f"cannot recover {path}: {len(lost)} array(s) have no surviving copy: " + "; ".join(parts) + more
            + ". Nothing was committed; restore an older checkpoint")


def _node_speed(speed: float | None) -> float:
    if speed is None:
        text = os.environ.get("UCP_NODE_SPEED", "1")
        try:
            speed = float(text)
        except ValueError:
            raise PlacementInputError(f"UCP_NODE_SPEED={text!r} is not a number; set it to this node's relative "
                                      "read rate (1: nominal, 0.25: four times slower)") from None
    if not (speed > 0 and math.isfinite(speed)):
        raise PlacementInputError(f"ReplicaManager: speed must be a finite number > 0, got {speed}")
    return float(speed)


def _norm(path: str) -> str:
    """One spelling per place: absolute local paths, URLs without a trailing slash."""
    return path.rstrip("/") if "://" in path else os.path.abspath(path)
