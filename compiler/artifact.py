"""`codegen_dir`: a compiled function on disk, reloadable in a new process.

    manifest.json   format version, chip name and fingerprint, the sha256 of every other file,
                    and a checksum of itself
    program.npz     instructions, relocations, labels; every constant's values and the
                    compile-time values of device-resident (registered) inputs
    specs.json      IOSpecs, buffer table, input/output symbols and shapes, output structure
    summary.json    ops, chosen locations and layouts, estimated cycles (also summary.txt)
    chip.yaml       the chip's resolved description

or, written by a pfvm:cpu compile, reference.pt: the traced program torch runs on the host and
the registered tensors' values (a directory holds the latest compile's kind).

Loading checks every file against the manifest before decoding anything: a missing, truncated,
edited or foreign file (or one replaced by a directory) raises ArtifactError naming it.

Nothing of the original Python function is needed to run it again: MLSDK's GPFNApp likewise
embeds the parameters so that a loader need not register the model.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import warnings
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from torch.utils import _pytree as pytree

import hwdesc
from hwdesc import HwDesc
from hwdesc.dump import dump
from sim import Machine, Program

from .kernels.context import Buffer
from .chain import Chain
from .compile import Compiled
from .errors import ArtifactError
from .iospec import IOSpec
from .layout import Placement, parse

FORMAT = "mnsim-codegen/3"  # 2: temporaries share one scratch region (offsets); 3: checksums
MANIFEST, PROGRAM, SPECS, SUMMARY, SUMMARY_TEXT, CHIP = (
    "manifest.json", "program.npz", "specs.json", "summary.json", "summary.txt", "chip.yaml")
# pfvm:cpu's codegen_dir: the traced program torch runs on the host (and the registered tensors'
# values), one file; a directory holds either kind, the latest compile's
REFERENCE, REFERENCE_FORMAT = "reference.pt", "mnsim-reference/1"
FILES = (MANIFEST, PROGRAM, SPECS, SUMMARY, SUMMARY_TEXT, CHIP)  # a device program's
WRITTEN = (*FILES, REFERENCE)  # every name mnsim writes into a codegen_dir



def estimate_cycles(compiled: Compiled) -> int:
    """Cycles of one call from the timing model alone (addresses do not change timing)."""
    return Machine(compiled.hw).time(compiled.program.code).total_cycles


def save(compiled: Compiled, directory: str | Path) -> Path:
    d = Path(directory)
    _prepare(d)
    (d / REFERENCE).unlink(missing_ok=True)  # a pfvm:cpu program compiled here before is not this one
    p = compiled.program
    arrays = {"code": p.code, "relocs": p.relocs}
    for i, buf in enumerate(compiled.buffers.values()):
        if buf.data is not None:
            data = buf.data
            arrays[f"const_{i}"] = data.detach().cpu().numpy() if isinstance(data, torch.Tensor) else np.asarray(data)
    for name, value in compiled.resident.items():
        arrays[f"resident_{name}"] = value.detach().cpu().numpy()
    npz = io.BytesIO()
    np.savez_compressed(npz, **arrays)
    buffers = [{"symbol": b.symbol, "role": b.role, "layout": str(b.placement.layout), "dtype": b.placement.dtype,
                "value": b.value, "lm": str(b.lm) if b.lm is not None else None, "reach": b.reach,
                "offset": b.offset, "data": f"const_{i}" if b.data is not None else None}
               for i, b in enumerate(compiled.buffers.values())]
    specs = {"inputs": {k: s.to_json() for k, s in compiled.inputs.items()},
             "outputs": {k: s.to_json() for k, s in compiled.outputs.items()},
             "input_symbols": compiled.input_symbols, "output_symbols": compiled.output_symbols,
             "output_shapes": {k: list(v) for k, v in compiled.output_shapes.items()},
             "out_spec": pytree.treespec_dumps(compiled.out_spec) if compiled.out_spec is not None else None,
             "resident": list(compiled.resident), "symbols": list(p.symbols), "labels": [list(x) for x in p.labels],
             "buffers": buffers, "scratch_lw": compiled.scratch_lw, "updates": compiled.updates,
             "donated": sorted(compiled.donated), "phases": [list(x) for x in compiled.phases],
             "clean_inputs": sorted(compiled.clean_inputs),
             "constraints": {k: s.to_json() for k, s in compiled.constraints.items()}}
    summary = dict(compiled.summary)
    summary.setdefault("estimated_cycles", estimate_cycles(compiled))
    contents = {
        PROGRAM: npz.getvalue(),
        SPECS: json.dumps(specs, indent=1).encode(),
        SUMMARY: json.dumps(summary, indent=1).encode(),
        SUMMARY_TEXT: _summary_text(compiled, summary).encode(),
        CHIP: dump(compiled.hw).encode(),
    }
    body = {"format": FORMAT, "chip": compiled.hw.name, "chip_fingerprint": compiled.hw.fingerprint,
            "files": {name: _sha256(data) for name, data in contents.items()}}
    contents[MANIFEST] = json.dumps({**body, "checksum": _sha256(_canonical(body))}, indent=1).encode()
    for name, data in contents.items():  # the manifest last: a half-written directory has none
        try:
            (d / name).write_bytes(data)
        except OSError as e:
            raise ArtifactError(f"codegen_dir {d}: cannot write {name}: {e.strerror or e}") from None
    return d


def _prepare(d: Path) -> None:
    """A directory to write a codegen_dir into: created, or one whose files are only mnsim's.
    Subdirectories are left alone (mnsim writes none, so nothing there is overwritten): PFN's
    examples keep their compile cache inside the codegen_dir (`CacheOptions(f"{outdir}/{name}/cache")`
    beside `codegen_dir=outdir/name`)."""
    if d.exists() and not d.is_dir():
        raise ArtifactError(f"codegen_dir {d} is a file, not a directory")
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ArtifactError(f"codegen_dir {d}: cannot create it: {e.strerror or e}") from None
    foreign = sorted(f.name for f in d.iterdir()
                     if f.name not in WRITTEN and not f.name.startswith(".") and not f.is_dir())
    if foreign:
        raise ArtifactError(f"codegen_dir {d} holds {', '.join(foreign)}, which mnsim did not write; compile into an "
                            f"empty directory or an earlier codegen_dir")
    for name in WRITTEN:
        if (d / name).is_dir():
            raise ArtifactError(f"codegen_dir {d}: {name} is a directory; mnsim writes a file there")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _canonical(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _summary_text(compiled: Compiled, summary: dict) -> str:
    lines = [f"compiled for {compiled.hw.name}: {len(compiled.program)} instructions, "
             f"about {summary['estimated_cycles']} cycles per call"]
    lines.append("ops: " + ", ".join(summary.get("ops", [])))
    for title, specs in (("inputs", compiled.inputs), ("outputs", compiled.outputs)):
        lines.append(f"{title}:")
        lines += [f"  {name}: {s.dtype}{list(s.shape)} in {s.location} {s.layout}" for name, s in specs.items()]
    lines.append("buffers:")
    lines += [f"  {b.symbol} ({b.role}): {b.placement.layout}" for b in compiled.buffers.values()]
    return "\n".join(lines) + "\n"


def save_reference(graph: object, directory: str | Path, calling: dict | None = None) -> Path:
    """pfvm:cpu's codegen_dir: the traced graph (its torch module and the registered tensors'
    values) and how it is called (compile_automap's convention, or None), reloadable by
    `load_reference` on pfvm:cpu in another process."""
    d = Path(directory)
    _prepare(d)
    (d / MANIFEST).unlink(missing_ok=True)  # a device program compiled here before is not this one
    try:
        torch.save({"format": REFERENCE_FORMAT, "graph": graph, "calling": calling}, d / REFERENCE)
    except OSError as e:
        raise ArtifactError(f"codegen_dir {d}: cannot write {REFERENCE}: {e.strerror or e}") from None
    return d


def load_reference(directory: str | Path) -> tuple[object, dict | None]:
    """The traced graph a pfvm:cpu compile wrote and its calling convention (`save_reference`)."""
    d = Path(directory)
    if not (d / REFERENCE).is_file():
        held = "a device program" if (d / MANIFEST).exists() else "no program"
        raise ArtifactError(f"codegen_dir {d} holds {held}; pfvm:cpu loads what a pfvm:cpu compile wrote "
                            f"({REFERENCE}): compile on pfvm:cpu, or load it on the chip it was compiled for")
    # a pickled fx GraphModule's code names this module without importing it (torch 2.13): a new
    # process that has not imported it fails to load the program
    import torch._higher_order_ops.triton_kernel_wrap  # noqa: F401
    try:  # the user's own file, written by save_reference: a pickle of the graph module
        with warnings.catch_warnings():  # (torch's own deprecation inside its unpickler)
            warnings.simplefilter("ignore", FutureWarning)
            found = torch.load(d / REFERENCE, weights_only=False)
    except Exception as e:
        raise ArtifactError(f"codegen_dir {d}: {REFERENCE} is unreadable ({type(e).__name__}: {e})") from None
    if not isinstance(found, dict) or found.get("format") != REFERENCE_FORMAT:
        raise ArtifactError(f"codegen_dir {d}: {REFERENCE} is not an {REFERENCE_FORMAT} program")
    return found["graph"], found.get("calling")


def load(directory: str | Path, hw: HwDesc | None = None) -> Compiled:
    """A codegen_dir back as a Compiled. Every file is checked against the manifest's checksums
    first, so a missing, truncated, edited or foreign file raises ArtifactError naming it."""
    d = Path(directory)
    if not d.exists():
        raise ArtifactError(f"no codegen_dir at {d}")
    if not d.is_dir():
        raise ArtifactError(f"codegen_dir {d} is a file, not a directory")
    manifest = _manifest(d)
    data = _checked_files(d, manifest)
    with _reading(d, CHIP):
        if hw is None:
            hw = hwdesc.load(d / CHIP)
    if manifest["chip_fingerprint"] != hw.fingerprint:
        raise ArtifactError(f"{d} was compiled for chip {manifest['chip']!r}; the device is {hw.name!r} (recompile, "
                            f"or load it on the chip it was compiled for)")
    with _reading(d, SPECS):
        specs = json.loads(data[SPECS])
    with _reading(d, SUMMARY):
        summary = json.loads(data[SUMMARY])
    with _reading(d, PROGRAM):
        arrays = dict(np.load(io.BytesIO(data[PROGRAM])))
    dram = Chain.of(hw).dram
    with _reading(d, f"{SPECS} and {PROGRAM}"):
        program = Program(arrays["code"], [tuple(x) for x in specs["labels"]], arrays["relocs"], tuple(specs["symbols"]))
        buffers = {}
        for b in specs["buffers"]:
            const = torch.from_numpy(arrays[b["data"]]) if b["data"] else None
            buffers[b["symbol"]] = Buffer(b["symbol"], b["role"], Placement(parse(b["layout"]), hw, dram, b["dtype"]),
                                          b["value"], const, parse(b["lm"]) if b["lm"] else None, b["reach"],
                                          b["offset"])
        compiled = Compiled(hw, program, buffers, {k: IOSpec.from_json(v) for k, v in specs["inputs"].items()},
                            {k: IOSpec.from_json(v) for k, v in specs["outputs"].items()}, specs["input_symbols"],
                            specs["output_symbols"], {k: tuple(v) for k, v in specs["output_shapes"].items()},
                            pytree.treespec_loads(specs["out_spec"]) if specs["out_spec"] else None,
                            summary, scratch_lw=specs["scratch_lw"], updates=specs["updates"],
                            donated=set(specs["donated"]), phases=[tuple(x) for x in specs["phases"]],
                            constraints={k: IOSpec.from_json(v) for k, v in specs["constraints"].items()},
                            clean_inputs=set(specs.get("clean_inputs", [])))
        compiled.resident = {name: torch.from_numpy(arrays[f"resident_{name}"]) for name in specs["resident"]}
    return compiled


def _manifest(d: Path) -> dict:
    path = d / MANIFEST
    if not path.exists() and (d / REFERENCE).is_file():
        raise ArtifactError(f"{d} holds a pfvm:cpu program ({REFERENCE}), not a device one: load it on pfvm:cpu, "
                            f"or compile for this chip")
    if not path.exists():
        raise ArtifactError(f"{path} is missing: {d} is not a complete mnsim codegen_dir")
    if not path.is_file():
        raise ArtifactError(f"{path} is not a file")
    with _reading(d, MANIFEST):
        manifest = json.loads(path.read_bytes())
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            found = manifest.get("format") if isinstance(manifest, dict) else None
            raise ArtifactError(f"{path}: format {found!r}; this mnsim reads {FORMAT!r} (recompile)")
        body = {k: v for k, v in manifest.items() if k != "checksum"}
        if manifest.get("checksum") != _sha256(_canonical(body)):
            raise ArtifactError(f"{path} does not match its checksum: it was edited or is corrupt")
        if set(manifest["files"]) != set(FILES) - {MANIFEST}:
            raise ArtifactError(f"{path} lists {sorted(manifest['files'])}; expected {sorted(set(FILES) - {MANIFEST})}")
    return manifest


def _checked_files(d: Path, manifest: dict) -> dict[str, bytes]:
    out = {}
    for name, digest in manifest["files"].items():
        path = d / name
        if not path.exists():
            raise ArtifactError(f"{path} is missing from the codegen_dir")
        if not path.is_file():
            raise ArtifactError(f"{path} is not a file")
        try:
            out[name] = path.read_bytes()
        except OSError as e:
            raise ArtifactError(f"{path}: cannot read it: {e.strerror or e}") from None
        if _sha256(out[name]) != digest:
            raise ArtifactError(f"{path} does not match the checksum in {MANIFEST}: it was edited, truncated, or comes "
                                "from another codegen_dir")
    foreign = sorted(f.name for f in d.iterdir()
                     if f.name not in WRITTEN and not f.name.startswith(".") and not f.is_dir())
    if foreign:
        raise ArtifactError(f"{d / foreign[0]} is not part of an mnsim codegen_dir (written by something else)")
    return out


@contextlib.contextmanager
def _reading(d: Path, name: str) -> Iterator[None]:
    """Any failure while decoding a file becomes an ArtifactError naming it."""
    try:
        yield
    except ArtifactError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever a decoder raises (zlib.error, KeyError, HwDescError, ...)
        raise ArtifactError(f"{d / name} cannot be read: {type(e).__name__}: {e}") from None
