"""A deterministic synthetic corpus and the data position a checkpoint records.

Sample ``i`` is a walk of a fixed random Markov chain over the vocabulary (each
token has a few likely successors, so the loss has something to learn), drawn
from a generator seeded by ``(seed, i)`` alone. A global batch is the samples
``position .. position + batch - 1``; data-parallel ranks take contiguous rows
(uneven splits allowed), context-parallel ranks contiguous chunks of the
sequence. So every layout sees the same global batch at the same step, and a
resumed run continues at the saved position.

    >>> corpus = SyntheticCorpus(vocab_size=50, seq_len=8, seed=0)
    >>> corpus.batch(position=0, size=2).shape
    torch.Size([2, 9])
    >>> torch.equal(corpus.batch(position=3, size=1), corpus.batch(position=2, size=2)[1:])
    True
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ucp.geometry import split_evenly

__all__ = ["SyntheticCorpus", "rows_of", "chunk_of", "local_batch"]

SUCCESSORS = 3  # likely next tokens per token


@dataclass(frozen=True)
class SyntheticCorpus:
    vocab_size: int
    seq_len: int
    seed: int = 0

    def _chain(self) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed)
        successors = torch.randint(0, self.vocab_size, (self.vocab_size, SUCCESSORS), generator=gen)
        probs = torch.tensor([0.6, 0.3, 0.1])
        return successors, probs

    def sample(self, index: int) -> torch.Tensor:
        """Sample ``index``: ``seq_len + 1`` token ids (inputs and shifted targets)."""
        successors, probs = self._chain()
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index + 1)
        token = int(torch.randint(0, self.vocab_size, (1,), generator=gen))
        picks = torch.multinomial(probs, self.seq_len, replacement=True, generator=gen)
        out = [token]
        for pick in picks.tolist():
            token = int(successors[token, pick])
            out.append(token)
        return torch.tensor(out, dtype=torch.long)

    def batch(self, *, position: int, size: int) -> torch.Tensor:
        """Samples ``position .. position + size - 1``, ``[size, seq_len + 1]``."""
        return torch.stack([self.sample(position + i) for i in range(size)])


def rows_of(batch: torch.Tensor, parts: int, index: int) -> torch.Tensor:
    """Data-parallel rank ``index``'s rows of a global batch (uneven splits allowed)."""
    start, count = split_evenly(batch.shape[0], parts, index)
    return batch[start : start + count]


def chunk_of(seq: torch.Tensor, parts: int, index: int) -> tuple[torch.Tensor, int]:
    """Context-parallel rank ``index``'s chunk of the sequence dim (dim 1) and its start position."""
    start, count = split_evenly(seq.shape[1], parts, index)
    return seq[:, start : start + count], start


def local_batch(corpus: SyntheticCorpus, *, position: int, global_batch: int, dp: tuple[int, int],
                cp: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, targets)`` of one rank: its dp rows (``dp = (size, rank)``) of the global batch at
    ``position``, and its cp chunk (``cp = (size, rank)``) of their tokens."""
    rows = rows_of(corpus.batch(position=position, size=global_batch), *dp)
    inputs, targets = rows[:, :-1], rows[:, 1:]
    if cp[0] > 1:
        inputs, targets = chunk_of(inputs, *cp)[0], chunk_of(targets, *cp)[0]
    return inputs, targets
