"""`load(name_or_path) -> HwDesc`: read, merge, type-check and cross-check a description.

All errors become one `HwDescError` that names the file, the line and the key path of the first
problem and lists the others, so a user fixing a variant sees everything that is wrong at once.
"""

from __future__ import annotations

import typing
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from .checks import check
from .errors import HwDescError, LocatedError
from .model import HwDesc
from .source import Document, KeyPath, builtin_names, key_path_text, read_document, resolve_name


def load(name_or_path: str | Path) -> HwDesc:
    """Load a built-in description by name (`mncore2`, `mini`, ...) or any YAML file by path."""
    path = resolve_name(name_or_path)
    return _load_cached(path, path.stat().st_mtime_ns, _chain_mtimes(path))


def names() -> list[str]:
    """The built-in description names."""
    return builtin_names()


def from_document(doc: Document) -> HwDesc:
    """Type-check and cross-check an already read Document."""
    try:
        hw = HwDesc.model_validate(doc.data)
    except ValidationError as e:
        raise_problems(validation_problems(e, HwDesc), doc)
    hw.attach_document(doc)
    problems = check(hw)
    if problems:
        raise_problems(problems, doc)
    return hw


@lru_cache(maxsize=64)
def _load_cached(path: Path, mtime: int, chain_mtimes: tuple[int, ...]) -> HwDesc:
    return from_document(read_document(path))


def _chain_mtimes(path: Path) -> tuple[int, ...]:
    """Modification times of the built-in files, so an edited base reloads its variants."""
    return tuple(p.stat().st_mtime_ns for p in sorted(path.parent.glob("*.yaml")))


def raise_problems(problems: list[tuple[KeyPath, str]], doc: Document,
                   error: type[LocatedError] = HwDescError) -> typing.NoReturn:
    """Raise `error` for the first problem at its file:line, listing all of them."""
    texts = []
    for path, message in problems:
        loc = doc.location_of(path)
        texts.append(f"{loc}: {key_path_text(path)}: {message}" if loc else f"{key_path_text(path)}: {message}")
    path, message = problems[0]
    loc = doc.location_of(path)
    raise error(message, file=loc.file if loc else None, line=loc.line if loc else None,
                key_path=key_path_text(path), problems=texts)


def validation_problems(e: ValidationError, root: type[BaseModel]) -> list[tuple[KeyPath, str]]:
    """pydantic's errors against schema `root` as (key path, message a YAML author reads)."""
    return [_describe(err, root) for err in e.errors(include_url=False)]


def _describe(err: Any, root: type[BaseModel]) -> tuple[KeyPath, str]:
    loc = tuple(part for part in err["loc"] if not (isinstance(part, str) and "[" in part))
    kind = err["type"]
    if kind == "missing":
        expected = _field_doc(loc, root)
        return loc, f"missing key {loc[-1]!r}" + (f" ({expected})" if expected else "")
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1], root)
        return loc, f"unknown key {loc[-1]!r}; expected one of: {', '.join(allowed)}"
    if kind == "value_error":  # a validator's own sentence
        return loc, err["msg"].removeprefix("Value error, ")
    got = err.get("input")
    return loc, f"{err['msg'].replace('Input should be', 'expected')}, got {got!r}"


def _model_at(loc: KeyPath, root: type[BaseModel]) -> Any:
    """The schema type found by following a key path from `root`."""
    current: Any = root
    for part in loc:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return None
            current = field.annotation
        elif typing.get_origin(current) is dict:
            current = typing.get_args(current)[1]
        else:
            return None
    return _unwrap(current)


def _unwrap(t: Any) -> Any:
    while True:
        origin = typing.get_origin(t)
        if origin is typing.Annotated:
            t = typing.get_args(t)[0]
        elif origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
            args = [a for a in typing.get_args(t) if a is not type(None)]
            t = args[0] if len(args) == 1 else t
            if len(args) != 1:
                return t
        else:
            return t


def _allowed_keys(loc: KeyPath, root: type[BaseModel]) -> list[str]:
    model = _model_at(loc, root)
    if isinstance(model, type) and issubclass(model, BaseModel):
        return list(model.model_fields)
    return []


def _field_doc(loc: KeyPath, root: type[BaseModel]) -> str:
    parent = _model_at(loc[:-1], root)
    if isinstance(parent, type) and issubclass(parent, BaseModel):
        field = parent.model_fields.get(str(loc[-1]))
        if field is not None and field.description:
            return field.description
    return ""
