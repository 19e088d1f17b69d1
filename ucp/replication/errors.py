"""Errors raised by replica placement; all inherit :class:`ucp.errors.UcpError`.

Example::

    try:
        ClusterSpec.parse("nodes=0")
    except PlacementInputError as err:
        print(err)  # cluster spec 'nodes=0': nodes must be >= 2
"""

from __future__ import annotations

from ucp.errors import UcpError


class PlacementInputError(UcpError, ValueError):
    """A cluster spec, scenario, request or option is malformed."""


class PlacementError(UcpError, ValueError):
    """A placement breaks the request's rules (budget, capacity, dead or duplicate holders)."""


class FailureLogError(UcpError, ValueError):
    """A ``ucp logs analyze --json`` report cannot be replayed (wrong schema, no fatal incidents)."""


class PolicyFileError(UcpError, FileNotFoundError):
    """A trained RL policy file is missing or was trained for an incompatible observation layout."""


class ReplicaLostError(UcpError, FileNotFoundError):
    """Every copy of a checkpoint array is gone: not in the checkpoint, no replica survived with a good checksum."""


class ReplicaCapacityError(UcpError, MemoryError):
    """A replica tier cannot hold a copy even after evicting every older checkpoint."""


class ReplicaWarning(UserWarning):
    """A replica was skipped (checksum mismatch, unreadable) and the next one was used."""


class ReplicaError(UcpError, RuntimeError):
    """Replication or recovery failed on some rank (the message names the rank and why)."""
