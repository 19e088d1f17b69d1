"""Message headers: the severity and component a logging system writes in front of the content.

Readers (:mod:`ucp.reliability.logs.readers`) strip the envelope (time stamp,
host); what is left often still starts with a header: a level word (``INFO``,
``[error]``, logcat's ``E``, ``<3>``, Blue Gene's ``RAS KERNEL FATAL``), a
thread in brackets and a component (``dfs.DataNode:``, ``sshd[42]:``).
:func:`split_header` finds them without knowing the format: it skips
stamp-like tokens (digits and punctuation), takes a level word written as a
level (upper case, capitalised or bracketed) among the first tokens, then a
bracketed context and a component. The content - what a template describes -
is the rest. Severities are ordinal (:data:`SEVERITY_NAMES`).

Example::

    >>> split_header("081109 204132 26 INFO dfs.FSNamesystem: BLOCK* NameSystem.addStoredBlock: updated")
    (1, 'BLOCK* NameSystem.addStoredBlock: updated')
    >>> split_header("RAS KERNEL FATAL data TLB error interrupt")
    (4, 'data TLB error interrupt')
    >>> split_header("sshd[24200]: Failed password for invalid user webmaster")
    (None, 'Failed password for invalid user webmaster')
"""

from __future__ import annotations

import re

DEBUG, INFO, WARNING, ERROR, CRITICAL = 0, 1, 2, 3, 4
SEVERITY_NAMES = ("debug", "info", "warning", "error", "critical")

_LEVEL_WORDS = {
    "trace": DEBUG, "debug": DEBUG, "dbg": DEBUG, "verbose": DEBUG, "fine": DEBUG, "finer": DEBUG,
    "finest": DEBUG,
    "info": INFO, "information": INFO, "informational": INFO, "notice": INFO,
    "warn": WARNING, "warning": WARNING,
    "error": ERROR, "err": ERROR, "severe": ERROR,
    "fatal": CRITICAL, "critical": CRITICAL, "crit": CRITICAL, "alert": CRITICAL, "emerg": CRITICAL,
    "emergency": CRITICAL, "failure": CRITICAL, "panic": CRITICAL,
}
# Android logcat, glog/klog ("E0601 12:00:00.1 ..."), torch's c10 ("[E ...]"): one letter.
_LETTERS = {"V": DEBUG, "D": DEBUG, "I": INFO, "N": INFO, "W": WARNING, "E": ERROR, "F": CRITICAL, "A": CRITICAL,
            "C": CRITICAL}
# syslog PRI "<13>" and kernel printk "<3>": the level is the low three bits (0 emerg .. 7 debug).
_PRIORITY = (CRITICAL, CRITICAL, CRITICAL, ERROR, WARNING, INFO, INFO, DEBUG)

_STAMP = re.compile(r"[\[(<]?\d[\d\-:/.,|+T_]*[\])>,:]?|-|\|")
# An address ("183.62.156.108:22", "10.0.0.2,10.0.0.1") is all digits and dots too, but it is the message's subject.
_ADDRESS = re.compile(r"(?<![\d.])\d{1,3}(?:\.\d{1,3}){3}(?![\d.])")
_BRACKETED = re.compile(r"[\[<(]([A-Za-z]+)[\]>)]:?")
_PRI = re.compile(r"<(\d{1,3})>")
_GLOG = re.compile(r"([IWEF])\d{4}")
_KEYED = re.compile(r"(?:level|lvl|severity|loglevel)=\"?([A-Za-z]+)\"?", re.IGNORECASE)
_COMPONENT = re.compile(r"[\w.$()/@-]+(?:\[[\w.:-]*\])?:|[\w./-]+:\d+\]")  # "tag[pid]:", glog's "file.go:12]"
_SOURCE_LINE = re.compile(r"[\w./-]+:\d+\]")  # glog's "file.cc:12]": a source location, never a message's word
_DOTTED = re.compile(r"[A-Za-z_][\w$]*(?:\.[\w$]+)+")
_WORD = re.compile(r"[A-Za-z]")
_PIPE_HEADER = re.compile(r"(?:[^|\s]*\|){2,}")
COMPONENT_SHARE = 0.5  # a component column: most header lines name one (a message's first word: a few)


def level_of(token: str, *, after_tag: bool = False) -> int | None:
    """The severity a single token names, if it is written as a level.

    >>> level_of("ERROR"), level_of("[error]"), level_of("Warning"), level_of("error"), level_of("error:", after_tag=True)
    (3, 3, 2, None, 3)
    """
    word = token.rstrip(":,")
    bracketed = _BRACKETED.fullmatch(token)
    if bracketed is not None:
        word = bracketed.group(1)
    level = _LEVEL_WORDS.get(word.lower())
    if level is None:
        return None
    # "error" inside a sentence is a word, not a level: levels are written upper case,
    # capitalised ("Info" in Windows CBS logs) or bracketed ("[notice]" in Apache's).
    # Right after a syslog tag, "error:" is Slurm's and many daemons' way to write the level.
    if word.isupper() or word.istitle() or bracketed is not None or (after_tag and token.endswith(":")):
        return level
    return None


