"""The Megatron-style reference trainer: TP, PP, DP (distributed optimizer), CP and EP.

Layouts ``tp x cp x dp x pp`` with ``ep`` dividing dp and ``zero`` 0 (Adam beside
every parameter) or 1/2 (the distributed optimizer over dp x cp). Checkpoints are
mapped by the megatron-gpt UCL preset: ``ucp.save(..., program=megatron-gpt:...,
layout=...)``, and loads compile the same preset for the new layout, so each rank
reads only the bytes of its shards, from a checkpoint of any layout or stack.

``TrainSettings(precision="bf16")``: the model holds bf16 parameters (and gets bf16
gradients); the optimizers keep fp32 masters (zero=0: one per parameter; the
distributed optimizer: this rank's part of the flat buffer), saved as
``optim/fp32/...`` -> ``<name>/fp32`` beside the bf16 ``model/...`` -> ``<name>``.

    trainer = MegatronTrainer(LlamaConfig(num_experts=4), "tp=2,dp=4,ep=2,zero=1", TrainSettings(), rank=rank)
    loss = trainer.train_step()
    trainer.save("ckpt/step_1")
"""

from __future__ import annotations

import fnmatch

import torch
import torch.distributed as dist

import ucp
from ucp.integrations.llama.config import ConfigError, LlamaConfig
from ucp.integrations.llama.context_parallel import context_parallel_attention
from ucp.integrations.llama.data import SyntheticCorpus, local_batch
from ucp.integrations.llama.model import build_model, logical_shapes
from ucp.integrations.megatron.groups import ParallelGroups
from ucp.integrations.megatron.layers import vocab_parallel_cross_entropy
from ucp.integrations.megatron.model import GPTStage
from ucp.integrations.megatron.optimizer import DistributedAdam, ReplicatedAdam, adoptable
from ucp.integrations.megatron.pipeline import run_gpipe
from ucp.integrations.megatron.sharding import local_shards, pieces_of, shards_from_logical
from ucp.integrations.stacks.common import (STATES, CheckpointSaving, MissingMastersError, Progress, TrainSettings,
                                            assemble, gather_to_rank0, global_loss, global_tokens, plan_program_load)
from ucp.errors import LayoutError
from ucp.layout import Layout

__all__ = ["MegatronTrainer", "megatron_program"]


def megatron_program(cfg: LlamaConfig, states: tuple[str, ...]) -> str:
    """The megatron-gpt preset bound to ``cfg`` and the optimizer states saved (no trainer needed)."""
    return f"{cfg.megatron_program()},states={'|'.join(states)}"


def saved_states(layout: Layout, settings: TrainSettings) -> tuple[str, ...]:
    """The optimizer states a run under ``layout`` saves: fp32 masters apart from the parameters
    under ZeRO or in mixed precision, and Adam's moments."""
    return ("fp32", *STATES) if layout.zero > 0 or settings.mixed else STATES


def _fill(dest: torch.Tensor, source: torch.Tensor) -> None:
    """``dest.copy_(source)``, skipped where ``dest`` is ``source``'s own storage (a state the
    trainer adopted when it was built from loaded tensors)."""
    if (dest.data_ptr() == source.data_ptr() and dest.shape == source.shape and dest.stride() == source.stride()
            and dest.dtype == source.dtype):
        return
    dest.copy_(source)


def _natural(key: str):
    import re

    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", key)]


