"""The manifest fragments a rank's save writes, computed from its fragment map alone (no tensors).

The writer decides, for every piece of every local tensor, which sub-regions this replica
writes (:func:`ucp.write_units.write_plan`), how each is chunked and whether it is packed;
this module makes the same decisions from shapes and dtypes, so the size of a checkpoint's
metadata at thousands of ranks can be computed without a byte of tensor data
(``ucp/tools/bench/scale_sim.py``)::

    >>> from ucp.sharding import split_fragment_map
    >>> from ucp.spec import LogicalTensor
    >>> fmap = split_fragment_map({"w": LogicalTensor("w", (4096, 1024), "float32")}, rank=1, world_size=2)
    >>> [(f.key, str(f.region), len(f.checksums)) for f in planned_fragments(fmap, rank=1)["w"]]
    [('r1/000000-w', '[2048:4096, 0:1024]', 1)]
"""

from __future__ import annotations

import math
import re

from ucp.dtypes import torch_dtype
from ucp.geometry import region_shape
from ucp.manifest import Fragment
from ucp.spec import FragmentMap
from ucp.stores.chunking import chunk_rows_for
from ucp.zarr_array import chunk_count
from ucp.stores import DEFAULT_OPTIONS
from ucp.write_units import write_plan

# The writer's packing rule (docs/FORMAT.md, "Packs"), at the store options' defaults.
PACK_MAX_BYTES = DEFAULT_OPTIONS.pack_max_bytes
PACK_TARGET_BYTES = DEFAULT_OPTIONS.pack_target_bytes
PACK_ALIGN = DEFAULT_OPTIONS.pack_align
_DIGEST = "0" * 16  # an xxh3_64 digest as the manifest writes it: 16 hex digits


def array_key(rank: int, counter: int, logical: str, *, prefix: str = "") -> str:
    """The key of a fragment's own array: ``r<rank>/<counter>-<sanitized logical name>`` (docs/FORMAT.md 1)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", logical)[:80]
    return f"{prefix}r{rank}/{counter:06d}-{safe}"


def planned_fragments(fmap: FragmentMap, *, rank: int, checksums: bool = True,
                      pack_max: int = PACK_MAX_BYTES) -> dict[str, list[Fragment]]:
    """logical name -> the fragments rank ``rank`` writes under ``fmap`` (a save-direction map).

    Keys, regions, sizes, chunking, packing and the number of checksums are those the writer
    records; checksum values are placeholders of the right length.
    """
    out: dict[str, list[Fragment]] = {}
    counter = 0
    pack_key, pack_len = None, 0
    for spec in fmap.tensors.values():
        for piece in spec.pieces:
            itemsize = torch_dtype(fmap.logical[piece.logical].dtype).itemsize
            for _, target in write_plan(piece, piece.local.numel * itemsize, spec):
                shape = region_shape(target)
                nbytes = math.prod(shape) * itemsize
                rows = chunk_rows_for(shape, itemsize)
                chunks = chunk_count(shape, rows)
                sums = (_DIGEST,) * chunks if checksums else ()
                if pack_max and 0 < nbytes <= pack_max and chunks == 1:
                    if pack_key is None:
                        pack_key, pack_len = f"r{rank}/pack-{counter:06d}", 0
                        counter += 1
                    frag = Fragment(pack_key, rank, target, nbytes, rows, sums, pack_offset=pack_len)
                    pack_len += nbytes + (-nbytes % PACK_ALIGN)
                    if pack_len >= PACK_TARGET_BYTES:
                        pack_key = None
                else:
                    frag = Fragment(array_key(rank, counter, piece.logical), rank, target, nbytes, rows, sums)
                    counter += 1
                out.setdefault(piece.logical, []).append(frag)
    return out
