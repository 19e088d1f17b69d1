"""Template mining: group lines into templates by how often each token appears where it does.

The lines' template tokens (:func:`reliability.logs.masking.template_tokens`:
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
as long as at least half of the general one stays constant. This is the
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

from collections import Counter
from dataclasses import dataclass, field

from reliability.logs.masking import PARAM
from reliability.logs.template_state import TemplateSet

Tokens = tuple[str, ...]


def group_sequences(counts: dict[Tokens, int], *, distinct_values: int = 3) -> dict[Tokens, Tokens]:
    """Each sequence -> its template tokens (see the module docstring)."""
    by_length: dict[int, list[Tokens]] = {}
    for seq in counts:
        by_length.setdefault(len(seq), []).append(seq)
    result: dict[Tokens, Tokens] = {}
    for seqs in by_length.values():
        freq: Counter = Counter()
        for seq in seqs:
            n = counts[seq]
            for pos, token in enumerate(seq):
                if token != PARAM:
                    freq[pos, token] += n
        groups: dict[Tokens, list[Tokens]] = {}
        for seq in seqs:
            shared = Counter(freq[pos, t] for pos, t in enumerate(seq) if t != PARAM)
            if not shared:
                groups.setdefault(seq, []).append(seq)
                continue
            root = max(shared, key=lambda f: (shared[f], f))
            template = tuple(t if t != PARAM and freq[pos, t] >= root else PARAM for pos, t in enumerate(seq))
            groups.setdefault(template, []).append(seq)
        for template, members in groups.items():
            keep = [pos for pos, t in enumerate(template) if t == PARAM
                    and len(values := {m[pos] for m in members}) <= distinct_values and PARAM not in values]
            for seq in members:
                if keep:
                    tokens = list(template)
                    for pos in keep:
                        tokens[pos] = seq[pos]
                    result[seq] = tuple(tokens)
                else:
                    result[seq] = template
    return _generalize(result)


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
        new_ids: dict[Tokens, int] = {}
        for seq, n in fresh.items():  # first-occurrence order: ids are reproducible
            template = grouped[seq]
            tid = new_ids.get(template)
            if tid is None:
                tid = new_ids[template] = self.known.add(template, 0)
            self.known.count(tid, n)
            ids[seq] = tid
        return ids
