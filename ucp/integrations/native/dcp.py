"""The torch-native peer path: checkpoints through torch.distributed.checkpoint (DCP).

What a torchtitan user does today: ``get_state_dict`` of the FSDP2/TP model and its
optimizer, ``dcp.save``; after a failure, a new layout builds its model, asks for
its state dict and ``dcp.load`` reshards into it. The recovery benchmark runs this
next to ucp on the same trainer. A checkpoint is complete once DCP's ``.metadata``
file exists (rank 0 writes it after every rank's data).

    save_dcp(trainer, "dcp/step_10")
    load_dcp(new_trainer, "dcp/step_10")        # another layout
"""

from __future__ import annotations

import os

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from ucp.integrations.stacks.common import Progress

__all__ = ["save_dcp", "load_dcp", "dcp_committed"]


def save_dcp(trainer, path: str) -> None:
    model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer)
    progress = {"step": trainer.progress.step, "position": trainer.progress.position}
    dcp.save({"model": model_sd, "optim": optim_sd, "progress": progress}, checkpoint_id=path)


def load_dcp(trainer, path: str) -> Progress:
    model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer)
    state = {"model": model_sd, "optim": optim_sd, "progress": {"step": 0, "position": 0}}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(trainer.model, trainer.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    trainer.progress = Progress(int(state["progress"]["step"]), int(state["progress"]["position"]))
    for param_state in trainer.optimizer.state.values():
        param_state["step"] = torch.tensor(float(trainer.progress.step))
    return trainer.progress


def dcp_committed(path: str) -> bool:
    return os.path.isfile(os.path.join(path, ".metadata"))
