"""What a replica tier hands back is checked against the manifest before recovery acts on it.

A tier (a local directory, another process's memory) can be stale, damaged or
written by someone else. Before a replica map read back from one decides what is
written into a checkpoint, :func:`map_problem` checks that

- the manifest bytes it came with are the checkpoint it claims (their digest is
  the checkpoint id, which is also the store's manifest digest when there is one);
- every array it lists is one the manifest names, written by the rank the manifest
  says, no larger than the manifest's fragments of it can be (the keys and file
  names themselves were checked as manifest keys when the map was parsed:
  :meth:`~ucp.replication.replica_map.ArrayRecord.from_dict`).

Example::

    >>> import os, tempfile, torch, ucp
    >>> from ucp.replication.replica_files import CheckpointFiles
    >>> from ucp.replication.replica_map import ReplicaMap
    >>> path = os.path.join(tempfile.mkdtemp(), "ck")
    >>> _ = ucp.save({"w": torch.arange(4.0)}, path)
    >>> files = CheckpointFiles(path)
    >>> manifest = files.read("manifest.json")
    >>> (key, owner), = array_owners(Manifest.from_json(manifest)).items()
    >>> record, _ = files.read_array(key, owner=owner)
    >>> rmap = ReplicaMap(checkpoint=digest(manifest), path=path, generation=1, policy="group", nodes=("n0",),
    ...                   arrays={key: record})
    >>> map_problem(manifest, rmap, digest(manifest), files, source="tier") is None
    True
    >>> print(map_problem(manifest, rmap, "0" * 16, files, source="tier"))  # doctest: +ELLIPSIS
    tier: its manifest bytes have digest ..., not checkpoint 0000000000000000; the replica tier is damaged ...
"""

from __future__ import annotations

from ucp.replication.replica_files import CheckpointFiles, array_limit, array_owners, fragment_bytes
from ucp.replication.replica_map import ReplicaMap
from ucp.checksum import digest
from ucp.errors import UcpError
from ucp.manifest import Manifest

_ADVICE = "the replica tier is damaged or not this checkpoint's - remove it and replicate again"


def map_problem(manifest_bytes: bytes, rmap: ReplicaMap, checkpoint: str, files: CheckpointFiles, *,
                source: str) -> str | None:
    """Why ``rmap`` (read back from ``source``) cannot be trusted for ``checkpoint``, or None."""
    found = digest(manifest_bytes)
    if found != checkpoint:
        return f"{source}: its manifest bytes have digest {found}, not checkpoint {checkpoint}; {_ADVICE}"
    if rmap.checkpoint != checkpoint:
        return f"{source}: the replica map is of checkpoint {rmap.checkpoint}, not {checkpoint}; {_ADVICE}"
    try:
        manifest = Manifest.from_json(manifest_bytes, source=f"{source} (manifest)", read_shard=files.read_shard)
        owners = array_owners(manifest)
        raw = fragment_bytes(manifest)
    except (UcpError, OSError) as err:
        return f"{source}: cannot read the manifest it replicates ({err}); {_ADVICE}"
    for key, record in rmap.arrays.items():
        if key not in owners:
            return f"{source}: the replica map names array {key!r}, which the manifest does not; {_ADVICE}"
        if record.owner != owners[key]:
            return (f"{source}: the replica map says rank {record.owner} wrote array {key!r}, the manifest says "
                    f"rank {owners[key]}; {_ADVICE}")
        limit = array_limit(raw[key], len(record.files))
        if record.nbytes > limit:
            return (f"{source}: the replica map says array {key!r} holds {record.nbytes} bytes, more than the "
                    f"{limit} its fragments can take; {_ADVICE}")
    return None
