"""Check a program against a real model's state dict, before anything is saved.

The model is built on the meta device (shapes only, no memory): from a factory
(``"pkg.module:build"`` or ``"path/to/file.py:build"``), or from a Hugging Face
``config.json`` through ``transformers.AutoModelForCausalLM.from_config`` (local files only,
never remote code). Then:

1. the whole model's state dict is saved, in thought, by one rank: every key must be mapped by
   a rule, and the logical shapes must be the ones the program declares;
2. those logical tensors are checked under the target layout (:func:`ucp.ucl.check.check_program`);
3. where the model's own sharding is known, each rank's real local tensors are saved in thought
   too, and must give the same logical shapes. A factory that takes ``layout`` and ``rank``
   keywords builds each rank's shard; a Hugging Face model's ``tp_plan`` says how its tensor
   parallelism cuts each weight. A rule that splits the wrong dimension fails here::

    report = check_model("hf-llama", "tp=2", hf_config("config.json"))
    report.ok    # False if the program's splits differ from the model's tp_plan
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Callable

from ucp.ucl.bind import load_program
from ucp.ucl.check import CheckReport, Finding, check_program
from ucp.ucl.compiler import compile_save
from ucp.ucl.errors import DeclaredShapeError, UclError
from ucp.layout import Layout
from ucp.spec import LogicalTensor


@dataclass(frozen=True)
class ModelShapes:
    """A model's whole state dict as shapes, and (optionally) each rank's real local shapes.

    ``config`` holds integer attributes of the model's configuration (a Hugging Face config), which
    fill program parameters of the same name that were not given.
    """

    whole: dict[str, LogicalTensor]
    rank_local: Callable[[Layout, int], dict[str, LogicalTensor]] | None = None
    config: dict = field(default_factory=dict)
    warnings: tuple[str, ...] = ()


def check_model(program, layout, model: ModelShapes, *, params: dict | None = None, prefix: str = "") -> CheckReport:
    """Check ``program`` for ``layout`` against ``model``; ``prefix`` is where the state dict sits in the
    saved state (``"model/"`` for ``{"model": model.state_dict()}``)."""
    given = load_program(program, **(params or {}))
    fill = {k: v for k, v in model.config.items() if k in given.program.params and k not in given.params}
    bound = load_program(given, **fill)
    prog = bound.program
    lay = layout if isinstance(layout, Layout) else Layout.parse(str(layout))
    warnings = tuple(Finding("model", w) for w in model.warnings)
    local = {prefix + k: (t.shape, t.dtype) for k, t in model.whole.items()}
    try:
        logical = compile_save(prog, Layout(), 0, local, params=bound.params).logical
    except UclError as err:
        kind = "shape" if isinstance(err, DeclaredShapeError) else "model"
        return CheckReport(
            prog.filename,
            str(lay),
            lay.world_size,
            0,
            len(local),
            (Finding(kind, f"the whole model: {err}"),),
            warnings,
        )
    report = check_program(bound, lay, logical)
    findings = list(report.findings)
    if model.rank_local is not None and not any(f.kind == "layout" for f in findings):
        findings += _rank_findings(bound, lay, model.rank_local, logical, prefix)
    return CheckReport(
        report.program,
        report.layout,
        report.ranks,
        report.logical_tensors,
        report.local_tensors,
        tuple(findings),
        report.warnings + warnings,
    )


def _rank_findings(
    bound, lay: Layout, rank_local: Callable[[Layout, int], dict[str, LogicalTensor]], logical: dict, prefix: str
) -> list[Finding]:
    out = []
    for rank in range(lay.world_size):
        local = {prefix + k: (t.shape, t.dtype) for k, t in rank_local(lay, rank).items()}
        try:
            implied = compile_save(bound.program, lay, rank, local, params=bound.params).logical
        except UclError as err:
            out.append(
                Finding(
                    "shape" if isinstance(err, DeclaredShapeError) else "model",
                    f"rank {rank}: the model's own shards: {err}",
                    rank=rank,
                )
            )
            continue
        for name, lt in implied.items():
            if name in logical and tuple(lt.shape) != tuple(logical[name].shape):
                out.append(
                    Finding(
                        "model",
                        f"rank {rank}: the model's own shard of {name!r} makes it "
                        f"{tuple(lt.shape)} under the program, the model has {tuple(logical[name].shape)} "
                        "(the program splits it differently from the model)",
                        name,
                        rank,
                    )
                )
    return out


# --------------------------------------------------------------------------- building models on meta


def model_from_factory(spec: str) -> ModelShapes:
    """``"pkg.module:build"`` or ``"file.py:build"``: ``build()`` returns a module (or a state dict).

    When ``build`` accepts ``layout`` and ``rank`` keywords, it is also called for each rank.
    """
    factory = _import_factory(spec)
    whole = _shapes(_on_meta(factory), spec)
    takes = inspect.signature(factory).parameters
    rank_local = None
    if "layout" in takes and "rank" in takes:

        def rank_local(layout: Layout, rank: int) -> dict[str, LogicalTensor]:
            return _shapes(_on_meta(lambda: factory(layout=layout, rank=rank)), spec)

    return ModelShapes(whole, rank_local)


def _import_factory(spec: str) -> Callable:
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr.isidentifier():
        raise UclError(f"--model {spec!r}: expected MODULE:FACTORY, e.g. mypkg.models:build or models.py:build")
    try:
        if module_name.endswith(".py"):
            if not os.path.isfile(module_name):
                raise UclError(f"--model {spec!r}: file {module_name!r} does not exist")
            loaded = importlib.util.spec_from_file_location(os.path.basename(module_name)[:-3], module_name)
            assert loaded is not None and loaded.loader is not None, "a .py path always has a spec and a loader"
            module = importlib.util.module_from_spec(loaded)
            loaded.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path:  # the console script does not put the working directory on the path
                sys.path.append(os.getcwd())
            module = importlib.import_module(module_name)
    except UclError:
        raise
    except Exception as err:  # noqa: BLE001 - the user's own module failed to import: say so, with its error
        raise UclError(f"--model {spec!r}: importing {module_name!r} failed: {type(err).__name__}: {err}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise UclError(f"--model {spec!r}: {module_name!r} has no callable {attr!r}")
    return factory


def _on_meta(build: Callable):
    import torch

    with torch.device("meta"):
        try:
            return build()
        except Exception as err:  # noqa: BLE001 - the factory is the user's code: report what it raised
            raise UclError(f"building the model on the meta device failed: {type(err).__name__}: {err}") from None


def _shapes(model, what: str) -> dict[str, LogicalTensor]:
    import torch

    from ucp.dtypes import dtype_name

    state = model.state_dict() if isinstance(model, torch.nn.Module) else model
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise UclError(f"{what}: expected a torch.nn.Module or a dict of tensors, got {type(model).__name__}")
    return {str(k): LogicalTensor(str(k), tuple(t.shape), dtype_name(t.dtype)) for k, t in state.items()}


def hf_config(path: str) -> ModelShapes:
    """A Hugging Face causal LM from its ``config.json`` (a file or a directory), on the meta device.

    Local files only; ``trust_remote_code`` stays off, so no code from the config runs. The
    model's ``tp_plan`` gives each rank's local shapes under tensor parallelism.
    """
    try:
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError:
        raise UclError("--hf-config needs transformers: pip install 'ucp-middleware[transformers]'") from None
    if not os.path.exists(path):
        raise UclError(f"--hf-config {path!r} does not exist")
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - transformers raises OSError, ValueError, KeyError for bad configs
        raise UclError(f"--hf-config {path!r} is not a Hugging Face config: {type(err).__name__}: {err}") from None
    model = _on_meta(lambda: AutoModelForCausalLM.from_config(config, trust_remote_code=False))
    whole = _shapes(model, path)
    plan = dict(getattr(model, "tp_plan", None) or getattr(model, "_tp_plan", None) or {})
    styles, warnings = _tp_styles(whole, plan)
    values = {k: v for k, v in config.to_dict().items() if isinstance(v, int) and not isinstance(v, bool)}
    if "head_dim" not in values and "hidden_size" in values and values.get("num_attention_heads"):
        values["head_dim"] = values["hidden_size"] // values["num_attention_heads"]
    if "num_key_value_heads" not in values and "num_attention_heads" in values:
        values["num_key_value_heads"] = values["num_attention_heads"]
    values["tie_word_embeddings"] = int(bool(getattr(config, "tie_word_embeddings", False)))

    def rank_local(layout: Layout, rank: int) -> dict[str, LogicalTensor]:
        tp, index = layout.tp, layout.coords(rank).tp
        out = {}
        for name, lt in whole.items():
            shape = list(lt.shape)
            dim = styles.get(name)
            if dim is not None:
                shape[dim] = _chunk(shape[dim], tp, index)
            out[name] = LogicalTensor(name, tuple(shape), lt.dtype)
        return out

    return ModelShapes(whole, rank_local, values, tuple(warnings))


# Styles of transformers' tensor parallelism (distributed/tensor_parallel.py) -> the dimension each cuts.
_REPLICATED = (
    "replicate",
    "replicated_with_grad_allreduce",
    "sequence_parallel",
    "all_reduce",
    "local_params",
    "moe_identity_expert",
)


def _style_dim(style: str, name: str, ndim: int) -> int | None | str:
    """The dimension a style shards a parameter along, None when replicated, "?" when not modelled."""
    if style in _REPLICATED or ndim == 0:
        return None
    if style.startswith("embedding_"):
        return 0 if style == "embedding_rowwise" else 1
    if style.startswith(("colwise", "packed_colwise")):
        return ndim - 2 if ndim >= 2 else 0
    if style.startswith(("rowwise", "packed_rowwise")):
        return None if name.endswith("bias") or ndim == 1 else ndim - 1
    return "?"


def _tp_styles(whole: dict[str, LogicalTensor], plan: dict[str, str]) -> tuple[dict[str, int], list[str]]:
    patterns = [(re.compile(re.escape(k).replace(r"\*", r"\d+")), style) for k, style in plan.items()]
    styles, warnings = {}, []
    for name, lt in whole.items():
        module = name.rpartition(".")[0]
        style = next((s for rx, s in patterns if rx.fullmatch(name) or rx.fullmatch(module)), None)
        if style is None:
            continue
        dim = _style_dim(style, name, len(lt.shape))
        if dim == "?":
            warnings.append(f"tp_plan style {style!r} of {name!r} is not modelled: its shards are not compared")
        elif isinstance(dim, int):
            styles[name] = dim
    return styles, warnings


def _chunk(size: int, parts: int, index: int) -> int:
    """The size DTensor's Shard gives rank ``index`` (torch.chunk: ceil-sized pieces, the last ones short)."""
    piece = -(-size // parts)
    return max(0, min(piece, size - index * piece))
