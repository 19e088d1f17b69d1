"""torchft in the recovery bench: a SIGKILLed data-parallel replica is replaced by a spare that heals
from a healthy peer (same layout: torchft never changes it).

``replicas`` replica groups of one process each train the logical Llama model under torchft's
:class:`torchft.Manager` (its Rust lighthouse on this machine, ``ProcessGroupGloo``, its
``DistributedDataParallel`` and ``OptimizerWrapper``, synchronous quorum so a healing replica
applies the peer's state before its step). A spare process starts with the others, imports
torchft and builds its model, then waits. After step ``kill_after_step`` has committed on every
replica, the launcher SIGKILLs replica 1 and, as torchelastic would on seeing the death, tells the
spare to join: the spare creates its Manager, joins the next quorum, is healed from a peer over
torchft's HTTP checkpoint transport, and trains on.

Recovery = SIGKILL to the start of the spare's first step with the healed state (its quorum,
heal included, done); the first step is timed on its own; the survivors' own go-on time
(SIGKILL to the start of their first step that commits) is reported as a part, since torchft
lets them train on while the spare heals. Lost steps: steps the survivors ran after the kill
that did not commit. ``bitwise``: at the end every replica's parameters and Adam state hash
to the same digest (the healed spare equals its healthy peers).

    result = measure_torchft(model="", replicas=4, kill_after_step=4)
    result["recovery_s"], result["bitwise"]
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import signal
import time
from datetime import timedelta

from ucp.errors import UcpError

__all__ = ["measure_torchft", "torchft_unavailable", "TorchftFailed"]

# The lighthouse's timing knobs, set here (torchft's defaults are a 60 s join timeout and a 5 s
# heartbeat timeout, made for multi-host jobs); these are the values the bench documents. A 1 s
# heartbeat timeout dropped live replicas from the quorum at load average 40 (a quorum timed out).
JOIN_TIMEOUT_MS, QUORUM_TICK_MS, HEARTBEAT_TIMEOUT_MS = 1000, 50, 2000
COLLECTIVE_TIMEOUT = timedelta(seconds=120)
UNTIL_TOLD = 1 << 30


class TorchftFailed(UcpError, RuntimeError):
    """The torchft run failed or hung; the message carries the replica's traceback."""


def torchft_unavailable() -> str | None:
    """Why torchft cannot run here (the import error's text), or None when it can."""
    os.environ.setdefault("RUST_LOG", "warn")  # before torchft loads: it logs every quorum at info
    try:
        import torchft  # noqa: F401
        from torchft._torchft import LighthouseServer  # noqa: F401
    except Exception as error:  # noqa: BLE001 - any import failure is the reason reported
        return f"{type(error).__name__}: {error}"
    return None


