"""Persisted templates: a versioned JSON file of template ids, texts and counts (``--state FILE``).

A run that is given a state file matches its lines against the templates in
it first, so a template keeps its id from run to run; new templates get new
ids and the file is rewritten atomically at the end. The format is plain JSON
read with :func:`json.loads` and checked field by field: nothing in it can
name a class or run code (drain3's own state is jsonpickle, which can; such a
file is refused with a clear error, never loaded).

Example::

    state = TemplateSet.load("templates.json")       # an empty set if the file does not exist
    tid = state.match(("session", "opened", "for", "user", "alice"))
    state.save("templates.json")

The file::

    {"format": "ucp-log-templates", "version": 1, "next_id": 3,
     "templates": [{"id": 1, "template": "session opened for user <*>", "count": 122},
                   {"id": 2, "template": "Invalid user <*> from <*>", "count": 113}]}
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from ucp.file_io import write_atomic
from ucp.reliability.logs.errors import TemplateStateError
from ucp.reliability.logs.masking import PARAM

STATE_FORMAT = "ucp-log-templates"
STATE_VERSION = 1
MAX_STATE_BYTES = 1 << 30  # a state of a billion bytes is not one we wrote


@dataclass(frozen=True)
class Template:
    """One template: its stable id, its tokens (``<*>`` for values) and how many lines it has covered."""

    id: int
    tokens: tuple[str, ...]
    count: int

    @property
    def text(self) -> str:
        return " ".join(self.tokens)

    def matches(self, tokens: tuple[str, ...]) -> bool:
        """Whether a line's template tokens are an instance of this template."""
        return len(tokens) == len(self.tokens) and all(
            t == PARAM or t == u for t, u in zip(self.tokens, tokens))


class TemplateSet:
    """Templates by id, with lookup of the template a line's tokens are an instance of.

    Mutable on purpose: a run adds its new templates and counts, then saves.
    """

    def __init__(self, templates: tuple[Template, ...] = (), *, next_id: int = 1):
        self._by_id: dict[int, Template] = {t.id: t for t in templates}
        self._by_length: dict[int, list[Template]] = {}
        for t in sorted(templates, key=lambda t: t.id):
            self._by_length.setdefault(len(t.tokens), []).append(t)
        self.next_id = max([next_id, *(t.id + 1 for t in templates)])

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self):
        return iter(sorted(self._by_id.values(), key=lambda t: t.id))

    def get(self, template_id: int) -> Template | None:
        return self._by_id.get(template_id)

    def match(self, tokens: tuple[str, ...]) -> int | None:
        """The id of the oldest known template ``tokens`` is an instance of, or None."""
        for template in self._by_length.get(len(tokens), ()):
            if template.matches(tokens):
                return template.id
        return None

    def add(self, tokens: tuple[str, ...], count: int) -> int:
        """Register a new template; returns its id (the next free one)."""
        template = Template(id=self.next_id, tokens=tuple(tokens), count=count)
        self.next_id += 1
        self._by_id[template.id] = template
        self._by_length.setdefault(len(template.tokens), []).append(template)
        return template.id

    def count(self, template_id: int, lines: int) -> None:
        """Add ``lines`` to a template's count."""
        old = self._by_id[template_id]
        new = Template(id=old.id, tokens=old.tokens, count=old.count + lines)
        self._by_id[template_id] = new
        bucket = self._by_length[len(old.tokens)]
        bucket[bucket.index(old)] = new

    # -- the file ------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"format": STATE_FORMAT, "version": STATE_VERSION, "next_id": self.next_id,
                "templates": [{"id": t.id, "template": t.text, "count": t.count} for t in self]}

    @classmethod
    def from_dict(cls, data: object, *, origin: str = "template state") -> "TemplateSet":
        """Check every field of a parsed state file; raise :class:`TemplateStateError` naming the problem."""
        def bad(what: str) -> TemplateStateError:
            return TemplateStateError(f"{origin}: {what}; delete it to start afresh")

        if isinstance(data, (dict, list)) and _names_python_objects(data):
            raise bad("is a jsonpickle document (e.g. a drain3 state): it can run code when loaded, "
                      f"so it is never loaded; only {STATE_FORMAT!r} JSON files are read")
        if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
            raise bad(f"not a template state (expected a JSON object with \"format\": \"{STATE_FORMAT}\")")
        if data.get("version") != STATE_VERSION:
            raise bad(f"unsupported version {data.get('version')!r} (this version reads {STATE_VERSION})")
        entries, next_id = data.get("templates"), data.get("next_id", 1)
        if not isinstance(entries, list):
            raise bad("\"templates\" must be a list")
        if not _is_int(next_id) or next_id < 1:
            raise bad(f"\"next_id\" must be a positive integer, got {next_id!r}")
        templates, seen = [], set()
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                raise bad(f"templates[{i}] must be an object")
            tid, text, count = entry.get("id"), entry.get("template"), entry.get("count", 0)
            if not _is_int(tid) or tid < 1 or tid in seen:
                raise bad(f"templates[{i}].id must be a unique positive integer, got {tid!r}")
            if not isinstance(text, str):
                raise bad(f"templates[{i}].template must be a string")
            if not _is_int(count) or count < 0:
                raise bad(f"templates[{i}].count must be a non-negative integer, got {count!r}")
            seen.add(tid)
            templates.append(Template(id=tid, tokens=tuple(text.split()), count=count))
        return cls(tuple(templates), next_id=next_id)

    @classmethod
    def load(cls, path: str) -> "TemplateSet":
        """The state in ``path``; an empty set when the file does not exist yet."""
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            return cls()
        if not os.path.isfile(path):
            raise TemplateStateError(f"template state {path!r} is not a regular file")
        if size > MAX_STATE_BYTES:
            raise TemplateStateError(f"template state {path!r} is {size:,} bytes, more than any state "
                                     "this tool writes; delete it to start afresh")
        with open(path, "rb") as handle:
            raw = handle.read(MAX_STATE_BYTES + 1)
        try:
            data = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as err:
            raise TemplateStateError(f"template state {path!r} is not UTF-8 JSON (binary data at byte "
                                     f"{err.start}); delete it to start afresh") from err
        except (json.JSONDecodeError, RecursionError) as err:
            raise TemplateStateError(f"template state {path!r} is not valid JSON ({err}); "
                                     "delete it to start afresh") from err
        return cls.from_dict(data, origin=f"template state {path!r}")

    def save(self, path: str) -> None:
        """Write the state to ``path`` atomically (:func:`ucp.file_io.write_atomic`)."""
        write_atomic(path, json.dumps(self.to_dict(), indent=0).encode("utf-8"))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _names_python_objects(data, depth: int = 0) -> bool:
    # jsonpickle tags ("py/object", "py/reduce", "py/type", ...) anywhere near the top.
    if depth > 6:
        return False
    if isinstance(data, dict):
        return any(isinstance(k, str) and k.startswith("py/") for k in data) or any(
            _names_python_objects(v, depth + 1) for v in list(data.values())[:64])
    if isinstance(data, list):
        return any(_names_python_objects(v, depth + 1) for v in data[:64])
    return False
