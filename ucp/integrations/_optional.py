"""Import an optional framework, or say how to install it."""

from __future__ import annotations

import importlib
from types import ModuleType

from ucp.errors import UcpError


class MissingDependencyError(UcpError, ImportError):
    """An optional framework (Lightning, Transformers) is not installed."""


def require(module: str, *, extra: str) -> ModuleType:
    """``importlib.import_module(module)``, or an error naming the pip extra to install.

    >>> require("json", extra="none").__name__
    'json'
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingDependencyError(
            f"{module} is not installed; install it with: pip install 'ucp-middleware[{extra}]' ({err})"
        ) from None
