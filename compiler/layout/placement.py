"""`Placement`: a layout bound to a chip, a memory kind and a dtype.

This is the one implementation of "where does element (i, j, ...) live" that the planner, code
generation, host upload/download and conversion all share. The rule is that of
layout_notation.md section 3.1:

1. each dimension's index is split mixed-radix over its factors, last factor fastest;
2. each digit times its stride is added to its target: an axis coordinate, the W position,
   the Time slice or the long-word address;
3. axes no factor names are replicated (broadcast): on a per-PE memory (LM, GRF) every
   unnamed axis; on a memory above the PE level (DRAM) only the axes listed in `B@`, so that a
   DRAM layout without an L2B factor lives in DRAM 0 only (the PFN educational compiler's
   convention); `W` follows step 3 everywhere;
4. the memory instance follows from the axis coordinates of the memory's level: for DRAM (one
   per Group) it is L2B div 2, from the chip's level counts.

mnsim's conventions where the sources are silent (layout_notation.md, "[I]"):
* a `B@` item on an axis that factors already place adds nothing (example C5);
* `Time` slices are stacked: slice t starts at address t * (address span of one slice);
* memories are rows of host-endian slots: the element at W position w of long word a is slot
  a * (elements per long word) + w of the row viewed in the element's width.

Everything is linear in the digits, so a placement is a list of coefficients: the memory offset
of an element is the sum of its digits times their coefficients, and a broadcast copy adds a
constant. Validation and the injectivity check work on the coefficients, so a layout of
hundreds of millions of elements is checked without materialising it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property
from math import prod

import numpy as np

from hwdesc import HwDesc

from ..errors import LayoutError
from .layout import TIME_AXIS, W_AXIS, Broadcast, Factor, Layout, spread

# Exact injectivity checks materialise the offsets of every element; beyond this many elements
# only the algebraic check runs, and a layout it cannot prove injective is rejected.
EXACT_CHECK_LIMIT = 1 << 24
CACHED_PLACEMENTS = 4096  # placements kept for reuse (a compile-time cache, not a hardware number)


@dataclass(frozen=True)
class InstanceAxis:
    """A layout axis as it indexes instances of the memory's level."""

    name: str
    size: int  # positions of the axis on the chip
    divisor: int  # positions per instance (2 for L2B on DRAM: one DRAM per Group)
    radix: int  # instance-index weight of one instance step along this axis

    @property
    def instances(self) -> int:
        return self.size // self.divisor


@dataclass(frozen=True)
class Location:
    """Every copy of some elements: arrays of equal length, one entry per (element, copy)."""

    element: np.ndarray  # flat index into the logical shape
    instance: np.ndarray
    lw: np.ndarray  # long-word address relative to the tensor's base (Time slices stacked)
    w: np.ndarray
    coords: dict[str, np.ndarray]  # axis coordinates, including broadcast positions
    time: np.ndarray


