"""UCL's errors: syntax errors that point at the offending token, and compile errors.

Both descend from :class:`ucp.errors.UcpError` and from the matching builtin::

    try:
        ucl.parse("ucl 1\\ntensor a -> b\\n  split dim x over tp\\n", filename="m.ucl")
    except ucl.UclSyntaxError as err:
        print(err)   # m.ucl:3:13: expected a dimension number after 'split dim', found 'x' + line + caret
"""

from __future__ import annotations

from ucp.errors import UcpError


class UclSyntaxError(UcpError, SyntaxError):
    """A UCL program does not parse. Carries file, line, column, the source line and a caret."""

    def __init__(self, message: str, *, filename: str, line: int, column: int, source_line: str):
        super().__init__(message)
        # SyntaxError's own attributes, so tools that know SyntaxError show the location too.
        self.msg = message
        self.filename = filename
        self.lineno = line
        self.offset = column
        self.text = source_line
        self.column = column

    def __str__(self) -> str:
        caret = " " * (self.column - 1) + "^"
        return f"{self.filename}:{self.lineno}:{self.column}: {self.msg}\n    {self.text}\n    {caret}"


class UclError(UcpError, ValueError):
    """A well-formed program cannot be applied: no rule for a tensor, shapes that do not fit, ...

    The message names the rule's ``file:line`` and the tensor.
    """


class UnboundNameError(UclError):
    """An expression reads a program parameter (or capture) that has no value here."""


class ProgramMismatchError(UclError):
    """The program given to a load disagrees with the one the checkpoint was saved with (a model parameter)."""


class DeclaredShapeError(UclError):
    """A tensor's logical shape contradicts the shape its rule declares (``shape [...]`` or ``size dim``)."""
