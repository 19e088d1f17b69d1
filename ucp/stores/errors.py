"""The errors every store raises alike for damaged or missing checkpoint files (one wording for all)."""

from __future__ import annotations

from ucp.errors import IncompleteCheckpointError, TruncatedDataError

_RESTORE = "the file is damaged - restore it from a replica or load an older checkpoint"


def missing(what: str, where: str) -> IncompleteCheckpointError:
    return IncompleteCheckpointError(
        f"{what}: {where} is missing; the checkpoint is incomplete - load an older checkpoint"
    )


def wrong_size(what: str, where: str, found: object, expected: int) -> TruncatedDataError:
    return TruncatedDataError(
        f"{what}: {where} is shorter or longer than the manifest says ({found} bytes, expected {expected}); {_RESTORE}"
    )


def too_long(what: str, where: str, limit: int) -> TruncatedDataError:
    return TruncatedDataError(f"{what}: {where} is longer than the manifest says (more than {limit} bytes); {_RESTORE}")


def short_pack(what: str, where: str, start: int, stop: int, found: int) -> TruncatedDataError:
    return TruncatedDataError(
        f"{what}: {where} is shorter than the manifest says (bytes {start}..{stop} wanted, {found} found); {_RESTORE}"
    )


def tensorstore_error(err: ValueError, what: str, where: str) -> Exception:
    """A tensorstore read failure as the error a plain read of the same file would raise."""
    text = str(err)
    if text.startswith("NOT_FOUND"):
        return missing(what, where)
    return TruncatedDataError(
        f"{what}: {where} is shorter or longer than the manifest says ({text.split('[')[0].strip()}); {_RESTORE}"
    )