class MegatronTrainer(CheckpointSaving):
    """One rank of a Megatron-style run (see the module doc). ``init=False`` skips drawing the initial
    weights, for a rank that loads a checkpoint right away. ``tensors`` (with ``init=False``): local
    tensors of this rank's load map already filled (``model/<key>``, ``optim/<state>/<kind>`` or
    ``optim/<state>/model/<key>``), taken as the storage of the parameters, masters and Adam moments
    they fit (same shape and dtype): nothing allocated twice, and :meth:`load_tensors` skips them."""

    stack = "megatron"

    def __init__(self, cfg: LlamaConfig, layout: Layout | str, settings: TrainSettings, *, rank: int,
                 init: bool = True, tensors: dict[str, torch.Tensor] | None = None) -> None:
        if tensors and init:
            raise ValueError("tensors= holds a loaded state: build with init=False")
        tensors = tensors or {}
        layout = Layout.parse(layout) if isinstance(layout, str) else layout
        self._check(cfg, layout, settings)
        self.cfg, self.layout, self.settings, self.rank = cfg, layout, settings, rank
        self.coords = layout.coords(rank)
        self.groups = ParallelGroups.build(layout, rank)
        self.corpus = SyntheticCorpus(cfg.vocab_size, cfg.seq_len, settings.data_seed)
        self.progress = Progress()
        self.shards = local_shards(cfg, layout, rank)
        self.stage = GPTStage(cfg, self.groups)
        if layout.cp > 1:
            offset = self.coords.cp * (cfg.seq_len // layout.cp)
            self.stage.position_offset = offset
            self.stage.attend = context_parallel_attention(self.groups.cp, q_offset=offset)
        self.params = dict(self.stage.named_parameters())
        if set(self.params) != set(self.shards):
            raise AssertionError(f"model and sharding disagree: {sorted(set(self.params) ^ set(self.shards))[:4]}")
        with torch.no_grad():
            if init:  # the same logical start on every layout, cut into this rank's shards
                logical = build_model(cfg).state_dict()
                for key, tensor in shards_from_logical(self.shards, logical).items():
                    self.params[key].copy_(tensor)
            else:  # a checkpoint is loaded next; padding stays zero
                for key, param in self.params.items():
                    if not adoptable(tensors.get(f"model/{key}"), param.shape, settings.param_dtype):
                        param.zero_()
        # Megatron's Float16Module: the model computes in bf16; the optimizers' masters start as its copies
        self.stage.to(settings.param_dtype)
        for key, param in self.params.items():  # filled already: their storage becomes the parameter's
            if adoptable(given := tensors.get(f"model/{key}"), param.shape, param.dtype):
                param.data = given
        self.optimizers = self._optimizers(tensors)

    @staticmethod
    def _check(cfg: LlamaConfig, layout: Layout, settings: TrainSettings) -> None:
        if layout.vpp > 1 or layout.zero > 2:
            raise LayoutError(f"the Megatron-style stack runs zero 0-2 without virtual pipeline stages; got {layout}")
        if cfg.kv_heads % layout.tp:
            raise LayoutError(f"tp={layout.tp} must divide kv_heads ({cfg.kv_heads}): "
                              "each tp rank holds whole key/value groups")
        if cfg.ffn % layout.tp:
            raise LayoutError(f"tp={layout.tp} must divide ffn ({cfg.ffn}), as Megatron requires of ffn_hidden_size")
        if layout.ep > 1 and cfg.num_experts % layout.ep:
            raise LayoutError(f"ep={layout.ep} must divide num_experts ({cfg.num_experts})")
        if layout.ep > 1 and not cfg.moe:
            raise LayoutError(f"ep={layout.ep} needs a mixture-of-experts model (num_experts > 0)")
        if cfg.seq_len % layout.cp:
            raise ConfigError(f"cp={layout.cp} must divide seq_len ({cfg.seq_len}): each cp rank holds an equal chunk")
        if settings.global_batch < layout.dp:
            raise ConfigError(f"global_batch ({settings.global_batch}) must be at least dp ({layout.dp})")

    # ------------------------------------------------------------------ optimizers
    def _keys(self, *, experts: bool) -> list[str]:
        """Local parameter names in the preset's flat-buffer order (natural order of their keys)."""
        keys = [k for k in self.params if fnmatch.fnmatchcase(f"model/{k}", "*.experts.*") == experts]
        return sorted(keys, key=lambda k: _natural(f"model/{k}"))

    def _optimizers(self, tensors: dict[str, torch.Tensor]) -> dict:
        """The optimizers over this rank's parameters (``tensors``: filled states to adopt, see the class doc)."""
        g = self.groups
        out = {}
        for kind, experts in (("dense", False), ("experts", True)):
            keys = self._keys(experts=experts)
            if not keys:
                continue
            params = {k: self.params[k] for k in keys}
            # experts' tokens came from the whole ep group already: sum over the ranks holding the same expert
            reduce_group = g.edp_cp if experts else g.dp_cp
            if self.layout.zero == 0:
                given = {k: {s: t for s in ("fp32", *STATES) if (t := tensors.get(f"optim/{s}/model/{k}")) is not None}
                         for k in keys}
                out[kind] = ReplicatedAdam(params, self.settings, reduce_group=reduce_group,
                                           given={k: v for k, v in given.items() if v})
            else:
                partition = g.edp if experts else g.dp_cp
                out[kind] = DistributedAdam(params, self.settings, reduce_group=reduce_group, partition_group=partition,
                                            given={s: t for s in ("fp32", *STATES)
                                                   if (t := tensors.get(f"optim/{s}/{kind}")) is not None})
        return out

    # ------------------------------------------------------------------ training
    def _loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        losses = vocab_parallel_cross_entropy(logits, targets, start=self.stage.vocab_start,
                                              vocab_size=self.cfg.vocab_size, group=self.groups.tp)
        return losses.sum() / global_tokens(self.settings, self.cfg.seq_len)

    def train_step(self) -> float:
        """One optimiser step on the global batch at the data position; returns its mean loss."""
        inputs, targets = local_batch(self.corpus, position=self.progress.position,
                                      global_batch=self.settings.global_batch, dp=(self.layout.dp, self.coords.dp),
                                      cp=(self.layout.cp, self.coords.cp))
        count = min(self.settings.microbatches, inputs.shape[0])
        micro_in, micro_tg = inputs.tensor_split(count), targets.tensor_split(count)
        if self.layout.pp == 1:
            local = torch.zeros((), dtype=torch.float64)
            for x, y in zip(micro_in, micro_tg):
                loss = self._loss(self.stage(x), y)
                loss.backward()
                local += loss.detach().double()
        else:
            local = run_gpipe(self.stage, self.groups, list(micro_in), list(micro_tg), self._loss,
                              hidden=self.cfg.hidden, dtype=self.settings.param_dtype)
        for optimizer in self.optimizers.values():
            optimizer.step()
        self.progress = Progress(self.progress.step + 1, self.progress.position + self.settings.global_batch)
        return global_loss(local if self.stage.last and self.coords.tp == 0 else None)

    # ------------------------------------------------------------------ checkpoints
    def program(self, states: tuple[str, ...]) -> str:
        """The megatron-gpt preset bound to this model and the optimizer states saved."""
        return megatron_program(self.cfg, states)

    def _states(self) -> tuple[str, ...]:
        return saved_states(self.layout, self.settings)

    def run_info(self) -> dict:
        return {"stack": self.stack, "layout": str(self.layout), "model": str(self.cfg),
                "settings": self.settings.to_dict()}

    def checkpoint_state(self) -> tuple[dict, dict]:
        """``(state, options)`` for ``ucp.save(state, path, **options)`` (or a CheckpointManager)."""
        optim: dict = {s: {} for s in self._states()}
        for kind, opt in self.optimizers.items():
            for s in self._states():
                if self.layout.zero == 0:  # beside each parameter: optim/<state>/model/<name>
                    optim[s].setdefault("model", {}).update(
                        {k: opt.state_of(self.params[k], s) for k in opt.keys})
                else:  # flat partitions: optim/<state>/dense, optim/<state>/experts
                    optim[s][kind] = opt.state(s)
        state = {"model": {k: p.detach() for k, p in self.params.items()}, "optim": optim,
                 **self.progress.to_tree(rank=self.rank, run=self.run_info())}
        return state, {"program": self.program(self._states()), "layout": self.layout,
                       "process_group": dist.group.WORLD}

    def load(self, path: str) -> Progress:
        """Load a checkpoint of any stack and layout into this rank's shards; returns its progress."""
        has_masters, fmap, into = plan_program_load(path, self.program, self.layout, self.rank,
                                                    masters="fp32" in self._states())
        tree = ucp.load(path, into=into, spec=fmap)
        return self.load_tensors(into, tree, has_masters=has_masters)

    @staticmethod
    def params_from_masters(layout: Layout, settings: TrainSettings, has_masters: bool) -> bool:
        """Whether :meth:`load_tensors` writes every parameter from the fp32 masters (the distributed
        optimizer in fp32 with masters in the checkpoint: its parameters are its masters), so a
        load need not read the ``model/...`` tensors at all."""
        return has_masters and layout.zero > 0 and not settings.mixed

    def load_tensors(self, into: dict[str, torch.Tensor], tree: dict, *, has_masters: bool) -> Progress:
        """Take loaded local tensors (keys of this rank's load map) and the saved JSON tree as this
        rank's state: what :meth:`load` does after reading, also used by a load from peers' memory."""
        mixed = self.settings.mixed
        if not has_masters:  # the checkpoint's parameters are its masters: they must be fp32
            low = sorted(k for k in into if k.startswith("model/") and into[k].dtype != torch.float32)
            if low:
                raise MissingMastersError(
                    f"the checkpoint holds {low[0]!r} as {str(into[low[0]].dtype).replace('torch.', '')} and no fp32 "
                    f"masters ({len(low)} tensor(s) like it): rebuilding fp32 masters from them would lose precision")
        from_masters = self.params_from_masters(self.layout, self.settings, has_masters)
        with torch.no_grad():
            for key, param in self.params.items():
                if from_masters and f"model/{key}" not in into:  # copy_to_params below writes it
                    continue
                master = into.get(f"optim/fp32/model/{key}")  # zero=0 target, masters in the checkpoint
                # mixed: the checkpoint's bf16 parameter (or its fp32 one, rounded as master.to(bf16) rounds)
                _fill(param, master if master is not None and not mixed else into[f"model/{key}"])
        for kind, opt in self.optimizers.items():
            if self.layout.zero == 0:
                for key in opt.keys:
                    for s in self._states():
                        source = into.get(f"optim/{s}/model/{key}")
                        if s == "fp32" and source is None:  # an fp32 run's parameters are its masters
                            source = into[f"model/{key}"]
                        if source is not None:
                            _fill(opt.state_of(self.params[key], s), source)
            else:
                if has_masters:
                    _fill(opt.state("fp32"), into[f"optim/fp32/{kind}"])
                    if not mixed:  # fp32 parameters are the masters (the checkpoint's may be bf16)
                        opt.copy_to_params()
                else:
                    opt.refresh_master([into[f"model/{k}"] for k in opt.keys])
                for s in STATES:
                    if f"optim/{s}/{kind}" in into:
                        _fill(opt.state(s), into[f"optim/{s}/{kind}"])
        self.progress = Progress.from_tree(tree)
        for opt in self.optimizers.values():
            opt.set_step(self.progress.step)
        Progress.restore_rng(tree, rank=self.rank, seed=self.settings.data_seed)
        return self.progress

    def _local_states(self, opt, s: str) -> dict[str, torch.Tensor]:
        """Optimizer state ``s`` as tensors shaped like this rank's parameters."""
        if self.layout.zero == 0:
            return {k: opt.state_of(self.params[k], s) for k in opt.keys}
        part = opt.state(s)
        parts = [torch.empty_like(part) for _ in range(opt.parts)]
        if opt.partition_group is None:
            parts = [part]
        else:
            dist.all_gather(parts, part.contiguous(), group=opt.partition_group)
        flat, out, offset = torch.cat(parts), {}, 0
        for k in opt.keys:
            n = self.params[k].numel()
            out[k] = flat[offset : offset + n].view_as(self.params[k])
            offset += n
        return out

    def logical_snapshot(self) -> dict[str, torch.Tensor] | None:
        """Every logical tensor this run holds (parameters, masters, Adam moments), whole, on rank 0."""
        pieces = pieces_of(self.shards, {k: p.detach() for k, p in self.params.items()})
        for opt in self.optimizers.values():
            for s in self._states():
                pieces += pieces_of({k: self.shards[k] for k in opt.keys}, self._local_states(opt, s), suffix=f"/{s}")
        everyone = gather_to_rank0(pieces)
        if everyone is None:
            return None
        merged = [p for part in everyone for p in part]
        shapes = logical_shapes(self.cfg)
        names = {name for name, _, _ in merged}
        dtype = self.settings.param_dtype  # of the parameters; masters and moments are fp32
        return assemble(merged, {n: (shapes[n.split("/")[0]], torch.float32 if "/" in n else dtype) for n in names})
