"""How the core names a checkpoint of another format without importing one (docs/ARCHITECTURE.md).

Foreign formats sit above the core (``ucp.formats`` imports the reader and the writer), so the
core never imports them. The format registry hands the core one function when it is imported,
a recogniser (a path -> the format that recognises it, or None), and the core asks through
:func:`recognise` when it words the error for a path that holds no ucp checkpoint. As with
fsspec's ``known_implementations``, the package whose import registers the built-in formats is
named here as data and imported only then, so ``ucp.load("model.safetensors")`` names the
format even in a process that never imported ``ucp.formats``.

    >>> recognise("/no/such/path") is None
    True
"""

from __future__ import annotations

import importlib
from typing import Callable, Protocol

__all__ = ["BUILTIN_FORMATS", "Recognised", "recognise", "register_recogniser"]

# Importing this package registers every built-in format (and its recogniser).
BUILTIN_FORMATS = "ucp.formats"


class Recognised(Protocol):
    """What a recogniser returns: a format's short name and what it is, for the message."""

    @property
    def name(self) -> str: ...  # read-only: formats are frozen values
    @property
    def description(self) -> str: ...


_RECOGNISERS: list[Callable[[str], "Recognised | None"]] = []


def register_recogniser(recogniser: Callable[[str], "Recognised | None"]) -> None:
    """Let the core ask ``recogniser(url)`` what a path that is no ucp checkpoint holds (once per function)."""
    if recogniser not in _RECOGNISERS:
        _RECOGNISERS.append(recogniser)


def recognise(url: str) -> Recognised | None:
    """The registered format that recognises ``url`` (a file or directory), or None."""
    importlib.import_module(BUILTIN_FORMATS)
    for recogniser in _RECOGNISERS:
        found = recogniser(url)
        if found is not None:
            return found
    return None
