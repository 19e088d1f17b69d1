"""The rules a state tree in a manifest must follow (docs/FORMAT.md, section 5), checked without recursion.

A state tree is JSON with a few tagged objects (``{"$tensor": key}``,
``{"$tuple": [...]}``, ...). The loader rebuilds Python values from it
recursively, so a tree that nests deeper than :data:`MAX_STATE_DEPTH`, or a
tag whose body has the wrong type, would fail deep inside a load. Checking the
tree when the manifest is read (and before it is written) turns both into a
:class:`~ucp.errors.ManifestError` that names the place::

    >>> check_state_tree({"step": 3, "t": {"$tensor": "w"}}, where="states[0]")
    >>> check_state_tree({"x": {"$tuple": 5}}, where="states[0]")
    Traceback (most recent call last):
    ...
    ucp.errors.ManifestError: states[0] at 'x': tag $tuple needs a list, got int
"""

from __future__ import annotations

from typing import Any

from ucp.errors import ManifestError

# Far beyond any real training state (optimizer states nest ~5 levels), and far enough
# below Python's recursion limit that the loader's recursive rebuild never reaches it.
MAX_STATE_DEPTH = 100

# Tag -> the JSON type its body must have.
_TAG_BODIES: dict[str, type] = {"$tensor": str, "$tuple": list, "$dict": list, "$float": str, "$object": str}
_NON_FINITE = ("nan", "inf", "-inf")
_KEY_TYPES = (str, int, float, bool, type(None))
_CONTAINERS = (list, dict)


def check_state_tree(tree: Any, *, where: str) -> None:
    """Raise :class:`ManifestError` unless ``tree`` is a state tree a loader can rebuild.

    Checks the tags (known, with a body of the right type) and the depth; ``where``
    starts each message (e.g. ``"manifest.json: states[3]"``). Linear in the size of
    the tree and without recursion: one level of containers at a time, and only when
    something is wrong a second walk that spells out where.
    """
    level, depth = ([tree] if type(tree) in _CONTAINERS else []), 0
    while level:
        if depth > MAX_STATE_DEPTH:
            _raise_first_problem(tree, where)
        below: list = []
        for node in level:
            if type(node) is list:
                below.extend(value for value in node if type(value) in _CONTAINERS)
                continue
            if len(node) == 1:
                tag = next(iter(node))
                if isinstance(tag, str) and tag.startswith("$"):
                    body = node[tag]
                    if _TAG_BODIES.get(tag) is not type(body) or not _plain_tag_body(tag, body):
                        _raise_first_problem(tree, where)
                    if tag in ("$tuple", "$dict"):
                        below.extend(v for v in (body if tag == "$tuple" else (i[1] for i in body))
                                     if type(v) in _CONTAINERS)
                    continue
            below.extend(value for value in node.values() if type(value) in _CONTAINERS)
        level, depth = below, depth + 1


def _plain_tag_body(tag: str, body: Any) -> bool:
    """The checks of a tag body beyond its type (see _tag_children)."""
    if tag == "$float":
        return body in _NON_FINITE
    if tag == "$dict":
        return all(type(i) is list and len(i) == 2 and isinstance(i[0], _KEY_TYPES) for i in body)
    return True


def _raise_first_problem(tree: Any, where: str) -> None:
    """Walk the tree again, depth first, keeping each node's place, and raise for the first problem found."""
    stack: list[tuple[Any, int, Any]] = [(tree, 0, None)]
    while stack:
        node, depth, trail = stack.pop()
        if depth > MAX_STATE_DEPTH:
            raise ManifestError(
                f"{where} at {_show(trail, limit=8)}: the state tree nests deeper than {MAX_STATE_DEPTH} levels; "
                "flatten that part of the state"
            )
        if isinstance(node, list):
            items = enumerate(node)
        elif isinstance(node, dict):
            tag = next(iter(node)) if len(node) == 1 else None
            plain = not (isinstance(tag, str) and tag.startswith("$"))
            items = node.items() if plain else _tag_children(tag, node[tag], trail, where)
        else:
            continue
        stack.extend((value, depth + 1, (key, trail)) for key, value in items if type(value) in _CONTAINERS)
    raise AssertionError("check_state_tree found a problem that the second walk did not")  # an internal invariant


def _tag_children(tag: str, body: Any, trail: Any, where: str) -> list[tuple[Any, Any]]:
    wanted = _TAG_BODIES.get(tag)
    if wanted is None:
        raise ManifestError(
            f"{where} at {_show(trail)}: unknown tag {tag[:40]!r} (known: {', '.join(_TAG_BODIES)}); "
            "the checkpoint was written by a newer ucp-middleware or is damaged"
        )
    if not isinstance(body, wanted):
        raise ManifestError(f"{where} at {_show(trail)}: tag {tag} needs a {wanted.__name__}, got {type(body).__name__}")
    if tag == "$float" and body not in _NON_FINITE:
        raise ManifestError(f"{where} at {_show(trail)}: tag $float must be one of {list(_NON_FINITE)}, got {body[:40]!r}")
    if tag == "$tuple":
        return list(enumerate(body))
    if tag == "$dict":
        for i, item in enumerate(body):
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], _KEY_TYPES)):
                raise ManifestError(
                    f"{where} at {_show((i, trail))}: each item of a $dict must be [key, value] with a "
                    "str, number, bool or null key"
                )
        return [(item[0], item[1]) for item in body]
    return []


def _show(trail: Any, *, limit: int | None = None) -> str:
    """The ``/``-joined path of a place (its first ``limit`` parts), quoted; ``<root>`` for the root."""
    parts = []
    while trail is not None:
        key, trail = trail
        parts.append(str(key)[:40])
    parts.reverse()
    if not parts:
        return "<root>"
    if limit is not None and len(parts) > limit:
        return repr("/".join(parts[:limit]) + "/...")
    return repr("/".join(parts))
