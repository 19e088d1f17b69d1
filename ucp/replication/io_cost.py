"""The I/O cost model: time to write and to restore a fragment per tier, learned from measured transfers.

:func:`measure` times real transfers through the replica-tier API
(:class:`~ucp.replication.replica_tiers.ReplicaTier`: ``put`` is a write, ``get`` a restore)
on three stores - host memory (:class:`~ucp.replication.replica_tiers.MemoryTier`),
a local disk (:class:`~ucp.replication.replica_tiers.DiskTier`) and an S3 bucket (the
remote store) - for fragments of several sizes, in several runs, in a shuffled order.
``ucp place io-measure`` runs it against a local S3 server and writes the table that
ships as ``ucp/replication/data/io-measurements.json``.

:class:`IoCostModel` fits scikit-learn's ``GradientBoostingRegressor`` to that table
when it is loaded (a few hundred rows: well under a second; no pickled model ships).
It predicts *throughput* (log bytes per second) from (tier, write or restore, log2
bytes); time is bytes over that throughput. Trees do not extrapolate: beyond the
largest measured fragment the throughput stays at the largest size's, i.e. the
model assumes the sustained rate holds for larger fragments (stated in
docs/REPLICATION.md). Predictions are tabulated on a fine grid of sizes once, so a
simulator can ask millions of times.

Example::

    >>> model = IoCostModel.shipped()
    >>> model.seconds("restore", "memory", 64e9) < model.seconds("restore", "remote", 64e9)
    True
"""

from __future__ import annotations

import functools
import json
import math
import time
from dataclasses import dataclass
from importlib import resources

import numpy as np

from ucp.replication.cluster import DISK, MEMORY, REMOTE
from ucp.replication.errors import PlacementInputError

IO_TIERS = (MEMORY, DISK, REMOTE)
OPS = ("write", "restore")
DEFAULT_SIZES = tuple(4 ** k * 1024 for k in range(1, 10))  # 4 KiB .. 256 MiB
_GRID_STEP = 0.125  # log2 bytes between tabulated predictions
GBR_SETTINGS = {"n_estimators": 300, "max_depth": 3, "learning_rate": 0.05, "subsample": 1.0, "random_state": 0}


@dataclass(frozen=True)
class Transfer:
    """One measured transfer: ``op`` of ``nbytes`` on ``tier`` in run ``run`` took ``seconds``."""

    tier: str
    op: str
    nbytes: int
    run: int
    seconds: float


