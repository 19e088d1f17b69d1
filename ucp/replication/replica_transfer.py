"""Moving blobs between ranks over torch.distributed point-to-point, in rounds of bounded bytes.

Every rank is given the same list of :class:`Transfer` (source rank, destination
rank, array key, bytes) and calls :func:`exchange` collectively. Transfers run in
rounds of at most ``round_bytes`` (at least one transfer each), so a rank never
holds more than about a round of blobs in flight; in a round each rank posts its
sends and receives as one ``batch_isend_irecv`` (tagged by transfer index so pairs
never cross) and waits for them all. A transfer whose source is its destination is
handed over without any communication (a rank's copy of its own array).

Gloo sends CPU tensors; NCCL needs them on the rank's GPU, so with an NCCL group
blobs are staged through ``torch.cuda.current_device()`` (``device`` overrides).

Example (every rank runs it)::

    transfers = [Transfer(source=0, dest=1, key="r0/000001-w", nbytes=4096)]
    exchange(transfers, load=lambda t: tier.get(ck, t.key), deliver=lambda t, blob: keep(t, blob))
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist

ROUND_BYTES = 256 << 20


@dataclass(frozen=True)
class Transfer:
    """Send the blob of ``key`` (``nbytes`` long) from rank ``source`` to rank ``dest`` (group ranks)."""

    source: int
    dest: int
    key: str
    nbytes: int
    tier: str = "memory"  # where the destination keeps it (or what it does with it: the caller decides)


def rounds(transfers: Sequence[Transfer], round_bytes: int = ROUND_BYTES) -> Iterator[list[tuple[int, Transfer]]]:
    """``(index, transfer)`` groups of at most ``round_bytes`` (a larger transfer alone), in order.

    >>> ts = [Transfer(0, 1, "a", 60), Transfer(1, 0, "b", 60), Transfer(0, 2, "c", 10)]
    >>> [[i for i, _ in r] for r in rounds(ts, round_bytes=100)]
    [[0], [1, 2]]
    """
    batch: list[tuple[int, Transfer]] = []
    size = 0
    for index, transfer in enumerate(transfers):
        if batch and size + transfer.nbytes > round_bytes:
            yield batch
            batch, size = [], 0
        batch.append((index, transfer))
        size += transfer.nbytes
    if batch:
        yield batch


def _device(group) -> torch.device:
    backend = dist.get_backend(group)
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def exchange(transfers: Sequence[Transfer], *, load: Callable[[Transfer], bytes],
             deliver: Callable[[Transfer, bytes | None], None], group=None, round_bytes: int = ROUND_BYTES,
             device: torch.device | None = None,
             receive_into: Callable[[Transfer], torch.Tensor | None] | None = None) -> list[str]:
    """Run ``transfers`` collectively: sources ``load`` blobs, destinations get ``deliver(transfer, blob)``.

    Returns this rank's failures to load (a source that cannot read a blob sends zeros of
    the planned length, which fail the receiver's checksum, and keeps going), so no peer is
    left waiting. ``deliver`` is called after a round's communication has finished, for the
    same reason; the caller agrees on failures afterwards. ``receive_into(transfer)``: where
    the destination wants the bytes received straight (a contiguous uint8 CPU tensor of the
    transfer's length, e.g. a view of its final tensor), or None for a buffer; a transfer
    received that way is delivered as ``deliver(transfer, None)`` (no copy out of a buffer).
    """
    errors: list[str] = []

    def loaded(t: Transfer) -> bytes:
        try:
            blob = load(t)
        except Exception as err:  # noqa: BLE001 - reported to the caller, never left hanging in a peer
            errors.append(f"cannot read array {t.key!r} to send it to rank {t.dest}: {type(err).__name__}: {err}")
            return bytes(t.nbytes)
        if len(blob) != t.nbytes:
            errors.append(f"array {t.key!r}: {len(blob)} bytes to send, the plan says {t.nbytes}")
            return bytes(t.nbytes)
        return blob

    if not (dist.is_available() and dist.is_initialized()):  # one process: only its own copies, no sends
        rank, device = 0, torch.device("cpu")
    else:
        rank, device = dist.get_rank(group), device or _device(group)
    for batch in rounds(transfers, round_bytes):
        ops, inbox = [], []
        for index, t in batch:
            if t.source == rank == t.dest:
                inbox.append((t, None, loaded(t)))
            elif t.source == rank:
                tensor = _as_tensor(loaded(t)).to(device)
                ops.append(dist.P2POp(dist.isend, tensor, _global(group, t.dest), group=group, tag=index))
            elif t.dest == rank:
                target = receive_into(t) if receive_into is not None and device.type == "cpu" else None
                buffer = torch.empty(t.nbytes, dtype=torch.uint8, device=device) if target is None else target
                ops.append(dist.P2POp(dist.irecv, buffer, _global(group, t.source), group=group, tag=index))
                inbox.append((t, buffer, None) if target is None else (t, None, None))
        # One batch per round: NCCL runs it as one group (no order between peers can deadlock it);
        # gloo matches the pairs by tag.
        for work in dist.batch_isend_irecv(ops) if ops else ():
            work.wait()
        for t, buffer, blob in inbox:  # blob None with no buffer: received in place
            deliver(t, blob if buffer is None else buffer.cpu().numpy().data)  # a view: no copy of the blob
    return errors


def _as_tensor(blob) -> torch.Tensor:
    """A uint8 tensor over the blob's memory (no copy; sends only read it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "buffer is not writable": nothing writes to it
        return torch.frombuffer(blob, dtype=torch.uint8)


def _global(group, rank: int) -> int:
    """isend/irecv take global ranks."""
    if group is None or group is dist.group.WORLD:
        return rank
    return dist.get_global_rank(group, rank)
