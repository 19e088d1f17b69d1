"""The literal prefilter may only skip patterns that cannot match: first-match answers equal the plain loop's."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ucp.reliability.logs.prefilter import RuleSet, required_literals
from ucp.reliability.logs.taxonomy import load_taxonomy

TAXONOMY = load_taxonomy()
RULES = RuleSet.of(TAXONOMY.rules)


@pytest.mark.parametrize("pattern, literals", [
    (r"(?i)\bEDAC\b.*\b(CE|UE|error)\b", {"edac"}),
    (r"\bXid\b(?: \([^)]*\))?:? ?79\b", {"xid"}),                  # the optional group adds nothing
    (r"(?i)\b(?:fan|psu)\b.{0,40}fail", {"fail"}),                 # the longest required piece wins
    (r"(?i)\b(?:power supply|psu)\b", {"ower supply", "su"}),     # any branch (the parser factors out "p")
    (r"[Ee]xit [Cc]ode", {"exit code"}),                           # one letter in two cases is a literal
    (r"(?i)^(?!.*\bGPU\b).*double[- ]bit", {"double"}),            # look-arounds are zero-width
    (r"(?:ab)+cdx", {"cdx"}),                                      # a repeat's body is a piece of its own
    (r"(a|b|)xyz", {"xyz"}),                                       # an empty branch makes the group optional
    (r"\d+ errors?", {" error"}),
    (r"(\w+)\1", None),                                            # nothing literal to require
    (r"x{0,3}", None),
    (r"(?i)ſegfault", {"egfault"}),                                # non-ASCII letters are never required
])
def test_required_literals(pattern, literals):
    found = required_literals(re.compile(pattern))
    assert (None if found is None else set(found)) == literals


def _plain_first(rules, text):
    for pattern, label in rules:
        if pattern.search(text):
            return label
    return None


def test_rule_set_answers_as_the_plain_loop_on_the_taxonomy_examples():
    texts = [ex for cat in TAXONOMY.categories for ex in (*cat.examples, cat.description)]
    texts += [t.upper() for t in texts] + [t.swapcase() for t in texts]
    answers = [RULES.first(t) for t in texts]
    assert answers == [_plain_first(TAXONOMY.rules, t) for t in texts]
    assert sum(a is not None for a in answers) > len(texts) // 3  # the rules really were exercised


_PIECES = ["EDAC", "mce", "error", "Xid", " 79", "fail", "ed", "psu", "PSU", "power supply", "double-bit", "GPU",
           "ECC", " ", "\u017fegfault at", "segfault at", "\u212aernel panic", "kernel panic", "link", "down",
           "corrected", "(", ")", ":", "0"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=12))
def test_rule_set_answers_as_the_plain_loop_on_any_text(pieces):
    # Includes non-ASCII letters that case-fold onto ASCII (long s, Kelvin sign): the plain loop decides those.
    text = "".join(pieces)
    assert RULES.first(text) == _plain_first(TAXONOMY.rules, text)


def test_one_letter_literals_and_pairs_at_the_ends_still_select_their_rules():
    # Literals are looked up by their first two letters; a one-letter literal has none, and a literal may sit
    # at the very start or end of the text.
    rules = RuleSet.of([(re.compile(r"q\d"), "one"), (re.compile(r"(?i)oom\b"), "end"), (re.compile(r"^ab"), "start")])
    assert required_literals(rules.rules[0][0]) == frozenset({"q"})
    for text in ("q7 x", "x q7", "OOM", "killed: oom", "ab", "ab oom", "nothing", "", "o", "q"):
        assert rules.first(text) == _plain_first(rules.rules, text), text
