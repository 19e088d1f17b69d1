"""The UCL program a checkpoint was saved with, as plain data: what a manifest records.

Both the language (:mod:`ucp.ucl`, which makes and reads records) and the manifest (which keeps
one) need it, so it sits in the bottom layer beside the layout and the fragment-map types
(docs/ARCHITECTURE.md); how save and load apply a record is :mod:`ucp.programs`.

    >>> rec = ProgramRecord(text="ucl 1\\n", params={"heads": 4}, name="m.ucl")
    >>> ProgramRecord.from_dict(rec.to_dict()) == rec
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ucp.errors import ManifestError


@dataclass(frozen=True)
class ProgramRecord:
    """The UCL program a checkpoint was saved with, as plain data.

    ``text`` is the program's full source; ``params`` the values it was given (JSON: integers,
    words, lists of those); ``name`` its file name for messages; ``preset`` the shipped preset it
    came from, if any. Manifests written before this record held a plain string (UCL text or a
    preset reference such as ``megatron-gpt:heads=8``): :meth:`from_dict` reads that into ``text``.
    """

    text: str
    params: dict = field(default_factory=dict)
    name: str = "<ucl>"
    preset: str | None = None

    def to_dict(self) -> dict:
        return {"text": self.text, "params": dict(self.params), "name": self.name, "preset": self.preset}

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "manifest.json") -> "ProgramRecord":
        """The record in ``data`` (a dict, or an older manifest's plain string); ManifestError names the field."""
        if isinstance(data, str):
            return cls(text=data, name="<manifest>")
        if not isinstance(data, dict):
            raise ManifestError(
                f"{source}: program must be an object with the program's text, got {type(data).__name__}"
            )
        unknown = sorted(set(map(str, data)) - {"text", "params", "name", "preset"})
        if unknown:
            raise ManifestError(f"{source}: program has unknown field(s) {unknown}")
        text, params, name, preset = (
            data.get("text"),
            data.get("params", {}),
            data.get("name", "<ucl>"),
            data.get("preset"),
        )
        if not isinstance(text, str):
            raise ManifestError(f"{source}: program.text must be the program's source text, got {type(text).__name__}")
        if not isinstance(name, str) or not (preset is None or isinstance(preset, str)):
            raise ManifestError(f"{source}: program.name and program.preset must be strings")
        if not isinstance(params, dict) or not all(_json_param(v) for v in params.values()):
            raise ManifestError(f"{source}: program.params must map names to integers, words or lists of those")
        return cls(text=text, params=dict(params), name=name, preset=preset)


def _json_param(value: Any) -> bool:
    scalar = (int, str)
    if isinstance(value, list):
        return all(isinstance(v, scalar) and not isinstance(v, bool) for v in value)
    return isinstance(value, scalar) and not isinstance(value, bool)
