"""Masking: turn a message into the key under which its template and category are cached.

Every token that contains a digit (hosts, pids, addresses, sizes, ids,
timestamps) becomes ``<*>`` - except the few numbers that decide a category:
Xid codes, signals, exit codes and statuses, which are kept as ``#N`` so that
``Xid 79`` and ``Xid 48`` stay different templates. Two C-level regex
substitutions and no callbacks, because this runs on every line.

Example::

    >>> mask("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.")
    'NVRM: Xid (PCI:<*>:<*>:<*>): #79, pid=<*>, GPU has fallen off the bus.'
"""

from __future__ import annotations

import re

_DECISIVE = re.compile(
    r"(?=[XWSsEe])(Xid(?: \([^)]*\))?:?|WTERMSIG|WEXITSTATUS|[Ss]ignal|SIG|[Ee]xit ?[Cc]ode[:=]?|exitcode:|"
    r"[Ee]xit [Ss]tatus|[Ss]tatus[:=]|[Ee]rror [Cc]ode[:=]?) ?(-?\d+)\b"
)
_DIGIT_TOKEN = re.compile(r"(?<![#\w-])[\w-]*\d[\w-]*")
PARAM = "<*>"


def mask(message: str) -> str:
    """The message with its variable parts replaced by ``<*>`` (decisive numbers kept)."""
    # Cheap substring gates: most lines hold none of the decisive words.
    if "Xid" in message or "SIG" in message or "ignal" in message or "xit" in message or "XIT" in message \
            or "tatus" in message or "rror code" in message or "rror Code" in message:
        message = _DECISIVE.sub(r"\1 #\2", message)
    return _DIGIT_TOKEN.sub(PARAM, message)
