"""The planner: the whole graph at once, before any instruction is emitted.

Nodes are planned in program order (element-wise runs fused into groups first). For each, the
kernels of its kind propose candidates (layouts, tilings); each candidate is emitted into a
scratch context with the inputs where they are, and timed on the simulator's rules; the fastest
is kept. What that implies is recorded: where its outputs are stored (the images of the LM
layouts it computes them in), and where graph inputs and constants it is the first to read are
placed (as it wants them: the host arranges uploads in any layout).

An input stored in a layout the kernel cannot stage from (its lanes would have to move) gets a
relayout step first, so composing ops never fails for want of a layout. Views of values not yet
placed wait for their first consumer, which places the base so that the view is what it wants.
Output constraints (io_spec_constraints) are met by the layout that produces them or by a
relayout at the end; every output gets a buffer of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Callable, Iterable

from hwdesc import HwDesc
from sim.builder import InstructionLimit

from ..errors import CompileError, LayoutError, SpecMismatchError, UnsupportedOpError
from ..iospec import IOSpec
from ..ir import Graph, Node, Value
from ..kernels import plan_kernels, reads_as_is
from ..kernels.base import Kernel, device_dtype
from ..kernels.context import Buffer, EmitContext, Ref, lane_compatible
from ..kernels.conv import im2col_mvs, nhwc_layout
from ..kernels.elementwise import ElementwiseKernel, Group, fuse_elementwise
from ..kernels.movement import GatherKernel, view_ref, view_transform
from ..kernels.reduce import in_pe, local_runs
from ..kernels.operands import restrict
from ..kernels.relayout import RelayoutKernel, lane_matched
from ..layout import W_AXIS, Layout, Placement, lane_dims, lanes_innermost
from ..layout.part import part_layout
from ..layout.spread import lane_runs, lm_layouts
from ..layout.unbroadcast import spread_over_units
from ..transfer.gather import lw_sources
from ..transfer.host import host_transfer
from ..transfer.separable import GatherTooLarge
from ..transfer.sources import LaneMismatch
from ..transfer.staging import stage
from .cost import cycles_of
from .plan import Plan, Step


@dataclass
class Pending:
    """A view of a value nobody has placed yet: placed when a consumer wants the view somewhere."""

    base: Value
    to_base: Callable[[Layout], Layout | None]
    to_view: Callable[[Layout], Layout | None]
    node: Node


ROLE = {"input": "input", "const": "const", "node": "temp"}


class NeedsRelay(Exception):
    """A candidate whose input would have to be relaid first (refused in the first round)."""


class OverBudget(Exception):
    """A candidate whose program passes TIMED_INSTRUCTIONS while a timed one exists."""


# Once a candidate is timed, another whose program (a kernel, or one of its relayouts) passes this
# many instructions is dropped instead of timed: the planner emits what it times, and a relayout of
# a large tensor in single long words took 15 GB of host memory to build for a GPT-2 LM head
# (50,257 x 768) that did not need it. A compile-time budget, not a hardware number.
TIMED_INSTRUCTIONS = 1_000_000
CANDIDATE_LAYOUTS = 6  # iteration / output layouts the planner times per node (compile-time budget)
# A candidate whose own estimate exceeds this many times the fastest timed kernel is not timed:
# kernels' estimates stay within this factor of their timing (tests/compiler/test_planner_properties.py
# checks it), so such a candidate cannot be the fastest alone. It is timed still when that bound plus
# what its output costs its readers (`meet_cycles`) is below the best candidate's whole cost: a tied
# LM head's product whose reductions read its output where it lies, 218,682 cycles alone against the
# fastest's 83,564, spares them 146,242 cycles of relayout each. A compile-time budget, not a hardware
# number.
ESTIMATE_SLACK = 2.0
# A kernel whose `least_cycles` (a lower bound, never above its timing) already passes what it must
# beat is not emitted: exact, only faster (ResNet-18 at 224x224: its candidates' timing 17.6 -> 10.8 s
# of CPU). False times them anyway (tests/compiler/test_planner_properties.py checks the bounds).
SKIP_BY_BOUNDS = True
# Candidates of a kind whose timings cluster (`Kernel.stops_when_stale`: convolutions) are timed in
# rank order until STALE_CANDIDATES in a row have bettered the best by less than STALE_GAIN of it;
# the rest of that round (those that read their inputs as they lie, then those that relay one
# first) is left untimed. A CNN training step's weight gradients timed 25 and 29 im2col candidates,
# 0.2-2.2 s each, the last twenty within 2 % of each other. For products the ranking misses too
# often (a GPT-2 training step: 4,447,316 -> 6,078,646 cycles). A compile-time budget, not a
# hardware number.
STALE_CANDIDATES = 8
STALE_GAIN = 0.01


@dataclass(frozen=True)
class PlannerState:
    """What planning a node changes in the Planner, to try two ways of planning one and keep the
    faster (`Planner.plan_reduce`)."""

    refs: dict
    pending: dict
    buffers: dict
    owner: dict
    steps: list
    copies: dict
    clean: set
    relied_clean: set

    def cycles_since(self, earlier: "PlannerState") -> int:
        """The cycles of the steps planned after `earlier`."""
        return sum(step.cycles or 0 for step in self.steps[len(earlier.steps):])


class Planner:
    def __init__(self, graph: Graph, hw: HwDesc, options: dict, constraints: dict[str, IOSpec]) -> None:
        self.graph, self.hw, self.options = graph, hw, options
        self.ctx = EmitContext(hw, options)  # for placements and the chain, never emitted into
        self.refs: dict[Value, Ref] = {}
        self.pending: dict[Value, Pending] = {}
        self.buffers: dict[str, Buffer] = {}
        self.owner: dict[str, Value] = {}
        self.steps: list[Step] = []
        self.users = graph.users()
        self.outputs = set(graph.outputs.values())
        self.updated_state = {graph.outputs[out]: graph.inputs[n] for n, out in graph.update_outputs().items()}
        self.updated_inputs = set(graph.update_outputs())
        self.constraints = constraints
        self.output_wishes: dict[Value, Layout] = {}
        self.costs: dict[object, int] = {}
        self.wish_cache: dict[Value, list[tuple[Node, list[Layout]]]] = {}
        self.window_cache: dict[tuple[Node, str], float] = {}  # (convolution, x's layout) -> extra MVs
        self.clean: set[str] = set()  # buffers whose padding is known to hold zeros
        # resident inputs the program reads as if their padding held zeros (the runtime keeps the
        # copies it binds so: `Compiled.clean_inputs`), and those each candidate would (by kernel)
        self.relied_clean: set[str] = set()
        self.relying: dict[int, set[str]] = {}
        self.provisional: dict[Value, Ref] = {}  # what the candidate being prepared has placed so far
        # the copies relays have made of each value (with whether their padding holds zeros): a
        # later reader that wants the value where a copy lies reads that copy
        self.copies: dict[Value, list[tuple[Ref, bool]]] = {}

    # ---- the whole graph ----------------------------------------------------------------------

    def plan(self) -> Plan:
        self._apply_constraints()
        for unit in fuse_elementwise(self.graph.nodes, self.users, self.outputs):
            self.plan_unit(unit)
        in_symbols = {name: self.place_default(v).symbol for name, v in self.graph.inputs.items()}
        out_symbols = self._finish_outputs(set(in_symbols.values()))
        return Plan(self.graph, self.hw, self.options, self.refs, self.buffers, self.steps, in_symbols, out_symbols,
                    self.owner, frozenset(self.relied_clean))

    def plan_unit(self, unit: object) -> None:
        if isinstance(unit, Group):
            self.plan_group(unit)
            return
        node: Node = unit
        if node.kind in ("reshape", "permute"):
            self.plan_view(node)
        elif node.kind == "expand":
            self.plan_group(Group([node], list(node.inputs), [node.out]))
        elif node.kind in ("slice", "pad", "window", "cat", "split"):
            self.plan_movement(node)
        elif node.kind == "iota":
            self.plan_iota(node)
        elif node.kind == "reduce":
            self.plan_reduce(node)
        else:
            candidates = plan_kernels(node, self)
            self.choose(candidates, node)

    # ---- placing values ---------------------------------------------------------------------

    def symbol_for(self, v: Value) -> str:
        stem = f"{ROLE[v.kind]}:{v.name}"
        symbol, k = stem, 1
        while symbol in self.buffers:
            symbol, k = f"{stem}#{k}", k + 1
        return symbol

    def uploaded_clean(self, v: Value, role: str | None = None) -> bool:
        """Whether `v`'s buffer holds zeros in its padding when the program starts: a constant or a
        call's input, which the host uploads so, or a resident tensor the program does not update:
        another program may have written it, but a program that reads it as clean says so
        (`relied_clean`), and the runtime binds it a copy whose padding it zeroed if need be
        (runtime.resident). A tensor the program updates is written by this very program."""
        role = role or ROLE[v.kind]
        return role == "const" or role == "input" and (v.name not in self.graph.resident or self.clean_resident(v))

    def clean_resident(self, v: Value) -> bool:
        """Whether `v` is a resident input this program reads and never writes."""
        return v.kind == "input" and v.name in self.graph.resident and v.name not in self.updated_inputs

    def residents_behind(self, ref: Ref, placed: list[tuple[Value, Ref]]) -> set[str]:
        """The resident inputs (read, never written) whose buffer `ref` reads."""
        owners = [w for w, r in placed if r.symbol == ref.symbol]
        if ref.symbol in self.owner:
            owners.append(self.owner[ref.symbol])
        return {w.name for w in owners if self.clean_resident(w)}

    def known_clean(self, ref: Ref, placed: list[tuple[Value, Ref]]) -> bool:
        """Whether `ref`'s padding is known to hold zeros: a buffer marked so, or one the candidate
        being prepared places for an uploaded value (`placed`)."""
        return ref.symbol in self.clean or any(r.symbol == ref.symbol and self.uploaded_clean(w) for w, r in placed)

    def register(self, v: Value, ref: Ref, role: str | None = None) -> Ref:
        role = role or ROLE[v.kind]
        if self.uploaded_clean(v, role):
            self.clean.add(ref.symbol)
        data = v.data.reshape(v.shape or (1,)) if v.kind == "const" else None
        self.buffers[ref.symbol] = Buffer(ref.symbol, role, ref.placement, v.name, data, ref.lm)
        self.owner[ref.symbol] = v
        self.refs[v] = ref
        return ref

    def host_written(self, v: Value) -> bool:
        """Whether `v` is (a view of) a tensor the host writes and the program does not, an input
        or constant outside graph.updates, that only products read (matmuls, or convolutions as
        their weight): its copies over the Groups
        are then stored spread over their DRAMs (`tentative`; transfer.staging._spread), which a
        product fetches by distributed broadcast at half the Data Engine time on MN-Core 2. Any
        other reader would gather from it, in blocks spread over the Groups (an embedding's rows
        looked up by index cost twice as much so)."""
        while v in self.pending:
            v = self.pending[v].base
        return v.kind in ("input", "const") and v.name not in self.graph.updates and \
            all(u.kind == "matmul" or (u.kind == "conv" and read is u.args[1])
                for u, read in self._readers_through_views(v))

    def _readers_through_views(self, v: Value) -> list[tuple[Node, Value]]:
        """The nodes that read `v` or a reshape or permute of it (the views the planner places
        without moving data), each with the value it reads."""
        found = []
        for user in self.users.get(v, []):
            if user.kind in ("reshape", "permute"):
                found += self._readers_through_views(user.out)
            else:
                found.append((user, v))
        return found

    def unplaced(self, v: Value) -> bool:
        return v not in self.refs and (v in self.pending or v.kind in ("input", "const"))

    def tentative(self, v: Value, wanted: Layout | None) -> tuple[Ref, list[tuple[Value, Ref]], list[Step]]:
        """Where `v` would be if a kernel that wants it in LM layout `wanted` read it now, the
        values that would be placed for that (graph inputs, constants, pending views), and the
        steps that would make it (a view its base's layout cannot express is gathered), not yet
        timed (`price`)."""
        if v in self.refs:
            return self.refs[v], [], []
        if v in self.provisional:  # placed by an earlier operand of the same candidate
            return self.provisional[v], [], []
        if v in self.pending:
            p = self.pending[v]
            base_layout = p.to_base(wanted) if wanted is not None else None
            if base_layout is not None and not lanes_innermost(base_layout) and len(self.users.get(p.base, [])) > 1:
                # the view's layout seen from its base packs lanes that are not the innermost digit
                # of a dimension: no relayout starts from that, so the base's other readers could
                # not get it (x.sum() beside x.amax(0)); the base takes a layout of its own
                base_layout = None
            base_ref, placed, steps = self.tentative(p.base, base_layout)
            ref = view_ref(base_ref, p.to_view)
            if ref is not None:
                return ref, placed + [(v, ref)], steps
            layout = wanted if wanted is not None and self._stageable(wanted, v) else self.default_layout(v)
            kernel = self.movement_kernel(p.node, {p.node.out: layout}, {p.base: base_ref})
            ref = Ref(self.symbol_for(v), stage(self.ctx.lm_placement(layout, device_dtype(v))).dram, layout)
            refs = {p.base: base_ref, v: ref}
            return ref, placed + [(v, ref)], steps + [Step(kernel, refs, None, (p.base,), (v,))]
        if v.kind in ("input", "const"):
            layout = wanted if wanted is not None and self._stageable(wanted, v) else self.default_layout(v)
            # what the host writes and the program does not is stored for the cheapest read: copies
            # over the Groups spread over their DRAMs (transfer.staging._spread)
            ref = Ref(self.symbol_for(v), stage(self.ctx.lm_placement(layout, device_dtype(v)),
                                                spread=self.host_written(v)).dram, layout)
            return ref, [(v, ref)], []
        raise CompileError(f"internal: {v!r} is read before it is computed")

    def movement_kernel(self, node: Node, layouts: dict[Value, Layout], refs: dict[Value, Ref]) -> Kernel:
        """The Data Engines' gather of a movement node into `layouts`, or the PEs' when lanes move."""
        from ..kernels.movement import source_maps
        kernel = GatherKernel(node, layouts, source_maps(node))
        if kernel.feasible(self.ctx, {**refs, **{out: None for out in layouts}}):
            return kernel
        return RelayoutKernel.of_movement(node, layouts[node.out])

    def _stageable(self, layout: Layout, v: Value) -> bool:
        try:
            stage(self.ctx.lm_placement(layout, device_dtype(v)))
            return layout.shape == (v.shape or (1,))
        except Exception:
            return False

    def default_layout(self, v: Value) -> Layout:
        return lm_layouts(v.shape or (1,), device_dtype(v), self.hw, self.budget(2))[0]

    def place_default(self, v: Value) -> Ref:
        if v in self.refs:
            return self.refs[v]
        ref, placed, steps = self.tentative(v, None)
        self.commit_steps(steps)
        self.commit_placed(placed)
        return self.refs[v]

    def commit_steps(self, steps: list[Step]) -> None:
        """Steps that make inputs of a chosen kernel (relayouts, gathered views): their outputs get
        buffers."""
        for step in steps:
            self.price(step)
            if getattr(step.kernel, "zero_pad", False):  # marked here, not when a candidate is prepared:
                # relay buffers of candidates that lose can share a name with the winner's
                self.clean.update(step.refs[out].symbol for out in step.writes)
            for out in step.writes:
                ref = step.refs[out]
                self.buffers[ref.symbol] = Buffer(ref.symbol, "temp", ref.placement, out.name, None, ref.lm)
                self.owner[ref.symbol] = out
            if isinstance(step.kernel, RelayoutKernel) and step.kernel.node is None:  # a relay: a copy of its source
                copy = step.refs[step.kernel.out]
                self.copies.setdefault(step.kernel.source, []).append((copy, step.kernel.zero_pad))
            self.steps.append(step)

    def copy_of(self, v: Value, target: Placement, zero_pad: bool) -> Ref | None:
        """A committed relay's copy of `v` stored as `target` (one whose padding holds zeros when
        `zero_pad`), if any: readers of a value in one layout share its relayout (a log-softmax's
        maximum, its exponentials' sum and the loss's pick all read the logits row by row; each
        relaid them, 136,738 cycles a copy on mncore2 for 256 x 512)."""
        return next((copy for copy, clean in self.copies.get(v, ())
                     if (clean or not zero_pad) and copy.placement.same_placement(target)), None)

    def commit_placed(self, placed: Iterable[tuple[Value, Ref]]) -> None:
        for v, ref in placed:
            if v in self.pending:
                self.refs[v] = ref
                del self.pending[v]
            elif v not in self.refs:
                self.register(v, ref)

    def budget(self, tensors: int, together: int = 1) -> int:
        """LM long words per PE each of `tensors` operands of one kernel may use: the largest
        region size of which that many fit the PE memories, each region inside one memory, with
        `together` of them in distinct memories (the operands one instruction reads together: it
        reads each memory with one address pattern)."""
        capacities = [self.hw.memory_lw(m) for m in self.ctx.chain.scratch]
        align = max(1, self.hw.long_word_bytes // self.hw.word_bytes)  # regions start on 2-word boundaries
        low, high = 1, max(1, sum(capacities) // max(1, tensors))
        while low < high:  # the largest size that still packs
            mid = (low + high + 1) // 2
            holding = [c // (mid + align) for c in capacities]
            if sum(holding) >= tensors and sum(h > 0 for h in holding) >= min(together, len(capacities)):
                low = mid
            else:
                high = mid - 1
        return low

    # ---- choosing among candidates ------------------------------------------------------------

    def prepare(self, kernel: Kernel, allow_relay: bool = True
                ) -> tuple[dict[Value, Ref], list[Step], list[tuple[Value, Ref]]]:
        """The refs a candidate would read and write, the relayout steps its inputs would need, and
        the values it would place. Without `allow_relay`, a candidate that needs one is refused.
        The steps are not timed yet (`price`): most candidates lose before their relayouts matter."""
        self.provisional = {}
        try:
            return self._prepare(kernel, allow_relay)
        finally:
            self.provisional = {}

    def _prepare(self, kernel: Kernel, allow_relay: bool
                 ) -> tuple[dict[Value, Ref], list[Step], list[tuple[Value, Ref]]]:
        refs: dict[Value, Ref] = {}
        pre: list[Step] = []
        placed: list[tuple[Value, Ref]] = []
        relying = self.relying[id(kernel)] = set()

        def relay(v: Value, ref: Ref, layout: Layout | None, target: Placement, zero_pad: bool = False) -> Ref:
            made = self.copy_of(v, target, zero_pad)
            if made is not None:
                return made
            if not allow_relay:
                raise NeedsRelay(v.name)
            relayout = RelayoutKernel(v, layout, target=target, zero_pad=zero_pad)
            copy = Ref(f"temp:{v.name}@{len(self.steps)}.{len(pre)}", target, layout)
            step_refs = {v: ref, relayout.out: copy}
            pre.append(Step(relayout, step_refs, None, (v,), (relayout.out,)))
            return copy  # (its padding is known zero once committed: commit_steps)

        for v, layout in kernel.reads().items():
            ref, more, made = self.tentative(v, layout)
            placed += more
            self.provisional.update(more)
            pre += made
            wanted = stage(self.ctx.lm_placement(layout, device_dtype(v))).dram
            index = kernel.gather_index(v) if hasattr(kernel, "gather_index") else None
            clean = self.known_clean(ref, more)
            if hasattr(kernel, "padding_known"):
                kernel.padding_known(v, clean)
            sums_padding = hasattr(kernel, "sums_lane_padding") and kernel.sums_lane_padding(v, layout)
            if clean and (kernel.reads_padding(v, ref) if hasattr(kernel, "reads_padding") else sums_padding):
                relying |= self.residents_behind(ref, more)
            if sums_padding and not clean:
                refs[v] = relay(v, ref, layout, wanted, zero_pad=True)  # (see MatmulKernel.sums_lane_padding)
            elif ref.placement.same_placement(wanted) or lane_compatible(wanted, ref.placement, index):
                refs[v] = ref
            else:
                refs[v] = relay(v, ref, layout, wanted)
        for v in getattr(kernel, "sources", lambda: [])():
            want = kernel.source_placement(v, self.ctx) if hasattr(kernel, "source_placement") else None
            ref, more, made = self.tentative_dram(v, want)
            placed += more
            self.provisional.update(more)
            pre += made
            clean = self.known_clean(ref, more)
            if hasattr(kernel, "padding_known"):
                kernel.padding_known(v, clean)
            if hasattr(kernel, "source_ok") and not kernel.source_ok(v, ref, self.ctx, clean):
                ref = relay(v, ref, None, want, zero_pad=True)
            elif clean and ((hasattr(kernel, "reads_padding") and kernel.reads_padding(v, ref)) or
                            (hasattr(kernel, "source_ok") and not kernel.source_ok(v, ref, self.ctx, False))):
                relying |= self.residents_behind(ref, more)
            refs[v] = ref
        symbols = {v: self.symbol_for(v) for v in kernel.outputs()}
        refs.update(kernel.output_refs(self.ctx, symbols))
        return refs, pre, placed

    def tentative_dram(self, v: Value, want: Placement | None) -> tuple[Ref, list[tuple[Value, Ref]], list[Step]]:
        """Where `v` would be for a kernel that reads it from DRAM (a gather): as `want` when it
        is not placed yet (the host uploads any layout), else where it is."""
        if v in self.refs or v in self.provisional or v in self.pending or want is None:
            return self.tentative(v, None)
        if v.kind in ("input", "const"):
            ref = Ref(self.symbol_for(v), want, None)
            return ref, [(v, ref)], []
        return self.tentative(v, None)

    def price(self, step: Step, budget: int | None = None) -> int:
        """A step's cycles, timed on first asking (OverBudget past `budget` instructions)."""
        if step.cycles is None:
            step.cycles = self.time(step.kernel, step.refs, budget)
        return step.cycles

    def priced_within(self, steps: list[Step], start: int, limit: int | None, budget: int | None = None) -> int | None:
        """`start` plus the steps' cycles, or None once the sum exceeds `limit`: a relayout of a
        large tensor can take seconds to emit and time, and it cannot make a losing candidate win."""
        total = start
        for step in steps:
            if limit is not None and total > limit:
                return None
            if SKIP_BY_BOUNDS and limit is not None and step.cycles is None and \
                    total + step.kernel.least_cycles(self.ctx, step.refs) > limit:
                return None  # (not emitted: it cannot come in under the limit)
            total += self.price(step, budget)
        return None if limit is not None and total > limit else total

    def time(self, kernel: Kernel, refs: dict[Value, Ref], limit: int | None = None) -> int:
        """The cycles of what `kernel` emits; OverBudget if that passes `limit` instructions."""
        key = kernel.key(refs)
        if key is not None and key in self.costs:
            return self.costs[key]
        ctx = EmitContext(self.hw, self.options, limit)
        try:
            kernel.emit(ctx, refs)
        except InstructionLimit as e:
            raise OverBudget(str(e)) from None
        cycles = cycles_of(ctx.params, ctx.b.build_code())
        if key is not None:
            self.costs[key] = cycles
        return cycles

    def choose(self, candidates: list[Kernel], node: Node) -> Kernel:
        """The fastest candidate, by the simulator's timing of what it would emit, its inputs'
        relayouts included. Candidates that need one are timed too: a relayout that moves lanes
        goes through the matrix registers (kernels.transposer), and reading an operand relaid
        often beats gathering it in short runs (a transformer block's training step: 4,026,506
        -> 2,327,976 cycles), for about 1.3-1.5x the compile time."""
        best = self._best(candidates, True)
        found, errors = best
        if found is None:
            why = errors[0] if errors else f"none of {len(candidates)} candidate layouts works"
            raise UnsupportedOpError(node.aten or node.kind, [list(v.shape) for v in node.inputs], node.source, why)
        (cycles, _, _), kernel, refs, pre, placed = found
        self.commit(kernel, refs, pre, placed, cycles - sum(s.cycles for s in pre) - self.meet_cycles(kernel, refs))
        return kernel

    def _best(self, candidates: list[Kernel], allow_relay: bool) -> tuple[tuple | None, list[str]]:
        """Candidates that read their inputs where they are are timed first: once one is, the others
        are timed under TIMED_INSTRUCTIONS."""
        best = None
        fastest = None  # the fastest kernel timed, alone
        errors: list[str] = []
        prepared = []
        for kernel in candidates:
            try:
                prepared.append((kernel, *self.prepare(kernel, allow_relay)))
            except NeedsRelay:
                continue
            except UnsupportedOpError:
                raise
            except (CompileError, LayoutError) as e:
                errors.append(str(e))
        stale, relaid = 0, False  # timed candidates in a row that bettered the best by less than STALE_GAIN
        for kernel, refs, pre, placed in sorted(prepared, key=lambda c: len(c[2]) > 0):
            if bool(pre) != relaid:
                stale, relaid = 0, bool(pre)
            if stale >= STALE_CANDIDATES and kernel.stops_when_stale:
                continue
            budget = TIMED_INSTRUCTIONS if best is not None else None
            try:
                if hasattr(kernel, "feasible") and not kernel.feasible(self.ctx, refs):
                    continue
                if SKIP_BY_BOUNDS and best is not None and kernel.least_cycles(self.ctx, refs) > best[0][0]:
                    continue  # (its own cycles alone pass the best's: not emitted)
                estimate = kernel.estimate(self.ctx, refs)
                if self.beyond_slack(kernel, refs, estimate, fastest, best[0][0] if best is not None else None):
                    continue
                stale += 1  # (until it proves better)
                alone = self.time(kernel, refs, budget)
                fastest = alone if fastest is None else min(fastest, alone)
                cycles = self.priced_within(pre, alone, best[0][0] if best is not None else None, budget)
                if cycles is None:
                    continue  # slower before all its relayouts are priced (they only add): cannot win
                cycles += self.meet_cycles(kernel, refs)
            except OverBudget:
                continue
            except UnsupportedOpError:
                raise
            except (CompileError, LayoutError) as e:
                errors.append(str(e))
                continue
            cycles += self.sibling_cycles(kernel, placed)
            rank = (cycles, self.host_cycles(kernel, refs, placed), self.spread_key(kernel, refs))
            if best is None or cycles < (1 - STALE_GAIN) * best[0][0]:
                stale = 0
            if best is None or rank < best[0]:
                best = (rank, kernel, refs, pre, placed)
        return best, errors

    def beyond_slack(self, kernel: Kernel, refs: dict[Value, Ref], estimate: float | None, fastest: int | None,
                     best: int | None) -> bool:
        """Whether a candidate is left untimed (ESTIMATE_SLACK): its estimate passes the slack over
        the fastest kernel timed alone, and that bound plus what its output costs its readers
        (`meet_cycles`) cannot beat the best candidate's whole cost."""
        if estimate is None or fastest is None or estimate <= ESTIMATE_SLACK * fastest:
            return False
        return best is None or estimate / ESTIMATE_SLACK + self.meet_cycles(kernel, refs) >= best

    def sibling_cycles(self, kernel: Kernel, placed: list[tuple[Value, Ref]]) -> int:
        """What the places a candidate gives values no kernel has read yet (graph inputs, the host
        uploads them as the first reader wants) cost their other readers that are reductions, at
        least: the Data Engines' gather into the cheapest layout those reductions wish for, one
        DRAM latency per long-word run over all the Groups' queues (0 when stored as one of
        them). So the first reader does not settle a layout a reduction can only gather: x * 2 + 1
        beside x.sum(0) on MN-Core 2's 4096 x 4096 placed x in rows of single long words for the
        sum, a gather of 8 M runs that was refused. Products are left out: they read their
        operands relaid through the matrix registers or transposed, which the estimate does not
        see (counting them, a small MLP's training step went 78,442 -> 82,612 cycles)."""
        total = 0
        for v, ref in placed:
            wished = [w for user, ranked in self.wishes_by_user(v) if user not in kernel.nodes and user.kind == "reduce"
                      for w in ranked]
            costs = []
            for layout in wished:
                try:
                    wanted = stage(self.ctx.lm_placement(layout, device_dtype(v))).dram
                    if ref.placement.same_placement(wanted):
                        costs = [0]
                        break
                    runs = lw_sources(wanted, ref.placement).mv_count
                except GatherTooLarge as e:
                    runs = e.runs
                except (CompileError, LayoutError):
                    continue  # (lanes move: a relayout through the PEs, which the reader's candidates price)
                costs.append(runs * self.ctx.gather_mv_cycles())
            total += round(min(costs, default=0))
        return total

    def meet_cycles(self, kernel: Kernel, refs: dict[Value, Ref]) -> int:
        """What a candidate leaves to do for a constrained graph output it writes: the relayout into
        the constraint's layout (0 when it writes that layout). So a constrained producer costs at
        most its unconstrained best plus the conversion the constraint avoids. A value that feeds a
        resident tensor's update element-wise (a weight's gradient, into its optimizer step) is
        priced the same way against that tensor's layout: the update runs where the tensor is, so
        it reads the value relaid into that layout."""
        total = 0
        for v in kernel.outputs():
            wanted = getattr(self, "output_constraints", {}).get(v)
            lm = getattr(self, "output_lm", {}).get(v)
            state = self.updated_state.get(v)  # a resident tensor's new value goes where the old one is
            if wanted is None and state in self.refs:
                wanted, lm = self.refs[state].placement, self.refs[state].lm
            if wanted is not None and v in refs and not refs[v].placement.same_placement(wanted):
                total += self.relayout_cycles(v, refs[v], wanted, lm)
            elif wanted is None and state is None and v in refs:
                total += self.feed_cycles(v, refs[v]) + self.wish_cycles(v, refs[v]) + self.window_cycles(v, refs[v])
        return total

    def window_cycles(self, v: Value, ref: Ref) -> int:
        """What `v` stored as `ref` costs the convolutions it flows into as their input x (itself,
        or through element-wise ops of its shape, which compute where it is) beyond x stored
        channels-last (the layout the convolution copies x into when it must, `conv.nhwc_layout`):
        the extra MVs of their im2col gathers, each a DRAM latency over all the Groups' queues, at
        most those of a copy of x into that layout (which the convolution can gather from instead).
        An estimate, as the readers' tilings are not chosen yet. So a convolution whose output
        layout leaves the next one a gather of single long words (a direct form's rows split over
        the L1Bs, in ResNet-18 at 224x224: the stride-2 convolution after it 163,092 -> 429,524
        cycles) weighs that against its own speed."""
        total = 0.0
        for conv in self.convolutions_fed(v):
            key = (conv, str(ref.placement.layout))
            if key not in self.window_cache:
                x = conv.args[0]
                nhwc = Placement(nhwc_layout(self.ctx, x.shape, device_dtype(x)), self.hw, self.ctx.chain.dram,
                                 device_dtype(x))
                extra = im2col_mvs(conv, ref.placement) - im2col_mvs(conv, nhwc)
                self.window_cache[key] = min(extra, self.copy_mvs(nhwc, ref.placement, extra)) if extra > 0 else 0.0
            total += self.window_cache[key] * self.ctx.gather_mv_cycles()
        return round(total)

    @staticmethod
    def copy_mvs(wanted: Placement, held: Placement, otherwise: float) -> float:
        """MVs of the Data Engines' gather of a tensor held as `held` into `wanted` (`otherwise`
        when no gather can: its lanes move)."""
        try:
            return lw_sources(wanted, held).mv_count
        except GatherTooLarge as e:
            return e.runs
        except (CompileError, LayoutError, LaneMismatch):
            return otherwise

    def convolutions_fed(self, v: Value) -> list[Node]:
        """The convolutions that read `v`, or an element-wise function of it of its shape and
        dtype, as their input x."""
        return [user for x in self.elementwise_reach(v) for user in self.users.get(x, [])
                if user.kind == "conv" and user.args[0] is x]

    def elementwise_reach(self, v: Value) -> list[Value]:
        """`v` and the values element-wise ops of its shape and dtype make from it, breadth first
        (a cast ends a path: a tensor of another dtype has other layouts)."""
        reach, seen = [v], {v}
        for x in reach:
            for user in self.users.get(x, []):
                same = user.out.shape == v.shape and device_dtype(user.out) == device_dtype(v)
                if user.kind == "ew" and same and user.out not in seen:
                    seen.add(user.out)
                    reach.append(user.out)
        return reach

    def wish_cycles(self, v: Value, ref: Ref) -> int:
        """What a candidate's output costs its consumers beyond the layouts they wish for (0 when
        it is stored as one of them): the timed copy into the cheapest wished layout's image. So a
        producer weighs its own speed against its consumer's: an embedding's one-hot, computed in
        the layout fastest for the comparison, left its product to gather it in single long words
        (1.8 M cycles for a vocabulary of 4,000, against 0.1 M read as the product wishes).
        Nothing either when a convolution reads the candidate as it is (any layout with the
        channels in the lanes, its gather priced by `window_cycles`; with the other readers'
        wishes priced too, a small conv + BatchNorm training step on mncore2 took 860,392 cycles
        against 608,056). A reduction that reads it where it lies (across the PEs, in one step or
        two) wishes nothing of it: only the other readers' wishes are priced. Charged a relayout
        into its wished rows, alike for every candidate, it left a product free to spread its
        columns over the L2Bs, which its row reductions then relaid (256 x 128 x 512, three of
        them: 352,082 cycles against 16,292)."""
        if any(reads_as_is(user, v, ref, self) for user in self.users.get(v, []) if user.kind == "conv"):
            return 0
        readers = [ranked for user, ranked in self.wishes_by_user(v) if not reads_as_is(user, v, ref, self)]
        wished = []
        for layout in dict.fromkeys(layout for ranked in readers for layout in ranked):
            try:
                wished.append((stage(self.ctx.lm_placement(layout, device_dtype(v))).dram, layout))
            except (CompileError, LayoutError):
                continue
        if not wished or any(ref.placement.same_placement(p) for p, _ in wished):
            return 0
        # the cheapest by its bound first: a copy whose bound is above one timed is not emitted
        bounded = sorted(((self.relayout_bound(v, ref, placement, layout), k) for k, (placement, layout)
                          in enumerate(wished)))
        cheapest = None
        for bound, k in bounded:
            if SKIP_BY_BOUNDS and cheapest is not None and bound >= cheapest:
                break
            placement, layout = wished[k]
            try:
                cycles = self.relayout_cycles(v, ref, placement, layout, TIMED_INSTRUCTIONS)
            except (CompileError, LayoutError, OverBudget):
                continue  # (a copy too large to time: the consumer's own candidates price reading it)
            cheapest = cycles if cheapest is None else min(cheapest, cycles)
        return cheapest or 0

    @staticmethod
    def _copy(v: Value, ref: Ref, wanted: Placement, lm: Layout | None) -> tuple[RelayoutKernel, dict[Value, Ref]]:
        """The copy of `v`, stored as `ref`, into `wanted` (the image of LM layout `lm`, when known),
        and its refs: the copy `copy_to` emits."""
        copy = RelayoutKernel.copy(v, ref, wanted)
        return copy, {v: ref, copy.out: Ref("output", wanted, lm)}

    def relayout_bound(self, v: Value, ref: Ref, wanted: Placement, lm: Layout | None = None) -> float:
        """`RelayoutKernel.least_cycles` of the copy `relayout_cycles` times."""
        copy, refs = self._copy(v, ref, wanted, lm)
        return copy.least_cycles(self.ctx, refs)

    def relayout_cycles(self, v: Value, ref: Ref, wanted: Placement, lm: Layout | None = None,
                        budget: int | None = None) -> int:
        """The timed copy of `v`, stored as `ref`, into `wanted` (`_copy`), so that it and `copy_to`
        share one timing. OverBudget past `budget` instructions."""
        return self.time(*self._copy(v, ref, wanted, lm), budget)

    def feed_cycles(self, v: Value, ref: Ref) -> int:
        """The relayout of `v` into the layout of the resident tensor whose update it feeds (0 when
        it feeds none, or is there already). Only an estimate of what the update will read: a
        relayout the copy kernel cannot make is priced 0, never a reason to drop the candidate."""
        state = self.state_fed(v)
        if state is None or ref.placement.same_placement(self.refs[state].placement):
            return 0
        try:
            return self.relayout_cycles(v, ref, self.refs[state].placement, self.refs[state].lm)
        except (CompileError, LayoutError):
            return 0

    def state_fed(self, v: Value) -> Value | None:
        """A placed resident tensor whose new value `v` flows into through element-wise ops of its
        shape and dtype (an optimizer's arithmetic on a gradient), if any: where that update will
        run."""
        return next((self.updated_state[x] for x in self.elementwise_reach(v)[1:]
                     if self.updated_state.get(x) in self.refs), None)

    def host_cycles(self, kernel: Kernel, refs: dict[Value, Ref], placed: list[tuple[Value, Ref]]) -> int:
        """What the layouts a candidate gives graph inputs and outputs cost to upload and download
        (every call pays them): among equally fast kernels, the cheaper one for the host."""
        total = 0
        for v, ref in placed:
            if v.kind == "input":
                total += self.transfer_cycles(ref.placement, True)
        for v in kernel.outputs():
            if v in self.outputs and v in refs:
                total += self.transfer_cycles(refs[v].placement, False)
        return total

    def transfer_cycles(self, placement: Placement, upload: bool) -> int:
        key = (str(placement.layout), placement.dtype, upload)
        if key not in self.costs:
            self.costs[key] = cycles_of(self.ctx.params, host_transfer(placement, upload).code)
        return self.costs[key]

    def spread_key(self, kernel: Kernel, refs: dict[Value, Ref]) -> tuple[int, int]:
        """Among equally fast candidates, the one whose outputs use the most DRAM instances (more
        Data Engines for whoever reads them) and the least DRAM per instance."""
        outs = [refs[v].placement for v in kernel.outputs() if v in refs]
        return (-sum(len(p.instances_used) for p in outs), sum(p.span_lw for p in outs))

    def commit(self, kernel: Kernel, refs: dict[Value, Ref], pre: list[Step], placed: list[tuple[Value, Ref]],
               cycles: int) -> None:
        self.relied_clean |= self.relying.get(id(kernel), set())
        self.relying.clear()  # (by the id of kernels that may not live on)
        self.commit_steps(pre)
        self.commit_placed(placed)
        for v in kernel.outputs():
            self.register(v, refs[v], "temp")
        reads = tuple(v for v in refs if v not in kernel.outputs())
        self.steps.append(Step(kernel, refs, cycles, reads, tuple(kernel.outputs())))

    # ---- kinds ----------------------------------------------------------------------------------

    def group_layouts(self, group: Group) -> tuple[list[Layout], list[Layout]]:
        """Candidate iteration layouts of a fused group: its operands' layouts (no staging work),
        what its consumers want, then fresh ones; and, beside those, operands' MAB-broadcast
        layouts spread over the MABs (`over_units`), which are never in place of another. Also
        which of them read a channels-last operand in runs (`lane_runs`): those are tried with
        the gather in blocks too."""
        shape = group.shape or (1,)
        dtype = group.layout_dtype
        budget = self.budget(ElementwiseKernel.regions_of(group), ElementwiseKernel.read_together(group))
        found: list[Layout] = []
        runs: list[Layout] = []

        def add(layout: Layout | None, into: list[Layout] | None = None) -> bool:
            """Offer `layout` (time-sliced to the budget; listed in `into` too); whether the group
            can compute in it."""
            if layout is None or layout.shape != shape:
                return False
            from ..layout.spread import time_sliced
            sliced = time_sliced(layout, budget, self.hw.elements_per_lw(dtype))
            if sliced is None or not self._uploadable(sliced, dtype):
                return False
            if sliced not in found:
                found.append(sliced)
            if into is not None:
                into.append(sliced)
            return all(self._operand_stageable(sliced, v) for v in group.inputs)
        for v in group.outputs:
            if v in self.output_wishes:
                add(self.output_wishes[v])
            for ranked in self.wish_lists(v):  # each consumer's wishes, up to the first the group can make
                any(add(wish) for wish in ranked)
        for v in group.inputs:  # an operand not placed yet is placed as the group reads it: offer the
            if v.shape == group.shape and v not in self.refs and v not in self.provisional:  # layouts the
                for user, ranked in self.wishes_by_user(v):  # reductions reading it wish for (`sibling_cycles`)
                    if user.kind == "reduce":
                        any(add(wish) for wish in ranked)
        spread_inputs = []  # operands' broadcast layouts spread over the MABs: timed beyond the budget below
        for v in group.inputs:
            ref = self.refs.get(v)
            if ref is not None and ref.lm is not None and v.shape == group.shape:
                add(ref.lm)
                spread_inputs.append(self.over_units(ref))
        for v in group.inputs:  # layouts that stage an operand where it is by long-word gathers (the
            ref = self.refs.get(v)  # state a training step updates: read and written back in place)
            if ref is not None and v.shape == group.shape:
                try:
                    add(lane_matched(ref.placement, budget))
                except CompileError:
                    pass
                lanes = lane_dims(ref.placement.layout)
                if len(lanes) == 1 and self._read_by_windows(group):  # an operand stored channels-last,
                    # read in runs of a pixel's channels, for readers that read such runs too
                    for layout in lane_runs(shape, self.hw.elements_per_lw(dtype), self.hw.axes, lanes[0], budget):
                        add(layout, runs)
        # the dims every operand spans (broadcast operands are staged along the others); a single
        # element reaches every PE alike and constrains none (masked_fill's fill value)
        spanning = [v for v in group.inputs if prod(v.shape) > 1]
        common = tuple(d for d in range(len(shape)) if all(
            len(shape) - d <= v.rank and v.shape[v.rank - len(shape) + d] == shape[d] for v in spanning))
        for layout in lm_layouts(shape, dtype, self.hw, budget, common if len(common) < len(shape) else None):
            add(layout)
        kept = len(found)
        for layout in spread_inputs:
            add(layout)
        usable = [all(self._operand_stageable(layout, v) for v in group.inputs) for layout in found]
        return [x for x, ok in zip(found[:kept], usable) if ok][:CANDIDATE_LAYOUTS] + \
            [x for x, ok in zip(found[kept:], usable[kept:]) if ok], runs

    def _read_by_windows(self, group: Group) -> bool:
        """Whether every reader of the group's results reads them through a window of whole pixels
        (a convolution as its input, a pooling window): the readers `lane_runs` layouts serve.
        A value other nodes read too (a training step's backward reads the forward's activations)
        keeps the layouts those readers are priced against."""
        readers = [u for v in group.outputs for u in self.users.get(v, [])]
        return bool(readers) and all(u.kind == "window" or (u.kind == "conv" and u.args[0] in group.outputs)
                                     for u in readers)

    def over_units(self, ref: Ref) -> Layout | None:
        """`ref`'s LM layout spread over the MABs when it is a MAB broadcast (a weight placed as a
        product's B operand) and the spread layout stages from `ref` as it is: the same long words,
        but each MAB computing its own part instead of a copy (layout.unbroadcast)."""
        chain = self.ctx.chain
        spread = spread_over_units(ref.lm, chain.pes_per_l1 // chain.pes_per_unit, chain.unit_axis)
        if spread is None:
            return None
        try:
            staged = stage(self.ctx.lm_placement(spread, ref.placement.dtype))
        except (CompileError, LayoutError):
            return None
        return spread if staged.dram.same_placement(ref.placement) else None

    def _operand_stageable(self, layout: Layout, v: Value) -> bool:
        try:
            return self._stageable(restrict(layout, v.shape or (1,)).layout, v)
        except (CompileError, LayoutError):
            return False

    def _uploadable(self, layout: Layout, dtype: str) -> bool:
        try:
            return stage(self.ctx.lm_placement(layout, dtype)).pe_mode != "broadcast"
        except Exception:
            return False

    def wishes(self, v: Value) -> list[Layout]:
        """LM layouts the consumers of `v` would like to read it in."""
        found: list[Layout] = []
        for ranked in self.wish_lists(v):
            found += [layout for layout in ranked if layout not in found]
        return found

    def wish_lists(self, v: Value) -> list[list[Layout]]:
        """Per consumer of `v`, the LM layouts it would like to read it in, best first: a
        producer offers the first it can compute in."""
        return [ranked for _, ranked in self.wishes_by_user(v)]

    def wishes_by_user(self, v: Value) -> list[tuple[Node, list[Layout]]]:
        """(consumer, its wishes for `v`, best first) of every consumer that has some (cached: every
        candidate of every reader of `v` asks)."""
        if v not in self.wish_cache:
            self.wish_cache[v] = [(user, ranked) for user in self.users.get(v, [])
                                  if (ranked := self._wishes_of(user, v))]
        return self.wish_cache[v]

    def _wishes_of(self, user: Node, v: Value) -> list[Layout]:
        """`user`'s wishes for `v`; a reshape's or permute's are its readers' wishes for the view,
        seen from `v`, so that a producer computes where a product reads its output through a
        view (`tanh(x).t() @ w` on mncore2: 42,268 -> 2,278 cycles)."""
        if user.kind not in ("reshape", "permute"):
            return plan_wishes(user, v, self)
        _, backward = view_transform(user)
        found = []
        for wish in self.wishes(user.out):
            base = backward(wish)
            if base is not None and base not in found:
                found.append(base)
        return found

    def plan_group(self, group: Group) -> None:
        """A fused group in one iteration layout; when no layout serves all its operands (a
        group fusing the centring of two reductions over different dims: each mean is broadcast
        along another dim, and on small chips no layout stages both), its nodes one by one."""
        layouts, runs = self.group_layouts(group)
        candidates = [ElementwiseKernel(group, layout) for layout in layouts]
        candidates += [ElementwiseKernel(group, layout, blocks=True) for layout in layouts if layout in runs]
        try:
            if not candidates:
                node = group.nodes[-1]
                operands = ", ".join(str(list(v.shape)) for v in group.inputs)
                raise UnsupportedOpError(node.aten or node.kind, [list(v.shape) for v in node.inputs], node.source,
                                         f"no layout of its {list(group.shape)} result lets every operand "
                                         f"({operands}) be staged on {self.hw.name}: an operand broadcast along a "
                                         f"dimension must reach the PEs by one of the chip's transfer modes, and in "
                                         f"none of the layouts tried does each")
            self.choose(candidates, group.nodes[-1])
        except UnsupportedOpError:
            if len(group.nodes) == 1:
                raise
            for node in group.nodes:
                self.plan_group(Group([node], list(node.inputs), [node.out]))

    def plan_view(self, node: Node) -> None:
        x, out = node.args[0], node.out
        forward, backward = view_transform(node)
        if self.unplaced(x) and out not in self.outputs:
            self.pending[out] = Pending(x, backward, forward, node)
            return
        ref = self.place_default(x)
        viewed = view_ref(ref, forward)
        if viewed is not None:
            self.refs[out] = viewed
            return
        self.plan_movement(node)

    def plan_movement(self, node: Node) -> None:
        from ..kernels.movement import source_maps
        maps = source_maps(node)
        candidates = []
        per_output = [self.movement_layouts(out) for out in node.outputs]
        # one more candidate, the parts in their source's digits, last (first, it was GPT-2's split's
        # choice, whose heads' views and products then cost more: a step 4,447,316 -> 5,257,474 cycles)
        for k, part in enumerate(self.part_layouts(node)):
            if part is not None:
                per_output[k] = [c for c in per_output[k] if c != part] + [part]
        for k in range(max(len(c) for c in per_output)):
            layouts = {out: c[min(k, len(c) - 1)] for out, c in zip(node.outputs, per_output)}
            candidates.append(GatherKernel(node, layouts, maps))
        try:
            self.choose(candidates, node)
        except UnsupportedOpError:
            if node.kind == "cat" and len(node.inputs) > 1:
                self.plan_cat_as_sum(node)
                return
            if node.kind == "split" and len(node.outputs) > 1:
                self.plan_split_as_slices(node)
                return
            self.choose([RelayoutKernel.of_movement(node, per_output[0][0])], node)

    def _scratch_builder(self, node: Node) -> tuple[Graph, "Builder"]:
        """A builder of nodes that stand in for `node` (its source line and phase), named apart
        from every value the graph and the plan have."""
        from ..frontend.build import Builder
        graph = self.graph
        taken = {v.name for n in graph.nodes for v in n.outputs} | set(graph.inputs) | set(graph.outputs) | \
            {c.name for c in graph.constants} | {v.name for v in self.refs}
        scratch = Graph({}, {}, [])
        b = Builder(scratch, taken)
        b.source, b.aten, b.stem, b.phase = node.source, node.aten, node.out.name, node.phase
        return scratch, b

    def plan_split_as_slices(self, node: Node) -> None:
        """A split whose parts no gather writes together (a grouped convolution's weight gradient
        splits a gradient laid out for another product): each part a slice of its own, moved (or
        relaid) on its own, as a relayout moves one tensor's lanes."""
        from .rewrite import bind
        scratch, b = self._scratch_builder(node)
        (x,), dim, start = node.args, node.attrs["dim"], 0
        for out, size in zip(node.outputs, node.attrs["sizes"]):
            bind(b, b.slice(x, dim, start, start + size), out)
            start += size
        for n in scratch.nodes:
            self.plan_unit(n)

    def plan_cat_as_sum(self, node: Node) -> None:
        """A cat whose parts keep their lanes in different places (no gather assembles it, and a
        relayout moves one tensor's lanes): each part padded with zeros to the result's shape,
        where it lands, and the parts added (or-ed, for bool), so each is moved on its own."""
        from .rewrite import bind
        scratch, b = self._scratch_builder(node)
        dim, out = node.attrs["dim"], node.out
        start, total = 0, None
        for part in node.args:
            pads = [(0, 0)] * out.rank
            pads[dim] = (start, out.shape[dim] - start - part.shape[dim])
            start += part.shape[dim]
            placed = b.pad(part, pads, False if out.dtype == "bool" else 0)
            total = placed if total is None else b.ew("or" if out.dtype == "bool" else "add", total, placed)
        bind(b, total, out)
        for n in scratch.nodes:
            self.plan_unit(Group([n], list(n.inputs), [n.out]) if n.kind == "ew" else n)

    def plan_reduce(self, node: Node) -> None:
        """A reduction; or, when its input lies with runs of the reduced dim inside the PEs and
        the runs across them (a product's columns or rows), the fastest of that and the same
        reduction in two steps: over each run where the input lies, then over the runs' results.
        A bias gradient (the sum of a 256 x 512 product's rows, in runs of 8 rows per PE) took
        59,810 cycles on mncore2 for its rows gathered into the PEs, against 3,112 + 7,930 in two
        steps. Each way is planned, and all but the fastest undone (`_snapshot`)."""
        found = self._reduced_run(node)
        if found is None:
            self.choose(plan_kernels(node, self), node)
            return
        out = node.out
        before, made_by = self._snapshot(), (out.producer, out.index)
        in_runs = None  # (the plan, the node that makes the output there)
        try:
            self._plan_reduce_in_runs(node, *found)
            in_runs = (self._snapshot(), (out.producer, out.index))
        except (CompileError, LayoutError):  # (unsupported or no layout: the reduction whole)
            pass
        self._restore(before)
        out.producer, out.index = made_by
        try:
            self.choose(plan_kernels(node, self), node)
        except CompileError:
            if in_runs is None:
                raise
        else:  # (on a tie, the reduction whole: one step fewer)
            if in_runs is None or self._snapshot().cycles_since(before) <= in_runs[0].cycles_since(before):
                return
        state, (out.producer, out.index) = in_runs
        self._restore(state)

    def _reduced_run(self, node: Node) -> tuple[int, tuple[int, ...], tuple[int, ...]] | None:
        """(dim, digits, in_pe) when a reduction reads a placed input whose layout keeps some of a
        reduced dim's elements in each PE but not all it reduces: the dim read as `digits` (sizes,
        outer first) of which those at positions `in_pe` lie inside each PE. Either its innermost
        run (`reduce.local_runs`: the innermost such dim, its longest run: digits (n / run, run))
        or, where the PE digit lies between address digits (a product's columns dealt to the PEs
        a long word at a time, `Tiling.n_dealt`), the dim's digits as its layout has them. (Every
        run length, and the total in runs again, cost the test suite's training steps a fifth
        more compile time, and GPT-2's step came out 12,283,604 cycles that way against
        12,199,640.)"""
        x = node.args[0]
        ref = self.refs.get(x)
        dims = tuple(node.attrs["dims"] or range(x.rank))
        if node.attrs.get("split") or ref is None or ref.lm is None or not x.shape or in_pe(ref.lm, dims):
            return None
        for d in reversed(dims):
            n = x.shape[d]
            if ref.lm.extents[d] != n:
                continue
            runs = [run for run in local_runs(ref.lm, d) if run < n and n % run == 0]
            digits = [f for f in ref.lm.dims[d] if f.size > 1]
            inside = tuple(k for k, f in enumerate(digits) if f.axis in (None, W_AXIS))
            spread = bool(inside) and len(inside) < len(digits) and prod(f.size for f in digits) == n
            if runs and (not spread or prod(f.size for k, f in enumerate(digits) if k in inside) == runs[-1]):
                return d, (n // runs[-1], runs[-1]), (1,)  # the shorter runs leave more partial results to move
            if spread:
                return d, tuple(f.size for f in digits), inside
        return None

    def _plan_reduce_in_runs(self, node: Node, dim: int, digits: tuple[int, ...], inside: tuple[int, ...]) -> None:
        """The reduction in two steps: over the digits of `dim` at positions `inside` (those each
        PE holds), then over the results (the dim's other digits, merged back into one) and the
        other dims it reduces."""
        from .rewrite import bind
        scratch, b = self._scratch_builder(node)
        x = node.args[0]
        grid = b.reshape(x, (*x.shape[:dim], *digits, *x.shape[dim + 1:]))
        partial = b.reduce(node.op, grid, [dim + k for k in inside])
        kept = prod(n for k, n in enumerate(digits) if k not in inside)
        if partial.rank != x.rank:
            partial = b.reshape(partial, (*x.shape[:dim], kept, *x.shape[dim + 1:]))
        total = b.reduce(node.op, partial, node.attrs["dims"] or list(range(x.rank)), keepdim=node.attrs["keepdim"])
        partial.producer.attrs["split"] = total.producer.attrs["split"] = True
        bind(b, total, node.out)
        for n in scratch.nodes:
            self.plan_unit(n)

    def _snapshot(self) -> "PlannerState":
        return PlannerState(dict(self.refs), dict(self.pending), dict(self.buffers), dict(self.owner), list(self.steps),
                            {v: list(c) for v, c in self.copies.items()}, set(self.clean), set(self.relied_clean))

    def _restore(self, state: "PlannerState") -> None:
        self.refs, self.pending, self.buffers, self.owner = (dict(state.refs), dict(state.pending),
                                                             dict(state.buffers), dict(state.owner))
        self.steps, self.clean, self.relied_clean = list(state.steps), set(state.clean), set(state.relied_clean)
        self.copies = {v: list(c) for v, c in state.copies.items()}

    def part_layouts(self, node: Node) -> list[Layout | None]:
        """For a split or a unit-step slice of a placed value: each part's layout in its source's
        digits (layout.part), where the part starts at a digit boundary and the layout stages;
        else None."""
        x = node.args[0]
        ref = self.refs.get(x)
        if node.kind not in ("split", "slice") or ref is None or ref.lm is None or node.attrs.get("step", 1) != 1:
            return [None] * len(node.outputs)
        dim = node.attrs["dim"]
        if node.kind == "slice":
            ranges = [(node.attrs["start"], node.out.shape[dim])]
        else:
            starts = [sum(node.attrs["sizes"][:k]) for k in range(len(node.outputs))]
            ranges = list(zip(starts, node.attrs["sizes"]))
        found = []
        for out, (start, size) in zip(node.outputs, ranges):
            layout = part_layout(ref.lm, dim, start, size)
            found.append(layout if layout is not None and self._stageable(layout, out) else None)
        return found

    def movement_layouts(self, out: Value) -> list[Layout]:
        dtype = device_dtype(out)
        found = [w for w in [self.output_wishes.get(out), *self.wishes(out)] if w is not None]
        found += lm_layouts(out.shape or (1,), dtype, self.hw, self.budget(2))
        uploadable = []
        for layout in found:
            if layout not in uploadable and self._stageable(layout, out):
                uploadable.append(layout)
        return uploadable[:CANDIDATE_LAYOUTS]

    def plan_iota(self, node: Node) -> None:
        """An iota is a literal of indices: a constant the program is loaded with."""
        from ..ir import apply
        v = node.out
        data = apply(node, [])[0]
        v.kind, v.data = "const", data if v.dtype != "bool" else data.float()
        self.graph.constants.append(v)

    # ---- outputs ----------------------------------------------------------------------------------

    def _apply_constraints(self) -> None:
        graph = self.graph
        for name, spec in self.constraints.items():
            if not isinstance(spec, IOSpec):
                raise SpecMismatchError(f"io_spec_constraints[{name!r}] is a {type(spec).__name__}, not an IOSpec")
            # a name both an output and an input (a pipeline stage h -> h): the output, as a producer is
            # constrained to its consumer's input spec, unless only the input fits the spec
            named = [(v, role) for v, role in ((graph.outputs.get(name), "output"), (graph.inputs.get(name), "input"))
                     if v is not None]
            if not named:
                known = ", ".join([*graph.inputs, *graph.outputs])
                raise SpecMismatchError(f"io_spec_constraints names {name!r}, which is neither an input nor an "
                                        f"output; the function has {known}")
            fits = [(v, role) for v, role in named
                    if tuple(spec.shape) == v.shape and spec.dtype == (v.torch_dtype or v.dtype)]
            if not fits:
                value, role = named[0]
                raise SpecMismatchError(f"io_spec_constraints[{name!r}] is {spec.dtype}{list(spec.shape)} (from "
                                        f"{spec.name!r}) but {role} {name!r} is {value.torch_dtype or value.dtype}"
                                        f"{list(value.shape)}")
            value, role = fits[0]
            if spec.chip_fingerprint != self.hw.fingerprint:
                raise SpecMismatchError(f"io_spec_constraints[{name!r}] was compiled for chip {spec.chip!r}; this "
                                        f"compile targets {self.hw.name!r}")
            placement = spec.placement(self.hw, device_dtype(value))
            if role == "input":
                self.register(value, Ref(self.symbol_for(value), placement, spec.lm_layout), "input")
            else:
                self.output_constraints = getattr(self, "output_constraints", {})
                self.output_constraints[value] = placement
                self.output_lm = getattr(self, "output_lm", {})
                self.output_lm[value] = spec.lm_layout
                if spec.lm_layout is not None:
                    self.output_wishes[value] = spec.lm_layout

    def _finish_outputs(self, taken: set[str]) -> dict[str, str]:
        """Each output in a buffer of its own, in its constrained layout if it has one."""
        out_symbols: dict[str, str] = {}
        constraints = getattr(self, "output_constraints", {})
        update_names = set(self.graph.update_outputs().values())
        for name, v in self.graph.outputs.items():
            ref = self.place_default(v)
            wanted, lm = constraints.get(v), getattr(self, "output_lm", {}).get(v)
            if name in update_names:  # a resident tensor's new value: where it is read
                wanted, lm = self.refs[self.updated_state[v]].placement, self.refs[self.updated_state[v]].lm
            buffer = self.buffers[ref.symbol]
            shared = ref.symbol in taken or buffer.role in ("input", "const") or self.owner.get(ref.symbol) is not v
            if wanted is not None and not ref.placement.same_placement(wanted):
                ref = self.copy_to(v, ref, wanted, name, lm)
            elif shared:
                ref = self.copy_to(v, ref, None, name)
            else:
                buffer.role = "output"
                buffer.placement, buffer.lm = ref.placement, ref.lm
            out_symbols[name] = ref.symbol
            taken.add(ref.symbol)
        return out_symbols

    def copy_to(self, v: Value, ref: Ref, placement: Placement | None, name: str, lm: Layout | None = None) -> Ref:
        """A copy of `v` into a buffer of its own (in `placement`, whose LM layout `lm` is, when
        known: a transpose uses it, or as it is)."""
        target = placement or ref.placement
        symbol = f"output:{name}"
        copy = Ref(symbol, target, ref.lm if placement is None else lm)
        kernel = RelayoutKernel.copy(v, ref, target)
        refs = {v: ref, kernel.out: copy}
        self.steps.append(Step(kernel, refs, self.time(kernel, refs), (v,), (kernel.out,)))
        self.buffers[symbol] = Buffer(symbol, "output", target, v.name, None, copy.lm)
        self.owner[symbol] = kernel.out
        self.refs[v] = copy
        return copy


def plan_wishes(user: Node, v: Value, planner: Planner) -> list[Layout]:
    from ..kernels import wishes
    return wishes(user, v, planner)
