"""One model-parallel rank's ZeRO optimizer state, spread over the data-parallel rank files, read lazily.

DeepSpeed writes ``zero_pp_rank_<dp>_mp_rank_<mp>_optim_states.pt`` per
data-parallel rank. :class:`ZeroOptimizerFiles` opens rank 0's file (memory
mapped) to learn the layout, and each other rank's file only when a read needs
its partition. Every rank file opened is checked against the geometry:
its partition length (plus the padding DeepSpeed stripped) and DeepSpeed's own
``param_slice_mappings``.

>>> # files = ZeroOptimizerFiles({0: "zero_pp_rank_0_mp_rank_00_optim_states.pt", ...}, param_shapes)
>>> # files.read("emb.weight", "exp_avg", Box((0, 0), (2, 10)))   # opens only the ranks holding rows 0-1
"""

from __future__ import annotations

import math
import os
from typing import Any, Iterable

import torch

from ucp.errors import FormatError
from ucp.formats.deepspeed.flat import Fragment, read_region, zero12_fragments, zero3_fragments, zero3_rank_sizes
from ucp.formats.deepspeed.plain import foreign_of
from ucp.formats.deepspeed.pt import load_pt_mapped
from ucp.geometry import FlatRange, Region
from ucp.unpickle import InertObject

__all__ = ["ZeroOptimizerFiles", "zero_stage_of"]

FP32 = "fp32"


def zero_stage_of(optimizer_state: dict, where: str) -> int:
    """The ZeRO stage a rank's ``optimizer_state_dict`` records (DeepSpeed's ``ZeroStageEnum``)."""
    value = optimizer_state.get("zero_stage", 1)
    if isinstance(value, InertObject):
        args = foreign_of(value).args
        value = args[0] if args else None
    if not isinstance(value, int) or value not in (0, 1, 2, 3):
        raise FormatError(f"{where}: zero_stage {value!r} is not a ZeRO stage (0-3)")
    return value


def _numel(shape: Any) -> int:
    return math.prod(int(s) for s in shape)


