"""Graph rewrites before planning: primitives in the forms the kernels take.

* `matmul` with batch dimensions becomes a 2-D product (when B has none: A's batch folds into
  its rows) or a 3-D one with equal batches (both operands expanded to the broadcast batch and
  flattened);
* `conv` whose input dilation no direct form reads (`kernels.conv.direct_possible`) reads x
  spread with explicit zeros (`legalize_nn.spread_input`);
* `conv` with groups becomes, for depthwise convolutions, a dense convolution whose weight is
  block-diagonal (zeros where an output channel does not read an input channel; so an infinity
  or NaN in one input channel reaches every output channel at that pixel, as 0 * inf is NaN,
  where torch keeps it to its own), or, past DENSE_DEPTHWISE_WEIGHTS, a window over each channel
  times its filter summed over the window (vector work); and otherwise one convolution per group
  joined by a cat;
* a reduction over dims of size 1 is element-wise and a reshape (`_single_element`);
* a reduction whose kept part is small and reduced part large (a loss over a batch) is split into
  a partial reduction spread over the chip and a final one over the partials (not one whose kept
  dims do not lead over a convolution's output: `_of_a_convolution`); one that reduces
  all another reduction of its input reduces and more starts with the other's dims, so that both
  read the input in one layout;
* a product whose only use is its transpose, (A B)^T, becomes B^T A^T (autograd's weight
  gradients have this form): the transposes are views the planner reads the operands through,
  where transposing the product would move every element across lanes.

Each rewrite keeps the original output Value, so consumers and graph outputs are untouched.
"""

from __future__ import annotations

from math import ceil, prod

from hwdesc import HwDesc

from ..chain import Chain
from ..frontend.build import Builder
from ..frontend.legalize_nn import depthwise_patches, spread_input
from ..ir import Graph, Node, Value, reduction_identity
from ..kernels.base import device_dtype
from ..kernels.conv import direct_possible, reads_spread

# A reduction that keeps elements is split when it reduces this many elements per PE of the chip
# or more, and keeps fewer than one element per this many PEs (planner heuristics, not hardware
# numbers). A whole reduction splits from WHOLE_SPLIT_PARTS parts of `_least_part` up (timed on
# mncore2: a mean of 512 elements split 1,410 cycles, unsplit 1,356; of 1,024, 1,538 and 1,868).
SPLIT_REDUCED, SPLIT_KEPT, WHOLE_SPLIT_PARTS = 4, 8, 8
# A depthwise convolution runs as a dense one with a block-diagonal weight while that weight has
# at most this many elements (C = 680 at 3x3) and no more than the window path's patches (`_conv`):
# its MACs grow with C, its window path's gathers cost far more per element (32 channels of 56x56:
# 6.9 M cycles on mncore2, dense 0.61 M). Planner heuristic.
DENSE_DEPTHWISE_WEIGHTS = 1 << 22


def rewrite(graph: Graph, hw: HwDesc, options: dict | None = None) -> None:
    taken = {v.name for n in graph.nodes for v in n.outputs} | set(graph.inputs) | set(graph.outputs) | \
        {c.name for c in graph.constants}
    nodes = graph.nodes
    shared = _shared_reductions(graph)
    spread = _spread_explicitly(graph, hw, options or {})
    transposed = _transposed_products(graph)  # (found among the nodes before they are rebuilt)
    skip = set(transposed.values())
    graph.nodes = []
    b = Builder(graph, taken)
    for node in nodes:
        if node in skip:
            continue
        b.source, b.aten, b.stem, b.phase = node.source, node.aten, node.out.name, node.phase
        if node in transposed:
            _swap_product(b, node, transposed[node].out)
            continue
        if node in shared:
            _reduce_in_steps(b, node, shared[node])
            continue
        if node in spread:
            _explicit_spread(b, node)
            continue
        fn = RULES.get(node.kind)
        if fn is None or not fn(b, node, hw):
            graph.nodes.append(node)


def _spread_explicitly(graph: Graph, hw: HwDesc, options: dict) -> set[Node]:
    """The convolutions with an input dilation that no direct form of reads (grouped, strides
    unequal, or no tile and its halo fitting the PE memories). x's readers are counted as the
    planner counts them (`Graph.users`), so that both ask `direct_possible` the same question."""
    users = graph.users()
    return {node for node in graph.nodes if node.kind == "conv" and reads_spread(node) and
            (node.attrs["groups"] != 1 or not direct_possible(node, hw, options, len(users[node.args[0]])))}


