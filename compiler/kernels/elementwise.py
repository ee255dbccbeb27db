"""Element-wise kernels: a fused group of `ew` (and `full`) nodes computed in one LM layout.

Element-wise nodes of one shape that feed each other are fused (`fuse_elementwise`): the group's
inputs are staged into LM once per time slice, every node is a short recipe of VOPs on LM
regions, and only the values something outside the group reads are uploaded. The group iterates
in one LM layout of its shape; each input is laid out as that layout restricted to its own shape
(torch broadcasting: broadcast dimensions become copies, see kernels.operands).

Recipes (`recipe`): an IR op is one VOP in its compute dtype, with conversions around it where
the device's representation asks for them: bool is float32 0.0 / 1.0, so comparisons of half or
integer operands convert their 1 / 0 result, and `where` on int32 or half values converts its
condition first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim import ProgramBuilder

from ..errors import CompileError, UnsupportedOpError
from ..ir import BITWISE, COMPARISONS, Node, Value
from ..layout import Layout, has_lanes
from .base import Kernel, Operand, Slot, device_dtype, emit_step, fill_lanes
from .context import Arena, EmitContext, Ref, gather_mvs
from .operands import operand_slice, restrict, slice_count

SAME = {"copy": "copy", "neg": "neg", "abs": "abs", "relu": "relu", "exp": "exp", "log": "log", "log1p": "log1p",
        "expm1": "expm1", "sqrt": "sqrt", "rsqrt": "rsqrt", "reciprocal": "reciprocal", "sigmoid": "sigmoid",
        "tanh": "tanh", "erf": "erf", "sin": "sin", "cos": "cos", "floor": "floor", "ceil": "ceil", "trunc": "trunc",
        "round": "round", "sign": "sign", "add": "add", "sub": "sub", "mul": "mul", "div": "div",
        "floor_div": "floor_div", "rem": "rem", "pow": "pow", "max": "max", "min": "min",
        "and": "and", "or": "or", "xor": "xor", "bitand": "and", "bitor": "or", "bitxor": "xor",
        "shl": "shl", "shr": "shr", **{name: name for name in (
            "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "erfinv", "lgamma", "digamma",
            "atan2", "hypot", "erfc", "erfcx")}}
CMP = {op: f"cmp_{op}" for op in COMPARISONS}


@dataclass
class Step:
    """One VOP of a recipe: `dst = vop(*srcs)` in `dtype`; slots name group values, temporaries
    ("tmp", k) or scalars."""

    vop: str
    dtype: str
    dst: object
    srcs: list
    src_dtype: str | None = None


def recipe(node: Node) -> list[Step]:
    """The VOPs computing one ew (or full) node; ("tmp", k) slots are temporaries of the group."""
    out = node.out
    if node.kind == "full":
        return [Step("copy", device_dtype(out), out, [node.attrs["value"]])]
    if node.kind == "expand":  # broadcasting is what the operand layouts do: a copy
        return [Step("copy", device_dtype(out), out, [node.args[0]])]
    op, args = node.op, list(node.args)
    tensors = [a for a in args if isinstance(a, Value)]
    operand = device_dtype(tensors[-1]) if op == "where" else device_dtype(tensors[0])
    result = device_dtype(out)
    if op in SAME:
        if op in ("and", "or", "xor") and operand != "float32" or op in BITWISE and operand != "int32":
            raise CompileError(f"internal: {op} of {operand} operands ({node.aten})")
        return [Step(SAME[op], operand, out, args)]
    if op in CMP or op == "not":
        vop, srcs = (CMP[op], args) if op in CMP else ("cmp_eq", [args[0], 0.0 if operand != "int32" else 0])
        if operand == "float32":
            return [Step(vop, "float32", out, srcs)]
        return [Step(vop, operand, ("tmp", operand), srcs), Step("cvt", "float32", out, [("tmp", operand)], operand)]
    if op == "where":
        cond, a, b = args
        if result == "float32":
            return [Step("select", "float32", out, [cond, a, b])]
        return [Step("cvt", result, ("tmp", result), [cond], "float32"), Step("select", result, out, [("tmp", result), a, b])]
    if op == "cast":
        return _cast(args[0], out)
    raise UnsupportedOpError(node.aten, [list(t.shape) for t in tensors], node.source, f"element-wise op {op}")


def _cast(x: Value, out: Value) -> list[Step]:
    src, dst = device_dtype(x), device_dtype(out)
    if out.dtype == "bool":  # nonzero -> 1.0
        zero = 0 if src == "int32" else 0.0
        if src == "float32":
            return [Step("cmp_ne", "float32", out, [x, zero])]
        return [Step("cmp_ne", src, ("tmp", src), [x, zero]), Step("cvt", "float32", out, [("tmp", src)], src)]
    if src == dst:
        return [Step("copy", dst, out, [x])]
    return [Step("cvt", dst, out, [x], src)]


def group_steps(group: "Group") -> list[Step]:
    """The group's recipes in order, with each float32 multiply whose product only the next
    step adds to something fused into one fma (pe_ops.fma: the MAU's fvfma, one pass instead of
    two). The simulator's fma rounds the product before the add, so the values are torch's own."""
    steps = [s for n in group.nodes for s in recipe(n)]
    kept = set(group.inputs) | set(group.outputs)
    reads: dict[object, int] = {}  # every operand occurrence: p + p reads p twice
    for s in steps:
        for a in s.srcs:
            if isinstance(a, (Value, tuple)):
                reads[a] = reads.get(a, 0) + 1
    fused: list[Step] = []
    k = 0
    while k < len(steps):
        s = steps[k]
        nxt = steps[k + 1] if k + 1 < len(steps) else None
        if (nxt is not None and s.vop == "mul" and nxt.vop in ("add", "sub") and s.dtype == nxt.dtype == "float32"
                and s.src_dtype is None and nxt.src_dtype is None and s.dst not in kept and reads.get(s.dst) == 1
                and len(nxt.srcs) == 2 and any(a is s.dst for a in nxt.srcs)):
            step = _as_fma(s, nxt)
            if step is not None:
                fused.append(step)
                k += 2
                continue
        fused.append(s)
        k += 1
    return fused


def _as_fma(mul: Step, nxt: Step) -> Step | None:
    """`nxt`, an add or sub of `mul`'s product and another operand, as one fma, when a negation
    it needs falls on a number: a*b - c is a*b + (-c), c - a*b is (-a)*b + c."""
    first, second = nxt.srcs
    other = second if first is mul.dst else first
    if nxt.vop == "add":
        return Step("fma", "float32", nxt.dst, [*mul.srcs, other])
    if first is mul.dst:  # a*b - c
        return Step("fma", "float32", nxt.dst, [*mul.srcs, -other]) if _number(other) else None
    if not any(_number(f) for f in mul.srcs):  # c - a*b
        return None
    a, b = mul.srcs if _number(mul.srcs[0]) else mul.srcs[::-1]
    return Step("fma", "float32", nxt.dst, [-a, b, other])


def _number(a: object) -> bool:
    return isinstance(a, (int, float)) and not isinstance(a, bool)


def _tensor_srcs(step: Step) -> set:
    """The slots (values and temporaries, not immediates) a step reads."""
    return {a for a in step.srcs if isinstance(a, (Value, tuple))}


def _last_reads(steps: list[Step]) -> dict[object, int]:
    """The index of the last step that reads each slot."""
    return {a: k for k, s in enumerate(steps) for a in _tensor_srcs(s)}


def _read_together(steps: list[Step]) -> dict[object, set]:
    """For each slot, the other slots some step reads with it (they belong in other memories)."""
    partners: dict[object, set] = {}
    for s in steps:
        slots = _tensor_srcs(s)
        for a in slots:
            partners.setdefault(a, set()).update(slots - {a})
    return partners


@dataclass
class Group:
    """Fused element-wise nodes of one output shape: inputs from outside, outputs read outside."""

    nodes: list[Node]
    inputs: list[Value] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.nodes[0].out.shape

    @property
    def layout_dtype(self) -> str:
        """The widest device dtype of the group's tensors: its lanes decide the layout's W."""
        dtypes = {device_dtype(v) for n in self.nodes for v in [*n.inputs, n.out]}
        return "float16" if dtypes == {"float16"} else ("int32" if dtypes == {"int32"} else "float32")


def _width(v: Value) -> bool:
    """Values share a layout's lanes when they are all half or none is (float32 and int32 alike)."""
    return device_dtype(v) == "float16"


