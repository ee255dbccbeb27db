"""Relayouts that move lanes through the MAU's matrix registers instead of element by element.

A relayout whose lanes change dimension (a transpose of the packed dimension, or a copy into a
layout packed along another dimension) cannot be a long-word gather. Without the registers it
unpacks every element into a long word of its own, and the Data Engines then gather those, one
MV per element. A MAB does it with two PE instructions: `mwrite` puts side x side blocks
whose columns lie across its PEs into a register face (side = PEs per MAB x elements per long
word), and the transposed read `mread` gives them back with rows and columns exchanged
(sim.isa, "the matrix registers").

The layouts. The output's LM layout puts PEs and lanes, (pes_PE:1, epl_W:1), at the minor end
of the dimension the target packs (w). The dimension the source packs (a, as the output
numbers it) ends with an address digit `side:1`. The input's LM layout is the same with those
two digits exchanged, so a register block is `side` consecutive long words of every PE of a
MAB, and its transpose is the output's block. Each side keeps its lanes where its DRAM
neighbour has them, so both the staging of the input and the gather into the target are
long-word gathers.
"""

from __future__ import annotations

import contextlib
from math import ceil, prod

from ..errors import CompileError, LayoutError
from ..layout import TIME_AXIS, W_AXIS, Factor, Layout, Placement, lanes_innermost
from ..layout.spread import Spread, spread, time_sliced
from ..transfer.gather import lw_sources
from ..transfer.staging import stage
from .context import Arena, EmitContext, Ref
from .operands import slice_count

REGIONS = 2  # the input and the output, in two PE memories: mwrite reads one while mread writes the other


def lane_dim(layout: Layout, epl: int) -> int | None:
    """The dimension whose minor-most digit is the lanes (W, `epl` of them), or None."""
    if not lanes_innermost(layout):
        return None
    for d, dim in enumerate(layout.dims):
        real = [f for f in dim if f.size > 1]
        if real and real[-1].axis == W_AXIS and real[-1].size == epl and real[-1].stride == 1:
            return d
    return None


def _real(layout: Layout, d: int) -> list[int]:
    return [k for k, f in enumerate(layout.dims[d]) if f.size > 1]


def _blocks(layout: Layout, w: int, a: int, pes: int, epl: int, side: int, pe_axis: str) -> bool:
    """Whether `layout` has register blocks: dimension w ends with the lanes (epl_W:1) and holds
    the PE digit (pes_PE:1, anywhere in it, nowhere else); dimension a ends with the address digit
    side:1; every other address digit is a multiple of side apart (whole blocks per PE)."""
    if not _real(layout, w) or not _real(layout, a):
        return False
    lane, row = layout.dims[w][_real(layout, w)[-1]], layout.dims[a][_real(layout, a)[-1]]
    pe = [f for _, f in layout.factors if f.axis == pe_axis and f.size > 1]
    if lane != Factor(epl, W_AXIS, 1) or row != Factor(side, None, 1) or pe != [Factor(pes, pe_axis, 1)]:
        return False
    if not any(f.axis == pe_axis and f.size > 1 for f in layout.dims[w]):
        return False
    return all(f.stride % side == 0 for _, f in layout.factors if f.axis is None and f.size > 1 and f is not row)


def _exchange(layout: Layout, w: int, a: int, pes: int, epl: int, pe_axis: str) -> Layout:
    """The layout after a transposed read of `layout`'s blocks (see `_blocks`): dimension w's PE
    digit becomes the address digit pes:epl and its lanes epl:1; dimension a's block-row digit
    side:1 becomes (pes_PE:1, epl_W:1). (An element at long word r of a block, PE p, lane e moves
    to long word p*epl + e, PE r div epl, lane r mod epl.)"""
    dims = [list(dim) for dim in layout.dims]
    dims[w] = [Factor(pes, None, epl) if f.axis == pe_axis and f.size > 1 else f for f in dims[w]]
    lane = _real(layout, w)[-1]
    dims[w][lane] = Factor(epl, None, 1)
    row = _real(layout, a)[-1]
    dims[a][row:row + 1] = [Factor(pes, pe_axis, 1), Factor(epl, W_AXIS, 1)]
    return Layout.of(dims, layout.shape, layout.broadcast)


