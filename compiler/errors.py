"""Errors of the compiler: layouts, unsupported ops, compile failures, spec mismatches."""

from __future__ import annotations

from hwdesc.errors import MnsimError


class LayoutError(MnsimError, ValueError):
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


class CompileError(MnsimError, ValueError):
    """A function cannot be compiled for the chip; says what and where (op, shapes, user source line)."""


class UnsupportedOpError(CompileError, NotImplementedError):
    """The traced function uses an op mnsim cannot lower; names the op, its shapes and the user's line."""

    def __init__(self, op: str, shapes: list, source: str, reason: str = "") -> None:
        self.op, self.shapes, self.source = op, shapes, source
        why = f": {reason}" if reason else ""
        super().__init__(f"unsupported op {op} with shapes {shapes}{why}\n  at {source or 'an unknown line'}")


class UnregisteredWriteError(CompileError):
    """The function writes captured tensors that are named but not registered (a BatchNorm's
    running statistics when only the parameters were registered); `tensors` lists them, so that
    a Context can register them and trace again."""

    def __init__(self, message: str, tensors: list) -> None:
        super().__init__(message)
        self.tensors = tensors


class SpecMismatchError(CompileError):
    """An io_spec_constraints entry does not fit the value it constrains (shape, dtype, name)."""


class ArtifactError(MnsimError, OSError):
    """A codegen_dir is missing, corrupt, edited, or was compiled for another chip or format;
    names the file."""
