"""What kernels share: operand buffers, LM regions, slices and the stage-compute-upload loop.

A kernel iterates in one LM layout (its output's for element-wise ops, its input's for
reductions); every tensor operand gets the layout `plan.restrict` derives, an LM region, and
is downloaded slice by slice (or once, when it does not vary along the sliced dimension).
Graph inputs and constants met here for the first time are given a DRAM buffer in the image
of the layout this kernel wants, so they download with plain block copies.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim import DType

from ..codegen import Arena, CodeGen, Ref
from ..frontend.graph import Value
from ..layout import Layout, Placement
from ..errors import LayoutError
from ..layout.candidates import candidates
from ..plan import LM, Restricted, per_pe, restrict, slice_count, stageable
from ..transfer.gather import LaneMismatch, lw_sources
from ..transfer.staging import stage
from .loops import Operand as LoopOperand

ROLE = {"input": "input", "const": "const", "node": "temp"}


def lshape(v: Value) -> tuple[int, ...]:
    """Layouts have at least one dimension: a 0-d tensor is laid out as shape (1,)."""
    return v.shape or (1,)


def lm_placement(cg: CodeGen, layout: Layout, dtype: str) -> Placement:
    return Placement(layout, cg.hw, LM, dtype, check_capacity=False)


def ref_of(cg: CodeGen, v: Value, wanted: Layout) -> Ref:
    """Where `v` is in DRAM; a graph input or constant seen first is placed as wanted's image
    (through any views between it and `v`, see lower.views)."""
    ref = cg.refs.get(v)
    if ref is not None:
        return ref
    if v in cg.pending:
        return cg.pending[v](wanted)
    dtype = cg.device_dtype(v)
    st = stage(lm_placement(cg, wanted, dtype))
    data = None
    if v.kind == "const":
        data = v.data.reshape(lshape(v))
    if st.fitted is not None:
        ref = cg.buffer(ROLE[v.kind], st.fitted, v.name, lm=wanted, data=data)
    else:  # the wanted layout's image has no notation: store row-major, gather on the way in
        default = candidates(lshape(v), dtype, cg.hw, "DRAM")[0].layout
        ref = cg.buffer(ROLE[v.kind], Placement(default, cg.hw, "DRAM", dtype), v.name, data=data)
    cg.refs[v] = ref
    return ref


def arrives_by_block_copies(cg: CodeGen, v: Value, wanted: Layout) -> bool:
    """Whether a not-yet-placed graph input or constant (or a view of one) would be stored as the
    DRAM image of LM layout `wanted`, so that it downloads by block copies rather than a gather
    of short runs on every call: every view on the way must map `wanted` back to its base. Placed
    values are where they are (True)."""
    if v in cg.refs:
        return True
    if v in cg.view_bases:
        base, to_base = cg.view_bases[v]
        base_layout = to_base(wanted)
        return base_layout is not None and arrives_by_block_copies(cg, base, base_layout)
    try:
        return stage(Placement(wanted, cg.hw, LM, cg.device_dtype(v), check_capacity=False)).fitted is not None
    except LayoutError:
        return False


def compatible(cg: CodeGen, v: Value, layout: Layout) -> bool:
    """Can `v` be downloaded into LM `layout` from where it is (lane for lane)? Values not yet
    placed can be placed anywhere."""
    ref = cg.refs.get(v)
    if ref is None:
        return True
    key = (ref.symbol, str(ref.placement.layout), str(layout))
    if key not in cg.lane_cache:
        try:
            st = stage(lm_placement(cg, layout, cg.device_dtype(v)))
            if st.fitted is None or not ref.placement.same_placement(st.fitted):
                lw_sources(st.destination, ref.placement)  # raises when some long word would mix lanes
            cg.lane_cache[key] = True
        except (LaneMismatch, LayoutError):
            cg.lane_cache[key] = False
    return cg.lane_cache[key]


def usable_for(cg: CodeGen, v: Value, layout: Layout) -> bool:
    """`layout` stages, and `v` can get there."""
    return stageable(layout, cg.hw, cg.device_dtype(v)) and compatible(cg, v, layout)


def new_output(cg: CodeGen, v: Value, layout: Layout) -> Ref:
    st = stage(lm_placement(cg, layout, cg.device_dtype(v)))
    ref = cg.buffer("temp", st.dram, v.name, lm=layout)
    cg.refs[v] = ref
    return ref


@dataclass
class Tensor:
    """A tensor operand of a kernel: its layout, LM region and how it maps the loop's factors."""

    value: Value
    restricted: Restricted
    dtype: str
    memory: str = ""
    word: int = 0

    @property
    def layout(self) -> Layout:
        return self.restricted.layout

    @property
    def sliced(self) -> bool:
        return slice_count(self.layout) > 1

    def placement(self, cg: CodeGen) -> Placement:
        return lm_placement(cg, self.layout, self.dtype)

    def words(self, cg: CodeGen) -> int:
        return self.placement(cg).slice_span * cg.params.words_per_lw

    def loop_operand(self, cg: CodeGen) -> LoopOperand:
        """Element strides of this operand along the kernel's factors (0 where it is broadcast)."""
        mine = per_pe_strides(cg, self)
        st = tuple(0 if s is None else mine[s] for s in self.restricted.source)
        per_word = cg.params.elements_per_word(_dtype_enum(self.dtype))
        return LoopOperand(self.memory, self.word * per_word, st)


def per_pe_strides(cg: CodeGen, t: "Tensor") -> list[int]:
    return [s for _, s in per_pe(t.layout, cg.hw.elements_per_lw(t.dtype))]


def _dtype_enum(dtype: str) -> DType:
    return DType[dtype]


def allocate(cg: CodeGen, tensors: list[Tensor]) -> Arena:
    arena = Arena(cg.hw)
    for t in tensors:
        t.memory, t.word = arena.alloc(t.words(cg))
    return arena


def operand(cg: CodeGen, v: Value, iteration: Layout) -> Tensor:
    return Tensor(v, restrict(iteration, lshape(v)), cg.device_dtype(v))


def download_slice(cg: CodeGen, t: Tensor, ref: Ref, slice_index: int) -> None:
    cg.download(ref, t.placement(cg), memory=t.memory, word=t.word, slice_index=slice_index if t.sliced else 0)
