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


def kept_spans(text: str, start: int = 0) -> tuple[tuple[int, int], ...]:
    """Where the digits :func:`mask` would keep sit in ``text[start:]``.

    Lines of one shape (equal up to their digits) have them at the same
    places, and lines of one shape whose kept digits are equal mask alike.

    >>> text = "Xid (PCI:0000:3b:00): 79, pid=12 relay=#7#"
    >>> [text[a:b] for a, b in kept_spans(text)]
    ['79', '7']
    """
    spans = [m.span(1) for m in _DECISIVE_NUMBERS.finditer(text, start)]
    if "#" in text:
        spans.extend(m.span(1) for m in _AFTER_HASH.finditer(text, start))
    return tuple(spans)


def mask(message: str) -> str:
    """The message with its variable parts replaced by ``<*>`` (decisive numbers kept)."""
    # Most lines hold none of the decisive words.
    if has_decisive_number(message):
        message = _DECISIVE.sub(r"\1 #\2", message)
    return _DIGIT_TOKEN.sub(PARAM, message)


# -- template tokens: the finer mask that groups lines into templates (docs/LOGS.md, "Templates") ---------
_DATE_WORDS = frozenset("Mon Tue Wed Thu Fri Sat Sun Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split())
_KEY_VALUE = re.compile(r"([A-Za-z_][\w.-]*[=:])([^=,;]*)")
_PARAM_RUN = re.compile(r"<\*>(?:[.:/,_-]*<\*>)+")
_WORD_CHAR = re.compile(r"\w")
# A name that ends in a version, written in capitals ("SOCKS5", "HTTP2", "SHA256", "IPv6", "EXT4"): a constant.
# Zero-padded numbers are counters, not versions: "SRV01", "NODE007" stay values.
VERSIONED_NAME = re.compile(r"[A-Z][A-Za-z]*[A-Z][A-Za-z]*[1-9]\d{0,2}[.,;:)]?")
_UNITS = frozenset("B KB MB GB TB PB kB KiB MiB GiB TiB k K M G ms us ns s sec secs %".split())


def _template_token(token: str) -> str:
    if token in _DATE_WORDS:
        return PARAM
    # most tokens are words: letters are never digits, so only other tokens are searched
    has_digit = not token.isalpha() and any(ch.isdigit() for ch in token)
    # Paths and URLs are values: "/mnt/data/current/subdir7/blk_1", "HTTP/1.1" (but not "I/O")
    if "/" in token and (token[0] == "/" or token.count("/") > 1 or has_digit):
        return PARAM
    if not has_digit or VERSIONED_NAME.fullmatch(token):
        return token
    token = _DIGIT_TOKEN.sub(PARAM, token)
    kv = _KEY_VALUE.fullmatch(token)
    if kv is not None and PARAM in kv.group(2):  # "rhost=<*>.<*>.example.org" -> "rhost=<*>"
        return kv.group(1) + PARAM
    token = _PARAM_RUN.sub(PARAM, token)
    # values and punctuation only ("(<*>", "<<*>" from "<1", ">=<*>"): one value
    return token if _WORD_CHAR.search(token.replace(PARAM, "")) else PARAM


def template_tokens(content: str) -> tuple[str, ...]:
    """Tokens of ``content`` with its values masked: what the template miner groups by.

    Digit-bearing parts, paths, day and month names become ``<*>``; a token
    made only of values (an address, ``10.0.0.1:80``) is one ``<*>``; a unit
    after a value and runs of values collapse into one ``<*>``, so lines whose
    variable parts have different lengths still line up.

    >>> template_tokens("Block rdd_42_3 stored as bytes in memory (estimated size 16.0 KB, free 3.2 GB)")
    ('Block', '<*>', 'stored', 'as', 'bytes', 'in', 'memory', '(estimated', 'size', '<*>', 'free', '<*>')
    >>> template_tokens("connection from 10.0.0.1 (host) at Sun Jul 3 10:00:01 2005")
    ('connection', 'from', '<*>', '(host)', 'at', '<*>')
    """
    out: list[str] = []
    for token in content.split():
        if out and out[-1] == PARAM and token.rstrip(",;:)]") in _UNITS:
            continue
        token = _template_token(token)
        if token == PARAM and out and out[-1] == PARAM:
            continue
        out.append(token)
    return tuple(out)
