"""Element-wise ops (with torch broadcasting): each is a short recipe of PE vector ops.

A recipe is a list of steps `(op, a, b, c)` over operand slots: an input tensor ("in", i), a
scalar immediate, or the output itself ("out"), which doubles as the temporary of multi-step
recipes (clamp = max then min, a - alpha*b = mul then sub). The kernel iterates in the output's
layout; inputs come in the layouts `plan.restrict` derives from it.
"""

from __future__ import annotations

from typing import Any

from ..codegen import CodeGen
from ..errors import LayoutError, UnsupportedOpError
from ..frontend.graph import Node, Value
from ..plan import choose, per_pe, restrict, slice_count
from . import lowering
from .kernel import Tensor, allocate, download_slice, lm_placement, lshape, new_output, operand, ref_of, usable_for
from .loops import Operand as LoopOperand
from .loops import emit_vops, nest

OUT = ("out",)
Step = tuple[str, Any, Any, Any]

UNARY = {"neg": "neg", "relu": "relu", "exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt",
         "reciprocal": "reciprocal", "abs": "abs", "sigmoid": "sigmoid", "tanh": "tanh", "erf": "erf",
         "floor": "floor", "expand": "copy"}
BINARY = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "maximum": "max", "minimum": "min",
          "gt": "cmp_gt", "ge": "cmp_ge", "lt": "cmp_lt", "le": "cmp_le", "eq": "cmp_eq", "ne": "cmp_ne"}


def _arg(a: Any, tensors: list[Value]) -> Any:
    if isinstance(a, Value):
        if a not in tensors:
            tensors.append(a)
        return ("in", tensors.index(a))
    if isinstance(a, bool):
        return float(a)
    if isinstance(a, (int, float)):
        return float(a)
    return a


def recipe(node: Node) -> tuple[list[Step], list[Value]]:
    """The steps computing `node` and its tensor inputs, in slot order."""
    base, _, variant = node.op.partition(".")
    args, kw = node.args, node.kwargs
    tensors: list[Value] = []
    a = lambda x: _arg(x, tensors)  # noqa: E731
    if base in UNARY:  # expand is a copy that broadcasts its input to the output's shape
        return [(UNARY[base], a(args[0]), None, None)], tensors
    if base in ("add", "sub") and len(args) >= 2:
        alpha = kw.get("alpha", args[2] if len(args) > 2 else 1)
        x, y = a(args[0]), a(args[1])
        if alpha == 1:
            return [(base, x, y, None)], tensors
        if isinstance(y, float):
            return [(base, x, y * alpha, None)], tensors
        return [("mul", y, float(alpha), None), (base, x, OUT, None)], tensors
    if base == "rsub":
        alpha = kw.get("alpha", args[2] if len(args) > 2 else 1)
        x, y = a(args[0]), a(args[1])
        if alpha == 1:
            return [("sub", y, x, None)], tensors
        return [("mul", x, float(alpha), None), ("sub", y, OUT, None)], tensors
    if base in BINARY and len(args) == 2:
        return [(BINARY[base], a(args[0]), a(args[1]), None)], tensors
    if base == "clamp" or base == "clamp_min" or base == "clamp_max":
        x = a(args[0])
        lo = args[1] if base != "clamp_max" and len(args) > 1 else kw.get("min")
        hi = (args[2] if len(args) > 2 else kw.get("max")) if base == "clamp" else (args[1] if base == "clamp_max" else None)
        steps: list[Step] = []
        if lo is not None:
            steps.append(("max", x, a(lo), None))
        if hi is not None:
            steps.append(("min", OUT if steps else x, a(hi), None))
        return steps or [("copy", x, None, None)], tensors
    if base == "pow" and variant == "Tensor_Scalar":
        x, e = a(args[0]), float(args[1])
        special = {2.0: ("mul", x, x, None), 1.0: ("copy", x, None, None), 0.5: ("sqrt", x, None, None),
                   -0.5: ("rsqrt", x, None, None), -1.0: ("reciprocal", x, None, None)}
        return [special.get(e, ("pow", x, e, None))], tensors
    if base == "where" and variant in ("self", "ScalarSelf", "ScalarOther", "Scalar"):
        return [("select", a(args[0]), a(args[1]), a(args[2]))], tensors
    if base == "logical_not":
        return [("cmp_eq", a(args[0]), 0.0, None)], tensors
    if base in ("full", "scalar_tensor"):
        value = args[1] if base == "full" else args[0]
        return [("copy", float(value), None, None)], tensors
    if base in ("_to_copy", "to"):
        src = args[0]
        if src.dtype == node.out.dtype or {src.dtype, node.out.dtype} <= {"float32", "bool"}:
            return [("copy", a(src), None, None)], tensors
        return [("cvt", a(src), None, None)], tensors
    raise UnsupportedOpError(node.op, [list(v.shape) for v in node.inputs], node.source)


