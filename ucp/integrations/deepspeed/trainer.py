"""The DeepSpeed reference trainer: the real engine, ZeRO stages 1-3, checkpoints through ucp.

Data parallelism only (``dp`` and ``zero`` of the layout); DeepSpeed runs its own
ZeRO optimizer around ``torch.optim.Adam``. Checkpoints are mapped by the
deepspeed-zero UCL preset: stage 1/2 save the whole parameters (replicas) plus
each rank's flat partition of the fp32 masters and Adam moments; stage 3 saves
each rank's partition of every parameter as well. A load compiles the preset for
the new dp and stage, so a ZeRO-2 checkpoint on 4 ranks resumes as ZeRO-3 on 2,
and checkpoints of the other stacks (same logical names) load too.

    trainer = DeepSpeedTrainer(LlamaConfig(), "dp=4,zero=2", TrainSettings(), rank=rank)
    loss = trainer.train_step()
    trainer.save("ckpt/step_1")

``TrainSettings(precision="bf16")`` turns on DeepSpeed's ``bf16: {enabled: true}``: the
engine holds bf16 parameters (ZeRO-3: bf16 partitions) and its ZeRO optimizer the fp32
master partitions, saved as ``<name>`` (bfloat16) and ``<name>/fp32``; gradients are
reduced in fp32 (``communication_data_type``), as the other stacks reduce them.

DeepSpeed is an optional extra (``pip install 'ucp-middleware[deepspeed]'``);
without a GPU it runs on its CPU accelerator over gloo.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch

from ucp import ucl
import ucp
from ucp.integrations.llama.config import LlamaConfig
from ucp.integrations.llama.data import SyntheticCorpus, local_batch
from ucp.integrations.llama.model import build_model, token_loss_sum
from ucp.integrations.stacks.common import (STATES, CheckpointSaving, Progress, TrainSettings, fresh_adam_state,
                                            global_loss, global_tokens, make_adam, plan_logical_load,
                                            plan_program_load)
from ucp.errors import LayoutError
from ucp.layout import Layout
from ucp.spec import LogicalTensor

__all__ = ["DeepSpeedTrainer", "import_deepspeed"]

# DeepSpeed calls torch's older all_gather_into_tensor name, which warns on every call.
warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*is deprecated", category=FutureWarning)


def import_deepspeed():
    """Import DeepSpeed (on its CPU accelerator when there is no GPU), with an install hint."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import deepspeed
        import deepspeed.ops
    except ImportError as err:  # pragma: no cover - the extra is installed by `make test`
        raise ImportError("the DeepSpeed stack needs DeepSpeed: pip install 'ucp-middleware[deepspeed]'") from err
    if not torch.cuda.is_available():
        # On CPU, DeepSpeed's first init compiles a shared-memory all-reduce (minutes on a small machine,
        # again for every new environment path, and a build killed midway leaves a lock that hangs every
        # later init). It changes nothing in a checkpoint or a loss, so gloo communicates instead.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    return deepspeed


