"""A sweep SPEC: a base chip, the axes that vary it, how points are drawn, the workloads.

    base: mncore2                      # a built-in name, or a YAML path (relative to the SPEC)
    axes:
      levels.Group.count: [1, 2, 4]    # a dotted YAML path and its values
      memories.L2BM.lw_per_cycle: [x0.5, x1, x2]          # factors of the base value
      dram_rate:                       # a named axis that moves several keys together
        paths: [memories.DRAM.lw_per_cycle, "transfers.dram_to_l2bm.modes.*.src_lw_per_cycle"]
        values: [x0.5, x1, x2]
    sample: grid                       # every combination (default), or {random: 16, seed: 0}
    workloads:
      - program: transformer           # a model of mlsdk.sweep.suite
      - script: train.py               # an MLSDK script (relative to the SPEC), run as python would
        args: ["--steps", "1"]
        mode: both                     # timing (default) or both, for scripts that read values
      - codegen_dir: out/add           # a compiled program, timed as it is on each point
    cost: levels.Group.count           # optional: the x of the Pareto plot (an axis or a YAML path)

Errors in the SPEC name its file and line; the chip keys an axis names must exist in the base.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, NoReturn

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pydantic_core import PydanticCustomError

from hwdesc.errors import LocatedError
from hwdesc.loader import raise_problems, validation_problems
from hwdesc.source import Document, read_plain

from ..errors import SweepSpecError

Value = int | float | str | bool


def _invalid(message: str) -> PydanticCustomError:
    """A validator's complaint, reported like a schema error (at the SPEC line of its key)."""
    return PydanticCustomError("value_error", "{message}", {"message": message})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LinkedAxis(_Strict):
    """Several chip keys set together to one value per point (factors apply to each key's own
    base value): e.g. a DRAM rate that is the memory's rate and its paths' rates."""

    paths: Annotated[list[str], Field(min_length=1, description="dotted YAML paths of the base chip; '*' matches "
                                                                "every key of a mapping")]
    values: Annotated[list[Value], Field(min_length=1, description="the values, or factors written x0.5, x2")]


class RandomSample(_Strict):
    """`n` points drawn from the grid without repeats, the same `n` for the same seed."""

    random: Annotated[int, Field(gt=0, description="how many points to draw")]
    seed: int = 0


class Workload(_Strict):
    """One program run on every point; exactly one of program, script, codegen_dir."""

    program: str | None = Field(None, description="a model of the suite (mlsdk.sweep.suite.MODELS)")
    script: str | None = Field(None, description="an MLSDK script, relative to the SPEC")
    codegen_dir: str | None = Field(None, description="a codegen_dir, relative to the SPEC")
    args: list[str] = Field(default_factory=list, description="the script's command-line arguments")
    mode: Literal["timing", "both"] = Field("timing", description="timing (default), or both to also move data")
    name: str | None = Field(None, description="the workload's name in the results (default: what it runs)")

    @model_validator(mode="after")
    def _one_kind(self) -> "Workload":
        given = [k for k in ("program", "script", "codegen_dir") if getattr(self, k) is not None]
        if len(given) != 1:
            raise _invalid(f"a workload names exactly one of program, script, codegen_dir; got "
                           f"{', '.join(given) or 'none'}")
        if self.args and self.script is None:
            raise _invalid("args are a script's command-line arguments; this workload is not a script")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in ("program", "script", "codegen_dir") if getattr(self, k) is not None)

    @property
    def target(self) -> str:
        return getattr(self, self.kind)

    @property
    def label(self) -> str:
        return self.name or (Path(self.target).stem if self.kind != "program" else self.target)


class SweepSpec(_Strict):
    base: str = Field(description="the base chip: a built-in name or a YAML path")
    axes: Annotated[dict[str, list[Value] | LinkedAxis], Field(min_length=1, description="axis name or dotted "
                                                                                          "YAML path -> values")]
    workloads: Annotated[list[Workload], Field(min_length=1, description="what runs on every point")]
    sample: Literal["grid"] | RandomSample = "grid"
    cost: str | None = Field(None, description="an axis or YAML path: the x of the Pareto plot")


class LoadedSpec:
    """A SPEC with where it was read from: relative paths resolve against its folder, and
    problems found later (an axis path the base lacks) still name its lines."""

    def __init__(self, spec: SweepSpec, document: Document, path: Path) -> None:
        self.spec, self.document, self.path = spec, document, path

    @property
    def folder(self) -> Path:
        return self.path.parent

    def fail(self, key_path: tuple, message: str) -> NoReturn:
        """Raise SweepSpecError at the SPEC line of `key_path`."""
        raise_problems([(key_path, message)], self.document, SweepSpecError)


def load_spec(path: str | Path) -> LoadedSpec:
    """Read and check a SPEC file; SweepSpecError names the file, line and key of a problem."""
    path = Path(path)
    try:
        document = read_plain(path)
    except LocatedError as e:
        raise SweepSpecError(str(e)) from None
    try:
        spec = SweepSpec.model_validate(document.data)
    except ValidationError as e:
        raise_problems(validation_problems(e, SweepSpec), document, SweepSpecError)
    loaded = LoadedSpec(spec, document, path.resolve())
    labels = [w.label for w in spec.workloads]
    for i, label in enumerate(labels):
        if label in labels[:i]:
            loaded.fail(("workloads", i), f"a second workload named {label!r}; give them distinct names (name: ...)")
    for axis, given in spec.axes.items():
        if not (given.values if isinstance(given, LinkedAxis) else given):
            loaded.fail(("axes", axis), "an axis without values")
    return loaded
