"""The cluster model: nodes in racks, storage tiers with capacity and bandwidth, timing.

One frozen object holds every constant of the recovery model, with a short
string form for CLIs (as layouts have): ``nodes=16,rack_size=4,shard_gb=64``.

Example::

    >>> spec = ClusterSpec.parse("nodes=16,rack_size=4")
    >>> spec.racks, spec.rack_of(5)
    (4, 1)
    >>> ClusterSpec.parse(str(spec)) == spec
    True
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ucp.replication.errors import PlacementInputError

MEMORY = "memory"  # a peer's host memory (replica agent outside the training process)
DISK = "disk"  # a peer's local NVMe, served over the network by that peer
REMOTE = "remote"  # the shared remote store (object store / parallel file system)
TIERS = (MEMORY, DISK)  # the tiers a policy places replicas in; REMOTE is written by the job itself

_GB = 1e9

# string-form key -> (field, scale from the string's unit to the field's unit)
_KEYS = {
    "nodes": ("nodes", 1),
    "rack_size": ("rack_size", 1),
    "shard_gb": ("shard_bytes", _GB),
    "memory_slots": ("memory_slots", 1),
    "disk_slots": ("disk_slots", 1),
    "memory_gbps": ("memory_bandwidth_bps", _GB),
    "disk_gbps": ("disk_bandwidth_bps", _GB),
    "remote_gbps": ("remote_bandwidth_bps", _GB),
    "remote_total_gbps": ("remote_aggregate_bps", _GB),
    "restart_s": ("restart_s", 1),
    "interval_s": ("interval_s", 1),
    "remote_every": ("remote_every", 1),
}
_INTS = {"nodes", "rack_size", "memory_slots", "disk_slots", "remote_every"}


@dataclass(frozen=True)
class ClusterSpec:
    """Nodes, racks, tiers and the timing constants of checkpoint recovery.

    Every node owns one checkpoint shard of ``shard_bytes`` (its primary copy, in
    its own memory). Replicas go to other nodes' memory (``memory_slots`` shards
    per node) or local disk (``disk_slots`` per node). Bandwidths are per serving
    node for peers, per reading node and in aggregate for the remote store.
    Every ``remote_every``-th checkpoint is also persisted to the remote store.
    """

    nodes: int = 16
    rack_size: int = 4
    shard_bytes: float = 64 * _GB
    memory_slots: int = 1
    disk_slots: int = 4
    memory_bandwidth_bps: float = 12.5 * _GB
    disk_bandwidth_bps: float = 2.0 * _GB
    remote_bandwidth_bps: float = 1.0 * _GB
    remote_aggregate_bps: float = 8.0 * _GB
    restart_s: float = 60.0
    interval_s: float = 600.0
    remote_every: int = 6

    def __post_init__(self) -> None:
        problems = []
        if self.nodes < 2:
            problems.append("nodes must be >= 2")
        if not 1 <= self.rack_size <= max(self.nodes, 1):
            problems.append("rack_size must be between 1 and nodes")
        if self.memory_slots < 0 or self.disk_slots < 0:
            problems.append("memory_slots and disk_slots must be >= 0")
        if self.remote_every < 1:
            problems.append("remote_every must be >= 1")
        for name in ("shard_bytes", "memory_bandwidth_bps", "disk_bandwidth_bps", "remote_bandwidth_bps",
                     "remote_aggregate_bps", "interval_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                problems.append(f"{name} must be > 0")
        if not (math.isfinite(self.restart_s) and self.restart_s >= 0):
            problems.append("restart_s must be >= 0")
        if problems:
            raise PlacementInputError(f"cluster spec '{self}': " + "; ".join(problems))

    @property
    def racks(self) -> int:
        return -(-self.nodes // self.rack_size)

    def rack_of(self, node: int) -> int:
        """Racks hold consecutive node indices (node ``i`` sits in rack ``i // rack_size``)."""
        return node // self.rack_size

    def bandwidth(self, tier: str) -> float:
        return {MEMORY: self.memory_bandwidth_bps, DISK: self.disk_bandwidth_bps,
                REMOTE: self.remote_bandwidth_bps}[tier]

    def slots(self, tier: str) -> int:
        return {MEMORY: self.memory_slots, DISK: self.disk_slots}[tier]

    # -- plain-dict and string forms ------------------------------------------------
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ClusterSpec":
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise PlacementInputError(f"cluster spec: unknown field(s) {', '.join(unknown)}")
        return cls(**data)

    def __str__(self) -> str:
        return ",".join(f"{key}={getattr(self, field) / scale:g}" for key, (field, scale) in _KEYS.items())

    @classmethod
    def parse(cls, text: str) -> "ClusterSpec":
        """``key=value`` pairs separated by commas; unnamed keys keep their defaults."""
        values: dict = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, sep, raw = item.partition("=")
            key = key.strip()
            if not sep or key not in _KEYS:
                raise PlacementInputError(
                    f"cluster spec '{text}': bad item '{item}'; expected key=value with key one of "
                    + ", ".join(_KEYS))
            field, scale = _KEYS[key]
            try:
                number = float(raw)
            except ValueError:
                raise PlacementInputError(f"cluster spec '{text}': {key} needs a number, got '{raw}'") from None
            if key in _INTS:
                if not number.is_integer():
                    raise PlacementInputError(f"cluster spec '{text}': {key} must be an integer, got '{raw}'")
                values[field] = int(number)
            else:
                values[field] = number * scale
        return cls(**values)