class DeepSpeedTrainer(CheckpointSaving):
    """One rank of a DeepSpeed ZeRO run (see the module doc). ``universal=True`` configures the engine
    to load DeepSpeed universal checkpoints; ``init=False`` skips drawing the initial weights."""

    stack = "deepspeed"

    def __init__(self, cfg: LlamaConfig, layout: Layout | str, settings: TrainSettings, *, rank: int,
                 universal: bool = False, init: bool = True) -> None:
        layout = Layout.parse(layout) if isinstance(layout, str) else layout
        if layout.world_size != layout.dp or layout.ep > 1 or layout.vpp > 1 or not layout.zero:
            raise LayoutError(f"the DeepSpeed stack runs data parallelism with ZeRO stage 1, 2 or 3 (dp=N,zero=S); "
                              f"got {layout}")
        deepspeed = import_deepspeed()
        self.cfg, self.layout, self.settings, self.rank = cfg, layout, settings, rank
        self.corpus = SyntheticCorpus(cfg.vocab_size, cfg.seq_len, settings.data_seed)
        self.progress = Progress()
        model = build_model(cfg, init=init)
        self.names = [name for name, _ in model.named_parameters()]  # DeepSpeed's flat-buffer order
        self.shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
        config = {
            "train_batch_size": layout.dp, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": layout.zero}, "zero_allow_untested_optimizer": True,
            "gradient_clipping": 0.0,  # DeepSpeed clips at 1.0 unless told; the other stacks do not clip
            "steps_per_print": 1 << 30, "wall_clock_breakdown": False,
            "checkpoint": {"load_universal": universal},  # DeepSpeed's own resharding path (native.py)
        }
        if settings.mixed:
            config |= {"bf16": {"enabled": True}, "communication_data_type": "fp32"}
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=make_adam(model.parameters(), settings), config=config)
        self.params = dict(self.engine.module.named_parameters())
        # Adam's state before its first step (a step-0 checkpoint and a load need tensors to fill);
        # ZeRO-1/2 link the per-parameter views of it only after a step, so link them now
        for master in self._masters():
            self._adam.state[master] = fresh_adam_state(master)
        if layout.zero < 3:
            self.optimizer._lazy_init_hp_params_optimizer_state()

    # ------------------------------------------------------------------ DeepSpeed's buffers
    @property
    def _adam(self) -> torch.optim.Optimizer:
        return self.optimizer.optimizer  # the torch Adam inside DeepSpeed's ZeRO optimizer

    def _masters(self) -> list[torch.Tensor]:
        """The tensors Adam steps: this rank's flat fp32 partitions (one per parameter group)."""
        if self.layout.zero == 3:
            return list(self.optimizer.fp32_partitioned_groups_flat)
        return list(self.optimizer.single_partition_of_fp32_groups)

    # ------------------------------------------------------------------ training
    def train_step(self) -> float:
        """One optimiser step on the global batch at the data position; returns its mean loss."""
        inputs, targets = local_batch(self.corpus, position=self.progress.position,
                                      global_batch=self.settings.global_batch, dp=(self.layout.dp, self.rank),
                                      cp=(1, 0))
        loss = token_loss_sum(self.engine(inputs), targets) / global_tokens(self.settings, self.cfg.seq_len)
        # DeepSpeed averages gradients over dp; every rank's loss is already a share of the global mean
        self.engine.backward(loss * self.layout.dp)
        self.engine.step()
        self.progress = Progress(self.progress.step + 1, self.progress.position + self.settings.global_batch)
        return global_loss(loss)

    # ------------------------------------------------------------------ checkpoints
    def program(self, states: tuple[str, ...]) -> str:
        """The deepspeed-zero preset bound to this model's parameter order and the states saved."""
        return str(ucl.load_program("deepspeed-zero", order=list(self.names), states=list(states)))

    def run_info(self) -> dict:
        return {"stack": self.stack, "layout": str(self.layout), "model": str(self.cfg),
                "settings": self.settings.to_dict()}

    def checkpoint_state(self) -> tuple[dict, dict]:
        """``(state, options)`` for ``ucp.save(state, path, **options)`` (or a CheckpointManager)."""
        import torch.distributed as dist

        if self.layout.zero == 3:
            module = {"flat_param": self.optimizer.fp16_partitioned_groups_flat[0]}
        else:
            module = {name: p.detach() for name, p in self.params.items()}
        (master,) = self._masters()
        states = ("fp32", *STATES)
        optim = {s: {"group0": master.detach() if s == "fp32" else self._adam.state[master][s]} for s in states}
        state = {"module": module, "optim": optim, **self.progress.to_tree(rank=self.rank, run=self.run_info())}
        dtype = str(self.settings.param_dtype).replace("torch.", "")
        logical = {n: LogicalTensor(n, shape, dtype) for n, shape in self.shapes.items()}
        return state, {"program": self.program(states), "layout": self.layout,
                       "process_group": dist.group.WORLD, "logical": logical}

    def load(self, path: str) -> Progress:
        """Load a checkpoint of any stack and layout into this rank's partitions; returns its progress."""
        # ZeRO keeps fp32 masters apart in every precision: from an fp32 run's parameters if need be
        _, fmap, into = plan_program_load(path, self.program, self.layout, self.rank, masters=True,
                                          params_are_masters=not self.settings.mixed)
        tree = ucp.load(path, into=into, spec=fmap)
        self.load_tensors(into, tree)
        return self.progress

    def load_target(self, logical: dict, where: str) -> tuple[Any, dict[str, torch.Tensor]]:
        """:meth:`load`'s fragment map over a checkpoint's ``logical`` tensors and the zeroed local
        tensors to read into (then :meth:`load_tensors`); e.g. for a checkpoint held in memory."""
        _, fmap, into = plan_logical_load(logical, where, self.program, self.layout, self.rank, masters=True,
                                          params_are_masters=not self.settings.mixed)
        return fmap, into

    def load_tensors(self, into: dict[str, torch.Tensor], tree: dict) -> None:
        """Copy tensors read by :meth:`load_target`'s map into the engine's partitions, and restore
        the progress (step, data position, RNG) from ``tree``."""
        with torch.no_grad():
            if self.layout.zero == 3:
                self.optimizer.fp16_partitioned_groups_flat[0].copy_(into["module/flat_param"])
            else:
                for name, param in self.params.items():
                    param.copy_(into[f"module/{name}"])
            (master,) = self._masters()
            master.copy_(into["optim/fp32/group0"])
            for s in STATES:
                self._adam.state[master][s].copy_(into[f"optim/{s}/group0"])
        self.progress = Progress.from_tree(tree)
        for state in self._adam.state.values():
            state["step"] = torch.tensor(float(self.progress.step))
        Progress.restore_rng(tree, rank=self.rank, seed=self.settings.data_seed)

    def logical_snapshot(self) -> dict[str, torch.Tensor] | None:
        """Every logical tensor (parameters, masters, Adam moments), whole, on rank 0, by DeepSpeed's own API."""
        from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

        deepspeed = import_deepspeed()
        out = {}
        for name, param in self.params.items():
            if self.layout.zero == 3:
                with deepspeed.zero.GatheredParameters([param]):
                    out[name] = param.detach().clone()
            else:
                out[name] = param.detach().clone()
            out[f"{name}/fp32"] = safe_get_full_fp32_param(param).clone()
            for s in STATES:
                out[f"{name}/{s}"] = safe_get_full_optimizer_state(param, s).clone()
        return out if self.rank == 0 else None