def fuse_elementwise(nodes: list[Node], users: dict[Value, list[Node]], graph_outputs: set[Value]) -> list[object]:
    """Program order as units: a Group for each set of fusable element-wise nodes, other nodes as
    they are. A node joins the open group of its shape when its tensors have the group's element
    width (one layout serves them all) and none of its operands from outside depends on the group
    (that would need the group's output first): the group stages its inputs once, computes every
    node in LM, and uploads only what others read."""
    units: list[object] = []
    open_groups: dict[tuple, int] = {}  # shape -> index of its open group in `units`
    unit_of: dict[Value, int] = {}
    needs: list[set[int]] = []  # the units each unit reads from (a group's grows as it takes nodes)

    def reaches(start: int, target: int) -> bool:
        """Whether unit `start` depends, through any chain of units, on unit `target`."""
        seen, todo = set(), [start]
        while todo:
            u = todo.pop()
            if u == target:
                return True
            if u not in seen:
                seen.add(u)
                todo += needs[u]
        return False

    for node in nodes:
        joined = None
        sources = {unit_of[a] for a in node.inputs if a in unit_of}
        if node.kind in ("ew", "full", "expand"):
            gi = open_groups.get(node.out.shape)
            if gi is not None:
                group = units[gi]
                widths = {_width(v) for v in [*node.inputs, node.out]}
                late = any(u != gi and reaches(u, gi) for u in sources)
                if not late and widths == {_width(group.nodes[0].out)}:
                    group.nodes.append(node)
                    joined = gi
            if joined is None:
                units.append(Group([node]))
                needs.append(set())
                joined = open_groups[node.out.shape] = len(units) - 1
        else:
            units.append(node)
            needs.append(set())
            joined = len(units) - 1
        needs[joined] |= sources - {joined}
        for v in node.outputs:
            unit_of[v] = joined
    for unit in units:
        if isinstance(unit, Group):
            inside = {v for n in unit.nodes for v in n.outputs}
            members = set(unit.nodes)
            for n in unit.nodes:
                for a in n.inputs:
                    if a not in inside and a not in unit.inputs:
                        unit.inputs.append(a)
                if n.out in graph_outputs or any(u not in members for u in users.get(n.out, [])):
                    unit.outputs.append(n.out)
    return _in_order(units, unit_of)