def measure(tiers: dict, *, sizes=DEFAULT_SIZES, runs: int = 3, seed: int = 0, progress=None) -> list[Transfer]:
    """Time ``put`` and ``get`` of every size on every tier (``{"memory": ReplicaTier, ...}``), ``runs`` times.

    Each run visits (tier, size) in a new random order so that drift on a shared machine
    spreads over all of them; the blob is random bytes (nothing compresses it), read back and
    compared, then the checkpoint is evicted.
    """
    from ucp.replication.replica_tiers import CheckpointMeta

    rng = np.random.default_rng(seed)
    blobs = {n: rng.integers(0, 256, size=n, dtype=np.uint8).tobytes() for n in sizes}
    out = []
    pairs = [(tier, n) for tier in tiers for n in sizes]
    for run in range(runs):
        for k in rng.permutation(len(pairs)):
            tier_name, nbytes = pairs[k]
            tier = tiers[tier_name]
            checkpoint = f"io-{run}-{nbytes}"
            tier.put_meta(checkpoint, CheckpointMeta(path=checkpoint, generation=run, manifest=b"{}",
                                                     replica_map=b"{}"))
            start = time.perf_counter()
            tier.put(checkpoint, "data/fragment", blobs[nbytes])
            wrote = time.perf_counter()
            back = tier.get(checkpoint, "data/fragment")
            read = time.perf_counter()
            if back != blobs[nbytes]:
                raise PlacementInputError(f"{tier_name} tier returned other bytes than were put ({nbytes} bytes)")
            tier.evict(checkpoint)
            out += [Transfer(tier_name, "write", nbytes, run, wrote - start),
                    Transfer(tier_name, "restore", nbytes, run, read - wrote)]
            if progress is not None:
                progress(len(out) // 2, runs * len(pairs))
    return out


def measurements_path():
    return resources.files("ucp.replication") / "data" / "io-measurements.json"


def save_measurements(transfers: list[Transfer], path, *, note: str = "") -> None:
    rows = [[t.tier, t.op, t.nbytes, t.run, t.seconds] for t in transfers]
    doc = {"format": "ucp-io-measurements", "version": 1, "note": note,
           "columns": ["tier", "op", "bytes", "run", "seconds"], "rows": rows}
    head = json.dumps({k: v for k, v in doc.items() if k != "rows"}, indent=1)[:-2]
    with open(path, "w") as f:  # one row per line: a table a person can read and diff
        f.write(head + ',\n "rows": [\n' + ",\n".join("  " + json.dumps(r) for r in rows) + "\n ]\n}\n")


def load_measurements(path=None) -> list[Transfer]:
    """The measured table (default: the shipped one); refuses a document that is not one."""
    where = str(path or measurements_path())
    with open(where) as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or doc.get("format") != "ucp-io-measurements" or doc.get("version") != 1:
        raise PlacementInputError(f"{where}: not a ucp-io-measurements version 1 document; "
                                  "write one with `ucp place io-measure --out FILE`")
    out = []
    for i, row in enumerate(doc["rows"]):
        tier, op, nbytes, run, seconds = row
        if tier not in IO_TIERS or op not in OPS or not (nbytes > 0 and seconds > 0 and math.isfinite(seconds)):
            raise PlacementInputError(f"{where}: row {i} {row!r} is not (tier, op, bytes > 0, run, seconds > 0)")
        out.append(Transfer(tier, op, int(nbytes), int(run), float(seconds)))
    return out


def _features(tiers, ops, nbytes) -> np.ndarray:
    tiers, ops = np.asarray(tiers), np.asarray(ops)
    cols = [(tiers == t).astype(float) for t in IO_TIERS] + [(ops == "restore").astype(float),
                                                            np.log2(np.asarray(nbytes, dtype=float))]
    return np.column_stack(cols)


def _fit(transfers: list[Transfer]):
    from sklearn.ensemble import GradientBoostingRegressor

    x = _features([t.tier for t in transfers], [t.op for t in transfers], [t.nbytes for t in transfers])
    y = np.log([t.nbytes / t.seconds for t in transfers])
    return GradientBoostingRegressor(**GBR_SETTINGS).fit(x, y)


class IoCostModel:
    """Seconds to write or restore ``nbytes`` on a tier, from a gradient-boosted fit of measured transfers."""

    def __init__(self, transfers: list[Transfer]):
        missing = [(t, o) for t in IO_TIERS for o in OPS if not any(r.tier == t and r.op == o for r in transfers)]
        if missing:
            raise PlacementInputError(f"I/O measurements lack {', '.join(f'{t} {o}' for t, o in missing)}; "
                                      "measure every tier with `ucp place io-measure`")
        self.transfers = transfers
        self._memo: dict = {}  # a simulation asks for the same few sizes millions of times
        regressor = _fit(transfers)
        sizes = np.log2([t.nbytes for t in transfers])
        self.grid = np.arange(sizes.min(), sizes.max() + _GRID_STEP / 2, _GRID_STEP)
        self.log_rate = {}
        for tier in IO_TIERS:
            for op in OPS:
                n = len(self.grid)
                self.log_rate[(op, tier)] = regressor.predict(_features([tier] * n, [op] * n, 2.0 ** self.grid))

    @classmethod
    @functools.lru_cache(maxsize=1)
    def shipped(cls) -> "IoCostModel":
        """The model fitted to the shipped measurements (fitted once per process)."""
        return cls(load_measurements())

    def seconds(self, op: str, tier: str, nbytes: float) -> float:
        """Predicted seconds; sizes outside the measured range use the nearest measured size's throughput."""
        if nbytes <= 0:
            return 0.0
        key = (op, tier, nbytes)
        if key not in self._memo:
            rate = math.exp(float(np.interp(math.log2(nbytes), self.grid, self.log_rate[(op, tier)])))
            self._memo[key] = nbytes / rate
        return self._memo[key]

    def throughput(self, op: str, tier: str, nbytes: float) -> float:
        """Predicted bytes per second (for tables and the docs)."""
        return nbytes / self.seconds(op, tier, nbytes)


class ShippedIoCost:
    """The shipped model, fitted on first use: a policy that never asks for read times (``group``) pays nothing."""

    def seconds(self, op: str, tier: str, nbytes: float) -> float:
        return IoCostModel.shipped().seconds(op, tier, nbytes)


def live_io_model(io):
    """``"measured"``: the shipped model (fitted lazily); ``"constant"`` or None: None; a model: itself."""
    if io == "measured":
        return ShippedIoCost()
    if io is None or io == "constant":
        return None
    if not callable(getattr(io, "seconds", None)):
        raise PlacementInputError(f"io must be 'measured', 'constant' or a cost model with seconds(op, tier, "
                                  f"nbytes), got {io!r}")
    return io


def held_out_r2(transfers: list[Transfer], *, split: str = "run") -> dict:
    """R² of predicted seconds on held-out transfers, in log seconds and in seconds.

    ``split="run"``: fit on every run but the last, test on the last (same sizes, new
    measurements); ``split="size"``: fit on every other size, test on the sizes between
    (interpolation to sizes never measured).
    """
    from sklearn.metrics import r2_score

    if split == "run":
        last = max(t.run for t in transfers)
        train = [t for t in transfers if t.run != last]
        test = [t for t in transfers if t.run == last]
    elif split == "size":
        sizes = sorted({t.nbytes for t in transfers})
        held = set(sizes[1:-1:2])  # interior sizes only: the model is not asked to extrapolate
        train = [t for t in transfers if t.nbytes not in held]
        test = [t for t in transfers if t.nbytes in held]
    else:
        raise PlacementInputError(f"split must be 'run' or 'size', got {split!r}")
    if not train or not test:
        raise PlacementInputError(f"split by {split}: needs at least two runs or three sizes")
    model = IoCostModel(train)
    truth = np.array([t.seconds for t in test])
    guess = np.array([model.seconds(t.op, t.tier, t.nbytes) for t in test])
    return {"split": split, "train": len(train), "test": len(test),
            "r2_log_seconds": float(r2_score(np.log(truth), np.log(guess))),
            "r2_seconds": float(r2_score(truth, guess))}
