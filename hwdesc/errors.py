"""The root of mnsim's exception hierarchy and the hardware-description errors.

Every package raises subclasses of `MnsimError` so that a user can catch one type, while each
concern (hardware description, layout, compile, spec mismatch, device memory, runtime) keeps a
class of its own. The base lives here because hwdesc is the one package every other imports.
"""

from __future__ import annotations


class MnsimError(Exception):
    """Base of every error mnsim raises on purpose; `mlsdk.MLSDKError` is this class.

    Each subclass also derives from the builtin that fits (ValueError for bad input,
    RuntimeError for a failed run, MemoryError for exhausted memory, OSError for files), so
    code written against the builtins keeps working."""


class ReadOnlyError(MnsimError, TypeError):
    """A loaded hardware description was written to; it is immutable (edit the YAML instead)."""


class LocatedError(MnsimError, ValueError):
    """A YAML input that could not be read or is not valid, located for the person editing it.

    The message always says where (file:line), which key (a dotted key path) and what was
    expected, so that a user editing a YAML file can go straight to the line.
    """

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 key_path: str | None = None, problems: list[str] | None = None) -> None:
        self.file = file
        self.line = line
        self.key_path = key_path
        self.problems = problems or [message]
        where = f"{file}:{line}: " if file and line else (f"{file}: " if file else "")
        key = f"{key_path}: " if key_path else ""
        text = f"{where}{key}{message}"
        if len(self.problems) > 1:
            text += "\n" + "\n".join(f"  also: {p}" for p in self.problems[1:])
        super().__init__(text)


class HwDescError(LocatedError):
    """A hardware description could not be read or is not a valid chip (file:line, key path)."""
