"""Injected faults for the log-analysis benchmarks and tests, in the real message formats.

Each generator returns one message of a known category, with varying numbers,
hosts, pids and wordings. Variants marked ``held_out`` use wordings that the
taxonomy's examples do not contain, so the accuracy benchmark can report how
well the rules and the classifier generalise (docs/LOGS.md).

Example::

    rng = random.Random(0)
    line, category = render_fault(rng, FAULTS[0], ts=1.7e9)
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable


@dataclass(frozen=True)
class FaultKind:
    """One message variant: its category, envelope ('kern', 'slurm', 'app', 'k8s') and generator."""

    category: str
    envelope: str
    make: Callable[[random.Random], str]
    held_out: bool = False


def _host(r):
    return f"gpu-{r.choice('abcdef')}{r.randint(1, 64):03d}"


def _bus(r):
    return f"{r.choice(['07', '0f', '1a', '3b', '5e', '86', '9c', 'b7', 'c1', 'd8'])}"


def _pid(r):
    return r.randint(1000, 99999)


def _proc(r):
    return r.choice(["python", "python3", "pt_main_thread", "torchrun"])


def _iso(ts):
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]


FAULTS: list[FaultKind] = [
    FaultKind("hardware/gpu/xid-79", "kern", lambda r: f"NVRM: Xid (PCI:0000:{_bus(r)}:00): 79, pid={_pid(r)}, name={_proc(r)}, GPU has fallen off the bus."),
    FaultKind("hardware/gpu/xid-79", "kern", lambda r: f"NVRM: Xid (PCI:0000:{_bus(r)}:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.", held_out=True),
    FaultKind("hardware/gpu/xid-48", "kern", lambda r: f"NVRM: Xid (PCI:0000:{_bus(r)}:00): 48, pid={_pid(r)}, name={_proc(r)}, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition {r.randint(0, 7)}, subpartition {r.randint(0, 1)}."),
    FaultKind("hardware/gpu/xid-48", "kern", lambda r: f"NVRM: Xid (PCI:0000:{_bus(r)}:00): 48, pid={_pid(r)}, DBE ECC error in SRAM, GPU reset required", held_out=True),
    FaultKind("hardware/gpu/ecc", "kern", lambda r: f"NVRM: Xid (PCI:0000:{_bus(r)}:00): 94, pid={_pid(r)}, name={_proc(r)}, Contained: SM ({hex(r.randint(1, 255))}). RST: No, D-RST: No"),
    FaultKind("hardware/gpu/ecc", "kern", lambda r: f"NVRM: Xid (PCI:0000:{_bus(r)}:00): 95, pid={_pid(r)}, name={_proc(r)}, Uncontained: LTC TAG ({hex(r.randint(1, 4095))}). RST: Yes, D-RST: No", held_out=True),
    FaultKind("hardware/gpu/row-remap", "kern", lambda r: f"NVRM: Xid (PCI:0000:{_bus(r)}:00): 63, pid={_pid(r)}, Row Remapper: New row ({hex(r.randint(4096, 65535))}) Marked for Remapping, reset gpu to activate."),
    FaultKind("hardware/gpu/row-remap", "kern", lambda r: f"NVRM: Xid (PCI:0000:{_bus(r)}:00): 64, pid={_pid(r)}, Row Remapper Error: row remapping failed for bank {r.randint(0, 15)}", held_out=True),
    FaultKind("hardware/network/nvlink", "kern", lambda r: f"NVRM: Xid (PCI:0000:{_bus(r)}:00): 74, pid={_pid(r)}, name={_proc(r)}, NVLink: fatal error detected on link {r.randint(0, 17)}(0x0, 0x0, 0x{r.randint(1, 65535):x}, 0x0, 0x0, 0x0, 0x0)"),
    FaultKind("hardware/network/nvlink", "kern", lambda r: f"nvidia-nvswitch{r.randint(0, 3)}: NVLink link {r.randint(0, 63)} fatal error: training failed, link down", held_out=True),
    FaultKind("hardware/network/ib-link", "kern", lambda r: f"mlx5_core 0000:{_bus(r)}:00.{r.randint(0, 1)} ib{r.randint(0, 7)}: Link down"),
    FaultKind("hardware/network/ib-link", "kern", lambda r: f"mlx5_core 0000:{_bus(r)}:00.{r.randint(0, 1)}: mlx5_port_module_event:{r.randint(1000, 1200)}:(pid 0): Port module event: module {r.randint(0, 7)}, Cable unplugged"),
    FaultKind("hardware/network/ib-link", "kern", lambda r: f"infiniband mlx5_{r.randint(0, 7)}: port {r.randint(1, 2)} link went down, physical state LinkDown", held_out=True),
    FaultKind("hardware/pcie/aer", "kern", lambda r: f"pcieport 0000:{_bus(r)}:01.0: AER: Uncorrected (Fatal) error received: 0000:{_bus(r)}:00.0"),
    FaultKind("hardware/pcie/aer", "kern", lambda r: f"nvidia 0000:{_bus(r)}:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Receiver ID)", held_out=True),
    FaultKind("hardware/cpu/mce", "kern", lambda r: f"mce: [Hardware Error]: Machine check events logged, CPU {r.randint(0, 127)} bank {r.randint(0, 27)}"),
    FaultKind("software/nccl/timeout", "app", lambda r: (lambda rk: f"[rank{rk}]:[E{r.randint(1000, 1231)} 0{r.randint(1, 9)}:{r.randint(10, 59)}:{r.randint(10, 59)}.{r.randint(100000, 999999)} {_pid(r)} ProcessGroupNCCL.cpp:{r.randint(600, 1700)}] [PG 0 (default_pg) Rank {rk}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={r.randint(1, 99999)}, OpType={r.choice(['ALLREDUCE', 'ALLGATHER', '_ALLGATHER_BASE', '_REDUCE_SCATTER_BASE', 'BROADCAST'])}, NumelIn={r.randint(1, 10**8)}, NumelOut={r.randint(1, 10**8)}, Timeout(ms)=600000) ran for {600000 + r.randint(1, 999)} milliseconds before timing out.")(r.randint(0, 1023))),
    FaultKind("software/nccl/timeout", "app", lambda r: f"[E ProcessGroupNCCL.cpp:{r.randint(400, 900)}] [Rank {r.randint(0, 1023)}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={r.randint(1, 99999)}, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for {1800000 + r.randint(1, 999)} milliseconds before timing out."),
    FaultKind("software/nccl/timeout", "app", lambda r: f"torch.distributed.DistBackendError: [Rank {r.randint(0, 1023)}] NCCL watchdog thread terminated with exception: collective timed out after {r.choice([600, 1800])} s", held_out=True),
    FaultKind("software/nccl/remote-error", "app", lambda r: f"{_host(r)}:{_pid(r)}:{_pid(r)} [{r.randint(0, 7)}] NCCL WARN NET/IB : Got completion from peer 10.{r.randint(0, 255)}.{r.randint(0, 255)}.{r.randint(1, 254)}<{r.randint(1024, 65535)}> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.1.1.1"),
    FaultKind("software/nccl/remote-error", "app", lambda r: f"torch.distributed.DistBackendError: NCCL error in: /opt/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:{r.randint(1000, 3000)}, remote process exited or there was a network error, NCCL version 2.{r.randint(17, 21)}.{r.randint(1, 9)}", held_out=True),
    FaultKind("software/nccl/connection-reset", "app", lambda r: f"[rank{r.randint(0, 1023)}]: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:{r.randint(400, 700)}] Connection reset by peer [10.{r.randint(0, 255)}.{r.randint(0, 255)}.{r.randint(1, 254)}]:{r.randint(1024, 65535)}"),
    FaultKind("user/oom/cuda-oom", "app", lambda r: f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {r.randint(1, 40)}.{r.randint(0, 99):02d} GiB. GPU {r.randint(0, 7)} has a total capacity of 79.10 GiB of which {r.randint(1, 900)}.00 MiB is free. Including non-PyTorch memory, this process has {r.randint(60, 79)}.{r.randint(0, 99)} GiB memory in use."),
    FaultKind("user/oom/cuda-oom", "app", lambda r: f"RuntimeError: CUDA out of memory while allocating workspace of {r.randint(1, 9000)} MB on device cuda:{r.randint(0, 7)}", held_out=True),
    FaultKind("user/oom/host-oom", "kern", lambda r: f"Out of memory: Killed process {_pid(r)} ({_proc(r)}) total-vm:{r.randint(10**7, 10**9)}kB, anon-rss:{r.randint(10**7, 10**9)}kB, file-rss:{r.randint(0, 10**5)}kB, shmem-rss:0kB, UID:{r.randint(1000, 3000)} pgtables:{r.randint(1000, 99999)}kB oom_score_adj:0"),
    FaultKind("user/oom/host-oom", "slurm", lambda r: f"error: Detected {r.randint(1, 8)} oom_kill event in StepId={r.randint(1000, 999999)}.batch. Some of the step tasks have been OOM Killed.", held_out=True),
    FaultKind("user/oom/host-oom", "k8s", lambda r: ("OOMKilling", f"Memory cgroup out of memory: Killed process {_pid(r)} (python) total-vm:{r.randint(10**6, 10**8)}kB", "Node")),
    FaultKind("software/cuda/illegal-memory-access", "app", lambda r: "RuntimeError: CUDA error: an illegal memory access was encountered"),
    FaultKind("user/training/nan-loss", "app", lambda r: f"[rank{r.randint(0, 1023)}] iteration {r.randint(1, 10**6)}: loss=nan, grad_norm={r.choice(['nan', 'inf'])}, skipping update"),
    FaultKind("user/training/nan-loss", "app", lambda r: f"WARNING: Detected inf/NaN in gradients at step {r.randint(1, 10**6)}; loss scale reduced to {2 ** r.randint(1, 16)}", held_out=True),
    FaultKind("infra/slurm/node-fail", "slurm", lambda r: f"error: Nodes {_host(r)} not responding, setting DOWN"),
    FaultKind("infra/slurm/node-fail", "slurm", lambda r: f"_job_complete: JobId={r.randint(1000, 999999)} NODE_FAIL"),
    FaultKind("infra/slurm/node-fail", "slurm", lambda r: f"Killing JobId={r.randint(1000, 999999)} on failed node {_host(r)}", held_out=True),
    FaultKind("infra/preemption", "slurm", lambda r: f"_job_complete: JobId={r.randint(1000, 999999)} PREEMPTED"),
    FaultKind("infra/preemption", "slurm", lambda r: f"job_submit: JobId={r.randint(1000, 999999)} preempted by JobId={r.randint(1000, 999999)} (partition high)", held_out=True),
    FaultKind("infra/slurm/timeout", "slurm", lambda r: f"Time limit exhausted for JobId={r.randint(1000, 999999)}"),
    FaultKind("infra/slurm/timeout", "slurm", lambda r: f"slurmstepd: error: *** STEP {r.randint(1000, 999999)}.0 ON {_host(r)} CANCELLED AT 2024-06-0{r.randint(1, 9)}T1{r.randint(0, 9)}:00:00 DUE TO TIME LIMIT ***", held_out=True),
    FaultKind("infra/slurm/job-killed", "slurm", lambda r: f"_job_complete: JobId={r.randint(1000, 999999)} WTERMSIG 9"),
    FaultKind("infra/filesystem/lustre", "kern", lambda r: f"LustreError: {_pid(r)}:0:(ldlm_request.c:{r.randint(100, 2000)}:ldlm_cli_cancel_req()) Got rc -{r.choice([11, 107, 110])} from cancel RPC: canceling anyway"),
    FaultKind("infra/filesystem/lustre", "kern", lambda r: f"Lustre: scratch-OST{r.randint(0, 255):04x}-osc-ffff{r.randint(0, 16**8):08x}: Connection to scratch-OST{r.randint(0, 255):04x} (at 10.{r.randint(0, 255)}.0.{r.randint(1, 254)}@o2ib) was lost; in progress operations using this service will wait for recovery to complete", held_out=True),
    FaultKind("infra/filesystem/nfs", "kern", lambda r: f"nfs: server nas{r.randint(1, 9):02d} not responding, still trying"),
    FaultKind("infra/filesystem/io-error", "kern", lambda r: f"blk_update_request: I/O error, dev nvme{r.randint(0, 7)}n1, sector {r.randint(0, 10**9)} op 0x{r.randint(0, 1)}:({r.choice(['READ', 'WRITE'])}) flags 0x0 phys_seg 1 prio class 0"),
    FaultKind("infra/filesystem/io-error", "kern", lambda r: f"Buffer I/O error on dev md{r.randint(0, 3)}, logical block {r.randint(0, 10**8)}, async page read", held_out=True),
    FaultKind("infra/kubernetes/pod-failure", "k8s", lambda r: ("BackOff", f"Back-off restarting failed container trainer in pod llm-{r.randint(0, 999)}", "Pod")),
    FaultKind("infra/node/down", "k8s", lambda r: ("NodeNotReady", f"Node {_host(r)} status is now: NodeNotReady", "Node")),
]

NORMALS: list[Callable[[random.Random], tuple[str, str]]] = [
    lambda r: ("app", f"{_host(r)}:{_pid(r)}:{_pid(r)} [{r.randint(0, 7)}] NCCL INFO Channel {r.randint(0, 31):02d}/0 : {r.randint(0, 1023)}[{r.randint(0, 7)}] -> {r.randint(0, 1023)}[{r.randint(0, 7)}] via P2P/IPC/read"),
    lambda r: ("app", f"{_host(r)}:{_pid(r)}:{_pid(r)} [{r.randint(0, 7)}] NCCL INFO comm 0x{r.randint(0, 16**8):x} rank {r.randint(0, 1023)} nranks 1024 cudaDev {r.randint(0, 7)} nvmlDev {r.randint(0, 7)} busId {r.randint(0, 99999)} commId 0x{r.randint(0, 16**8):x} - Init COMPLETE"),
    lambda r: ("slurm", f"sched: Allocate JobId={r.randint(1000, 999999)} NodeList={_host(r)},{_host(r)} #CPUs={r.choice([64, 128, 256])} Partition=gpu"),
    lambda r: ("slurm", f"_job_complete: JobId={r.randint(1000, 999999)} WEXITSTATUS 0"),
    lambda r: ("slurm", f"_job_complete: JobId={r.randint(1000, 999999)} done"),
    lambda r: ("app", f"[rank{r.randint(0, 1023)}] iteration {r.randint(1, 10**6)}/{10**6} | lm loss: {r.uniform(1.5, 3.5):.4f} | grad norm: {r.uniform(0.1, 3):.3f} | tokens/s: {r.randint(10**4, 10**6)}"),
    lambda r: ("app", f"Saving checkpoint at iteration {r.randint(1, 10**6)} to /lustre/ckpt/run{r.randint(1, 99)}"),
    lambda r: ("kern", f"mlx5_core 0000:{_bus(r)}:00.0 ib{r.randint(0, 7)}: Link up"),
    lambda r: ("kern", f"nfs: server nas{r.randint(1, 9):02d} OK"),
    lambda r: ("k8s", ("Scheduled", f"Successfully assigned default/llm-{r.randint(0, 999)} to {_host(r)}", "Pod")),
    lambda r: ("k8s", ("Started", "Started container trainer", "Pod")),
]


def envelope(kind: str, message, *, ts: float, host: str, rng: random.Random) -> str:
    """Wrap a message the way its source logs it (kern syslog, slurmctld, app/torchrun, k8s JSON)."""
    if kind == "kern":
        when = datetime.fromtimestamp(ts, tz=timezone.utc)
        stamp = f"{when:%b} {when.day:2d} {when:%H:%M:%S}"  # syslog pads the day with a space, never the hour
        return f"{stamp} {host} kernel: {message}"
    if kind == "slurm":
        return f"[{_iso(ts)}] {message}"
    if kind == "app":
        return f"{_iso(ts).replace('T', ' ')} {message}" if rng.random() < 0.5 else message
    if kind == "k8s":
        reason, msg, obj = message
        return json.dumps({"kind": "Event", "reason": reason, "message": msg, "type": "Warning",
                           "involvedObject": {"kind": obj, "name": host if obj == "Node" else msg.split()[-1]},
                           "source": {"host": host}, "lastTimestamp": _iso(ts)[:19] + "Z"})
    raise ValueError(f"unknown envelope {kind!r}")


def render_fault(rng: random.Random, kind: FaultKind, *, ts: float, host: str | None = None) -> tuple[str, str]:
    """(log line, category) for one fault of ``kind`` at ``ts``."""
    return envelope(kind.envelope, kind.make(rng), ts=ts, host=host or _host(rng), rng=rng), kind.category


def render_normal(rng: random.Random, *, ts: float) -> str:
    kind, message = rng.choice(NORMALS)(rng)
    return envelope(kind, message, ts=ts, host=_host(rng), rng=rng)