def _state_digest(model, optimizer) -> str:
    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    for index, state in sorted(optimizer.state_dict()["state"].items()):
        for key, value in sorted(state.items()):
            digest.update(f"{index}.{key}".encode())
            digest.update(value.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def replica_main(index: int, lighthouse: str, model: str, settings, steps_box, events, go) -> None:
    """One replica group (one process): train under torchft until ``steps_box.value`` steps committed."""
    os.environ.setdefault("RUST_LOG", "warn")  # read when torchft's native module loads, just below
    import torch
    import torch.distributed as dist
    from torchft import Manager, Optimizer, ProcessGroupGloo

    from ucp.integrations.launch import _die_with_parent
    from ucp.integrations.llama.config import LlamaConfig
    from ucp.integrations.llama.data import SyntheticCorpus, local_batch
    from ucp.integrations.llama.model import build_model, token_loss_sum
    from ucp.integrations.stacks.common import make_adam

    _die_with_parent()
    torch.set_num_threads(1)
    # torchft logs every failed all-reduce with its traceback: the failure is the experiment here
    logging.getLogger("torchft").setLevel(logging.CRITICAL)
    try:
        cfg = LlamaConfig.parse(model)
        module = build_model(cfg)
        corpus = SyntheticCorpus(cfg.vocab_size, cfg.seq_len, settings.data_seed)
        if go is not None:  # the spare: everything is built; wait to be told to join
            go.wait()
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        holder: dict = {}
        manager = Manager(
            pg=ProcessGroupGloo(timeout=COLLECTIVE_TIMEOUT), min_replica_size=1,
            load_state_dict=lambda sd: (holder["model"].load_state_dict(sd["model"]),
                                        holder["optim"].load_state_dict(sd["optim"])),
            state_dict=lambda: {"model": holder["model"].state_dict(), "optim": holder["optim"].state_dict()},
            use_async_quorum=False, timeout=COLLECTIVE_TIMEOUT, quorum_timeout=COLLECTIVE_TIMEOUT,
            connect_timeout=COLLECTIVE_TIMEOUT, rank=0, world_size=1, store_addr="127.0.0.1",
            store_port=store.port, lighthouse_addr=lighthouse, replica_id=f"replica{index}")
        params = list(module.parameters())
        optimizer = Optimizer(manager, make_adam(params, settings))
        holder.update(model=module, optim=optimizer)
        tokens = settings.global_batch * cfg.seq_len
        while manager.current_step() < steps_box.value:
            began = time.monotonic()
            optimizer.zero_grad()  # the quorum (and, for a joining replica, the heal from a peer)
            healed_at = time.monotonic()
            step = manager.current_step()
            inputs, targets = local_batch(corpus, position=step * settings.global_batch,
                                          global_batch=settings.global_batch,
                                          dp=(manager.num_participants(), manager.participating_rank() or 0),
                                          cp=(1, 0))
            # the gradient all-reduce averages over the participants; scale to a per-token mean
            loss = token_loss_sum(module(inputs), targets) * manager.num_participants() / tokens
            loss.backward()
            # one fault-tolerant all-reduce of the flat gradient (torchft's DistributedDataParallel
            # cannot be used: its comm hook asserts `fut._fut` once an all-reduce has errored)
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            manager.allreduce(flat).wait()
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
                offset += p.numel()
            optimizer.step()
            committed = manager.current_step() > step
            events.put({"kind": "step", "replica": index, "step": step, "began": began, "healed_at": healed_at,
                        "ended": time.monotonic(), "committed": committed,
                        "participants": manager.num_participants()})
        events.put({"kind": "done", "replica": index, "digest": _state_digest(module, optimizer),
                    "step": manager.current_step()})
        manager.shutdown(wait=False)
    except BaseException:  # noqa: BLE001 - reported to the launcher, then the process exits non-zero
        import traceback

        events.put({"kind": "error", "replica": index, "traceback": traceback.format_exc()})
        raise SystemExit(1) from None


def measure_torchft(*, model: str, settings=None, replicas: int = 4, kill_after_step: int = 4,
                    kill_replica: int = 1, timeout_s: float = 1800.0) -> dict:
    """One failure and recovery under torchft; returns the bench's row fields and parts."""
    os.environ.setdefault("RUST_LOG", "warn")  # before torchft loads: the lighthouse logs every quorum at info
    from torchft._torchft import LighthouseServer

    from ucp.integrations.launch import start_fork_server
    from ucp.integrations.stacks.common import TrainSettings

    settings = settings or TrainSettings()
    ctx = start_fork_server()
    # every replica trains until told how far: two steps past the spare's first healed one
    events, go, steps_box = ctx.Queue(), ctx.Event(), ctx.Value("i", UNTIL_TOLD)
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=replicas - 1, join_timeout_ms=JOIN_TIMEOUT_MS,
                                  quorum_tick_ms=QUORUM_TICK_MS, heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS)
    procs = [ctx.Process(target=replica_main, daemon=True,
                         args=(i, lighthouse.address(), model, settings, steps_box, events, go if i == replicas else None))
             for i in range(replicas + 1)]  # the last one is the spare
    spare = replicas
    for proc in procs:
        proc.start()
    killed_at = None
    records: list[dict] = []
    done: dict[int, dict] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(done) < replicas:  # the killed replica never reports; the spare does
            if time.monotonic() > deadline:
                raise TorchftFailed(f"torchft run did not finish within {timeout_s:.0f}s "
                                    f"(replicas done: {sorted(done)})")
            try:
                event = events.get(timeout=0.2)
            except (queue.Empty, EOFError, OSError, RuntimeError):  # empty, or a message cut by the kill
                continue
            if event["kind"] == "error":
                raise TorchftFailed(f"torchft replica {event['replica']} failed:\n{event['traceback']}")
            if event["kind"] == "done":
                done[event["replica"]] = event
                continue
            records.append(event)
            if killed_at is None and all(
                    any(r["replica"] == i and r["committed"] and r["step"] >= kill_after_step for r in records)
                    for i in range(replicas)):
                os.kill(procs[kill_replica].pid, signal.SIGKILL)
                killed_at = time.monotonic()
                go.set()  # the death is seen at once by whoever launched the replica: the spare joins
            if event["replica"] == spare and event["committed"] and steps_box.value == UNTIL_TOLD:
                with steps_box.get_lock():  # everyone trains two more steps with the healed spare
                    steps_box.value = event["step"] + 3
    finally:
        for proc in procs:  # the replicas that reported done exit on their own; anything else is killed
            proc.join(timeout=10 if killed_at is not None else 0)
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGKILL)
                proc.join(timeout=5)
        lighthouse.shutdown()
    return _row(records, done, killed_at, spare=spare, kill_replica=kill_replica)


def _row(records: list[dict], done: dict[int, dict], killed_at: float, *, spare: int, kill_replica: int) -> dict:
    spare_steps = sorted((r for r in records if r["replica"] == spare), key=lambda r: r["began"])
    first = next(r for r in spare_steps if r["committed"])
    after = [r for r in records if r["replica"] not in (spare, kill_replica) and r["began"] >= killed_at]
    survivors_on = min(r["began"] for r in after if r["committed"])
    lost = {r["step"] for r in records if r["replica"] not in (spare, kill_replica) and r["ended"] > killed_at
            and not r["committed"]}
    digests = {d["digest"] for d in done.values()}
    return {"recovery_s": first["healed_at"] - killed_at, "first_step_s": first["ended"] - first["healed_at"],
            "lost_steps": len(lost), "bitwise": len(digests) == 1 and spare in done,
            "layout": f"dp={len(done)} (torchft replicas)",
            "parts": {"survivors_on_s": survivors_on - killed_at,
                      "join_heal_s": first["healed_at"] - killed_at}}
