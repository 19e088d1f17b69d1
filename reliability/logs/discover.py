"""Discovered categories: failure templates no taxonomy category knows, grouped and named.

Lines the detector flags that no rule, taxonomy template or confident model
answer places go here, never to ``normal``. Their templates are clustered by
the words they share (Jaccard similarity of their constant words at least
``min_similarity``, 0.5, against the cluster's largest template; largest
templates first, so the result does not depend on input order). Each cluster
becomes a category ``<domain>/discovered/<name>``: the name is made of the
first words of its largest template, the domain (hardware, infra, software,
user) is guessed by a model trained on the taxonomy's own examples, with its
probability as confidence. :meth:`DiscoveredCategory.taxonomy_entry` writes
one in the taxonomy file format, so a site can review, rename and keep it
(``ucp logs analyze --taxonomy-out FILE``).

Example::

    found = discover_categories([FlaggedTemplate(7, "data TLB error interrupt", 41, ("R02-M1",), ("...",))],
                                domain_of=lambda text: ("hardware", 0.81))
    found[0].path   # 'hardware/discovered/data-tlb-error-interrupt'
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from reliability.logs.detect import failure_phrase

MAX_EXAMPLES = 5
MAX_NODES = 20
_WORD = re.compile(r"[A-Za-z][A-Za-z_-]*[A-Za-z]|[A-Za-z]")
_STOP = frozenset("a an the of on in at to for from by with and or is are was were be been has have had this "
                  "that it its as".split())


@dataclass(frozen=True)
class FlaggedTemplate:
    """A template whose lines were flagged as failures but fit no known category."""

    template_id: int
    text: str
    lines: int
    nodes: tuple[str, ...]
    examples: tuple[str, ...]


@dataclass(frozen=True)
class DiscoveredCategory:
    """A mined category: its path, readable name, domain guess, and what it covers."""

    path: str
    name: str
    domain: str
    domain_confidence: float
    templates: tuple[str, ...]
    template_ids: tuple[int, ...]
    lines: int
    nodes: tuple[str, ...]
    examples: tuple[str, ...]

    def to_dict(self) -> dict:
        return {"path": self.path, "name": self.name, "domain": self.domain,
                "domain_confidence": self.domain_confidence, "templates": list(self.templates),
                "template_ids": list(self.template_ids), "lines": self.lines, "nodes": list(self.nodes),
                "examples": list(self.examples)}

    def taxonomy_entry(self) -> dict:
        """This category as an entry of a taxonomy file (docs/LOGS.md), ready to review and merge."""
        return {"description": f"Discovered from the logs: {self.name} ({self.lines} lines on "
                               f"{len(self.nodes)} nodes; domain guessed {self.domain} with confidence "
                               f"{self.domain_confidence:.2f}). Review, rename and keep.",
                "patterns": [], "templates": list(self.templates), "examples": list(self.examples),
                "symptom": False, "fatal": True}


def words(text: str) -> list[str]:
    """The constant words of a template, lower case, without stop words or values.

    >>> words("ciod: Error reading message prefix on CioStream socket to <*>, Link has been severed")
    ['ciod', 'error', 'reading', 'message', 'prefix', 'cio', 'stream', 'socket', 'link', 'severed']
    """
    out = []
    for token in text.split():
        if "<*>" in token:
            continue
        for word in _WORD.findall(token):
            # camelCase parts are words too: "CioStream" -> "cio", "stream"
            for part in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])", word) or [word]:
                part = part.lower()
                if part not in _STOP and len(part) > 1:
                    out.append(part)
    return out


def slug(text: str, *, max_words: int = 5) -> str:
    """A readable, path-safe name from a template's first words.

    >>> slug("data TLB error interrupt (dear=<*>)")
    'data-tlb-error-interrupt'
    """
    picked = words(text)[:max_words]
    return "-".join(picked) or "unnamed"


def _jaccard(a: frozenset, b: frozenset) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def discover_categories(flagged: Iterable[FlaggedTemplate], *, domain_of: Callable[[str], tuple[str, float]],
                        min_similarity: float = 0.5, taken: Iterable[str] = ()) -> list[DiscoveredCategory]:
    """Cluster ``flagged`` templates into named categories (see the module docstring)."""
    ordered = sorted(flagged, key=lambda t: (-t.lines, t.template_id))
    clusters: list[tuple[frozenset, list[FlaggedTemplate]]] = []
    for template in ordered:
        bag = frozenset(words(template.text))
        for head, members in clusters:
            if _jaccard(head, bag) >= min_similarity:
                members.append(template)
                break
        else:
            clusters.append((bag, [template]))
    used = set(taken)
    found = []
    for _, members in clusters:
        lead = members[0]
        domain, confidence = domain_of(" ".join(t.examples[0] if t.examples else t.text for t in members[:3]))
        # Named after what went wrong: the words around the first failure word, else the first words.
        phrase = failure_phrase(lead.text) or lead.text
        name = slug(phrase)
        path = f"{domain}/discovered/{name}"
        n = 2
        while path in used:
            path = f"{domain}/discovered/{name}-{n}"
            n += 1
        used.add(path)
        nodes = sorted({node for t in members for node in t.nodes})
        examples = []
        for t in members:
            for ex in t.examples:
                if ex not in examples and len(examples) < MAX_EXAMPLES:
                    examples.append(ex)
        found.append(DiscoveredCategory(
            path=path, name=" ".join(words(phrase)[:8]) or lead.text[:60], domain=domain,
            domain_confidence=round(float(confidence), 4), templates=tuple(t.text for t in members),
            template_ids=tuple(t.template_id for t in members), lines=sum(t.lines for t in members),
            nodes=tuple(nodes[:MAX_NODES]), examples=tuple(examples)))
    return found


def write_taxonomy(categories: Iterable[DiscoveredCategory], path: str) -> None:
    """Write discovered categories as a taxonomy file (``--taxonomy-out``), loadable with ``--taxonomy``."""
    import json

    data = {"version": 1, "categories": {c.path: c.taxonomy_entry() for c in categories}}
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1)
        handle.write("\n")
