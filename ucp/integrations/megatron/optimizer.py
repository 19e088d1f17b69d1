"""Megatron-style optimisers: Adam beside every parameter (zero=0), or the distributed optimizer.

The distributed optimizer (Megatron's ``--use-distributed-optimizer``, ZeRO-1/2)
lays a rank's local parameters end to end in one flat buffer (in the order the
megatron-gpt preset's ``flat`` rule uses: natural order of their keys), pads it to
a multiple of the partition group's size and cuts it into equal parts; each rank
keeps fp32 master weights and Adam moments for its part only. A step sums the
gradients over the reduction group, updates the part, and all-gathers the parts
back into the parameters. Dense parameters are partitioned over dp x cp (as
Megatron does); experts over the expert-data-parallel group.

Gradients are summed in float64: the result (rounded to fp32 once) does not depend
on how many ranks contributed or in what order, which keeps runs under different
layouts within rounding of each other.

Mixed precision (bf16 parameters): both optimisers keep fp32 masters apart from the
parameters, as Megatron does (its masters start as copies of the bf16 parameters;
gradients are reduced in fp32 or better, here float64, and never rounded to bf16
in between); after each step the parameters are the masters rounded to bf16.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch import nn

from ucp.integrations.stacks.common import TrainSettings, fresh_adam_state, make_adam

__all__ = ["ReplicatedAdam", "DistributedAdam"]


def _sum_grads(grad: torch.Tensor, group) -> torch.Tensor:
    """The gradient summed over ``group``, as float32 (the masters' dtype) whatever ``grad``'s dtype."""
    total = grad.double()
    if group is not None:
        dist.all_reduce(total, group=group)
    return total.float()


def adoptable(tensor: torch.Tensor | None, shape, dtype: torch.dtype) -> bool:
    """Whether ``tensor`` can serve as the storage of a state of this shape and dtype (contiguous)."""
    return (tensor is not None and tuple(tensor.shape) == tuple(shape) and tensor.dtype == dtype
            and tensor.is_contiguous())


def _fresh_state(adam: torch.optim.Adam, given: list[Mapping[str, torch.Tensor]] | None = None) -> None:
    """Adam's state before its first step for every parameter. ``given``: per parameter, moments
    already filled (from a checkpoint; ``exp_avg``, ``exp_avg_sq``), taken as they are where they
    fit instead of fresh zeros that a load would overwrite."""
    params = [p for group in adam.param_groups for p in group["params"]]
    for p, have in zip(params, given or [{}] * len(params)):
        state = fresh_adam_state(p) if not have else {"step": torch.tensor(0.0)}
        if have:
            for name in ("exp_avg", "exp_avg_sq"):
                t = have.get(name)
                state[name] = t if adoptable(t, p.shape, p.dtype) else torch.zeros_like(p)
        adam.state[p] = state


def _master(given: torch.Tensor | None, param: nn.Parameter) -> nn.Parameter:
    """The fp32 master of a parameter below fp32: ``given`` where it fits, else a copy of the parameter."""
    return nn.Parameter(given if adoptable(given, param.shape, torch.float32) else param.detach().float())


class ReplicatedAdam:
    """zero=0: gradients summed over ``reduce_group``, Adam state beside each parameter.

    ``params``: local key -> parameter. Parameters below fp32 get an fp32 master each, which
    Adam steps instead (Megatron's Float16OptimizerWithFloat16Params). ``given``: key -> state
    name (``fp32``, ``exp_avg``, ``exp_avg_sq``) -> a tensor already holding it, used as its storage."""

    def __init__(self, params: dict[str, nn.Parameter], settings: TrainSettings, *, reduce_group,
                 given: Mapping[str, Mapping[str, torch.Tensor]] | None = None) -> None:
        self.keys, self.params, self.group = list(params), list(params.values()), reduce_group
        given = given or {}
        with torch.no_grad():
            self.masters = [p if p.dtype == torch.float32 else _master(given.get(k, {}).get("fp32"), p)
                            for k, p in params.items()]
        self.adam = make_adam(self.masters, settings)
        _fresh_state(self.adam, [given.get(k, {}) for k in self.keys] if given else None)

    def step(self) -> None:
        for p, master in zip(self.params, self.masters):
            grad = _sum_grads(p.grad if p.grad is not None else torch.zeros_like(p), self.group)
            p.grad = None  # the bf16 gradient is consumed (in fp32, master is p: set again below)
            master.grad = grad
        self.adam.step()
        self.adam.zero_grad()
        with torch.no_grad():
            for p, master in zip(self.params, self.masters):
                if master is not p:
                    p.copy_(master)

    def state_of(self, param: nn.Parameter, name: str) -> torch.Tensor:
        """``fp32`` (the master), ``exp_avg`` or ``exp_avg_sq`` of ``param``."""
        master = self.masters[next(i for i, p in enumerate(self.params) if p is param)]
        return master.data if name == "fp32" else self.adam.state[master][name]

    def set_step(self, step: int) -> None:
        for state in self.adam.state.values():
            state["step"] = torch.tensor(float(step))


class DistributedAdam:
    """ZeRO-1/2 over ``partition_group`` for ``params`` (key -> parameter, in buffer order); see the module doc.
    ``given``: state name (``fp32``, ``exp_avg``, ``exp_avg_sq``) -> this rank's part already filled
    (from a checkpoint), used as its storage instead of a fresh one."""

    def __init__(self, params: dict[str, nn.Parameter], settings: TrainSettings, *, reduce_group,
                 partition_group, given: Mapping[str, torch.Tensor] | None = None) -> None:
        self.keys, self.params = list(params), list(params.values())
        self.reduce_group, self.partition_group = reduce_group, partition_group
        self.parts = 1 if partition_group is None else dist.get_world_size(partition_group)
        index = 0 if partition_group is None else dist.get_rank(partition_group)
        total = sum(p.numel() for p in self.params)
        self.padded = -(-total // self.parts) * self.parts
        self.chunk = self.padded // self.parts
        self.lo = index * self.chunk
        given = given or {}
        master = given.get("fp32")
        with torch.no_grad():
            if adoptable(master, (self.chunk,), torch.float32):  # filled already: no flat copy of the parameters
                self.master = nn.Parameter(master)
            else:
                flat = self._flat([p.detach().float() for p in self.params])
                self.master = nn.Parameter(flat[self.lo : self.lo + self.chunk].clone())
        self.adam = make_adam([self.master], settings)
        _fresh_state(self.adam, [given] if given else None)

    def _flat(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        flat = torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.zeros(0)
        return torch.cat([flat, flat.new_zeros(self.padded - flat.numel())])

    def step(self) -> None:
        grads = self._flat([p.grad.float() if p.grad is not None else torch.zeros_like(p, dtype=torch.float32)
                            for p in self.params])
        self.master.grad = _sum_grads(grads, self.reduce_group)[self.lo : self.lo + self.chunk]
        self.adam.step()
        self.adam.zero_grad()
        for p in self.params:
            p.grad = None
        self.copy_to_params()

    def copy_to_params(self) -> None:
        """All-gather the updated parts and write them into the (local, tp-sharded) parameters."""
        if self.partition_group is None or self.parts == 1:
            flat = self.master.data
        else:  # gathered straight into one flat buffer (its parts are views of it): no copy to join them
            flat = torch.empty(self.padded, dtype=self.master.dtype)
            dist.all_gather(list(flat.split(self.chunk)), self.master.data.contiguous(), group=self.partition_group)
        offset = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()

    def refresh_master(self, tensors: list[torch.Tensor] | None = None) -> None:
        """Masters from fp32 ``tensors`` (one per parameter, in buffer order; default: the parameters),
        after loading a checkpoint of an fp32 run, whose parameters are its masters."""
        tensors = [p.detach() for p in self.params] if tensors is None else tensors
        if any(t.dtype != torch.float32 for t in tensors):
            raise AssertionError("masters come from fp32 tensors only (check_masters refuses the rest)")
        with torch.no_grad():
            self.master.copy_(self._flat(list(tensors))[self.lo : self.lo + self.chunk])

    def state(self, name: str) -> torch.Tensor:
        """This rank's part: ``fp32`` (masters), ``exp_avg`` or ``exp_avg_sq``."""
        return self.master.data if name == "fp32" else self.adam.state[self.master][name]

    def set_step(self, step: int) -> None:
        self.adam.state[self.master]["step"] = torch.tensor(float(step))
