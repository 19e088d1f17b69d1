"""First-match over many regexes, with a literal prefilter: only patterns whose words occur are run.

The taxonomy holds ~200 patterns, most of them case-insensitive and starting
with ``\\b``, which Python's regex engine cannot skip ahead for: trying them
all costs ~1.5 ms a message. But nearly every pattern needs some literal text
to match (``(?i)\\bEDAC\\b.*\\b(CE|UE|error)\\b`` cannot match a line without
"edac"). :func:`required_literals` reads that off the parsed pattern: a set of
lower-case strings one of which every match contains. :class:`RuleSet` tests
those strings with ``in`` on the lower-cased message (C substring search,
~50 ns each) and runs, in their order, only the patterns whose strings occur
(and the few with no required literal). The answer is always the one the plain
loop gives: the prefilter only skips patterns that cannot match.

Lower-casing is exact only for ASCII text, so non-ASCII messages, and
literals with non-ASCII letters (case folding can map them onto ASCII), take
the plain loop or count as no literal.

Example::

    >>> rules = RuleSet.of([(re.compile(r"(?i)\\bEDAC\\b.*\\berror"), "mem"), (re.compile(r"Xid ?79"), "gpu")])
    >>> rules.first("EDAC MC0: 1 CE error on CPU#0"), rules.first("NVRM: Xid 79"), rules.first("all good")
    ('mem', 'gpu', None)
    >>> sorted(required_literals(re.compile(r"(?i)\\b(?:fan|psu)\\b.{0,40}fail")))
    ['fail']
"""

from __future__ import annotations

import re
from dataclasses import dataclass

try:  # the parser behind re.compile: a private module, so any surprise just means "no literal"
    from re import _parser as _sre_parse  # Python >= 3.11
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _sre_parse  # type: ignore[no-redef]

_LITERAL = _sre_parse.LITERAL
_IN = _sre_parse.IN
_AT = _sre_parse.AT
_ASSERTS = (_sre_parse.ASSERT, _sre_parse.ASSERT_NOT)
_SUBPATTERN = _sre_parse.SUBPATTERN
_BRANCH = _sre_parse.BRANCH
_REPEATS = tuple(getattr(_sre_parse, name) for name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")
                 if hasattr(_sre_parse, name))

Constraint = frozenset  # of lower-case strings: a match contains at least one of them


def _strength(constraint: Constraint) -> tuple[int, int]:
    # Longer strings are rarer; fewer alternatives are fewer chances to pass.
    return min(len(s) for s in constraint), -len(constraint)


def _best(constraints: list[Constraint]) -> Constraint | None:
    useful = [c for c in constraints if c and all(c)]
    return max(useful, key=_strength) if useful else None


def _char(code: int) -> str | None:
    ch = chr(code).lower()
    return ch if ch.isascii() else None


def _class_char(items) -> str | None:
    # "[Ee]" is the one lower-case letter "e" once the message is lower-cased
    chars = {_char(av) if op is _LITERAL else None for op, av in items}
    return chars.pop() if len(chars) == 1 and None not in chars else None


def _sequence(items) -> list[Constraint]:
    """Constraints each element of a sequence imposes; adjacent literals form one string."""
    found: list[Constraint] = []
    run: list[str] = []

    def flush():
        if run:
            found.append(frozenset(["".join(run)]))
            run.clear()

    for op, av in items:
        ch = None
        if op is _LITERAL:
            ch = _char(av)
        elif op is _IN:
            ch = _class_char(av)
        elif op is _AT or op in _ASSERTS:
            continue  # zero-width: the text on both sides is adjacent in the match
        if ch is not None:
            run.append(ch)
            continue
        flush()
        if op is _SUBPATTERN:
            found.extend(_sequence(av[-1]))
        elif op is _BRANCH:
            options = [_best(_sequence(branch)) for branch in av[1]]
            if options and all(o is not None for o in options):
                found.append(frozenset().union(*options))
        elif op in _REPEATS and av[0] >= 1:
            found.extend(_sequence(av[2]))
        # anything else (any char, categories, back references): no literal, and the run ends
    flush()
    return found


def required_literals(pattern: re.Pattern) -> frozenset[str] | None:
    """Lower-case strings one of which every match of ``pattern`` contains; None when there are none."""
    try:
        tree = _sre_parse.parse(pattern.pattern, pattern.flags)
    except Exception:  # noqa: BLE001 - an internal parser; no literal is always a safe answer
        return None
    return _best(_sequence(list(tree)))


@dataclass(frozen=True)
class RuleSet:
    """``(pattern, label)`` rules tried in order; :meth:`first` gives the first label whose pattern matches."""

    rules: tuple[tuple[re.Pattern, str], ...]
    literals: tuple[tuple[str, tuple[int, ...]], ...]  # literal -> indices of the rules that need it
    unfiltered: tuple[int, ...]  # rules without a required literal: always tried

    @classmethod
    def of(cls, rules) -> "RuleSet":
        rules = tuple(rules)
        needs: dict[str, list[int]] = {}
        unfiltered = []
        for i, (pattern, _label) in enumerate(rules):
            literals = required_literals(pattern)
            if literals is None:
                unfiltered.append(i)
            else:
                for literal in literals:
                    needs.setdefault(literal, []).append(i)
        return cls(rules=rules, literals=tuple((k, tuple(v)) for k, v in needs.items()),
                   unfiltered=tuple(unfiltered))

    def first(self, text: str) -> str | None:
        """The label of the first rule whose pattern matches ``text`` (``search``), or None."""
        rules = self.rules
        if not text.isascii():
            for pattern, label in rules:
                if pattern.search(text):
                    return label
            return None
        low = text.lower()
        candidates = set(self.unfiltered)
        for literal, indices in self.literals:
            if literal in low:
                candidates.update(indices)
        for i in sorted(candidates):
            pattern, label = rules[i]
            if pattern.search(text):
                return label
        return None
