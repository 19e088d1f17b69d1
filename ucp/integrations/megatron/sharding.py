"""How this stack's local tensors map onto the logical model, written out in Python.

The megatron-gpt UCL preset says the same thing declaratively, and the checkpoint
engine moves bytes by the preset; this module is the trainer's own statement,
used to build a rank's shards from the logical initial weights and to reassemble
logical tensors for the tests' bit-for-bit comparisons. A test that trains from
these shards and matches the single-process model's losses proves the two agree.

    shards = local_shards(cfg, layout, rank)
    shards["decoder.layers.0.self_attention.linear_qkv.weight"].pieces[0]
    # Piece(logical='decoder.layers.0.self_attention.linear_q.weight', target=Box(...), local=Box(...))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ucp.integrations.llama.config import LlamaConfig
from ucp.integrations.llama.model import stage_layers
from ucp.integrations.megatron.layers import padded_vocab
from ucp.geometry import Box, split_evenly
from ucp.layout import Layout

__all__ = ["Piece", "LocalShard", "local_shards", "shards_from_logical", "pieces_of"]


@dataclass(frozen=True)
class Piece:
    """``local`` block of the local tensor equals ``target`` block of logical tensor ``logical``."""

    logical: str
    target: Box
    local: Box


@dataclass(frozen=True)
class LocalShard:
    shape: tuple[int, ...]
    pieces: tuple[Piece, ...]


def _rows(name: str, start: int, count: int, at: int, cols: int) -> Piece:
    return Piece(name, Box((start, 0), (count, cols)), Box((at, 0), (count, cols)))


def _whole(name: str, shape: tuple[int, ...]) -> LocalShard:
    return LocalShard(shape, (Piece(name, Box.full(shape), Box.full(shape)),))


def _vocab(name: str, cfg: LlamaConfig, tp: int, tp_rank: int) -> LocalShard:
    rows = padded_vocab(cfg.vocab_size, tp, cfg.vocab_multiple) // tp
    start = tp_rank * rows
    real = max(0, min(rows, cfg.vocab_size - start))  # padding rows map to nothing
    pieces = (_rows(name, start, real, 0, cfg.hidden),) if real else ()
    return LocalShard((rows, cfg.hidden), pieces)


def _swiglu(prefix: str, local: str, cfg: LlamaConfig, tp: int, tp_rank: int) -> dict[str, LocalShard]:
    """``linear_fc1 = [gate_r; up_r]`` and the column block of ``linear_fc2``."""
    start, count = split_evenly(cfg.ffn, tp, tp_rank)
    fc1 = LocalShard((2 * count, cfg.hidden), (_rows(f"{prefix}.gate.weight", start, count, 0, cfg.hidden),
                                                _rows(f"{prefix}.up.weight", start, count, count, cfg.hidden)))
    fc2 = LocalShard((cfg.hidden, count), (Piece(f"{prefix}.linear_fc2.weight", Box((0, start), (cfg.hidden, count)),
                                                 Box((0, 0), (cfg.hidden, count))),))
    return {f"{local}.linear_fc1.weight": fc1, f"{local}.linear_fc2.weight": fc2}


def local_shards(cfg: LlamaConfig, layout: Layout, rank: int) -> dict[str, LocalShard]:
    """Local parameter name -> its shape and the logical blocks it holds, for ``rank`` of ``layout``."""
    c = layout.coords(rank)
    tp, d, h = layout.tp, cfg.head_dim, cfg.hidden
    out: dict[str, LocalShard] = {}
    if c.pp == 0:
        out["embedding.word_embeddings.weight"] = _vocab("embedding.word_embeddings.weight", cfg, tp, c.tp)
    groups, rep = cfg.kv_heads // tp, cfg.heads // cfg.kv_heads
    for i, layer in enumerate(stage_layers(cfg.layers, layout.pp, c.pp)):
        src, dst = f"decoder.layers.{layer}", f"decoder.layers.{i}"
        for norm in ("input_layernorm", "pre_mlp_layernorm"):
            out[f"{dst}.{norm}.weight"] = _whole(f"{src}.{norm}.weight", (h,))
        qkv = []
        for g in range(groups):  # per key/value group: [rep query heads; k; v]
            group = c.tp * groups + g
            at = g * (rep + 2) * d
            qkv.append(_rows(f"{src}.self_attention.linear_q.weight", group * rep * d, rep * d, at, h))
            qkv.append(_rows(f"{src}.self_attention.linear_k.weight", group * d, d, at + rep * d, h))
            qkv.append(_rows(f"{src}.self_attention.linear_v.weight", group * d, d, at + (rep + 1) * d, h))
        out[f"{dst}.self_attention.linear_qkv.weight"] = LocalShard((groups * (rep + 2) * d, h), tuple(qkv))
        cols = groups * rep * d
        out[f"{dst}.self_attention.linear_proj.weight"] = LocalShard(
            (h, cols), (Piece(f"{src}.self_attention.linear_proj.weight", Box((0, c.tp * cols), (h, cols)),
                              Box((0, 0), (h, cols))),))
        if not cfg.moe:
            out.update(_swiglu(f"{src}.mlp", f"{dst}.mlp", cfg, tp, c.tp))
            continue
        out[f"{dst}.mlp.router.weight"] = _whole(f"{src}.mlp.router.weight", (cfg.num_experts, h))
        here = cfg.num_experts // layout.ep
        for e in range(here):
            expert = e + c.ep * here
            out.update(_swiglu(f"{src}.mlp.experts.{expert}", f"{dst}.mlp.experts.local_experts.{e}", cfg, tp, c.tp))
    if c.pp == layout.pp - 1:
        out["decoder.final_layernorm.weight"] = _whole("decoder.final_layernorm.weight", (h,))
        out["output_layer.weight"] = _vocab("output_layer.weight", cfg, tp, c.tp)
    return out


def shards_from_logical(shards: dict[str, LocalShard], logical: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """This rank's local tensors cut from whole logical tensors (padding zero)."""
    out = {}
    for key, shard in shards.items():
        tensor = torch.zeros(shard.shape, dtype=next(iter(logical.values())).dtype)
        for p in shard.pieces:
            tensor[p.local.slices()] = logical[p.logical][p.target.slices()]
        out[key] = tensor
    return out


def pieces_of(shards: dict[str, LocalShard], tensors: dict[str, torch.Tensor], *,
              suffix: str = "") -> list[tuple[str, Box, torch.Tensor]]:
    """``(logical name + suffix, logical box, block)`` for every piece of the local ``tensors``."""
    return [(p.logical + suffix, p.target, tensors[key][p.local.slices()].clone())
            for key, shard in shards.items() for p in shard.pieces]
