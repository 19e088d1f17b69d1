"""The rules a state tree in a manifest must follow (docs/FORMAT.md, section 5), checked without recursion.

A state tree is JSON with a few tagged objects (``{"$tensor": key}``,
``{"$tuple": [...]}``, ...) that :func:`ucp.state.unflatten_state` rebuilds into
Python values. Checking every tree when the manifest is read (and before one is
written) finds a malformed tag or a tree nested too deep before any tensor is
read, for ``ucp.load``, ``ucp inspect`` and ``ucp verify`` alike, in the words the
loader uses (``where`` starts them)::

    >>> check_state_tree({"step": 3, "t": {"$tensor": "w"}}, where="state tree of ckpt")
    >>> check_state_tree({"x": {"$tuple": 5}}, where="state tree of ckpt")
    Traceback (most recent call last):
    ...
    ucp.errors.ManifestError: state tree of ckpt: bad $tuple at 'x': expected a list

The body of ``$object`` is only checked to be a string here: whether it is a
pickle the restricted unpickler accepts is for a load with ``allow_objects``.
"""

from __future__ import annotations

from typing import Any, Iterable

from ucp.errors import ManifestError

# The depth ucp.state's save and load allow (far beyond any real training state, far enough below
# Python's recursion limit that the loader's recursive rebuild never reaches it; a hostile manifest
# of 900 nested lists would otherwise end in a RecursionError): one limit for all.
MAX_DEPTH = 256
MAX_STATE_DEPTH = MAX_DEPTH

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
        below: list = []
        for node in level:
            if type(node) is list:
                children: Iterable[Any] = node
            elif len(node) == 1 and isinstance(tag := next(iter(node)), str) and tag.startswith("$"):
                body = node[tag]
                if _TAG_BODIES.get(tag) is not type(body) or not _plain_tag_body(tag, body):
                    _raise_first_problem(tree, where)
                children = body if tag == "$tuple" else [i[1] for i in body] if tag == "$dict" else ()
            else:
                children = node.values()
            if depth == MAX_STATE_DEPTH and children:  # a value one level too deep, of any type
                _raise_first_problem(tree, where)
            below.extend(value for value in children if type(value) in _CONTAINERS)
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
                f"{where}: nested deeper than {MAX_STATE_DEPTH} levels at {_show(trail)}; "
                "flatten that part of the state"
            )
        if isinstance(node, list):
            items: Iterable[tuple[Any, Any]] = enumerate(node)
        elif isinstance(node, dict):
            tag = next(iter(node)) if len(node) == 1 else None
            if isinstance(tag, str) and tag.startswith("$"):
                items = _tag_children(tag, node[tag], trail, where)
            else:
                items = node.items()
        else:
            continue
        stack.extend((value, depth + 1, (key, trail)) for key, value in items)
    raise AssertionError("check_state_tree found a problem that the second walk did not")  # an internal invariant


def _tag_children(tag: str, body: Any, trail: Any, where: str) -> list[tuple[Any, Any]]:
    at = f"at {_show(trail)}"
    wanted: Any = _TAG_BODIES.get(tag)  # a type or a tuple of types
    if wanted is None:
        raise ManifestError(f"{where}: unknown tag {_short(tag)} {at} (a newer format?)")
    if tag == "$float" and body not in _NON_FINITE:
        raise ManifestError(f'{where}: bad {_short({tag: body})} {at}: expected "nan", "inf" or "-inf"')
    if tag == "$dict" and not (
        isinstance(body, list)
        and all(isinstance(item, list) and len(item) == 2 and isinstance(item[0], _KEY_TYPES) for item in body)
    ):
        raise ManifestError(f"{where}: bad $dict {at}: expected a list of [key, value] pairs")
    if not isinstance(body, wanted):
        expected = {
            "$tensor": "expected a tensor key (a string)",
            "$tuple": "expected a list",
            "$object": "not base64 of a pickle",
        }[tag]
        raise ManifestError(f"{where}: bad {tag} {at}: {expected}")
    if tag == "$tuple":
        return list(enumerate(body))
    if tag == "$dict":
        return [(item[0], item[1]) for item in body]
    return []


def _show(trail: Any) -> str:
    """The ``/``-joined path of a place, quoted (cut at 60 characters; ``<root>`` for the root)."""
    parts = []
    while trail is not None:
        key, trail = trail
        parts.append(str(key)[:60])
    text = "/".join(reversed(parts)) or "<root>"
    return repr(text if len(text) <= 60 else text[:60] + "...")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
