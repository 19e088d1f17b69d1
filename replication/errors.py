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
