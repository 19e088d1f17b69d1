"""A tiny Transformers job for the kill-and-resume test (run as a subprocess, offline).

usage: python tiny_transformers_job.py DIRECTORY MAX_STEPS [--sleep S]
A 2-layer Llama (hidden 32) built from a config, random tokens. Prints
"step N" after each step; dumps the live state to DIRECTORY/witness/witness_N at each
save and, after a resume, to DIRECTORY/witness/resumed (not in DIRECTORY itself, where
the checkpoint manager would count them as checkpoints).
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

from ucp.integrations.transformers import UcpTrainerCallback
from ucp.api import save
from ucp.policies import EveryNSteps


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, count: int, length: int, vocab: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (count, length), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


class Witness(TrainerCallback):
    def __init__(self, directory: str, every: int, sleep: float) -> None:
        self.directory, self.every, self.sleep = directory, every, sleep

    def _dump(self, name, model, optimizer, lr_scheduler) -> None:
        save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
              "scheduler": lr_scheduler.state_dict()}, f"{self.directory}/witness/{name}", overwrite=True)

    def on_train_begin(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        print("resumed", state.global_step, flush=True)
        if state.global_step:
            self._dump("resumed", model, optimizer, lr_scheduler)

    def on_step_end(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        if self.sleep:
            time.sleep(self.sleep)
        if state.global_step % self.every == 0:
            self._dump(f"witness_{state.global_step}", model, optimizer, lr_scheduler)
        print("step", state.global_step, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("max_steps", type=int)
    parser.add_argument("--sleep", type=float, default=0.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config)
    callback = UcpTrainerCallback(args.directory, save_policy=EveryNSteps(5), flush_every_s=0.0)
    training = TrainingArguments(
        output_dir=f"{args.directory}/hf", max_steps=args.max_steps, per_device_train_batch_size=4,
        learning_rate=1e-3, lr_scheduler_type="linear", warmup_steps=3, save_strategy="no", logging_steps=5,
        report_to=[], use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=0,
    )
    log_history = []

    class KeepLogs(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            log_history.append(dict(logs or {}))

    trainer = Trainer(model=model, args=training, train_dataset=RandomTokens(64, 16, 64),
                      callbacks=[callback, Witness(args.directory, 5, args.sleep), KeepLogs()])
    trainer.train()
    print("logged ettr", [round(entry["ettr"], 4) for entry in log_history if "ettr" in entry], flush=True)
    print("summary", callback.session.summary(), flush=True)


if __name__ == "__main__":
    main()
