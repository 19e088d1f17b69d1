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

_DECISIVE_WORDS = (r"Xid(?: \([^)]*\))?:?|WTERMSIG|WEXITSTATUS|[Ss]ignal|SIG|[Ee]xit ?[Cc]ode[:=]?|exitcode:|"
                   r"[Ee]xit [Ss]tatus|[Ss]tatus[:=]|[Ee]rror [Cc]ode[:=]?")
_DECISIVE = re.compile(r"(?=[XWSsEe])(" + _DECISIVE_WORDS + r") ?(-?\d+)\b")
# The digits the mask keeps: decisive numbers, and tokens right after a "#" (which the
# digit-token rule leaves alone, e.g. sendmail's "relay=#7#"). With a line's shape they decide its mask.
_DECISIVE_NUMBERS = re.compile(r"(?=[XWSsEe])(?:" + _DECISIVE_WORDS + r") ?(-?\d+)\b")
_AFTER_HASH = re.compile(r"#([\w-]*\d[\w-]*)")
_DIGIT_TOKEN = re.compile(r"(?<![#\w-])[\w-]*\d[\w-]*")
PARAM = "<*>"


def has_decisive_number(message: str) -> bool:
    """Whether ``message`` may hold a number that :func:`mask` keeps (cheap substring gates)."""
    return "Xid" in message or "SIG" in message or "ignal" in message or "xit" in message \
        or "XIT" in message or "tatus" in message or "rror code" in message or "rror Code" in message


def may_keep_numbers(message: str) -> bool:
    """Whether :func:`mask` may keep some of ``message``'s digits (so its mask depends on their values)."""
    return "#" in message or has_decisive_number(message)


def kept_numbers(text: str, start: int = 0) -> tuple[str, ...]:
    """The digits :func:`mask` would keep in ``text[start:]``; lines of one shape with equal
    kept numbers mask alike.

    >>> kept_numbers("Xid (PCI:0000:3b:00): 79, pid=12 relay=#7#")
    ('79', '|', '7')
    """
    found = _DECISIVE_NUMBERS.findall(text, start)
    found.append("|")
    if "#" in text:
        found.extend(_AFTER_HASH.findall(text, start))
    return tuple(found)


def mask(message: str) -> str:
    """The message with its variable parts replaced by ``<*>`` (decisive numbers kept)."""
    # Most lines hold none of the decisive words.
    if has_decisive_number(message):
        message = _DECISIVE.sub(r"\1 #\2", message)
    return _DIGIT_TOKEN.sub(PARAM, message)
