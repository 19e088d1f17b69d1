"""The demo's UCL program maps every local tensor exactly as the demo model shards it, in any layout."""

import pytest

import ucl
from tools import demo_model as dm
from tools.demo import PROGRAM
from ucp.geometry import Box
from ucp.layout import Layout

LAYOUTS = ["tp=1", "tp=2,dp=2", "tp=1,dp=2", "tp=3", "tp=4,dp=3", "tp=3,dp=2"]


def _local_tensors(layout: Layout, rank: int) -> dict:
    local = {}
    for index, name in enumerate(dm.PARAMS):
        shape = dm.local_box(name, layout, rank).sizes
        local[f"model/{name}"] = (shape, "float32")
        local[f"optim/state/{index}/exp_avg"] = (shape, "float32")
        local[f"optim/state/{index}/exp_avg_sq"] = (shape, "float32")
        local[f"optim/state/{index}/step"] = ((), "float32")
    return local


@pytest.mark.parametrize("text", LAYOUTS)
def test_program_matches_the_models_sharding(text):
    layout = Layout.parse(text)
    for rank in range(layout.world_size):
        fmap = ucl.spec_for_save(PROGRAM, layout, rank, _local_tensors(layout, rank))
        for index, name in enumerate(dm.PARAMS):
            box = dm.local_box(name, layout, rank)
            for key, logical in [(f"model/{name}", name), (f"optim/state/{index}/exp_avg", f"{name}:exp_avg")]:
                (piece,) = fmap.tensors[key].pieces
                assert (piece.logical, piece.target, piece.local) == (logical, box, Box((0,) * box.ndim, box.sizes))
            (step,) = fmap.tensors[f"optim/state/{index}/step"].pieces
            assert step.target == Box((), ())


@pytest.mark.parametrize("text", LAYOUTS)
def test_program_covers_every_layout(text):
    logical = {}
    for index, (name, shape) in enumerate(dm.LOGICAL_SHAPES.items()):
        logical[name] = (shape, "float32")
        for state in ("exp_avg", "exp_avg_sq"):
            logical[f"{name}:{state}"] = (shape, "float32")
        logical[f"adam.step.{dm.PARAMS.index(name)}"] = ((), "float32")
    report = ucl.check_program(PROGRAM, Layout.parse(text), logical)
    assert report.ok, report