def _explicit_spread(b: Builder, node: Node) -> None:
    """A convolution reading x spread by its input dilation, as one of x spread with zeros."""
    x, w = node.args
    a = node.attrs
    out = node.out
    spread = spread_input(b, x, a["input_dilation"], a["padding"], out.shape[2:], w.shape[2:], a["dilation"],
                          a["stride"])
    bind(b, b.conv(spread, w, a["stride"], (0, 0), a["dilation"], a["groups"], out.dtype), out)


def _transposed_products(graph: Graph) -> dict[Node, Node]:
    """matmul nodes in kernel form (2-D, or 3-D with one batch) whose output is only read by a
    permute that swaps its last two dimensions -> that permute."""
    users = graph.users()
    outputs = set(graph.outputs.values())
    found = {}
    for node in graph.nodes:
        if node.kind != "permute":
            continue
        src = node.args[0]
        mm = src.producer
        swap = tuple(range(src.rank - 2)) + (src.rank - 1, src.rank - 2)
        if mm is None or mm.kind != "matmul" or tuple(node.attrs["order"]) != swap or src in outputs \
                or len(users.get(src, [])) != 1:
            continue
        a, w = mm.args
        if a.rank == w.rank == src.rank and a.rank in (2, 3) and a.shape[:-2] == w.shape[:-2]:
            found[mm] = node
    return found


def _swap_product(b: Builder, mm: Node, out: Value) -> None:
    """(A B)^T computed as B^T A^T into `out`, the transpose's value."""
    a, w = mm.args
    swap = tuple(range(a.rank - 2)) + (a.rank - 1, a.rank - 2)
    y = b.matmul(b.permute(w, swap), b.permute(a, swap), out.dtype)
    if mm.attrs.get("exact"):
        y.producer.attrs["exact"] = True
    bind(b, y, out)


def _shared_reductions(graph: Graph) -> dict[Node, tuple[int, ...]]:
    """Reductions that reduce everything another reduction of the same tensor reduces and more:
    node -> the other's dims. Reduced over those first, both read the tensor in the same layout;
    apart, the first planned placed it for itself and the other gathered it (x.sum() beside
    x.amax(0) on mncore2's 1024 x 1024: the amax gathered x in single long words, 4,016,346
    cycles of the program's 4,064,304). Only when reductions alone read the tensor: an element-wise
    reader then computes in the reductions' layout, and its result may feed a whole reduction that
    is split along rows (`_reduce`), which it then reaches by a gather (x.sum(), x.amax(0) and
    x.std() of 64 x 256: 50,340 -> 139,020 cycles)."""
    users = graph.users()
    found = {}
    for node in graph.nodes:
        if node.kind != "reduce" or node.attrs.get("split"):
            continue
        x, dims = _through_reshapes(node.args[0], set(node.attrs["dims"] or range(node.args[0].rank)))
        if all(x.shape[d] == 1 for d in dims):
            continue  # one element each: element-wise (`_single_element`)
        if any(user.kind != "reduce" for user in users.get(x, []) if user is not node.args[0].producer):
            continue  # another kind of reader's layout decides too (see the docstring)
        for other in users.get(x, []):
            theirs = set(other.attrs["dims"] or range(x.rank)) if other.kind == "reduce" else set()
            if other is not node and theirs and theirs < dims:
                found[node] = tuple(sorted(theirs))
                break
    return found


def _through_reshapes(x: Value, dims: set[int]) -> tuple[Value, set[int]]:
    """(the tensor, its reduced dims): a reduction of every element of a reshape is one of its
    source's (x.view(-1).sum() is x.sum())."""
    while len(dims) == x.rank and x.producer is not None and x.producer.kind == "reshape":
        x = x.producer.args[0]
        dims = set(range(x.rank))
    return x, dims


def _reduce_in_steps(b: Builder, node: Node, first_dims: tuple[int, ...]) -> None:
    """node's reduction over `first_dims`, then over its other dims (renumbered without the first)."""
    x, dims = _through_reshapes(node.args[0], set(node.attrs["dims"] or range(node.args[0].rank)))
    partial = b.reduce(node.op, x, first_dims)
    rest = [d - sum(1 for e in first_dims if e < d) for d in sorted(dims - set(first_dims))]
    total = b.reduce(node.op, partial, rest)
    if total.shape != node.out.shape:  # keepdim
        total = b.reshape(total, node.out.shape)
    bind(b, total, node.out)


def bind(b: Builder, result: Value, original: Value) -> None:
    """Make the node that produced `result` produce `original` instead."""
    node = result.producer
    if node is None:  # the rewrite produced an existing value: copy it
        node = b.node("ew", "copy", (result,), {}, [(original.shape, original.dtype)])
        result = node.out
    outputs = list(node.outputs)
    outputs[result.index] = original
    node.outputs = tuple(outputs)
    original.producer, original.index = node, result.index


