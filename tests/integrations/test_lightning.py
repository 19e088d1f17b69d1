"""The Lightning callback with the real Lightning Trainer: kill, resume, ETTR."""

from __future__ import annotations

import pytest

pytest.importorskip("lightning")

from ucp.reliability.ettr.tracker import ETTRTracker
from ucp.api import load


@pytest.mark.slow
def test_lightning_run_killed_and_resumed(tmp_path, jobs, same_state, committed):
    jobs.run_until("tiny_lightning_job.py", str(tmp_path), "30", "--sleep", "0.03", line="step 17")
    last = committed(tmp_path)[-1]
    assert last == 15

    out = jobs.run("tiny_lightning_job.py", str(tmp_path), "30")
    assert f"resumed {last}" in out
    # The state Lightning restored from the ucp checkpoint is the state the
    # killed process had when it saved (model, optimizer, scheduler).
    same_state(load(tmp_path / "witness" / f"witness_{last}"), load(tmp_path / "witness" / "resumed"))
    assert committed(tmp_path)[-1] == 30  # ran on to max_steps and saved the last step

    summary = ETTRTracker(tmp_path).summary()
    assert (summary.restarts, summary.last_step) == (1, 30)
    assert summary.lost_steps >= 16 - last and summary.lost_s > 0
    assert "ettr 0." in out and "1 restart" in out


def test_checkpoint_io_round_trips_a_lightning_style_dict(tmp_path):
    import torch

    from ucp.integrations.lightning import UcpCheckpointIO

    io = UcpCheckpointIO()
    checkpoint = {"epoch": 1, "global_step": 7, "state_dict": {"w": torch.ones(2)},
                  "loops": {"fit_loop": {"state_dict": {}, "progress": {"total": {"completed": 7}}}}}
    io.save_checkpoint(checkpoint, tmp_path / "c")
    io.save_checkpoint(checkpoint, tmp_path / "c")  # Lightning may rewrite a path
    back = io.load_checkpoint(tmp_path / "c", map_location=lambda storage, loc: storage)
    assert back["global_step"] == 7 and torch.equal(back["state_dict"]["w"], torch.ones(2))
    io.remove_checkpoint(tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_gradient_accumulation_saves_once_per_optimizer_step(tmp_path):
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from ucp.integrations.lightning import UcpCheckpoint
    from ucp.policies import EveryNSteps

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    x = torch.randn(64, 4)
    checkpoint = UcpCheckpoint(tmp_path, save_policy=EveryNSteps(3), verbose=False)
    trainer = pl.Trainer(
        max_steps=6, accumulate_grad_batches=2, callbacks=[checkpoint], plugins=[checkpoint.checkpoint_io],
        enable_checkpointing=False, logger=False, enable_progress_bar=False, enable_model_summary=False,
        accelerator="cpu", devices=1,
    )
    trainer.fit(Tiny(), DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4))
    assert [r.step for r in checkpoint.session.manager.records] == [3, 6]
    summary = checkpoint.session.summary()
    assert (summary.saves, summary.last_step, summary.restarts) == (2, 6, 0)
    assert 0 < float(trainer.callback_metrics["ettr"]) <= 1
