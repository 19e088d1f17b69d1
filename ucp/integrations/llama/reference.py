"""The uninterrupted single-process run every parallel run is compared with.

In bf16 mode (``TrainSettings(precision="bf16")``) the model computes in bf16 and
Adam steps fp32 masters, which start as the bf16 parameters and are rounded back
into them after every step, as every stack's mixed-precision mode does.

    >>> losses = reference_losses(LlamaConfig(layers=1), TrainSettings(), steps=2)
    >>> len(losses)
    2
"""

from __future__ import annotations

import torch

from ucp.integrations.llama.config import LlamaConfig
from ucp.integrations.llama.data import SyntheticCorpus
from ucp.integrations.llama.model import build_model, token_loss_sum
from ucp.integrations.stacks.common import TrainSettings, global_tokens, make_adam

__all__ = ["reference_losses"]


def reference_losses(cfg: LlamaConfig, settings: TrainSettings, *, steps: int) -> list[float]:
    """The global mean loss of steps 1..``steps`` of the logical model on one process."""
    model = build_model(cfg).to(settings.param_dtype)
    params = list(model.parameters())
    masters = [p.detach().float().requires_grad_() for p in params] if settings.mixed else params
    optimizer = make_adam(masters, settings)
    corpus = SyntheticCorpus(cfg.vocab_size, cfg.seq_len, settings.data_seed)
    tokens = global_tokens(settings, cfg.seq_len)
    losses = []
    for step in range(1, steps + 1):
        batch = corpus.batch(position=(step - 1) * settings.global_batch, size=settings.global_batch)
        loss = token_loss_sum(model(batch[:, :-1]), batch[:, 1:]) / tokens
        optimizer.zero_grad()
        loss.backward()
        if settings.mixed:
            for p, master in zip(params, masters):
                master.grad, p.grad = p.grad.float(), None
        optimizer.step()
        if settings.mixed:
            with torch.no_grad():
                for p, master in zip(params, masters):
                    p.copy_(master)
        losses.append(loss.item())
    return losses