OPS = [f"{op}.default" for op in UNARY] + [f"{op}.{v}" for op in BINARY for v in ("Tensor", "Scalar")] + [
    "rsub.Scalar", "rsub.Tensor", "clamp.default", "clamp.Tensor", "clamp_min.default", "clamp_max.default",
    "pow.Tensor_Scalar", "where.self", "where.ScalarSelf", "where.ScalarOther", "where.Scalar", "logical_not.default",
    "full.default", "scalar_tensor.default", "_to_copy.default", "maximum.default", "minimum.default"]


IDENTITY = {("mul", 1.0), ("div", 1.0), ("add", 0.0), ("sub", 0.0)}


def is_identity(steps: list[Step], inputs: list[Value], out: Value) -> bool:
    """x * 1, x / 1, x + 0, x - 0 (decompositions leave them, e.g. addmm's alpha and beta)."""
    if len(steps) != 1 or len(inputs) != 1:
        return False
    op, a, b, _ = steps[0]
    x = inputs[0]
    return (op, b) in IDENTITY and a == ("in", 0) and x.shape == out.shape and x.dtype == out.dtype


@lowering(*OPS)
def lower_elementwise(cg: CodeGen, node: Node) -> None:
    steps, inputs = recipe(node)
    out = node.out
    if is_identity(steps, inputs, out):
        from .views import alias
        alias(cg, out, inputs[0])
        return
    dtype = cg.device_dtype(out)
    mixed = {cg.device_dtype(v) for v in inputs} - {dtype}
    if mixed and steps[0][0] != "cvt":
        raise UnsupportedOpError(node.op, [list(v.shape) for v in node.inputs], node.source,
                                 f"operands of dtypes {sorted(mixed | {dtype})} in one element-wise op")
    budget = (cg.hw.memory_lw("LM0") + cg.hw.memory_lw("LM1")) // (len(inputs) + 1)
    prefer = [_known_lm(cg, v) for v in inputs if lshape(v) == lshape(out) and _known_lm(cg, v) is not None]
    if out in cg.wishes:
        prefer.insert(0, cg.wishes[out])
    def operands_stage(layout) -> bool:
        try:
            return all(usable_for(cg, v, restrict(layout, lshape(v)).layout) for v in inputs)
        except LayoutError:  # an operand's copies that no layout describes
            return False
    layout = choose(lshape(out), dtype, cg.hw, budget_lw=budget, prefer=prefer, accept=operands_stage)
    result = Tensor(out, operand(cg, out, layout).restricted, dtype)
    operands = [operand(cg, v, layout) for v in inputs]
    allocate(cg, [result, *operands])
    refs = [ref_of(cg, t.value, t.layout) for t in operands]
    out_ref = new_output(cg, out, layout)
    sizes = [s for s, _ in per_pe(layout, cg.hw.elements_per_lw(dtype))]
    for t in range(slice_count(layout)):
        for k, (tensor, ref) in enumerate(zip(operands, refs)):
            if t == 0 or tensor.sliced:
                download_slice(cg, tensor, ref, t)
        emit_recipe(cg, steps, result, operands, sizes)
        cg.upload(lm_placement(cg, layout, dtype), out_ref, memory=result.memory, word=result.word, slice_index=t)


def _known_lm(cg: CodeGen, v: Value):
    ref = cg.refs.get(v)
    return ref.lm if ref is not None else None


def emit_recipe(cg: CodeGen, steps: list[Step], result: Tensor, operands: list[Tensor], sizes: list[int]) -> None:
    """Emit the VOPs of a recipe over the output's loop nest (the output is the loop's walker)."""
    out_op = result.loop_operand(cg)
    ins = [t.loop_operand(cg) for t in operands]
    hazard = cg.hw.hazards["lm_write_to_read"]
    for k, (op, *srcs) in enumerate(steps):
        slots = [out_op if s == OUT else (ins[s[1]] if isinstance(s, tuple) else s) for s in srcs]
        tensors = [s for s in slots if isinstance(s, LoopOperand)]
        loops, strides = nest(sizes, list(out_op.strides), *[list(s.strides) for s in tensors])
        moved = iter(strides[1:])
        placed = [LoopOperand(s.memory, s.base, next(moved)) if isinstance(s, LoopOperand) else s for s in slots]
        dst = LoopOperand(out_op.memory, out_op.base, strides[0])
        src_dtype = operands[srcs[0][1]].dtype if op == "cvt" else None
        emit_vops(cg.b, op, result.dtype, loops, dst, *placed, src_dtype=src_dtype)
        if k + 1 < len(steps):
            cg.b.nop(hazard)