class ZeroOptimizerFiles:
    """The flat optimizer partitions of one model-parallel rank; ``param_shapes`` from its model-states file."""

    def __init__(self, files: dict[int, str], param_shapes: list[dict]) -> None:
        ranks = sorted(files)
        if ranks != list(range(len(ranks))):
            missing = sorted(set(range(max(ranks) + 1)) - set(ranks))
            raise FormatError(
                f"{os.path.dirname(files[ranks[0]])}: optimizer files of data-parallel rank(s) "
                f"{missing} are missing (found ranks {ranks})"
            )
        self.files = files
        self.dp = len(ranks)
        self._open: dict[int, dict] = {}
        self._mapped: dict[int, bool] = {}
        first = self._osd(0)
        self.stage = zero_stage_of(first, files[0])
        self.param_shapes = [dict(group) for group in param_shapes]
        self.groups = [[(name, _numel(shape)) for name, shape in group.items()] for group in self.param_shapes]
        self.shapes = {
            name: tuple(int(s) for s in shape) for group in self.param_shapes for name, shape in group.items()
        }
        if self.stage <= 2:
            self._init_zero12(first)
        else:
            self.fragments = zero3_fragments(self.groups, dp=self._zero3_partitions(first))
            self._sizes = zero3_rank_sizes(self.groups, dp=self.dp)
        self.group_of = {name: g for g, group in enumerate(self.groups) for name, _ in group}
        self._check_rank(0)

    # --- layout -------------------------------------------------------------------------------------
    def _init_zero12(self, osd: dict) -> None:
        counts = osd.get("partition_count")
        counts = counts if isinstance(counts, list) else [counts] * len(self.groups)
        if any(c not in (None, self.dp) for c in counts):
            raise FormatError(
                f"{self.files[0]}: partition_count {counts} but {self.dp} optimizer files were found; "
                "a file is missing or another checkpoint's file is mixed in"
            )
        fp32 = self._flat_list(0, FP32)
        if len(fp32) != len(self.groups):
            raise FormatError(
                f"{self.files[0]}: {len(fp32)} flat fp32 groups but the model states list "
                f"{len(self.groups)} param groups"
            )
        paddings = osd.get("param_alignment_paddings") or [[0] * len(g) for g in self.groups]
        self._paddings = self._group_paddings(0)
        self._sizes = [t.numel() + pad for t, pad in zip(fp32, self._paddings, strict=True)]
        try:
            self.fragments = zero12_fragments(self.groups, paddings, dp=self.dp, partition_sizes=self._sizes)
        except ValueError as err:
            raise FormatError(f"{self.files[0]}: {err}; the model states do not describe these partitions") from None

    def _zero3_partitions(self, osd: dict) -> int:
        count = osd.get("partition_count", self.dp)
        if isinstance(count, list):
            count = max(count)
        if count != self.dp:
            raise FormatError(f"{self.files[0]}: partition_count {count} but {self.dp} optimizer files were found")
        if osd.get("ds_zero_partition_groups"):
            raise FormatError(
                f"{self.files[0]}: ZeRO-3 partition groups of their own (AutoEP experts) are not "
                "supported; convert the folder with DeepSpeed's ds_to_universal first"
            )
        return self.dp

    # --- files --------------------------------------------------------------------------------------
    def _osd(self, rank: int) -> dict:
        if rank not in self._open:
            sd, self._mapped[rank] = load_pt_mapped(self.files[rank])
            osd = sd.get("optimizer_state_dict") if isinstance(sd, dict) else None
            if not isinstance(osd, dict):
                raise FormatError(
                    f"{self.files[rank]} has no optimizer_state_dict: not a DeepSpeed ZeRO optimizer file"
                )
            self._open[rank] = osd
            if hasattr(self, "fragments"):
                self._check_rank(rank)
        return self._open[rank]

    def _base_state(self, rank: int) -> dict:
        osd = self._osd(rank)
        if self.stage <= 2:
            base = osd.get("base_optimizer_state")
            if isinstance(base, list):  # elastic checkpoints keep one state dict per group
                return dict(enumerate(base))
            return (base or {}).get("state", {})
        return (osd.get("optimizer_state_dict") or {}).get("state", {})

    def _flat_list(self, rank: int, key: str) -> list[torch.Tensor]:
        osd = self._osd(rank)
        if key == FP32:
            found = osd.get("single_partition_of_fp32_groups" if self.stage <= 2 else "fp32_flat_groups")
            if not isinstance(found, list):
                raise FormatError(f"{self.files[rank]} holds no fp32 partitions")
            return found
        state = self._base_state(rank)
        return [state.get(g, {}).get(key) for g in range(len(self.groups))]

    def _flat(self, rank: int, group: int, key: str, need: int) -> torch.Tensor:
        tensor = self._flat_list(rank, key)[group]
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 1 or tensor.numel() < need:
            raise FormatError(
                f"{self.files[rank]}: {key} of group {group} is not a flat tensor of at least {need} "
                f"elements (found {getattr(tensor, 'shape', type(tensor).__name__)})"
            )
        return tensor

    def _group_paddings(self, rank: int) -> list[int]:
        """The rank's ``group_paddings``: one count of padding elements per param group (none: zeros)."""
        pads = self._open[rank].get("group_paddings") or [0] * len(self.groups)
        if (
            not isinstance(pads, (list, tuple))
            or len(pads) != len(self.groups)
            or not all(type(p) is int and p >= 0 for p in pads)
        ):
            raise FormatError(
                f"{self.files[rank]}: group_paddings must list one non-negative element count per param "
                f"group ({len(self.groups)}), found {str(pads)[:80]}"
            )
        return list(pads)

    def _check_rank(self, rank: int) -> None:
        osd = self._open[rank]
        if self.stage <= 2:
            pads = self._group_paddings(rank)
            for g, flat in enumerate(self._flat_list(rank, FP32)):
                if flat.numel() + pads[g] != self._sizes[g]:
                    raise FormatError(
                        f"{self.files[rank]}: fp32 partition of group {g} holds {flat.numel()} (+{pads[g]} "
                        f"padding) elements where rank 0's holds {self._sizes[g]}"
                    )
            for g, mapping in enumerate(osd.get("param_slice_mappings") or []):
                mine = {n: f for n, frags in self.fragments.items() for f in frags if f.rank == rank and f.group == g}
                for name, address in mapping.items():
                    state = foreign_of(address).state if isinstance(address, InertObject) else None
                    frag = mine.get(name)
                    if (
                        not isinstance(state, dict)
                        or frag is None
                        or (state.get("start"), state.get("numel")) != (frag.offset, frag.numel)
                    ):
                        raise FormatError(
                            f"{self.files[rank]}: DeepSpeed's slice map puts {name} at {state} in group "
                            f"{g}, which the param_shapes of the model states do not give"
                        )
        else:
            for g, flat in enumerate(self._flat_list(rank, FP32)):
                if flat.numel() != self._sizes[g]:
                    raise FormatError(
                        f"{self.files[rank]}: flat fp32 sub-group {g} holds {flat.numel()} elements, "
                        f"the param_shapes give {self._sizes[g]}"
                    )

    # --- what the reader asks ---------------------------------------------------------------------------
    def state_keys(self) -> list[str]:
        """The flat per-element states besides ``fp32`` (``exp_avg``, ``exp_avg_sq``...), in file order."""
        keys: list[str] = []
        for group_state in self._base_state(0).values():
            for key, value in group_state.items():
                if isinstance(value, torch.Tensor) and value.dim() == 1 and key not in keys:
                    keys.append(key)
        return keys

    def group_values(self, key: str) -> list[Any]:
        """The per-group non-flat value ``key`` (``step``: an int or a 0-d tensor) of rank 0, one per group."""
        state = self._base_state(0)
        return [state.get(g, {}).get(key) for g in range(len(self.groups))]

    def names(self) -> Iterable[str]:
        for group in self.groups:
            for name, _ in group:
                yield name

    def read(self, name: str, key: str, region: Region | None, *, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``region`` of state ``key`` (``fp32``, ``exp_avg``...) of parameter ``name``, from the ranks that hold it."""
        frags: list[Fragment] = self.fragments[name]
        if dtype is None:
            dtype = self.dtype(name, key)

        def fetch(f: Fragment):
            return lambda: self._flat(f.rank, f.group, key, f.offset + f.numel)[f.offset : f.offset + f.numel]

        runs = [(FlatRange(f.start, f.stop), fetch(f)) for f in frags]
        out = read_region(
            self.shapes[name], dtype, runs, region, mapped=all(self._mapped.get(f.rank, False) for f in frags)
        )
        return out

    def dtype(self, name: str, key: str) -> torch.dtype:
        """The dtype of state ``key`` of ``name``, from rank 0's file (which holds every group's partition)."""
        flat = self._flat_list(0, key)[self.group_of[name]]
        if not isinstance(flat, torch.Tensor):
            raise FormatError(f"{self.files[0]}: no {key} for group {self.group_of[name]}")
        return flat.dtype

    def opened(self) -> list[int]:
        """The data-parallel ranks whose files have been opened so far (tests check region reads with it)."""
        return sorted(self._open)

    def osd(self, rank: int = 0) -> dict:
        return self._osd(rank)

    def close(self) -> None:
        self._open.clear()
