"""The failure taxonomy: a data file of categories, rules and labeled examples.

``ucp/reliability/data/taxonomy.json`` maps regex patterns and drain3-style
templates to category paths (``domain/category/subcategory``) and carries the
labeled examples the fallback classifier learns from. A user file given with
``--taxonomy`` is merged on top: its rules are tried first (so it can
override), its examples are added, and new categories are created. The file
format is documented in docs/LOGS.md.

Example::

    taxonomy = load_taxonomy(extra="site-taxonomy.json")
    taxonomy.match_rule("NVRM: Xid (PCI:0000:3b:00): 79, pid=7, GPU has fallen off the bus.")
    # -> "hardware/gpu/xid-79"
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from functools import cached_property
from importlib import resources

from ucp.reliability.logs.errors import TaxonomyError
from ucp.reliability.logs.prefilter import RuleSet

NORMAL = "normal"
UNCLASSIFIED = "unclassified"
DEFAULT_ROOT_CAUSE_ORDER = ("hardware", "infra", "user", "software")


@dataclass(frozen=True)
class Category:
    """One taxonomy entry; ``symptom`` marks a follower in cascades (e.g. NCCL timeouts)."""

    path: str
    description: str
    patterns: tuple[str, ...]
    templates: tuple[str, ...]
    examples: tuple[str, ...]
    symptom: bool = False
    fatal: bool = True

    @property
    def domain(self) -> str:
        return self.path.split("/", 1)[0]


@dataclass(frozen=True)
class Taxonomy:
    """Categories in rule order plus settings; build it with :func:`load_taxonomy`."""

    categories: tuple[Category, ...]
    confidence_threshold: float
    root_cause_order: tuple[str, ...]
    rules: tuple[tuple[re.Pattern, str], ...]
    template_rules: tuple[tuple[re.Pattern, str], ...]

    @cached_property
    def _by_path(self) -> dict[str, Category]:
        return {c.path: c for c in self.categories}

    def category(self, path: str) -> Category | None:
        return self._by_path.get(path)

    @cached_property
    def _rule_set(self) -> RuleSet:
        return RuleSet.of(self.rules)

    @cached_property
    def _template_set(self) -> RuleSet:
        return RuleSet.of(self.template_rules)

    def match_rule(self, message: str) -> str | None:
        """The category of the first regex pattern that matches the raw message."""
        return self._rule_set.first(message)

    def match_template(self, masked: str) -> str | None:
        """The category of the first taxonomy template that matches the masked message."""
        return self._template_set.first(masked)

    def is_symptom(self, path: str) -> bool:
        cat = self.category(path)
        return bool(cat and cat.symptom)

    def is_fatal(self, path: str) -> bool:
        """Whether an incident rooted in ``path`` counts as a failure for MTTF (default yes)."""
        cat = self.category(path)
        return cat.fatal if cat is not None else True

    def root_rank(self, path: str) -> int:
        """Lower ranks win root cause: hardware before infra before user before software."""
        domain = path.split("/", 1)[0]
        order = self.root_cause_order
        return order.index(domain) if domain in order else len(order)

    def labeled_examples(self) -> list[tuple[str, str]]:
        return [(ex, c.path) for c in self.categories for ex in c.examples]


def _template_regex(template: str) -> str:
    parts = [re.escape(p) for p in template.split("<*>")]
    return ".*?".join(parts)


def _read_json(text: str, origin: str) -> dict:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise TaxonomyError(f"{origin}:{err.lineno}:{err.colno}: not valid JSON: {err.msg}") from err
    except RecursionError as err:
        raise TaxonomyError(f"{origin}: JSON nested too deeply to be a taxonomy (docs/LOGS.md)") from err
    if not isinstance(data, dict) or not isinstance(data.get("categories"), dict):
        raise TaxonomyError(f"{origin}: expected an object with a \"categories\" object (see docs/LOGS.md)")
    return data


def _check_entry(path: str, entry: object, origin: str) -> dict:
    if not re.fullmatch(r"[a-z0-9_.-]+(?:/[a-z0-9_.-]+){0,2}", path):
        raise TaxonomyError(f"{origin}: category {path!r}: expected domain/category/subcategory "
                            "in lower case, e.g. 'hardware/gpu/xid-79'")
    if not isinstance(entry, dict):
        raise TaxonomyError(f"{origin}: category {path!r}: expected an object")
    for key in ("patterns", "templates", "examples"):
        value = entry.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise TaxonomyError(f"{origin}: category {path!r}: {key!r} must be a list of strings")
    for pattern in entry.get("patterns", []):
        try:
            re.compile(pattern)
        except re.error as err:
            raise TaxonomyError(f"{origin}: category {path!r}: bad pattern {pattern!r}: {err}") from err
    for key in ("symptom", "fatal"):
        # bool("false") is True: a quoted flag would silently mean the opposite
        if key in entry and not isinstance(entry[key], bool):
            raise TaxonomyError(f"{origin}: category {path!r}: {key!r} must be true or false, "
                                f"got {entry[key]!r}")
    return entry


def load_taxonomy(*, extra: str | None = None, base: str | None = None) -> Taxonomy:
    """The built-in taxonomy (or ``base``), with the JSON file ``extra`` merged on top."""
    if base is None:
        text = resources.files("ucp.reliability").joinpath("data/taxonomy.json").read_text("utf-8")
        origin = "ucp/reliability/data/taxonomy.json"
    else:
        text, origin = _read_file(base), base
    data = _read_json(text, origin)
    merged: dict[str, dict] = {p: _check_entry(p, e, origin) for p, e in data["categories"].items()}
    settings = dict(data.get("settings", {}))
    user_first: list[str] = []
    if extra is not None:
        user = _read_json(_read_file(extra), extra)
        settings.update(user.get("settings", {}))
        for path, entry in user["categories"].items():
            entry = _check_entry(path, entry, extra)
            user_first.append(path)
            old = merged.get(path, {})
            merged[path] = {
                "description": entry.get("description", old.get("description", "")),
                "patterns": entry.get("patterns", []) + old.get("patterns", []),
                "templates": entry.get("templates", []) + old.get("templates", []),
                "examples": old.get("examples", []) + entry.get("examples", []),
                "symptom": entry.get("symptom", old.get("symptom", False)),
                "fatal": entry.get("fatal", old.get("fatal", True)),
            }
    categories = tuple(
        Category(path=p, description=e.get("description", ""), patterns=tuple(e.get("patterns", [])),
                 templates=tuple(e.get("templates", [])), examples=tuple(e.get("examples", [])),
                 symptom=bool(e.get("symptom", False)), fatal=bool(e.get("fatal", True)))
        for p, e in merged.items()
    )
    ordered = [c for p in user_first for c in categories if c.path == p] + \
              [c for c in categories if c.path not in user_first]
    threshold = settings.get("confidence_threshold", 0.6)
    if not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
        raise TaxonomyError(f"{origin}: settings.confidence_threshold must be a number in [0, 1], "
                            f"got {threshold!r}")
    order = settings.get("root_cause_order", DEFAULT_ROOT_CAUSE_ORDER)
    if not isinstance(order, (list, tuple)) or not all(isinstance(o, str) for o in order):
        raise TaxonomyError(f"{origin}: settings.root_cause_order must be a list of category "
                            f"prefixes, got {order!r}")
    return Taxonomy(
        categories=categories,
        confidence_threshold=float(threshold),
        root_cause_order=tuple(order),
        rules=tuple((re.compile(p), c.path) for c in ordered for p in c.patterns),
        template_rules=tuple((re.compile(_template_regex(t)), c.path) for c in ordered for t in c.templates),
    )


MAX_TAXONOMY_BYTES = 64 << 20


def _read_file(path: str) -> str:
    if os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path):
        # a FIFO or device would block or never end
        raise TaxonomyError(f"taxonomy file {path!r} is not a regular file; give a JSON file (docs/LOGS.md)")
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_TAXONOMY_BYTES + 1)
    except FileNotFoundError as err:
        raise TaxonomyError(f"taxonomy file {path!r} does not exist") from err
    except IsADirectoryError as err:
        raise TaxonomyError(f"taxonomy file {path!r} is a directory; give a JSON file (docs/LOGS.md)") from err
    except OSError as err:
        raise TaxonomyError(f"cannot read taxonomy file {path!r}: {err.strerror or err}") from err
    if len(raw) > MAX_TAXONOMY_BYTES:
        raise TaxonomyError(f"taxonomy file {path!r} is larger than {MAX_TAXONOMY_BYTES >> 20} MiB; "
                            "a taxonomy is a small JSON file (docs/LOGS.md)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise TaxonomyError(f"taxonomy file {path!r} is not UTF-8 text (binary data at byte {err.start}); "
                            "a taxonomy is a JSON file (docs/LOGS.md)") from err
