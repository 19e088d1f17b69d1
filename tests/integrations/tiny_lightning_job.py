"""A tiny Lightning job for the kill-and-resume test (run as a subprocess).

usage: python tiny_lightning_job.py DIRECTORY MAX_STEPS [--sleep S]
Prints "step N" after each step; at each save dumps the live model and
optimizer state to DIRECTORY/witness/witness_N; after a resume dumps it to
DIRECTORY/witness/resumed (the test compares the two; not in DIRECTORY itself,
where the checkpoint manager would count them as checkpoints).
"""

from __future__ import annotations

import argparse
import time

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from ucp.integrations.lightning import UcpCheckpoint
from ucp.api import save
from ucp.policies import EveryNSteps


class Tiny(pl.LightningModule):
    def __init__(self, sleep: float) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        self.sleep = sleep

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        if self.sleep:
            time.sleep(self.sleep)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-2)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 7, 0.9)}


class Witness(pl.Callback):
    def __init__(self, directory: str, every: int) -> None:
        self.directory, self.every = directory, every

    def _dump(self, trainer, name: str) -> None:
        save({"model": trainer.lightning_module.state_dict(), "optimizer": trainer.optimizers[0].state_dict(),
              "scheduler": trainer.lr_scheduler_configs[0].scheduler.state_dict()},
             f"{self.directory}/witness/{name}", overwrite=True)

    def on_train_start(self, trainer, pl_module):
        print("resumed", trainer.global_step, flush=True)
        if trainer.global_step:
            self._dump(trainer, "resumed")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step % self.every == 0:
            self._dump(trainer, f"witness_{trainer.global_step}")
        print("step", trainer.global_step, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("max_steps", type=int)
    parser.add_argument("--sleep", type=float, default=0.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    x = torch.randn(256, 8)
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8, shuffle=True)
    checkpoint = UcpCheckpoint(args.directory, save_policy=EveryNSteps(5), flush_every_s=0.0)
    # The witness runs after the checkpoint callback, so it sees the state just saved.
    trainer = pl.Trainer(
        max_steps=args.max_steps, callbacks=[checkpoint, Witness(args.directory, 5)],
        plugins=[checkpoint.checkpoint_io], enable_checkpointing=False, logger=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1,
    )
    trainer.fit(Tiny(args.sleep), data, ckpt_path=checkpoint.latest_checkpoint())
    print("ettr", trainer.callback_metrics["ettr"].item(), flush=True)
    print("summary", checkpoint.session.summary(), flush=True)


if __name__ == "__main__":
    main()
