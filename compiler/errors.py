"""Errors of the compiler: layouts, unsupported ops, compile failures, spec mismatches."""

from __future__ import annotations

from hwdesc.errors import MnsimError


class LayoutError(MnsimError):
    """A layout string is malformed, or a layout does not fit a chip, a dtype or a memory.

    Parse errors carry `position` (0-based character offset) and `expected`; the message shows
    the text with a caret under the offending character.
    """

    def __init__(self, message: str, *, text: str | None = None, position: int | None = None,
                 expected: str | None = None) -> None:
        self.text = text
        self.position = position
        self.expected = expected
        if text is not None and position is not None:
            message = f"{message}\n  {text}\n  {' ' * position}^"
        super().__init__(message)
