"""The manifest fragments a rank's save writes, computed from its fragment map alone (no tensors).

A view of :func:`ucp.save_plan.plan_save` (the writer's own plan: spreading over replicas,
chunking, packing), so the size of a checkpoint's metadata at thousands of ranks can be
computed without a byte of tensor data (``ucp/tools/bench/scale_sim.py``)::

    >>> from ucp.sharding import split_fragment_map
    >>> from ucp.spec import LogicalTensor
    >>> fmap = split_fragment_map({"w": LogicalTensor("w", (4096, 1024), "float32")}, rank=1, world_size=2)
    >>> [(f.key, str(f.region), len(f.checksums)) for f in planned_fragments(fmap, rank=1)["w"]]
    [('r1/pack-000000', '[2048:4096, 0:1024]', 1)]
"""

from __future__ import annotations

from ucp.manifest import Fragment
from ucp.save_plan import SaveRules, array_key, plan_save
from ucp.spec import FragmentMap

__all__ = ["array_key", "planned_fragments"]


def planned_fragments(
    fmap: FragmentMap, *, rank: int, checksums: bool = True, pack_max: int | None = None, rules: SaveRules | None = None
) -> dict[str, list[Fragment]]:
    """logical name -> the fragments rank ``rank`` writes under ``fmap`` (a save-direction map).

    Keys, regions, sizes, chunking, packing and the number of checksums are those the writer
    records under ``rules`` (default: the store options' defaults; ``pack_max`` overrides their
    ``pack_max_bytes``); checksum values are placeholders of the right length.
    """
    rules = rules or SaveRules()
    if pack_max is not None:
        rules = SaveRules(rules.chunk_bytes, pack_max, rules.pack_target_bytes, rules.pack_align)
    return plan_save(fmap, rank=rank, rules=rules).fragments(checksums=checksums)
