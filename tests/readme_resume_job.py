"""Child process of the README resume test: run README's resume block, then dump what training left.

    python readme_resume_job.py CKPT_DIR TOTAL_STEPS EVERY OUT.pt

Builds a tiny model and AdamW from scratch (as a restarted job does), runs the block as written
(the manager resumes from CKPT_DIR if it holds a checkpoint; it saves every EVERY steps
instead of the README's 500, to keep the test short) and saves the model's parameters and
the optimizer's state dict to OUT.pt with torch.save for the test to compare.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import torch

README = Path(__file__).resolve().parents[1] / "README.md"


def resume_block() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    return next(b for b in blocks if "manager.restore(into=state)" in b)


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def main(argv: list[str]) -> None:
    directory, total, every, out = argv
    torch.set_num_threads(1)  # the same arithmetic in every process
    Path(directory).parent.mkdir(parents=True, exist_ok=True)
    os.chdir(Path(directory).parent)
    import ucp

    holder: dict = {}

    def build_optimizer() -> torch.optim.Optimizer:
        return torch.optim.AdamW(holder["model"].parameters(), lr=1e-2, weight_decay=0.05)

    def build() -> torch.nn.Module:
        holder["model"] = build_model()
        return holder["model"]

    def train_step(model, opt, step):
        gen = torch.Generator().manual_seed(step)  # the batch of a step does not depend on restarts
        x, y = torch.randn(8, 6, generator=gen), torch.randn(8, 3, generator=gen)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    block = resume_block()
    assert '"ckpt"' in block and "EveryNSteps(500)" in block, block
    block = block.replace('"ckpt"', repr(Path(directory).name)).replace("EveryNSteps(500)", f"EveryNSteps({int(every)})")
    scope = {"ucp": ucp, "build_model": build, "build_optimizer": build_optimizer, "train_step": train_step,
             "total_steps": int(total)}
    exec(block, scope)  # noqa: S102 - our own README
    torch.save({"model": dict(scope["model"].named_parameters()), "optim": scope["opt"].state_dict(),
                "step": scope["state"]["step"], "start": scope["start"]}, out)


if __name__ == "__main__":
    main(sys.argv[1:])