class Placement:
    """Where every element of a tensor lives on one memory kind of one chip; see the module doc.

    Placements are values: building one validates the layout, so the last few thousand built are
    kept and a placement asked for again is the same object (planning asks for the same ones
    many times)."""

    _cache: "OrderedDict[tuple, Placement]" = OrderedDict()

    def __new__(cls, layout: Layout, hw: HwDesc, memory: str, dtype: str, *, check_capacity: bool = True):
        key = (layout, hw.fingerprint, memory, dtype, check_capacity)  # layouts compare and hash canonically
        found = cls._cache.get(key)
        if found is not None:
            cls._cache.move_to_end(key)
            return found
        return super().__new__(cls)

    def __init__(self, layout: Layout, hw: HwDesc, memory: str, dtype: str, *, check_capacity: bool = True) -> None:
        if self.__dict__.get("_built"):
            return
        self._build(layout, hw, memory, dtype, check_capacity)
        self._built = True
        cache = type(self)._cache
        cache[(layout, hw.fingerprint, memory, dtype, check_capacity)] = self
        if len(cache) > CACHED_PLACEMENTS:
            cache.popitem(last=False)

    def _build(self, layout: Layout, hw: HwDesc, memory: str, dtype: str, check_capacity: bool) -> None:
        if memory not in hw.memories:
            raise LayoutError(f"memory {memory!r} does not exist on {hw.name}; expected one of {', '.join(hw.memories)}")
        if dtype not in hw.formats:
            raise LayoutError(f"dtype {dtype!r} has no number format on {hw.name}; expected one of {', '.join(hw.formats)}")
        self.layout = layout.canonical()
        self.hw, self.memory, self.dtype = hw, memory, dtype
        self.epl = hw.elements_per_lw(dtype)
        self.level = hw.memories[memory].level
        self.instance_count = hw.memory_instances(memory)
        self.instance_axes = self._instance_axes()
        self._check_factors()
        self._build_coefficients()
        self.fits = self.span_lw <= hw.memory_lw(memory)
        if check_capacity:
            self._check_capacity()
        self._check_injective()

    # ---- the chip's axes at this memory's level ---------------------------------------------

    def _instance_axes(self) -> list[InstanceAxis]:
        hw, levels = self.hw, self.hw.level_names
        depth = levels.index(self.level)
        axes: list[tuple[str, int, int]] = []
        for axis, size in hw.axes.items():
            names = hw.axis_levels(axis)
            above = [n for n in names if levels.index(n) <= depth]
            if above:
                divisor = prod(hw.levels[n].count for n in names if levels.index(n) > depth)
                axes.append((axis, size, divisor))
        out, radix = [], 1
        for axis, size, divisor in reversed(axes):
            out.append(InstanceAxis(axis, size, divisor, radix))
            radix *= size // divisor
        return list(reversed(out))

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.instance_axes)

    @property
    def is_leaf_memory(self) -> bool:
        return self.level == self.hw.leaf_level

    # ---- validation of the factors ------------------------------------------------------------

    def _where(self, d: int, f: Factor) -> str:
        return f"factor {f} of dimension {d}"

    def _check_factors(self) -> None:
        layout, hw = self.layout, self.hw
        known = (*hw.axes, W_AXIS, TIME_AXIS)
        for d, (size, extent) in enumerate(zip(layout.shape, layout.extents)):
            if size > extent:
                raise LayoutError(f"dimension {d} has size {size} but its factors cover {extent} positions "
                                  f"({', '.join(map(str, layout.dims[d]))}); the sizes must multiply to at least {size}")
        if len(layout.shape) != layout.rank:
            raise LayoutError(f"shape {layout.shape} has {len(layout.shape)} dimensions but the layout has {layout.rank}")
        reach: dict[str, int] = {}
        for d, f in layout.factors:
            if f.axis is None:
                continue
            if f.axis not in known:
                raise LayoutError(f"unknown axis {f.axis!r} in {self._where(d, f)}; {hw.name} has the axes "
                                  f"{', '.join(known)}")
            if f.axis in hw.axes and f.axis not in self.axis_names:
                raise LayoutError(f"axis {f.axis} in {self._where(d, f)} does not exist at {self.memory}'s level "
                                  f"({self.level}); a {self.memory} layout may use {', '.join((*self.axis_names, W_AXIS, TIME_AXIS))}")
            reach[f.axis] = reach.get(f.axis, 0) + f.reach
        for d, f in layout.factors:
            if f.axis is None or f.axis == TIME_AXIS:
                continue
            limit = self.epl if f.axis == W_AXIS else hw.axes[f.axis]
            if reach[f.axis] >= limit:
                rule = (f"a long word holds {self.epl} {self.dtype} elements" if f.axis == W_AXIS
                        else f"{hw.name} has {limit} {f.axis} positions")
                raise LayoutError(f"axis {f.axis} reaches position {reach[f.axis]} ({self._where(d, f)}) but {rule}")
        for b in layout.broadcast:
            if b.axis not in known or b.axis == TIME_AXIS:
                raise LayoutError(f"cannot broadcast over {b.axis!r} (B@ item {b}); {hw.name} has the axes "
                                  f"{', '.join((*hw.axes, W_AXIS))}")
            if b.axis in hw.axes and b.axis not in self.axis_names:
                raise LayoutError(f"B@ item {b}: axis {b.axis} does not exist at {self.memory}'s level ({self.level})")
            limit = self.epl if b.axis == W_AXIS else hw.axes[b.axis]
            if b.size is not None and (b.size - 1) * b.stride >= limit:
                raise LayoutError(f"B@ item {b} reaches position {(b.size - 1) * b.stride} but the axis has {limit}")
            if b.axis in reach and layout.adds_copies(b):
                if b.axis == W_AXIS:
                    raise LayoutError(f"B@ item {b}: lanes of a long word are either placed or all copies; copies "
                                      f"between placed lanes are not supported")
                self._check_partial_broadcast(b, limit)

    def _check_partial_broadcast(self, b: Broadcast, limit: int) -> None:
        """A sized B@ item on an axis the factors also place: every placed position plus every
        copy offset must be a distinct position of the axis."""
        positions = self.layout.positions(b.axis)
        every = spread(positions, b.size, b.stride)
        if max(every) >= limit or len(every) != len(positions) * b.size:
            raise LayoutError(f"B@ item {b} puts copies on {b.axis} positions the factors already use "
                              f"(placed at {sorted(positions)}); the copies must fall between them")

    # ---- coefficients -------------------------------------------------------------------------

    def _build_coefficients(self) -> None:
        factors = self.layout.factors
        n = len(factors)
        self.sizes = np.array([f.size for _, f in factors], dtype=np.int64)
        self.dim_of = np.array([d for d, _ in factors], dtype=np.int64)
        self.addr = np.array([f.stride if f.axis is None else 0 for _, f in factors], dtype=np.int64)
        self.wpos = np.array([f.stride if f.axis == W_AXIS else 0 for _, f in factors], dtype=np.int64)
        self.tpos = np.array([f.stride if f.axis == TIME_AXIS else 0 for _, f in factors], dtype=np.int64)
        self.coord = {a.name: np.array([f.stride if f.axis == a.name else 0 for _, f in factors], dtype=np.int64)
                      for a in self.instance_axes}
        reach = (self.sizes - 1)
        self.slice_span = int((reach * self.addr).sum()) + 1
        self.time_slices = int((reach * self.tpos).sum()) + 1
        self.span_lw = self.slice_span * self.time_slices
        self.lw_coef = self.addr + self.tpos * self.slice_span
        self.slot_coef = self.lw_coef * self.epl + self.wpos
        # Instance index is linear when every stride on a split axis is a multiple of its divisor.
        self.linear = all(not (self.coord[a.name] % a.divisor).any() for a in self.instance_axes)
        inst = np.zeros(n, dtype=np.int64)
        if self.linear:
            for a in self.instance_axes:
                inst += self.coord[a.name] // a.divisor * a.radix
        self.inst_coef = inst
        self._build_copies()

    def _build_copies(self) -> None:
        """Instance and slot offsets of every broadcast copy (the first copy is offset 0)."""
        placed = set(self.layout.placed_axes)
        explicit = {b.axis: b for b in self.layout.broadcast}
        per_axis: list[list[tuple[int, int, str, int]]] = []  # (instance offset, slot offset, axis, position)
        for a in self.instance_axes:
            if a.name in placed and (a.name not in explicit or not self.layout.adds_copies(explicit[a.name])):
                continue
            if a.name in explicit:
                b = explicit[a.name]
                positions = range(0, a.size, a.divisor) if b.size is None else range(0, b.size * b.stride, b.stride)
                # offsets below one instance of this memory's level (an L2B offset in a Group's DRAM)
                # land on the same instance: one copy there
                positions = [p for p in positions if p % a.divisor == 0]
            elif self.is_leaf_memory:
                positions = range(0, a.size, a.divisor)
            else:
                continue
            per_axis.append([(p // a.divisor * a.radix, 0, a.name, p) for p in positions])
        if W_AXIS not in placed:
            b = explicit.get(W_AXIS)
            positions = range(self.epl) if b is None or b.size is None else range(0, b.size * b.stride, b.stride)
            per_axis.append([(0, p, W_AXIS, p) for p in positions])
        # Each group is an arithmetic progression: one extra strided dimension of the copies.
        self.copy_dims = [(len(g), g[1][0] - g[0][0] if len(g) > 1 else 0, g[1][1] - g[0][1] if len(g) > 1 else 0)
                          for g in per_axis]
        counts = [len(g) for g in per_axis]
        grid = np.indices(counts, dtype=np.int64).reshape(len(counts), -1) if counts else np.zeros((0, 1), np.int64)
        self.copy_inst = sum((np.array([c[0] for c in g], np.int64)[grid[i]] for i, g in enumerate(per_axis)),
                             np.zeros(grid.shape[1], np.int64))
        self.copy_slot = sum((np.array([c[1] for c in g], np.int64)[grid[i]] for i, g in enumerate(per_axis)),
                             np.zeros(grid.shape[1], np.int64))
        self.copy_coords = {g[0][2]: np.array([c[3] for c in g], np.int64)[grid[i]] for i, g in enumerate(per_axis)}
        self.broadcast_axes = tuple(group[0][2] for group in per_axis)

    @property
    def copies(self) -> int:
        """How many copies of each element the memory holds."""
        return len(self.copy_inst)

    @property
    def slots_per_lw(self) -> int:
        return self.epl

    # ---- capacity and injectivity -------------------------------------------------------------

    def _check_capacity(self) -> None:
        capacity = self.hw.memory_lw(self.memory)
        if self.span_lw > capacity:
            raise LayoutError(f"the layout spans {self.span_lw} long words per {self.memory} instance "
                              f"({self.time_slices} time slices x {self.slice_span}) but {self.memory} holds "
                              f"{capacity} on {self.hw.name}")

    def _check_injective(self) -> None:
        if self.linear and self._superincreasing():
            return
        if self.layout.numel > EXACT_CHECK_LIMIT:
            raise LayoutError(f"cannot prove that {self.layout} places its {self.layout.numel} elements at distinct "
                              f"addresses (strides are not nested); split the factors so they nest")
        loc = self.locate(first_copy_only=True)
        key = loc.instance * (self.span_lw * self.epl) + loc.lw * self.epl + loc.w
        order = np.argsort(key, kind="stable")
        same = np.nonzero(key[order][1:] == key[order][:-1])[0]
        if len(same):
            a, b = loc.element[order[same[0]]], loc.element[order[same[0] + 1]]
            ia, ib = np.unravel_index(a, self.layout.shape), np.unravel_index(b, self.layout.shape)
            differing = [str(f) for (d, f), da, db in zip(self.layout.factors, self.digits_of(int(a)), self.digits_of(int(b)))
                         if da != db]
            i = order[same[0]]
            raise LayoutError(f"address overlap: elements {tuple(map(int, ia))} and {tuple(map(int, ib))} both land on "
                              f"{self.memory} instance {int(loc.instance[i])}, long word {int(loc.lw[i])}, W {int(loc.w[i])}; "
                              f"factors {', '.join(differing)} overlap (their strides do not nest)")

    def _superincreasing(self) -> bool:
        """Sufficient test: sorted by coefficient, each one exceeds everything the smaller ones reach."""
        coef = self.inst_coef * (self.span_lw * self.epl) + self.slot_coef
        order = np.argsort(coef, kind="stable")
        covered = 0
        for k in order:
            if self.sizes[k] == 1:
                continue
            if coef[k] <= covered:
                return False
            covered += int(coef[k]) * int(self.sizes[k] - 1)
        return True

    # ---- element -> location ------------------------------------------------------------------

    def digits_of(self, flat_index: int) -> list[int]:
        """Digits of one element, one per factor (for error messages and `--where`)."""
        multi = np.unravel_index(flat_index, self.layout.shape)
        return [int(x) for x in self._digits(np.array(multi, dtype=np.int64).reshape(-1, 1))[:, 0]]

    def _digits(self, multi: np.ndarray) -> np.ndarray:
        """[rank, n] indices -> [factors, n] digits (last factor of a dimension fastest)."""
        digits = np.empty((len(self.sizes), multi.shape[1]), dtype=np.int64)
        k = len(self.sizes)
        for d in reversed(range(self.layout.rank)):
            rest = multi[d].copy()
            for f in reversed(self.layout.dims[d]):
                k -= 1
                digits[k] = rest % f.size
                rest //= f.size
        return digits

    def _parts(self, coef: np.ndarray) -> list[np.ndarray]:
        """Per dimension d, what each index value 0..shape[d]-1 adds to sum_k coef[k] * digit_k:
        a linear quantity of an element is the sum of its dimensions' parts."""
        parts, k = [], 0
        for d, size in enumerate(self.layout.shape):
            factors = self.layout.dims[d]
            rest = np.arange(size, dtype=np.int64)
            part = np.zeros(size, dtype=np.int64)
            for j in reversed(range(len(factors))):
                if coef[k + j]:
                    part += coef[k + j] * (rest % factors[j].size)
                rest //= factors[j].size
            k += len(factors)
            parts.append(part)
        return parts

    def _outer(self, coef: np.ndarray) -> np.ndarray:
        """sum_k coef[k] * digit_k over every element in row-major order, built as an outer sum of
        one small vector per dimension (no per-element division)."""
        total = np.zeros(1, dtype=np.int64)
        for part in self._parts(coef):
            total = np.add.outer(total, part).ravel()
        return total

    def _gathered(self, coef: np.ndarray, multi: np.ndarray) -> np.ndarray:
        """sum_k coef[k] * digit_k of the elements at indices `multi` ([rank, n]): a lookup per
        dimension, where digits would cost a division per factor and element."""
        total = np.zeros(multi.shape[1], dtype=np.int64)
        for d, part in enumerate(self._parts(coef)):
            if part.any():
                total += part[multi[d]]
        return total

    def dim_terms(self, sizes: tuple[int, ...] | None = None) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per dimension, what its index adds to (instance, long word, W) of an element, for each
        index value below `sizes` (default: the shape; up to the extents, padding positions): a
        linear placement's locations are sums of these terms. Planning asks for the same terms
        often: they are kept on the placement, read-only."""
        cache = self.__dict__.setdefault("_terms_cache", {})
        if sizes not in cache:
            cache[sizes] = self._dim_terms(sizes)
        return list(cache[sizes])

    def _dim_terms(self, sizes: tuple[int, ...] | None) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...]:
        out, k = [], 0
        for d, size in enumerate(sizes if sizes is not None else self.layout.shape):
            factors = self.layout.dims[d]
            idx = np.arange(size, dtype=np.int64)
            terms = [np.zeros(size, dtype=np.int64) for _ in range(3)]
            rest = idx.copy()
            for j in reversed(range(len(factors))):
                digit = rest % factors[j].size
                rest //= factors[j].size
                for t, coef in zip(terms, (self.inst_coef, self.lw_coef, self.wpos)):
                    if coef[k + j]:
                        t += coef[k + j] * digit
            k += len(factors)
            for t in terms:
                t.setflags(write=False)
            out.append(tuple(terms))
        return tuple(out)

    def locate(self, elements: np.ndarray | None = None, *, first_copy_only: bool = False) -> Location:
        """Locations of the given flat element indices (default: all), one row per copy."""
        if elements is None:  # every element: each quantity is a sum of per-dimension terms
            elements = np.arange(self.layout.numel, dtype=np.int64)
            linear = self._outer
        else:
            elements = np.asarray(elements, dtype=np.int64).ravel()
            multi = np.array(np.unravel_index(elements, self.layout.shape), dtype=np.int64).reshape(self.layout.rank, -1)
            linear = lambda coef: self._gathered(coef, multi)  # noqa: E731
        lw = linear(self.lw_coef)
        w = linear(self.wpos)
        t = linear(self.tpos)
        coords = {a.name: linear(self.coord[a.name]) for a in self.instance_axes}
        inst = np.zeros_like(lw)
        for a in self.instance_axes:
            inst += coords[a.name] // a.divisor * a.radix
        n_copies = 1 if first_copy_only else self.copies
        if n_copies == 1:
            rep = lambda x: x  # noqa: E731
            tile = lambda x: x[0]  # noqa: E731
        else:
            rep = lambda x: np.repeat(x, n_copies)  # noqa: E731
            tile = lambda x: np.tile(x[:n_copies], len(elements))  # noqa: E731
        out_coords = {name: rep(c) + (tile(self.copy_coords[name]) if name in self.copy_coords else 0)
                      for name, c in coords.items()}
        w_all = rep(w) + tile(self.copy_slot)
        return Location(element=rep(elements), instance=rep(inst) + tile(self.copy_inst), lw=rep(lw),
                        w=w_all, coords=out_coords, time=rep(t))

    def element_at(self, instance: np.ndarray, lw: np.ndarray, w: np.ndarray) -> np.ndarray:
        """The inverse map: flat element index held at (instance, long word, W), or -1 for a hole."""
        instance, lw, w = (np.asarray(a, dtype=np.int64) for a in (instance, lw, w))
        inverse = self._inverse
        inside = (instance >= 0) & (instance < self.instance_count) & (lw >= 0) & (lw < self.span_lw) & \
                 (w >= 0) & (w < self.epl)
        key = np.where(inside, (instance * self.span_lw + lw) * self.epl + w, 0)
        return np.where(inside, inverse[key], -1)

    @cached_property
    def _inverse(self) -> np.ndarray:
        slots = self.instance_count * self.span_lw * self.epl
        if slots > 4 * EXACT_CHECK_LIMIT:
            raise LayoutError(f"the inverse map of {self.layout} would need {slots} entries; locate elements instead")
        inverse = np.full(slots, -1, dtype=np.int64)
        loc = self.locate()
        inverse[(loc.instance * self.span_lw + loc.lw) * self.epl + loc.w] = loc.element
        return inverse

    # ---- what a person asks of a layout -------------------------------------------------------

    @cached_property
    def instances_used(self) -> np.ndarray:
        """Sorted indices of the memory instances that hold any element (from the digits' instance
        coefficients when the map is linear: no per-element work)."""
        if self.linear:
            return self._instances_used_by_digits()
        return np.unique(self.locate(first_copy_only=False).instance)

    def _instances_used_by_digits(self) -> np.ndarray:
        """The instances elements reach: per dimension, the instance terms of its digits that place
        instances (a combination counts when its smallest index is inside the shape, so padding
        reaches nothing), summed over dimensions, plus every copy's offset. No per-element work."""
        base = np.zeros(1, dtype=np.int64)
        k = 0
        for d, size in enumerate(self.layout.shape):
            factors = self.layout.dims[d]
            place, places = 1, []
            for f in reversed(factors):
                places.insert(0, place)
                place *= f.size
            picked = [j for j in range(len(factors)) if self.inst_coef[k + j]]
            inst, low = np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64)
            for j in picked:
                digit = np.arange(factors[j].size, dtype=np.int64)
                inst = (inst[:, None] + digit[None, :] * self.inst_coef[k + j]).ravel()
                low = (low[:, None] + digit[None, :] * places[j]).ravel()
            base = np.unique((base[:, None] + np.unique(inst[low < size])[None, :]).ravel())
            k += len(factors)
        return np.unique((base[:, None] + self.copy_inst[None, :]).ravel())

    @cached_property
    def distinct_instances(self) -> int:
        """Instances holding distinct data (the first copy of every element)."""
        return len(np.unique(self.locate(first_copy_only=True).instance))

    @property
    def instance_replicas(self) -> int:
        """Copies of each element on different instances (W copies inside a long word excluded)."""
        return int(np.prod([n for (n, inst, _), axis in zip(self.copy_dims, self.broadcast_axes) if axis != W_AXIS]))

    @property
    def footprint_lw(self) -> int:
        """Long words one instance reserves for this tensor: the address span of all slices."""
        return self.span_lw

    @property
    def footprint_bytes_total(self) -> int:
        return self.span_lw * self.hw.long_word_bytes * len(self.instances_used)

    def instance_coordinates(self, instance: int) -> dict[str, int]:
        """Axis coordinates (in instance units) of one memory instance, e.g. {'L2B': 3, 'L1B': 1, ...}."""
        out = {}
        for a in self.instance_axes:
            out[a.name] = (instance // a.radix) % a.instances * a.divisor
        return out

    def level_coordinates(self, instance: int) -> dict[str, int]:
        """Per-level indices of an instance, e.g. {'Group': 1, 'L2B': 1, 'L1B': 0, 'MAB': 3, 'PE': 2}."""
        hw, out, rest = self.hw, {}, instance
        names = hw.level_names[: hw.level_names.index(self.level) + 1]
        for name in reversed(names):
            out[name] = rest % hw.levels[name].count
            rest //= hw.levels[name].count
        return {n: out[n] for n in names}

    def same_placement(self, other: "Placement") -> bool:
        """True when both put every element (and every copy) at the same instance, address and W."""
        if (self.hw.fingerprint, self.memory, self.dtype, self.layout.shape) != \
                (other.hw.fingerprint, other.memory, other.dtype, other.layout.shape):
            return False
        if self.layout == other.layout:
            return True
        if self.copies != other.copies:
            return False
        if self.linear and other.linear:  # locations are sums of per-dimension terms: compare those
            for mine, theirs in zip(self.dim_terms(), other.dim_terms()):
                if any(not np.array_equal(a, b) for a, b in zip(mine, theirs)):
                    return False
            ours = sorted(zip(self.copy_inst.tolist(), self.copy_slot.tolist()))
            return ours == sorted(zip(other.copy_inst.tolist(), other.copy_slot.tolist()))
        if self.span_lw != other.span_lw:
            return False

        def keys(p: "Placement") -> np.ndarray:
            loc = p.locate()
            return np.sort(((loc.instance * p.span_lw + loc.lw) * p.epl + loc.w) * p.layout.numel + loc.element)

        return bool(np.array_equal(keys(self), keys(other)))
