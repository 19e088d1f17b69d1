"""Errors raised by log analysis; all inherit :class:`ucp.errors.UcpError`.

Example::

    try:
        analyze_logs(["missing.log"])
    except LogInputError as err:
        print(err)  # no log files match 'missing.log'
"""

from __future__ import annotations

from ucp.errors import UcpError


class LogInputError(UcpError, FileNotFoundError):
    """A path, directory or glob given as log input matches no readable file."""


class TaxonomyError(UcpError, ValueError):
    """A taxonomy file is not valid JSON or does not follow docs/LOGS.md."""


class TemplateStateError(UcpError, ValueError):
    """A ``--state`` file exists but is not a drain3 state this version can load."""


class FittedModelError(UcpError, ValueError):
    """A file of fitted classifier numbers is damaged or does not follow its format."""
