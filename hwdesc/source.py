"""Reading hardware-description YAML with line numbers, `extends` chains and sourced values.

Why a reader of our own around PyYAML: validation errors must name the file and line of the
offending key, a variant must be a short file that overrides a base (`extends:`), and every
hardware number carries its source and confidence (`{v: 750000000, conf: "2", src: "..."}`),
which the typed model should not have to see. This module turns a chain of files into one plain
tree plus two side tables: where each key was written, and the provenance of each value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import HwDescError

KeyPath = tuple[str | int, ...]

BUILTIN_DIR = Path(__file__).resolve().parent

CONFIDENCE_TAGS: dict[str, str] = {
    "S": "PFN primary source",
    "M": "MN-Core 2 Software Development Manual",
    "2": "secondary notes citing PFN primaries",
    "T": "third-party SDK documentation (libgpfn3)",
    "R": "PFN's educational graph compiler",
    "P": "PFN primary pages (MN-Core Challenge)",
    "V": "checked against PFN's test vectors",
    "D": "derived arithmetic",
    "assumed": "no public number; assumed with reasoning",
    "variant": "a deliberate change in a what-if description",
}
UNSOURCED = "unsourced"
SOURCED_KEYS = frozenset({"v", "conf", "src"})
# Keys whose values name or connect things rather than state hardware facts; they carry no source.
STRUCTURAL_KEYS = frozenset({"name", "summary", "doc", "extends", "level", "axis", "src", "dst",
                             "engine", "slot", "group_level", "unit", "acc", "memory"})


@dataclass(frozen=True)
class Location:
    """Where a key was written: a file and a 1-based line."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class Provenance:
    """Why a value is what it is: confidence tag, note, and where it was written."""

    conf: str
    src: str
    location: Location


@dataclass
class _Node:
    """A YAML value with the location of its key; mappings hold child nodes."""

    value: Any
    location: Location
    provenance: Provenance | None = None
    items: list["_Node"] = field(default_factory=list)  # a sequence's items, for their locations


@dataclass
class Document:
    """A fully resolved description: plain data and its side tables."""

    data: dict[str, Any]
    locations: dict[KeyPath, Location]
    provenance: dict[KeyPath, Provenance]
    files: tuple[str, ...] = field(default_factory=tuple)

    def location_of(self, path: KeyPath) -> Location | None:
        """The location of the longest prefix of `path` that was written somewhere."""
        for end in range(len(path), -1, -1):
            loc = self.locations.get(tuple(path[:end]))
            if loc is not None:
                return loc
        return None