def _skip(tokens: list[str], i: int) -> int:
    while i < len(tokens) and (not tokens[i] or (_STAMP.fullmatch(tokens[i]) and not _ADDRESS.search(tokens[i]))):
        i += 1
    return i


def _skip_context(tokens: list[str], i: int) -> int:
    # "[main]", "[req-1 abc - - -]", " - " separators (log4j, Zookeeper, Proxifier)
    n = len(tokens)
    while i < n and (not tokens[i] or tokens[i] == "-"):
        i += 1
    if i < n and tokens[i].startswith("["):
        k = i
        while k < n and not tokens[k].endswith("]"):
            k += 1
        if k < n and k - i < 12:
            i = k + 1
    while i < n and (not tokens[i] or tokens[i] == "-"):
        i += 1
    return i


def split_header(message: str, *, components: bool = True) -> tuple[int | None, str]:
    """``(severity or None, content)`` of one message (see the module docstring).

    ``components=False``: a ``name:`` or dotted name after the level is content, not a component (a
    source whose messages carry no component column, see :func:`has_component_column`); a source
    location (``file.cc:12]``) is header either way.
    """
    severity = None
    m = _PRI.match(message)
    if m is not None:
        severity = _PRIORITY[int(m.group(1)) & 7]
        message = message[m.end():].lstrip()
    pipe = _PIPE_HEADER.match(message)
    if pipe is not None:  # "20171223-22:15:29:606|Step_LSC|30002312|msg", or "Step_LSC|30002312|msg"
        message = message[pipe.end():]
    if "\t" in message:  # tab-separated columns ("INFO\tdisk full"): a tab separates like a space
        message = message.replace("\t", " ")
    tokens = message.split(" ")
    n = len(tokens)
    i = start = _skip(tokens, 0)
    j = i
    while j < n and j < start + 4:
        token = tokens[j]
        if not token:
            j += 1
            continue
        level = level_of(token)
        if level is None and j == start and token in _LETTERS and (
                start > 0 or (j + 2 < n and _COMPONENT.fullmatch(tokens[j + 1]))):
            level = _LETTERS[token]  # logcat: "03-17 16:13:38.861  2227  2227 D Tag: ...", or "D Tag: ..." alone
        if level is None and j == start:
            glog = _GLOG.fullmatch(token)
            keyed = _KEYED.fullmatch(token)
            if glog is not None:
                level = _LETTERS[glog.group(1)]
            elif keyed is not None:
                level = _LEVEL_WORDS.get(keyed.group(1).lower())
        if level is not None:
            severity = level if severity is None else max(severity, level)
            i = j + 1
            break
        if not (token.isupper() and token.isalpha()):  # "RAS KERNEL FATAL": upper-case words may lead
            break
        j += 1
    if i > start or start > 0:  # a header: stamps and/or a level, then context and a component
        i = _skip_context(tokens, _skip(tokens, i))
        if severity is None and "-" in tokens[i:i + 3]:  # "[stamp] program *64 - content"
            i = tokens.index("-", i) + 1
        elif i < n - 1 and (_SOURCE_LINE.fullmatch(tokens[i]) or (components and (
                _COMPONENT.fullmatch(tokens[i]) or _DOTTED.fullmatch(tokens[i])))):
            i = _skip_context(tokens, i + 1)
    elif "-" in tokens[i:i + 2] and not any(_WORD.match(t) for t in tokens[i:tokens.index("-", i)]):
        i = tokens.index("-", i) + 1  # "*64 - content", "- content": a mark before a dash (Proxifier's "*64")
    elif tokens[i].startswith("["):  # "[context] content"
        i = _skip_context(tokens, i)
    elif i < n - 1 and _COMPONENT.fullmatch(tokens[i]):  # syslog tag: "sshd[42]: content"
        i += 1
        while i < n and not tokens[i]:
            i += 1
        token = tokens[i] if i < n - 1 else ""
        if token.endswith(":") or token.startswith("[") or (token.isupper() and len(token) >= 4):
            # "slurmd[7]: error: ...", "logrotate: ALERT exited ...": a level after the tag
            level = level_of(token, after_tag=True)
            if level is not None:
                severity = level
                i += 1
    while i < n - 1 and tokens[i] in ("-", ""):
        i += 1
    if i >= n:
        return severity, message.strip()
    return severity, " ".join(tokens[i:]).strip()


def has_component_column(messages: list[str]) -> bool:
    """Whether most of one source's messages that have a header name a component after it.

    ``INFO dfs.DataNode: Receiving block`` in every line is a logger's component column;
    ``INFO getTasks: caller 1000 ...`` in a few lines among ``INFO Skipping ...`` is the first word
    of those messages, which a rewritten header put right after the level.

    >>> has_component_column(["INFO dfs.DataNode: got block %d" % i for i in range(5)])
    True
    >>> has_component_column(["INFO getTasks: caller 7", "INFO Skipping frames", "INFO Displayed app",
    ...                       "WARN no window"])
    False
    """
    with_header = with_component = 0
    for message in messages:
        severity, kept = split_header(message, components=False)
        if severity is None and kept == message.strip():
            continue  # no header at all: the syslog-tag rule, not this one
        with_header += 1
        with_component += split_header(message)[1] != kept
    return with_header == 0 or with_component >= COMPONENT_SHARE * with_header
