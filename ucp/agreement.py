"""Every rank learns the first rank's failure, in O(1) data per rank.

A save or a restore across a process group must take the same branch on every rank: when one
rank cannot go on (its state is invalid, its bytes are damaged), the others must hear of it and
raise or fall back too, or they would wait forever in a collective that rank never joins. Only
the *first* failing rank (the lowest group rank) is reported, so nobody needs the others'
messages.

What it costs at ``W`` ranks: one ``all_reduce(MIN)`` of a 2-element int64 tensor (the lowest
rank with a problem, the lowest rank with a fatal one), then, only when some rank failed, one
``broadcast_object_list`` of that rank's message from that rank (two when the first fatal rank
is another rank). A success costs the one all-reduce and nothing else. What a rank receives is
constant in ``W``: 16 bytes reduced, and at most two error lines. How the backend routes them
(ring or tree, so ``W`` or ``log W`` latency steps) is its choice, as it was before. The
``all_gather_object`` this replaces delivered ``W`` pickled objects to every rank: at 16,384
ranks about 100 KB and 16,384 unpicklings per rank, ``W x W`` objects moved in all, on every
call, failure or not.

Groups may be subgroups: ranks here are group ranks, and each broadcast's source is mapped to
its global rank (``torch.distributed.get_global_rank``). A group whose backend is NCCL reduces
a CUDA tensor on the current device (NCCL has no CPU tensors); every other backend a CPU one.

Example (every rank of an initialized process group calls it at the same point)::

    failure = first_failure(None if ok else "OSError: disk full", group=group)
    if failure is not None and ok:  # a failing rank raises its own error
        raise UcpError(f"save failed on rank {failure.rank}: {failure.message}")
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Failure:
    """A rank's failure as every rank of the group learns it: its group rank and its message."""

    rank: int
    message: str | None


@dataclass(frozen=True)
class Agreement:
    """What :func:`agree` tells every rank: the first failure, and the first fatal one (``None`` where none).

    ``first`` is the lowest group rank whose message is not empty; ``fatal`` the lowest group
    rank that called with ``fatal=True`` (its message may be empty).
    """

    first: Failure | None
    fatal: Failure | None


def agree(message: str | None, *, fatal: bool = False, group: Any = None) -> Agreement:
    """The first rank's failure and the first fatal rank's, on every rank of ``group`` (``None``: the default group).

    Every rank of the group must call it at the same point. ``message`` is this rank's
    problem (``None`` or ``""`` when it has none); ``fatal`` marks a rank that is about to
    raise, so the others can raise too, naming it.

    Example::

        seen = agree(problem, fatal=about_to_raise, group=group)
        if seen.fatal is not None and not about_to_raise:
            raise RestoreError(f"restore failed on rank {seen.fatal.rank}: {seen.fatal.message}")
    """
    import torch.distributed as dist

    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    # MIN over (rank if it applies else W): the lowest rank it applies to, or W for none.
    lowest = torch.tensor(
        [rank if message else world, rank if fatal else world], dtype=torch.int64, device=_device(group)
    )
    dist.all_reduce(lowest, op=dist.ReduceOp.MIN, group=group)
    first_rank, fatal_rank = (int(v) for v in lowest.tolist())
    first = None if first_rank == world else Failure(first_rank, _from(first_rank, message, rank, group))
    if fatal_rank == world:
        return Agreement(first, None)
    if first is not None and first.rank == fatal_rank:
        return Agreement(first, first)
    return Agreement(first, Failure(fatal_rank, _from(fatal_rank, message, rank, group)))


def first_failure(message: str | None, *, group: Any = None) -> Failure | None:
    """The lowest group rank with a message (not ``None`` or ``""``) and that message, on every rank; ``None`` if none.

    Every rank of ``group`` (``None``: the default group) must call it at the same point.

    Example::

        failure = first_failure(None if error is None else f"{type(error).__name__}: {error}", group=group)
        if failure is not None and error is None:
            raise UcpError(f"save failed on rank {failure.rank}: {failure.message}")
    """
    return agree(message, group=group).first


def _from(src: int, message: str | None, rank: int, group: Any) -> str | None:
    """Group rank ``src``'s ``message`` on every rank (one broadcast from it)."""
    import torch.distributed as dist

    box = [message if rank == src else None]
    global_src = src if group is None else dist.get_global_rank(group, src)
    dist.broadcast_object_list(box, src=global_src, group=group)
    return box[0]


def _device(group: Any) -> torch.device:
    """Where a collective's tensor must live for ``group``'s backend."""
    import torch.distributed as dist

    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