def key_path_text(path: KeyPath) -> str:
    """`('levels', 'PE', 'count')` -> `levels.PE.count`; list indices as `[i]`."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def resolve_name(name_or_path: str | Path, *, relative_to: Path | None = None) -> Path:
    """Find the YAML file for a description name (`mini`) or a path (`chips/x.yaml`)."""
    text = str(name_or_path)
    looks_like_path = text.endswith((".yaml", ".yml")) or "/" in text or "\\" in text
    candidates: list[Path] = []
    if looks_like_path:
        p = Path(text)
        if not p.is_absolute() and relative_to is not None:
            candidates.append(relative_to / p)
        candidates.append(p)
    else:
        if relative_to is not None:
            candidates.append(relative_to / f"{text}.yaml")
        candidates.append(BUILTIN_DIR / f"{text}.yaml")
    for c in candidates:
        if c.is_file():
            return c.resolve()
    known = ", ".join(builtin_names())
    raise HwDescError(
        f"no hardware description named {text!r} (looked for {', '.join(str(c) for c in candidates)}); "
        f"built-in descriptions: {known}; or give a path to a .yaml file")


def builtin_names() -> list[str]:
    """Names of the descriptions shipped with mnsim, base chip first."""
    names = sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml"))
    return sorted(names, key=lambda n: (n != "mncore2", n))


def read_document(name_or_path: str | Path) -> Document:
    """Read a description and everything it extends into one resolved Document."""
    path = resolve_name(name_or_path)
    root = _read_chain(path, chain=())
    data: dict[str, Any] = _plain(root)
    locations: dict[KeyPath, Location] = {}
    provenance: dict[KeyPath, Provenance] = {}
    _collect(root, (), locations, provenance)
    files = tuple(sorted({loc.file for loc in locations.values()}))
    data.pop("extends", None)
    return Document(data=data, locations=locations, provenance=provenance, files=files)


def read_plain(path: str | Path) -> Document:
    """Any YAML mapping read with the location of every key (no `extends`): for the other files
    that name hardware keys, such as sweep specs, so that their errors name file:line too."""
    path = Path(path)
    if not path.is_file():
        raise HwDescError(f"no file {str(path)!r}")
    root = _parse_file(path)
    if not _is_mapping(root):
        raise HwDescError("expected a mapping of keys to values", file=str(path), line=root.location.line)
    locations: dict[KeyPath, Location] = {}
    _collect(root, (), locations, {})
    return Document(data=_plain(root), locations=locations, provenance={}, files=(str(path),))


def _read_chain(path: Path, chain: tuple[Path, ...]) -> _Node:
    if path in chain:
        cycle = " -> ".join(p.name for p in (*chain, path))
        raise HwDescError(f"circular extends: {cycle}", file=str(chain[-1]), key_path="extends")
    node = _parse_file(path)
    if not isinstance(node.value, dict):
        raise HwDescError("a hardware description is a mapping of keys to values",
                          file=str(path), line=node.location.line)
    extends = node.value.get("extends")
    if extends is None:
        return node
    if not isinstance(extends.value, str):
        raise HwDescError("expected the name or path of a description to extend",
                          file=str(path), line=extends.location.line, key_path="extends")
    try:
        base_path = resolve_name(extends.value, relative_to=path.parent)
    except HwDescError as e:
        raise HwDescError(str(e), file=str(path), line=extends.location.line, key_path="extends") from None
    base = _read_chain(base_path, (*chain, path))
    return _merge(base, node)


def _merge(base: _Node, over: _Node) -> _Node:
    """Deep-merge `over` onto `base`: mappings merge key by key, `null` deletes, the rest replaces."""
    merged = dict(base.value)
    for key, child in over.value.items():
        if key == "extends":
            continue
        if child.value is None:
            merged.pop(key, None)
        elif _is_mapping(child) and key in merged and _is_mapping(merged[key]):
            merged[key] = _merge(merged[key], child)
        else:
            merged[key] = child
    return _Node(merged, over.location)


# libyaml's parser when PyYAML has it (its wheels do): 8x faster on mncore2.yaml (6 against 48 ms),
# with the same nodes and marks. Its error messages say less ("found character that cannot start
# any token", not which), so a file it refuses is parsed again by PyYAML's own for the message.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _parse_file(path: Path) -> _Node:
    text = path.read_text(encoding="utf-8")
    loader = _LOADER(text)
    try:
        root = loader.get_single_node()
    except yaml.YAMLError:
        loader.dispose()
        loader = yaml.SafeLoader(text)
        try:
            loader.get_single_node()
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            line = mark.line + 1 if mark is not None else None
            problem = getattr(e, "problem", None) or str(e)
            raise HwDescError(f"not valid YAML: {problem}", file=str(path), line=line) from None
        raise  # (libyaml refused what PyYAML takes: not expected)
    finally:
        loader.dispose()
    if root is None:
        raise HwDescError("the file is empty; expected a mapping of keys to values", file=str(path), line=1)
    return _build(root, loader, str(path), (), Location(str(path), root.start_mark.line + 1))


def _build(node: yaml.Node, loader: yaml.BaseLoader, file: str, path: KeyPath, location: Location) -> _Node:
    if isinstance(node, yaml.MappingNode):
        children: dict[str, _Node] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            key_loc = Location(file, key_node.start_mark.line + 1)
            if not isinstance(key, str):
                raise HwDescError(f"keys must be names, got {key!r}", file=file, line=key_loc.line,
                                  key_path=key_path_text(path))
            if key in children:
                raise HwDescError(f"duplicate key {key!r} (first written on line {children[key].location.line})",
                                  file=file, line=key_loc.line, key_path=key_path_text((*path, key)))
            children[key] = _build(value_node, loader, file, (*path, key), key_loc)
        if children and set(children) <= SOURCED_KEYS | {"v"} and "v" in children:
            return _sourced(children, file, path, location)
        return _Node(children, location)
    value = loader.construct_object(node, deep=True)
    structural = bool(path) and path[-1] in STRUCTURAL_KEYS
    items = ([_build(item, loader, file, (*path, i), Location(file, item.start_mark.line + 1))
              for i, item in enumerate(node.value)] if isinstance(node, yaml.SequenceNode) else [])
    return _Node(value, location, None if structural else Provenance(UNSOURCED, "", location), items)


def _sourced(children: dict[str, _Node], file: str, path: KeyPath, location: Location) -> _Node:
    """`{v: ..., conf: ..., src: ...}` -> the bare value, with its provenance kept aside."""
    missing = SOURCED_KEYS - set(children)
    if missing:
        raise HwDescError(f"a sourced value is written {{v: value, conf: tag, src: note}}; missing {sorted(missing)}",
                          file=file, line=location.line, key_path=key_path_text(path))
    conf = children["conf"].value
    if conf not in CONFIDENCE_TAGS:
        raise HwDescError(f"unknown confidence tag {conf!r}; expected one of {', '.join(CONFIDENCE_TAGS)}",
                          file=file, line=children["conf"].location.line, key_path=key_path_text((*path, "conf")))
    src = children["src"].value
    if not isinstance(src, str) or not src.strip():
        raise HwDescError("the src note must be a non-empty string saying where the value comes from",
                          file=file, line=children["src"].location.line, key_path=key_path_text((*path, "src")))
    value = children["v"].value
    if isinstance(value, dict):
        raise HwDescError("a sourced value must be a scalar or a list, not a mapping",
                          file=file, line=children["v"].location.line, key_path=key_path_text((*path, "v")))
    return _Node(value, location, Provenance(str(conf), src, location))


def _is_mapping(node: _Node) -> bool:
    return isinstance(node.value, dict) and node.provenance is None


def _plain(node: _Node) -> Any:
    if _is_mapping(node):
        return {k: _plain(v) for k, v in node.value.items()}
    return node.value


def _collect(node: _Node, path: KeyPath, locations: dict[KeyPath, Location],
             provenance: dict[KeyPath, Provenance]) -> None:
    locations[path] = node.location
    if _is_mapping(node):
        for key, child in node.value.items():
            _collect(child, (*path, key), locations, provenance)
    elif node.provenance is not None:
        provenance[path] = node.provenance
    for i, item in enumerate(node.items):  # where each item is, not a value of its own to source
        _collect(item, (*path, i), locations, {})
