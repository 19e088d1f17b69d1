"""Template mining: group lines into templates by how often each token appears where it does.

The lines' template tokens (:func:`ucp.reliability.logs.masking.template_tokens`:
values with digits, paths and dates already masked) are counted once per
distinct sequence. Then, among sequences of one length, each (position,
token) pair gets its frequency in lines. A template's constant words occur
in every line of it, so in one line they share one frequency; values
(a user name, a host without digits) occur less. For each sequence the
frequency shared by most of its tokens marks its constants; rarer tokens
are values, except that a position with few distinct values over its group
(``distinct_values``, 3) is kept as constant and splits the group (so
"VM Started"/"VM Stopped" stay apart while user names merge). Last, a
template that equals a more general one up to one of its constants joins it
("Invalid user user from <*>" is an instance of "Invalid user <*> from <*>"),
as long as at least half of the general one stays constant. Templates with
the same constants in the same order that differ only in how many tokens
their values take ("0 bytes sent", "1268 bytes (1.23 KB) sent") are one
template, in one run and against the known ones of earlier runs. This is the
idea of the Brain parser (Yu et al., 2023), here without per-system settings.

The result depends only on the set of sequences and their counts, never on
the order lines arrived in: mining on one worker or many gives one answer.

Example::

    miner = TemplateMiner(known=TemplateSet())
    ids = miner.fit({("session", "opened", "for", "user", "alice"): 3,
                     ("session", "opened", "for", "user", "bob"): 2,
                     ("session", "opened", "for", "user", "carol"): 1,
                     ("session", "opened", "for", "user", "dave"): 1})
    miner.templates.get(ids[("session", "opened", "for", "user", "bob")]).text
    # -> 'session opened for user <*>'
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ucp.reliability.logs.masking import PARAM, VERSIONED_NAME
from ucp.reliability.logs.template_state import TemplateSet

Tokens = tuple[str, ...]
_WORDLIKE = re.compile(r"[A-Za-z][A-Za-z_-]*")
# A value that may be a constant of its own template ("Started", "user=root", "initialization."), not a value
# token (an address, a path, a masked number): few of them at one position keep the templates apart.
_CONSTANT_LIKE = re.compile(r"(?:[\w.-]+[=:])?[A-Za-z][A-Za-z_-]*[.,;:!]?|" + VERSIONED_NAME.pattern)
_KEY = re.compile(r"([A-Za-z_][\w.-]*[=:])[^=:]")


def lead_word(seq: Tokens) -> str:
    """The first *word* of a sequence: letters only (with ``_`` or ``-``), not a value, path, address or key.

    >>> lead_word(("proxy.example.org:<*>", "open", "through", "proxy", "<*>"))
    'open'
    """
    for token in seq:
        word = token.rstrip(":,;")
        if word and _WORDLIKE.fullmatch(word):
            return word
    return ""


def _similarity(template: Tokens, seq: Tokens) -> float:
    # Drain's simSeq: share of positions where the template's constant equals the token.
    same = 0
    for t, u in zip(template, seq):
        if t == u and t != PARAM:
            same += 1
    return same / len(seq)


def _merge(template: Tokens, seq: Tokens) -> Tokens:
    return tuple(t if t == u else _wider(t, u) for t, u in zip(template, seq))


def _wider(t: str, u: str) -> str:
    # "rhost=alpha" and "rhost=beta", "ret:false" and "ret:true": the key stays, the value is the variable part
    key = _KEY.match(t)
    return key.group(1) + PARAM if key is not None and u.startswith(key.group(1)) else PARAM


def group_sequences(counts: dict[Tokens, int], *, similarity: float = 0.5,
                    distinct_values: int = 3) -> dict[Tokens, Tokens]:
    """Each sequence -> its template tokens (see the module docstring).

    Sequences are grouped by length and leading word, then, largest first,
    each joins the most similar template of its group if at least
    ``similarity`` of its positions equal that template's constants and the
    merged template keeps a constant word; otherwise it starts a template.
    A token becomes ``<*>`` only where two members differ, and a position
    with at most ``distinct_values`` values, none of them a value token, is
    kept as a constant (``VM Started``/``VM Stopped`` stay apart).
    """
    buckets: dict[tuple[int, str], list[Tokens]] = {}
    for seq in sorted(counts, key=lambda s: (-counts[s], s)):  # largest first: independent of input order
        buckets.setdefault((len(seq), lead_word(seq)), []).append(seq)
    result: dict[Tokens, Tokens] = {}
    for seqs in buckets.values():
        clusters: list[list] = []  # [template, members]
        for seq in seqs:
            best, best_sim = None, -1.0
            for cluster in clusters:
                sim = _similarity(cluster[0], seq)
                if sim > best_sim:
                    best, best_sim = cluster, sim
            if best is not None and best_sim >= similarity:
                merged = _merge(best[0], seq)
                if any(t != PARAM for t in merged):
                    best[0] = merged
                    best[1].append(seq)
                    continue
            clusters.append([seq, [seq]])
        for template, members in clusters:
            keep = [pos for pos, t in enumerate(template) if t.endswith(PARAM)
                    and len(values := {m[pos] for m in members}) <= distinct_values
                    and all(_CONSTANT_LIKE.fullmatch(v) for v in values)]
            for seq in members:
                if keep:
                    tokens = list(template)
                    for pos in keep:
                        tokens[pos] = seq[pos]
                    result[seq] = tuple(tokens)
                else:
                    result[seq] = template
    return _join_variable_lengths(_generalize(result))


def _join_variable_lengths(result: dict[Tokens, Tokens]) -> dict[Tokens, Tokens]:
    """Templates with the same constant words in the same order, differing only in their values, become one.

    A value may take several tokens or none ("0 bytes sent", "1268 bytes (1.23 KB)
    sent"), which the grouping by length keeps apart. Joined when at least two
    constants and at least half of every member's tokens are constants; where the
    members' values differ between two constants, the joined template has one ``<*>``.
    """
    by_key: dict[Tokens, list[Tokens]] = {}
    for template in set(result.values()):
        key = constants_key(template)
        if key is not None:
            by_key.setdefault(key, []).append(template)
    joined: dict[Tokens, Tokens] = {}
    for key, templates in by_key.items():
        if len(templates) > 1:
            text = _aligned(key, templates)
            joined.update((t, text) for t in templates)
    return {seq: joined.get(t, t) for seq, t in result.items()} if joined else result


def constants_key(template: Tokens) -> Tokens | None:
    """The constants of a template in order, when there are enough of them to join on (else None)."""
    key = tuple(t for t in template if t != PARAM)
    return key if len(key) >= 2 and 2 * len(key) >= len(template) else None


def _aligned(key: Tokens, templates: list[Tokens]) -> Tokens:
    # the values between consecutive constants, per template: equal in all of them -> kept, else one <*>
    def gaps(template: Tokens) -> list[Tokens]:
        out, current = [], []
        for token in template:
            if token == PARAM:
                current.append(token)
            else:
                out.append(tuple(current))
                current = []
        out.append(tuple(current))
        return out

    per = [gaps(t) for t in sorted(templates)]
    tokens: list[str] = []
    for i in range(len(key) + 1):
        values = {g[i] for g in per}
        tokens.extend(values.pop() if len(values) == 1 else (PARAM,))
        if i < len(key):
            tokens.append(key[i])
    return tuple(tokens)


def _generalize(result: dict[Tokens, Tokens]) -> dict[Tokens, Tokens]:
    templates = set(result.values())
    cache: dict[Tokens, Tokens] = {}

    def general(template: Tokens) -> Tokens:
        start = template
        while True:
            for pos, token in enumerate(template):
                if token == PARAM:
                    continue
                wider = template[:pos] + (PARAM,) + template[pos + 1:]
                if wider in templates and 2 * sum(t != PARAM for t in wider) >= len(wider):
                    template = wider
                    break
            else:
                cache[start] = template
                return template

    return {seq: cache.get(t) or general(t) for seq, t in result.items()}


@dataclass
class TemplateMiner:
    """Mines templates over a run's distinct token sequences, keeping the ids of ``known`` ones.

    Mutable: :meth:`fit` adds the run's new templates and counts to :attr:`templates`.
    """

    known: TemplateSet = field(default_factory=TemplateSet)
    distinct_values: int = 3

    @property
    def templates(self) -> TemplateSet:
        return self.known

    def fit(self, counts: dict[Tokens, int]) -> dict[Tokens, int]:
        """Template id of each sequence in ``counts`` (dict order = first occurrence: new ids follow it)."""
        ids: dict[Tokens, int] = {}
        fresh: dict[Tokens, int] = {}
        for seq, n in counts.items():
            tid = self.known.match(seq)
            if tid is None:
                fresh[seq] = n
            else:
                ids[seq] = tid
                self.known.count(tid, n)
        grouped = group_sequences(fresh, distinct_values=self.distinct_values)
        # a value of another length than the known template's: the known template, as within one run
        joinable = {key: t.id for t in self.known if (key := constants_key(t.tokens)) is not None} if fresh else {}
        new_ids: dict[Tokens, int] = {}
        for seq, n in fresh.items():  # first-occurrence order: ids are reproducible
            template = grouped[seq]
            tid = new_ids.get(template)
            if tid is None:
                key = constants_key(template)
                tid = joinable.get(key) if key is not None else None
                if tid is None:
                    tid = self.known.add(template, 0)
                new_ids[template] = tid
            self.known.count(tid, n)
            ids[seq] = tid
        return ids
