"""`codegen_dir`: a compiled function on disk, reloadable in a new process.

    manifest.json   format version, chip name and fingerprint, the chip's resolved YAML
    program.npz     instructions, relocations, labels; every constant's values and the
                    compile-time values of device-resident (registered) inputs
    specs.json      IOSpecs, buffer table, input/output symbols and shapes, output structure
    summary.json    ops, chosen locations and layouts, estimated cycles (also summary.txt)

Nothing of the original Python function is needed to run it again: MLSDK's GPFNApp likewise
embeds the parameters so that a loader need not register the model.
"""

from __future__ import annotations

import json
from pathlib import Path

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
from .errors import ArtifactError, CompileError
from .iospec import IOSpec
from .layout import Placement, parse

FORMAT = "mnsim-codegen/2"  # 2: temporaries share one scratch region (offsets)



def estimate_cycles(compiled: Compiled) -> int:
    """Cycles of one call from the timing model alone (addresses do not change timing)."""
    return Machine(compiled.hw).time(compiled.program.code).total_cycles


def save(compiled: Compiled, directory: str | Path) -> Path:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    p = compiled.program
    arrays = {"code": p.code, "relocs": p.relocs}
    for i, buf in enumerate(compiled.buffers.values()):
        if buf.data is not None:
            data = buf.data
            arrays[f"const_{i}"] = data.detach().cpu().numpy() if isinstance(data, torch.Tensor) else np.asarray(data)
    for name, value in compiled.resident.items():
        arrays[f"resident_{name}"] = value.detach().cpu().numpy()
    np.savez_compressed(d / "program.npz", **arrays)
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
             "donated": sorted(compiled.donated), "phases": [list(x) for x in compiled.phases]}
    (d / "specs.json").write_text(json.dumps(specs, indent=1))
    summary = dict(compiled.summary)
    summary.setdefault("estimated_cycles", estimate_cycles(compiled))
    (d / "summary.json").write_text(json.dumps(summary, indent=1))
    (d / "summary.txt").write_text(_summary_text(compiled, summary))
    manifest = {"format": FORMAT, "chip": compiled.hw.name, "chip_fingerprint": compiled.hw.fingerprint}
    (d / "manifest.json").write_text(json.dumps(manifest, indent=1))
    (d / "chip.yaml").write_text(dump(compiled.hw))
    return d


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


def load(directory: str | Path, hw: HwDesc | None = None) -> Compiled:
    d = Path(directory)
    if not d.is_dir():
        raise ArtifactError(f"no codegen_dir at {d}")
    try:
        manifest = json.loads((d / "manifest.json").read_text())
        specs = json.loads((d / "specs.json").read_text())
        arrays = np.load(d / "program.npz")
    except (OSError, ValueError, KeyError) as e:
        raise ArtifactError(f"{d} is not a complete mnsim codegen_dir ({type(e).__name__}: {e})") from None
    if manifest.get("format") != FORMAT:
        raise ArtifactError(f"{d} has format {manifest.get('format')!r}; this mnsim reads {FORMAT!r}")
    if hw is None:
        hw = hwdesc.load(d / "chip.yaml")
    if manifest["chip_fingerprint"] != hw.fingerprint:
        raise ArtifactError(f"{d} was compiled for chip {manifest['chip']!r}; the device is {hw.name!r} (recompile, "
                            f"or load it on the chip it was compiled for)")
    dram = Chain.of(hw).dram
    try:
        program = Program(arrays["code"], [tuple(x) for x in specs["labels"]], arrays["relocs"], tuple(specs["symbols"]))
        buffers = {}
        for b in specs["buffers"]:
            data = torch.from_numpy(arrays[b["data"]]) if b["data"] else None
            buffers[b["symbol"]] = Buffer(b["symbol"], b["role"], Placement(parse(b["layout"]), hw, dram, b["dtype"]),
                                          b["value"], data, parse(b["lm"]) if b["lm"] else None, b["reach"],
                                          b["offset"])
        compiled = Compiled(hw, program, buffers, {k: IOSpec.from_json(v) for k, v in specs["inputs"].items()},
                            {k: IOSpec.from_json(v) for k, v in specs["outputs"].items()}, specs["input_symbols"],
                            specs["output_symbols"], {k: tuple(v) for k, v in specs["output_shapes"].items()},
                            pytree.treespec_loads(specs["out_spec"]) if specs["out_spec"] else None,
                            json.loads((d / "summary.json").read_text()), scratch_lw=specs["scratch_lw"],
                            updates=specs.get("updates", {}), donated=set(specs.get("donated", [])),
                            phases=[tuple(x) for x in specs.get("phases", [])])
        compiled.resident = {name: torch.from_numpy(arrays[f"resident_{name}"]) for name in specs.get("resident", [])}
    except (KeyError, ValueError, TypeError) as e:
        raise ArtifactError(f"{d} is corrupt: {type(e).__name__}: {e}") from None
    return compiled
