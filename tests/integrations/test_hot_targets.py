"""Hot recovery fills the trainer's own storage: targets allocated without a zero fill where the
map covers them, and a trainer built from filled tensors takes them as its parameters, masters
and Adam moments (nothing allocated twice, nothing copied again) and trains on as one that loaded.
"""

from __future__ import annotations

import pytest
import torch

from ucp.geometry import Box, FlatRange
from ucp.integrations.llama.config import LlamaConfig
from ucp.integrations.megatron.trainer import MegatronTrainer
from ucp.integrations.stacks.common import STATES, TrainSettings, plan_program_load
from ucp.integrations.stacks.hot_stacks import covers, new_targets, uncovered, without_params
from ucp.spec import FragmentMap, LocalTensor, ShardPiece, TensorSpec


def _pieces(*locals_):
    return tuple(ShardPiece("x", local, local) for local in locals_)


def test_covers_counts_whole_row_boxes_and_runs_and_refuses_any_gap():
    assert covers(_pieces(Box((0, 0), (2, 3)), Box((2, 0), (2, 3))), (4, 3))
    assert covers(_pieces(FlatRange(4, 12), FlatRange(0, 5)), (12,))  # overlapping runs still cover
    assert not covers(_pieces(Box((0, 0), (2, 3))), (4, 3))           # rows 2-3 are padding
    assert not covers(_pieces(FlatRange(0, 5), FlatRange(6, 12)), (12,))  # element 5 maps to nothing
    assert not covers(_pieces(Box((0, 0), (4, 2))), (4, 3))           # a column block: not taken as full
    assert not covers((), (3,))
    assert uncovered(_pieces(Box((1, 0), (1, 3))), (4, 3)) == [(0, 3), (6, 12)]
    assert uncovered(_pieces(Box((0, 0), (4, 2))), (4, 3)) is None


def test_new_targets_zero_only_the_padding():
    fmap = FragmentMap(rank=0, logical={}, tensors={
        "full": TensorSpec("full", _pieces(FlatRange(0, 6))), "padded": TensorSpec("padded", _pieces(FlatRange(0, 4)))})
    fmap.tensors["cols"] = TensorSpec("cols", _pieces(Box((0, 0), (2, 1))))
    shapes = {"full": LocalTensor("full", (6,), "float32"), "padded": LocalTensor("padded", (6,), "bfloat16"),
              "cols": LocalTensor("cols", (2, 2), "float32")}
    for _ in range(3):  # fresh memory may hold anything: the padding is zero every time
        out = new_targets(fmap, shapes)
        assert out["full"].shape == (6,) and out["padded"].dtype == torch.bfloat16
        assert torch.equal(out["padded"][4:], torch.zeros(2, dtype=torch.bfloat16))
        assert torch.equal(out["cols"], torch.zeros(2, 2))
        out["padded"].fill_(7)
        out["cols"].fill_(7)
        del out


def _state_tensors(trainer: MegatronTrainer) -> dict[str, torch.Tensor]:
    out = {f"model/{k}": p.data for k, p in trainer.params.items()}
    for kind, opt in trainer.optimizers.items():
        for s in trainer._states():
            if trainer.layout.zero:
                out[f"optim/{s}/{kind}"] = opt.state(s)
            else:
                out.update({f"optim/{s}/model/{k}": opt.state_of(trainer.params[k], s) for k in opt.keys})
    return out


@pytest.mark.parametrize("layout,precision,params", [("zero=1", "fp32", True), ("zero=1", "fp32", False),
                                                     ("zero=1", "bf16", True), ("dp=1", "bf16", True)])
def test_a_trainer_built_from_loaded_tensors_takes_them_as_its_storage(world_of_one, tmp_path, layout, precision,
                                                                        params):
    import ucp

    cfg, settings = LlamaConfig(), TrainSettings(precision=precision)
    before = MegatronTrainer(cfg, layout, settings, rank=0)
    before.train_step()  # moments that are not zero
    before.save(str(tmp_path / "ckpt"))
    has_masters, fmap, into = plan_program_load(str(tmp_path / "ckpt"), before.program, before.layout, 0,
                                                masters="fp32" in before._states())
    if not params:  # what the hot path leaves out where the parameters are the masters
        assert MegatronTrainer.params_from_masters(before.layout, settings, has_masters)
        fmap = without_params(fmap)
        into = {k: v for k, v in into.items() if k in fmap.tensors}
    tree = ucp.load(str(tmp_path / "ckpt"), into=into, spec=fmap)
    after = MegatronTrainer(cfg, layout, settings, rank=0, init=False, tensors=into)
    held = _state_tensors(after)
    adopted = [k for k in into if k in held and held[k].data_ptr() == into[k].data_ptr()]
    # every parameter, master and moment is the loaded tensor itself (fp32 parameters of a bf16 run
    # have bf16 storage: those are the only ones a trainer must convert)
    assert sorted(adopted) == sorted(k for k in into if k in held and into[k].dtype == held[k].dtype), (
        sorted(set(into) - set(adopted)))
    assert any(k.startswith("optim/") and k.split("/")[1] in STATES for k in adopted)
    after.load_tensors(into, tree, has_masters=has_masters)
    for key, tensor in _state_tensors(before).items():
        assert torch.equal(tensor.view(torch.uint8), _state_tensors(after)[key].view(torch.uint8)), key
    assert after.train_step() == before.train_step()


def test_a_step_is_left_at_the_next_module_once_a_newer_generation_is_published(monkeypatch):
    import queue
    import time
    from datetime import timedelta

    import torch.distributed as dist
    from torch import nn

    from ucp.integrations.elastic import ElasticContext, Membership
    from ucp.integrations.launch import free_port
    from ucp.integrations.stacks.hot import GenerationWatch, Superseded
    from ucp.layout import Layout

    store = dist.TCPStore("127.0.0.1", free_port(), is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=30))
    store.set("gen", "0")
    shut = []  # the real release shuts every TCP socket of the process but the store's: not in a test run
    monkeypatch.setattr("ucp.integrations.collective_release.release_collectives",
                        lambda keep_port: shut.append(keep_port) or 0)
    ctx = ElasticContext(0, store, queue.Queue(), 30.0, 30.0,
                         membership=Membership(0, 0, 1, Layout.parse("dp=1"), 1, "", (0,)))

    class Trainer:
        model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1))

    watch = GenerationWatch(ctx, every_s=0.005)
    watch.stop_stale_steps(Trainer())
    Trainer.model(torch.ones(1, 2))  # the rank's own generation: the step runs
    store.set("gen", "1")
    deadline = time.monotonic() + 30
    while watch.latest < 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    with pytest.raises(Superseded, match="generation 1 was published while rank 0 of generation 0"):
        Trainer.model(torch.ones(1, 2))
    assert shut == [store.port]  # its old collectives' sockets are shut before it leaves
    ctx.membership = Membership(1, 0, 1, Layout.parse("dp=1"), 1, "", (0,))
    Trainer.model(torch.ones(1, 2))  # the rank joined it: its steps run again
    watch.stop()