def _in_order(units: list[object], unit_of: dict[Value, int]) -> list[object]:
    """The units in an order where each comes after the producers of its inputs (a group may have
    taken a node whose other operand is made by a later unit), otherwise as they were."""
    import heapq
    needs: list[set[int]] = []
    for k, unit in enumerate(units):
        nodes = unit.nodes if isinstance(unit, Group) else [unit]
        needs.append({unit_of[a] for n in nodes for a in n.inputs if a in unit_of and unit_of[a] != k})
    waiting = [len(n) for n in needs]
    feeds: list[list[int]] = [[] for _ in units]
    for k, n in enumerate(needs):
        for j in n:
            feeds[j].append(k)
    ready = [k for k, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        k = heapq.heappop(ready)
        order.append(units[k])
        for j in feeds[k]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, j)
    if len(order) != len(units):
        stuck = [units[k] for k, w in enumerate(waiting) if w]
        raise AssertionError(f"internal: fused units depend on each other: {stuck[:3]}")
    return order


class ElementwiseKernel(Kernel):
    """A Group computed in LM layout `layout` (of the group's shape, possibly time-sliced). With
    `blocks`, operands it gathers arrive through images holding each L1B's data in a block of its
    own (transfer.staging): runs as long as the source's (a channels-last tensor's pixels) for
    more PE-stream time, so the planner times both."""

    def __init__(self, group: Group, layout: Layout, blocks: bool = False) -> None:
        self.group = group
        self.layout = layout
        self.blocks = blocks
        self.nodes = tuple(group.nodes)
        self.steps = group_steps(group)
        self.pads = {}

    @property
    def label(self) -> str:
        return self.group.nodes[-1].label

    def reads(self) -> dict[Value, Layout]:
        return {v: restrict(self.layout, v.shape or (1,)).layout for v in self.group.inputs}

    def writes(self) -> dict[Value, Layout]:
        return {v: self.layout for v in self.group.outputs}

    def least_cycles(self, ctx: EmitContext, refs: dict[Value, Ref]) -> float:
        """What its inputs' gathers take at least (`context.gather_mvs`), so that a layout whose
        inputs would arrive in single long words is not emitted to learn that it loses (ResNet-18
        at 224x224 timed relu candidates of 2.8 M cycles beside the 14,698 of the best)."""
        return (gather_mvs(ctx, refs, self.reads().items(), self.blocks) or 0) * ctx.gather_mv_cycles()

    def key(self, refs: dict[Value, Ref]) -> tuple:
        """The recipe's steps with values named by position, the layout, and where each input is."""
        names = {v: ("in", k) for k, v in enumerate(self.group.inputs)}
        names.update({n.out: ("node", k) for k, n in enumerate(self.group.nodes)})
        slot = lambda a: names.get(a, a) if isinstance(a, Value) else a  # noqa: E731
        steps = tuple((s.vop, s.dtype, slot(s.dst), tuple(slot(a) for a in s.srcs), s.src_dtype) for s in self.steps)
        shapes = tuple((v.shape, v.dtype) for v in self.group.inputs)
        stored = tuple((str(refs[v].placement.layout), refs[v].placement.dtype) for v in self.group.inputs)
        outs = tuple(names[v] for v in self.group.outputs)
        return ("ew", steps, shapes, stored, outs, str(self.layout), self.group.shape, self.blocks)

    @staticmethod
    def read_together(group: Group) -> int:
        """The most tensors one of the group's steps reads (each needs its own memory)."""
        return max((len(_tensor_srcs(s)) for s in group_steps(group)), default=1)

    @staticmethod
    def regions_of(group: Group) -> int:
        """LM regions a group's kernel needs at once: its inputs and outputs, and the most values
        computed inside it that are alive at the same time (a region is reused once its value
        has been read for the last time)."""
        steps = group_steps(group)
        kept = set(group.inputs) | set(group.outputs)
        live, most = set(), 0
        last = _last_reads(steps)
        for k, s in enumerate(steps):
            if s.dst not in kept:
                live.add(s.dst)
            most = max(most, len(live))
            live -= {slot for slot in live if last.get(slot, -1) <= k}
        return len(kept) + most

    def emit(self, ctx: EmitContext, refs: dict[Value, Ref]) -> None:
        shape = self.group.shape or (1,)
        arena = Arena(ctx.hw)
        ops: dict[object, Operand] = {}
        for v in self.group.inputs:
            ops[v] = Operand(v, restrict(self.layout, v.shape or (1,)), device_dtype(v))
        for n in self.group.nodes:
            ops[n.out] = Operand(n.out, restrict(self.layout, shape), device_dtype(n.out))
        for s in self.steps:
            if isinstance(s.dst, tuple) and s.dst not in ops:
                ops[s.dst] = Operand(None, restrict(self.layout, shape), s.dst[1])
        kept = list(dict.fromkeys([*self.group.inputs, *self.group.outputs]))  # in order: deterministic addresses
        partners = _read_together(self.steps)

        def place(slot) -> None:
            o = ops[slot]
            avoid = {ops[p].memory for p in partners.get(slot, ()) if ops[p].memory}
            o.memory, o.word = arena.alloc(o.words(ctx), avoid=avoid, strict=True)

        for slot in kept:
            place(slot)
        last = _last_reads(self.steps)
        placed: dict = {}  # slots holding a region now, in order of birth
        for k, s in enumerate(self.steps):  # values inside the group share regions as they die
            if s.dst not in kept and s.dst not in placed:
                place(s.dst)
                placed[s.dst] = True
            for slot in [slot for slot in placed if last.get(slot, -1) <= k]:
                arena.free(ops[slot].memory, ops[slot].word)
                del placed[slot]
        hazard = ctx.hw.hazards["lm_write_to_read"]
        body = ProgramBuilder(ctx.params)  # the compute of one slice: the same instructions every slice
        saved, ctx.b = ctx.b, body
        for k, s in enumerate(self.steps):
            srcs: list[Slot] = [ops[a] if isinstance(a, (Value, tuple)) else a for a in s.srcs]
            emit_step(ctx, s.vop, s.dtype, self.layout, ops[s.dst], srcs, s.src_dtype)
            if k + 1 < len(self.steps):
                ctx.b.nop(hazard)
        if not has_lanes(self.layout):  # the VOPs wrote lane 0: each output in every lane (base.fill_lanes)
            for v in self.group.outputs:
                o = ops[v]
                if ctx.hw.elements_per_lw(o.dtype) > 1:
                    ctx.b.nop(hazard)
                    fill_lanes(ctx, o.memory, o.loop(ctx).base, o.placement(ctx).slice_span, o.dtype)
        ctx.b = saved
        compute = body.build().code
        for t in range(slice_count(self.layout)):
            for v in self.group.inputs:
                o = ops[v]
                if t == 0 or o.sliced:
                    s = operand_slice(self.layout, o.restricted, t)
                    if t == 0 or s != operand_slice(self.layout, o.restricted, t - 1):
                        ctx.download(refs[v], o.placement(ctx), memory=o.memory, word=o.word, slice_index=s,
                                    blocks=self.blocks)
            ctx.b.extend(compute)
            for v in self.group.outputs:
                o = ops[v]
                ctx.upload(o.placement(ctx), refs[v], memory=o.memory, word=o.word, slice_index=t)


def wishes(user: Node, v: Value, planner) -> list[Layout]:
    """An element-wise node computes in one layout for all its operands, so it would read `v` in
    the LM layout its other operands of the same shape already lie in: a producer that computes
    there spares the group a gather, as the group's own candidates (its operands' layouts) would
    find it. A tiled pooling's gradient read back through a view by the batch-norm and relu
    gradients of a CNN's step was computed with the window's columns on the PEs where the
    activations had rows there: 131 K single-long-word MVs."""
    if user.kind != "ew" or v.shape != user.out.shape:
        return []
    found: list[Layout] = []
    for other in user.inputs:
        ref = planner.refs.get(other)
        if other is not v and other.shape == v.shape and ref is not None and ref.lm is not None \
                and ref.lm not in found:
            found.append(ref.lm)
    return found
