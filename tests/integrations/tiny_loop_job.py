"""A tiny training job for the kill-and-resume tests (run as a subprocess).

usage: python tiny_loop_job.py DIRECTORY TOTAL_STEPS [--sleep S] [--async]
Prints "step N" after every step and "saved N" after every save; at the end
saves the final state to DIRECTORY/final and prints the ETTR summary.
"""

from __future__ import annotations

import argparse
import time

import torch

from ucp.integrations.loop import TrainingSession
from ucp.api import save
from ucp.policies import EveryNSteps


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.9)
    return model, optimizer, scheduler


def batch(step: int):
    # The data depends only on the step, so a redone step sees the same batch.
    generator = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(16, 8, generator=generator)
    return x, x.sum(dim=1, keepdim=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("total", type=int)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--async-save", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, optimizer, scheduler = build()
    session = TrainingSession(
        args.directory, model=model, optimizer=optimizer, scheduler=scheduler,
        save_policy=EveryNSteps(5), async_save=args.async_save, flush_every_s=0.0,
    )
    with session:
        print("resumed", session.resumed_step, flush=True)
        for step in session.steps(args.total):
            x, y = batch(step)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
            torch.randn(1)  # consume the global RNG, which is checkpointed too
            if args.sleep:
                time.sleep(args.sleep)
            print("step", step, flush=True)
    session_final = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "scheduler": scheduler.state_dict(), "rng": torch.get_rng_state()}
    save(session_final, f"{args.directory}/final")
    print("summary", session.summary(), flush=True)


if __name__ == "__main__":
    main()
