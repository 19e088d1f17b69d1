"""The torch-native reference trainer: DTensor TP, FSDP2, torch pipelining, all-gather CP.

Any layout ``tp x cp x dp x pp`` (ranks ordered tp fastest, then cp, dp, pp).
Checkpoints go through ucp with a fragment map built from each local shard's
place in its logical tensor (DTensor's own chunk metadata), so a checkpoint saved
here loads under any layout of any stack, and this stack loads theirs.

``TrainSettings(precision="bf16")`` is FSDP2's mixed precision: the sharded parameters
stay fp32 and are the masters (Adam steps them), ``MixedPrecisionPolicy(param_dtype=
bfloat16)`` casts them to bf16 for compute, gradients are reduced in float64 (fp32 or
better). FSDP2 is applied even when dp x cp is 1, so every layout computes the same way.
A checkpoint holds the masters as ``<name>/fp32`` and, as ``<name>``, the bf16
parameters FSDP2 computes with (derived: ``master.to(bfloat16)``; a load reads the
masters only).

    trainer = NativeTrainer(LlamaConfig(), "tp=2,pp=2,dp=2", TrainSettings(), rank=dist.get_rank())
    for _ in range(10):
        loss = trainer.train_step()
    trainer.save("ckpt/step_10")
"""

from __future__ import annotations

import logging
import warnings

import torch
import torch.distributed as dist

import ucp
from ucp.integrations.llama.config import ConfigError, LlamaConfig
from ucp.integrations.llama.data import SyntheticCorpus, local_batch
from ucp.integrations.llama.context_parallel import context_parallel_attention
from ucp.integrations.llama.model import build_model, keep_stage, token_loss_sum
from ucp.integrations.native.parallelize import apply_fsdp, apply_tensor_parallel, build_mesh, cp_group
from ucp.integrations.stacks.common import (STATES, CheckpointSaving, Progress, TrainSettings, check_masters,
                                            fresh_adam_state, gather_to_rank0, global_loss, global_tokens, make_adam,
                                            master_name)
from ucp.integrations.stacks.fragments import box_fragment_map, dtensor_box
from ucp.errors import LayoutError
from ucp.geometry import Box, split_evenly
from ucp.layout import Layout
from ucp.reader import CheckpointReader
from ucp.spec import FragmentMap, LogicalTensor, ShardPiece, TensorSpec

__all__ = ["NativeTrainer"]

# FSDP2 warns that the root returns a view; nothing here modifies the logits in place.
warnings.filterwarnings("ignore", message="FSDP2-wrapped module", category=UserWarning)
# Snapshots gather strided FSDP2 x TP shards with two all-gathers; torch logs that it is suboptimal.
logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.detach()
    return tensor.to_local() if type(tensor).__name__ == "DTensor" else tensor