def _restrided(layout: Layout, a: int, side: int) -> Layout | None:
    """`layout` with its block-row digit made: the minor-most digit of dimension a (an address
    digit of a multiple of side positions) split so that its last side positions are long words
    0..side-1 of every block, and the other address digits side x apart, in their order."""
    real = _real(layout, a)
    if not real:
        return None
    k = real[-1]
    minor = layout.dims[a][k]
    if minor.axis is not None or minor.size % side:
        return None
    dims = [list(dim) for dim in layout.dims]
    row = Factor(side, None, 1)
    dims[a][k:k + 1] = ([Factor(minor.size // side, None, minor.stride)] if minor.size > side else []) + [row]
    address = sorted(((f.stride, d, j) for d, dim in enumerate(dims) for j, f in enumerate(dim)
                      if f.axis is None and f.size > 1 and f is not row), key=lambda t: t[0])
    stride = side
    for _, d, j in address:
        f = dims[d][j]
        dims[d][j] = Factor(f.size, None, stride)
        stride *= f.size
    return Layout.of(dims, layout.shape, layout.broadcast)


RECIPES = tuple(Spread(None, cyclic, inner, None, False, root) for cyclic in (True, False) for inner in (True, False)
                for root in (False, True))  # where the hardware axes go; the lanes and PEs go to w below


def output_layouts(shape: tuple[int, ...], w: int, a: int, epl: int, ctx: EmitContext, budget_lw: int
                   ) -> list[Layout]:
    """LM layouts of the output with register blocks (see the module doc), sliced to the budget:
    one per way of spreading the other hardware axes."""
    out: list[Layout] = []
    for recipe in RECIPES:
        layout = _output_layout(shape, w, a, epl, ctx, budget_lw, recipe)
        if layout is not None and layout not in out:
            out.append(layout)
    return out


def _output_layout(shape: tuple[int, ...], w: int, a: int, epl: int, ctx: EmitContext, budget_lw: int,
                   recipe: Spread) -> Layout | None:
    chain, axes = ctx.chain, ctx.hw.axes
    pes, side = chain.pes_per_unit, chain.pes_per_unit * epl
    if shape[w] < side or shape[a] < side:
        return None
    blocks = tuple(ceil(n / side) if d == a else n for d, n in enumerate(shape))  # a's rows come `side` to a
    base = spread(blocks, epl, axes, Spread(w, recipe.cyclic, recipe.inner_first, (w,), False, recipe.root_first),
                  None)  # block: the hardware axes share out blocks, not rows (or most of them would hold padding)
    placed = [[f for f in dim if f.axis not in (None, W_AXIS, TIME_AXIS)] for dim in base.dims]
    held = [prod(f.size for f in dim) * (epl if d == w else 1) for d, dim in enumerate(placed)]
    rows = [ceil(shape[d] / held[d]) for d in range(len(shape))]
    rows[a] = ceil(rows[a] / side) * side
    order = [d for d in range(len(shape)) if d != a] + [a]  # a's digits innermost in the address
    stride, strides = 1, {}
    for d in reversed(order):
        strides[d] = stride
        stride *= rows[d]
    dims = []
    for d in range(len(shape)):
        if d == a:
            outer = [Factor(rows[a] // side, None, side)] if rows[a] > side else []
            dims.append(outer + placed[d] + [Factor(side, None, 1)])
        else:
            address = [Factor(rows[d], None, strides[d])] if rows[d] > 1 else []
            lanes = [Factor(epl, W_AXIS, 1)] if d == w else []
            dims.append(address + placed[d] + lanes or [Factor(1, None, 1)])
    layout = Layout.of(dims, shape, base.broadcast)
    layout = time_sliced(layout, budget_lw, epl)
    if layout is None or not _blocks(layout, w, a, pes, epl, side, chain.pe_axis):
        return None
    return layout


def registers(ctx: EmitContext) -> str | None:
    """The register memory, when the chip describes matrix registers the PEs write (a path in
    mode individual) and read transposed (a path in mode transpose); else None."""
    hw, chain = ctx.hw, ctx.chain
    if chain.matrix_unit is None:
        return None
    level = hw.units[chain.matrix_unit].level
    for mem, spec in hw.memories.items():
        if spec.level != level:
            continue
        written = any(t.dst == (mem,) and "individual" in t.modes and set(chain.scratch) <= set(t.src)
                      for t in hw.transfers.values())
        read = any(t.src == (mem,) and "transpose" in t.modes and set(chain.scratch) <= set(t.dst)
                   for t in hw.transfers.values())
        if written and read:
            return mem
    return None


def emit_through_registers(ctx: EmitContext, src: Ref, out: Ref, dtype: str, order: tuple[int, ...],
                           name: str) -> bool:
    """Relay `src` (permuted by `order`: out dim i is source dim order[i]) into `out` through the
    matrix registers; False (nothing emitted) when the layouts or the chip do not allow it."""
    memory = registers(ctx)
    epl = ctx.hw.elements_per_lw(dtype)
    if memory is None or epl < 2:
        return False
    s = lane_dim(src.placement.layout, epl)
    w = lane_dim(out.placement.layout, epl)
    if s is None or w is None or order.index(s) == w:
        return False
    a = order.index(s)
    pes = ctx.chain.pes_per_unit
    face_lw = ctx.hw.memory_lw(memory) // ctx.hw.memories[memory].faces
    side = pes * epl
    if side * pes > face_lw:
        return False
    capacities = sorted((ctx.hw.memory_lw(m), m) for m in ctx.chain.scratch)
    if len(capacities) < REGIONS:
        return False
    budget = capacities[-REGIONS][0]
    inverse = tuple(order.index(d) for d in range(len(order)))
    best = None
    for produced, consumed in _candidates(ctx, src, out, order, w, a, epl, budget):
        try:
            lm_in, lm_out = ctx.lm_placement(consumed.permute(inverse), dtype), ctx.lm_placement(produced, dtype)
            image = stage(lm_out).dram
            runs = len(lw_sources(stage(lm_in).dram, src.placement).n)  # the input's staging: no lane moves
            final = None if image.same_placement(out.placement) else lw_sources(out.placement, image)
        except (CompileError, LayoutError):
            continue
        runs += 0 if final is None else len(final.n)
        if best is None or runs < best[0]:
            best = (runs, lm_in, lm_out, image, final)
    if best is None:
        return False
    _, lm_in, lm_out, image, final = best
    image_ref = out if final is None else ctx.buffer("temp", image, f"{name}_transposed")
    _emit(ctx, src, image_ref, lm_in, lm_out, memory, dtype, side)
    if final is not None:
        ctx.gather(final, out, [image_ref])
    return True


def _candidates(ctx: EmitContext, src: Ref, out: Ref, order: tuple[int, ...], w: int, a: int, epl: int,
                budget: int) -> list[tuple[Layout, Layout]]:
    """(output LM layout, input LM layout in the output's dimension order) pairs to choose from:
    the target's own LM layout given register blocks, the source's likewise, and fresh spreads."""
    chain = ctx.chain
    pes, side, pe_axis = chain.pes_per_unit, chain.pes_per_unit * epl, chain.pe_axis
    pairs = []

    def sliced(layout: Layout | None, w_: int, a_: int) -> Layout | None:
        layout = time_sliced(layout, budget, epl) if layout is not None else None
        return layout if layout is not None and _blocks(layout, w_, a_, pes, epl, side, pe_axis) else None
    known = lambda ref: ref.lm is not None and ref.lm.shape == ref.shape  # noqa: E731  (a view's may be its base's)
    if known(out):
        produced = sliced(_restrided(out.lm, a, side), w, a)
        if produced is not None:
            pairs.append((produced, _exchange(produced, w, a, pes, epl, pe_axis)))
    if known(src):
        consumed = sliced(_restrided(src.lm.permute(order), w, side), a, w)
        if consumed is not None:
            pairs.append((_exchange(consumed, a, w, pes, epl, pe_axis), consumed))
    for produced in output_layouts(out.placement.layout.shape, w, a, epl, ctx, budget):
        pairs.append((produced, _exchange(produced, w, a, pes, epl, pe_axis)))
    return pairs


def _emit(ctx: EmitContext, src: Ref, dst: Ref, lm_in: Placement, lm_out: Placement,
          memory: str, dtype: str, side: int) -> None:
    """Per time slice: stage the input, transpose its blocks a register face at a time (the next
    face written while the last is read, `memories.<registers>.faces` permitting), upload the
    output's image."""
    pes, wpl = ctx.chain.pes_per_unit, ctx.params.words_per_lw
    faces = ctx.hw.memories[memory].faces
    span = lm_in.slice_span
    face_lw = ctx.hw.memory_lw(memory) // faces
    per_chunk = face_lw // pes // side * side  # LW per PE per face
    arena = Arena(ctx.hw)
    a = arena.alloc(span * wpl)
    b = arena.alloc(span * wpl, avoid={a[0]}, strict=True)
    chunks = [(c, min(per_chunk, span - c)) for c in range(0, span, per_chunk)]

    def write(k: int) -> None:
        c, n = chunks[k]
        ctx.b.xfer("individual", "up", memory, (k % faces) * face_lw, a[0], a[1] + c * wpl,
                   n * pes, dtype=dtype)

    def read(k: int) -> None:
        c, n = chunks[k]
        ctx.b.xfer("transpose", "down", memory, (k % faces) * face_lw, b[0], b[1] + c * wpl,
                   n * pes, dtype=dtype)
    for t in range(slice_count(lm_in.layout)):
        ctx.download(src, lm_in, memory=a[0], word=a[1], slice_index=t, pad=0)  # padding stays padding: zeros
        write(0)
        for k in range(1, len(chunks)):
            with ctx.b.together() if faces > 1 else contextlib.nullcontext():  # one face: one after another
                read(k - 1)
                write(k)
        read(len(chunks) - 1)
        ctx.upload(lm_out, dst, memory=b[0], word=b[1], slice_index=t)