def _matmul(b: Builder, node: Node, hw: HwDesc) -> bool:
    a, w = node.args
    out = node.out
    if a.rank == w.rank and a.rank in (2, 3) and (a.rank == 2 or a.shape[0] == w.shape[0]):
        return False
    exact = node.attrs.get("exact", False)
    m, k, n = a.shape[-2], a.shape[-1], w.shape[-1]
    if w.rank == 2:  # fold A's batch into its rows
        rows = b.reshape(a, (prod(a.shape[:-1]), k))
        y = b.matmul(rows, w, out.dtype)
    else:
        batch = out.shape[:-2]
        aa = b.reshape(b.expand(a, batch + (m, k)) if a.shape[:-2] != batch else a, (prod(batch), m, k))
        ww = b.reshape(b.expand(w, batch + (k, n)) if w.shape[:-2] != batch else w, (prod(batch), k, n))
        y = b.matmul(aa, ww, out.dtype)
    if exact:
        y.producer.attrs["exact"] = True
    bind(b, b.reshape(y, out.shape), out)
    return True


def _conv(b: Builder, node: Node, hw: HwDesc) -> bool:
    groups = node.attrs["groups"]
    if groups == 1:
        return False
    x, w = node.args
    out = node.out
    n, c = x.shape[:2]
    co, cg, kh, kw = w.shape
    a = node.attrs
    ho, wo = out.shape[2:]
    dense_weights, patch_elements = co * c * kh * kw, n * co * ho * wo * kh * kw
    if cg == 1 and dense_weights <= min(DENSE_DEPTHWISE_WEIGHTS, patch_elements):
        # depthwise as a dense convolution whose weight is block-diagonal (zeros where an output
        # channel does not read an input channel): the MAU's product, not a window of patches.
        # Not when the weight, built each call, outnumbers the patches: where the batch's output
        # pixels are fewer than the channels (MobileNetV2's 240 channels at 1 x 1, batch 2: the
        # dense weight and its relayout 3.6 M cycles a layer on mncore2)
        mult = co // c
        own = b.ew("eq", b.ew("floor_div", b.iota((co, c, 1, 1), 0, "int32"), mult), b.iota((co, c, 1, 1), 1, "int32"))
        dense = b.ew("where", own, w, 0.0, dtype=w.dtype)
        bind(b, b.conv(x, dense, a["stride"], a["padding"], a["dilation"], 1, out.dtype), out)
        return True
    if cg == 1:  # depthwise: each output channel filters one input channel
        patches = depthwise_patches(b, x, co, ((kh, kw), a["stride"], a["padding"], a["dilation"], (ho, wo)))
        filt = b.reshape(b.permute(b.reshape(w, (co, kh, kw)), (1, 2, 0)), (1, 1, 1, kh, kw, co))
        y = b.reduce("sum", b.ew("mul", patches, b.cast(filt, patches.dtype)), (3, 4))  # (N, Ho, Wo, C)
        bind(b, b.cast(b.permute(y, (0, 3, 1, 2)), out.dtype), out)
        return True
    parts = []
    xs = b.split(x, [c // groups] * groups, 1)
    ws = b.split(w, [co // groups] * groups, 0)
    for xg, wg in zip(xs, ws):
        parts.append(b.conv(xg, wg, a["stride"], a["padding"], a["dilation"], 1, out.dtype))
    bind(b, b.cat(parts, 1), out)
    return True


def _least_part(hw: HwDesc, x: Value) -> int:
    """Elements a PE's part of a split reduction holds at least: one unit of the Data Engines'
    DRAM -> L2 transfer. Smaller parts spend more on staging each PE's few long words than on
    reducing them (128 x 128 summed over all 4,096 PEs of mncore2, 4 elements each: 32,818 cycles;
    in parts of a 64-LW unit: 2,682)."""
    chain = Chain.of(hw)
    unit = hw.transfers[chain.dram_to_l2].modes["individual"].unit_lw or 1
    return unit * hw.elements_per_lw(device_dtype(x))


def _aligned_part(shape: list[int], least: int) -> int | None:
    """The smallest part of at least `least` elements made of whole trailing dimensions of
    `shape` and a divisor of the next one, so that cutting the reduced elements into such parts
    splits one dimension and pads nothing (8 x 32 x 48 in parts of 4 x 48: the input read as it
    is; in parts of 128 it was relaid, 142,026 cycles for a sum of 12,288 elements). None when
    the only such part is everything, which leaves nothing to split."""
    trailing = 1
    for n in reversed(shape):
        if trailing * n >= least:
            part = trailing * next(k for k in range(1, n + 1) if n % k == 0 and trailing * k >= least)
            return part if part < prod(shape) else None
        trailing *= n
    return None


def _reduce(b: Builder, node: Node, hw: HwDesc) -> bool:
    """sum/max/min(x, dims) with many reduced and few kept elements: the reduced elements are cut
    into (parts, rest) and reduced in two steps, so that the first step runs on as many PEs as
    there are parts, each holding at least `_least_part`. Parts along the dimensions
    (`_aligned_part`) where they exist, else the reduced elements flat, padded with the identity."""
    if node.attrs.get("split"):
        return False
    if _single_element(b, node):
        return True
    x, reduced = _through_reshapes(node.args[0], set(node.attrs["dims"] or range(node.args[0].rank)))
    dims = tuple(sorted(reduced))
    kept = [d for d in range(x.rank) if d not in dims]
    reduced = prod(x.shape[d] for d in dims)
    pes = prod(hw.axes.values())
    kept_n = prod(x.shape[d] for d in kept)
    epl = hw.elements_per_lw("float32")
    # a whole reduction (nothing kept) runs on one PE unsplit; one with kept elements already
    # spreads over as many PEs, and splits only when much larger
    least_part = _least_part(hw, x)
    threshold = WHOLE_SPLIT_PARTS * least_part if kept_n == 1 else SPLIT_REDUCED * pes
    if reduced < threshold or kept_n * SPLIT_KEPT > pes:
        return False
    if kept != list(range(len(kept))) and _of_a_convolution(x):
        return False
    max_parts = max(1, pes // max(1, kept_n))
    least = max(least_part, ceil(reduced / max_parts))
    order = kept + list(dims)
    moved = b.permute(x, order) if order != list(range(x.rank)) else x
    rest = _aligned_part([x.shape[d] for d in dims], least)
    if rest is not None:  # a reshape that only splits one dimension: a view of x
        grid = b.reshape(moved, (kept_n, reduced // rest, rest))
    else:
        parts = max(1, min(max_parts, reduced // least_part))
        rest = ceil(ceil(reduced / parts) / epl) * epl
        flat = b.reshape(moved, (kept_n, reduced))
        padded = b.pad(flat, [(0, 0), (0, parts * rest - reduced)], reduction_identity(node.op, x.dtype))
        grid = b.reshape(padded, (kept_n, parts, rest))
    partial = b.reduce(node.op, grid, [2])
    partial.producer.attrs["split"] = True
    total = b.reduce(node.op, partial, [1])
    total.producer.attrs["split"] = True
    keep_shape = node.out.shape
    bind(b, b.reshape(total, keep_shape), node.out)
    return True


def _of_a_convolution(x: Value) -> bool:
    """Whether x is a convolution's output, or an element-wise function of one of its shape (a
    ReLU's, its gradient's). Its layout pads the pixels (a direct form's rows) and keeps the
    channels in the lanes, so a split that moves its kept channels to the front copies it twice:
    a BatchNorm's statistics or a bias gradient, the sum over (N, H, W) of relu(conv(x)) for x of
    16 x 64 x 56 x 56, took 24,064,442 cycles on mncore2 split and 2,337,758 whole."""
    reach, seen = [x], {x}
    for v in reach:
        node = v.producer
        if node is not None and node.kind == "conv":
            return True
        if node is not None and node.kind == "ew":
            new = [u for u in node.inputs if u.shape == x.shape and u not in seen]
            seen.update(new)
            reach.extend(new)
    return False


def _single_element(b: Builder, node: Node) -> bool:
    """A reduction over dims of size 1 (a cross-entropy's gradient scatters into (N, 1, C) and sums
    the 1 away) reduces one element each: it becomes element-wise, computed wherever its readers
    want it, and a reshape, where a reduction kernel chose a layout of its own (a tied embedding's
    step on mncore2 then gathered the scattered gradient in 131,072 single long words). A float
    sum adds its element to +0 as torch's does (-0 sums to +0); max, min and prod give it as it is."""
    x = node.args[0]
    dims = node.attrs["dims"] or range(x.rank)
    if not x.rank or any(x.shape[d] != 1 for d in dims):
        return False
    if node.op == "sum" and x.dtype.startswith("float"):
        one = b.ew("add", x, 0.0)
    else:
        one = b.ew("copy", x)
    bind(b, b.reshape(one, node.out.shape) if node.out.shape != x.shape else one, node.out)
    return True


RULES = {"matmul": _matmul, "conv": _conv, "reduce": _reduce}