def _full(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.detach()
    return tensor.full_tensor() if type(tensor).__name__ == "DTensor" else tensor


class NativeTrainer(CheckpointSaving):
    """One rank of a torch-native run (see the module doc). ``init=False`` skips drawing the initial
    weights, for a rank that loads a checkpoint right away."""

    stack = "native"

    def __init__(self, cfg: LlamaConfig, layout: Layout | str, settings: TrainSettings, *, rank: int,
                 init: bool = True) -> None:
        layout = Layout.parse(layout) if isinstance(layout, str) else layout
        if layout.ep > 1 or layout.vpp > 1 or layout.zero:
            raise LayoutError(
                f"the torch-native stack runs tp, pp, dp and cp (FSDP2 shards over dp x cp); got {layout}: "
                "use the Megatron-style stack for ep and vpp, DeepSpeed for ZeRO stages"
            )
        if cfg.seq_len % layout.cp:
            raise ConfigError(f"cp={layout.cp} must divide seq_len ({cfg.seq_len}): each cp rank holds an equal chunk")
        if settings.global_batch < layout.dp:
            raise ConfigError(f"global_batch ({settings.global_batch}) must be at least dp ({layout.dp})")
        self.cfg, self.layout, self.settings, self.rank = cfg, layout, settings, rank
        self.coords = layout.coords(rank)
        self.mesh = build_mesh(layout)
        self.corpus = SyntheticCorpus(cfg.vocab_size, cfg.seq_len, settings.data_seed)
        self.progress = Progress()
        self.first = self.coords.pp == 0
        self.last = self.coords.pp == layout.pp - 1

        model = build_model(cfg, init=init)  # every rank the same logical weights, then its shard
        if settings.mixed:  # the masters start as the bf16 parameters, as on every stack
            with torch.no_grad():
                for param in model.parameters():
                    param.copy_(param.to(settings.param_dtype))
        if layout.pp > 1:
            keep_stage(model, self.coords.pp, layout.pp)
        if layout.cp > 1:
            offset = self.coords.cp * (cfg.seq_len // layout.cp)
            model.position_offset = offset
            model.attend = context_parallel_attention(cp_group(layout, rank), q_offset=offset)
        if layout.tp > 1:
            apply_tensor_parallel(model, self.mesh["tp"])
        if layout.dp * layout.cp > 1 or settings.mixed:
            apply_fsdp(model, self.mesh["dp_cp"], pipelined=layout.pp > 1, param_dtype=settings.param_dtype)
        self.model = model
        self.optimizer = make_adam(model.parameters(), settings)
        self._init_optimizer_state()
        self._fmap = None
        self.schedule = None
        if layout.pp > 1:
            from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

            rows = split_evenly(settings.global_batch, layout.dp, self.coords.dp)[1]
            stage = PipelineStage(model, self.coords.pp, layout.pp, torch.device("cpu"),
                                  group=self.mesh["pp"].get_group())
            self.schedule = ScheduleGPipe(stage, n_microbatches=min(settings.microbatches, rows),
                                          loss_fn=self._loss, scale_grads=False)

    # ------------------------------------------------------------------ training
    def _loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return token_loss_sum(logits, targets) / global_tokens(self.settings, self.cfg.seq_len)

    def _init_optimizer_state(self) -> None:
        for group in self.optimizer.param_groups:
            for param in group["params"]:
                self.optimizer.state[param] = fresh_adam_state(param)

    def train_step(self) -> float:
        """One optimiser step on the global batch at the data position; returns its mean loss."""
        inputs, targets = local_batch(self.corpus, position=self.progress.position,
                                      global_batch=self.settings.global_batch, dp=(self.layout.dp, self.coords.dp),
                                      cp=(self.layout.cp, self.coords.cp))
        if self.schedule is None:
            loss = self._loss(self.model(inputs), targets)
            loss.backward()
            local = loss.detach().double()
        else:
            losses: list = []
            if self.first:
                self.schedule.step(inputs)
            elif self.last:
                self.schedule.step(target=targets, losses=losses)
            else:
                self.schedule.step()
            local = torch.stack([x.detach().double() for x in losses]).sum() if losses else None
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.progress = Progress(self.progress.step + 1, self.progress.position + self.settings.global_batch)
        return global_loss(local if self.last and self.coords.tp == 0 else None)

    # ------------------------------------------------------------------ checkpoints
    def _entries(self, *, saving: bool = True):
        """(key, logical name, box, local tensor, master of) for everything saved; empty shards left out.

        ``master of`` names the parameter whose fp32 master the entry is (None for the rest). In
        bf16 mode the sharded fp32 parameter is the master; the bf16 parameter is derived from it
        and only saved (``saving=False`` leaves it out)."""
        mixed = self.settings.mixed
        for name, param in self.model.named_parameters():
            box = dtensor_box(param)
            if not box.numel:
                continue
            if not mixed:
                yield f"model/{name}", name, box, _local(param), name
            else:
                if saving:
                    yield f"model/{name}", name, box, _local(param).to(self.settings.param_dtype), None
                yield f"optim/fp32/{name}", f"{name}/fp32", box, _local(param), name
            state = self.optimizer.state[param]
            for s in STATES:
                yield f"optim/{s}/{name}", f"{name}/{s}", box, _local(state[s]), None

    def run_info(self) -> dict:
        return {"stack": self.stack, "layout": str(self.layout), "model": str(self.cfg),
                "settings": self.settings.to_dict()}

    def checkpoint_state(self) -> tuple[dict, dict]:
        """``(state, options)`` for ``ucp.save(state, path, **options)`` (or a CheckpointManager)."""
        states = ("fp32", *STATES) if self.settings.mixed else STATES
        state: dict = {"model": {}, "optim": {s: {} for s in states}}
        local, logical = {}, {}
        for key, name, box, tensor, _ in self._entries():
            kind, _, rest = key.partition("/")
            if kind == "model":
                state["model"][rest] = tensor
            else:
                s, _, pname = rest.partition("/")
                state["optim"][s][pname] = tensor
            local[key] = (name, box)
        dtype = str(self.settings.param_dtype).replace("torch.", "")
        for name, param in self.model.named_parameters():
            logical[name] = LogicalTensor(name, tuple(param.shape), dtype)
            for logical_name in (f"{name}/{s}" for s in states):
                logical[logical_name] = LogicalTensor(logical_name, tuple(param.shape), "float32")
        if self._fmap is None:  # the layout never changes during a run: one metadata all-gather
            self._fmap = box_fragment_map(local, logical)
        state.update(self.progress.to_tree(rank=self.rank, run=self.run_info()))
        return state, {"spec": self._fmap, "process_group": dist.group.WORLD}

    def load(self, path: str) -> Progress:
        """Load a checkpoint of any stack and layout into this rank's shards; returns its progress."""
        with CheckpointReader(path) as reader:
            logical = reader.logical()
        fmap, into = self.load_target(logical, path)
        tree = ucp.load(path, into=into, spec=fmap, strict=True)
        self.progress = Progress.from_tree(tree)
        for state in self.optimizer.state.values():
            state["step"] = torch.tensor(float(self.progress.step))
        Progress.restore_rng(tree, rank=self.rank, seed=self.settings.data_seed)
        return self.progress

    def load_target(self, logical: dict, where: str) -> tuple[FragmentMap, dict[str, torch.Tensor]]:
        """The load-direction fragment map over ``logical`` (a checkpoint's tensors, read from ``where``)
        and this rank's live local shards to fill in place; fp32 masters come from ``<name>/fp32``
        where the checkpoint has them, and a checkpoint below fp32 without them is refused."""
        check_masters(where, logical, [name for name, _ in self.model.named_parameters()])
        into: dict = {}
        specs = {}
        for key, name, box, tensor, master_of in self._entries(saving=False):
            source = master_name(master_of, logical) if master_of else name
            into[key] = tensor
            specs[key] = TensorSpec(key, (ShardPiece(source, Box((0,) * box.ndim, box.sizes), box),))
        used = {p.logical for spec in specs.values() for p in spec.pieces}
        fmap = FragmentMap(rank=self.rank, logical={n: t for n, t in logical.items() if n in used}, tensors=specs)
        return fmap, into

    def logical_snapshot(self) -> dict[str, torch.Tensor] | None:
        """Every logical tensor this run holds (parameters, bf16 mode's masters, Adam moments), whole, on rank 0."""
        mine = {}
        leader = self.coords.tp == 0 and self.coords.dp == 0 and self.coords.cp == 0
        for name, param in self.model.named_parameters():
            state = self.optimizer.state[param]
            for logical_name, tensor in ((name, param), *((f"{name}/{s}", state[s]) for s in STATES)):
                full = _full(tensor)
                if leader:
                    mine[logical_name] = full.clone()
                    if self.settings.mixed and logical_name == name:
                        mine[f"{name}/fp32"], mine[name] = full.clone(), full.to(self.settings.param_dtype)
        everyone = gather_to_rank0(mine)
        if everyone is None:
            return None
        return {k: v for part in everyone for k, v in part.items()}
