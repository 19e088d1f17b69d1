"""The uninterrupted single-process run every parallel run is compared with.

    >>> losses = reference_losses(LlamaConfig(layers=1), TrainSettings(), steps=2)
    >>> len(losses)
    2
"""

from __future__ import annotations

from ucp.integrations.llama.config import LlamaConfig
from ucp.integrations.llama.data import SyntheticCorpus
from ucp.integrations.llama.model import build_model, token_loss_sum
from ucp.integrations.stacks.common import TrainSettings, global_tokens, make_adam

__all__ = ["reference_losses"]


def reference_losses(cfg: LlamaConfig, settings: TrainSettings, *, steps: int) -> list[float]:
    """The global mean loss of steps 1..``steps`` of the logical model on one process."""
    model = build_model(cfg)
    optimizer = make_adam(model.parameters(), settings)
    corpus = SyntheticCorpus(cfg.vocab_size, cfg.seq_len, settings.data_seed)
    tokens = global_tokens(settings, cfg.seq_len)
    losses = []
    for step in range(1, steps + 1):
        batch = corpus.batch(position=(step - 1) * settings.global_batch, size=settings.global_batch)
        loss = token_loss_sum(model(batch[:, :-1]), batch[:, 1:]) / tokens
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
