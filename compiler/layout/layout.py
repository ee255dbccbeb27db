"""`Layout`: PFN's tensor layout notation as a value.

A layout says, per tensor dimension (outermost first), how the dimension's index is split into
factors, major to minor, and where each factor's digit goes: onto a hardware axis (`8_L2B:1`),
the element-in-long-word axis (`2_W:1`), the time-slice axis (`25_Time:1`) or the long-word
address (`4:2`). `B@[...]` lists axes the tensor is replicated over. Axis names are not checked
here (a layout is chip-independent text); `Placement` binds a layout to a chip.

Two layouts are equal when they place every element alike: spacing, omitted or redundant strides,
size-1 factors and factors that merge (`2:8, 8:1` is `16:1`) do not make them differ. `str()`
prints that canonical form.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

ADDRESS = None  # the axis of an untagged factor: the long-word address
W_AXIS = "W"
TIME_AXIS = "Time"


@dataclass(frozen=True)
class Factor:
    """One digit of a dimension's index: `size` positions, each `stride` apart on `axis`."""

    size: int
    axis: str | None = ADDRESS
    stride: int = 1

    def __str__(self) -> str:
        return f"{self.size}:{self.stride}" if self.axis is None else f"{self.size}_{self.axis}:{self.stride}"

    @property
    def reach(self) -> int:
        """The largest offset this factor adds: (size - 1) * stride."""
        return (self.size - 1) * self.stride


@dataclass(frozen=True)
class Broadcast:
    """A `B@` item: replicate over `axis`; every position (`size` None) or `size` positions `stride` apart."""

    axis: str
    size: int | None = None
    stride: int = 1

    def __str__(self) -> str:
        return self.axis if self.size is None else f"{self.size}_{self.axis}:{self.stride}"


# Equal layouts are built again and again (planning tries the same ones for many candidates):
# their canonical forms are shared. A compile-time cache, cleared when full.
CACHED_CANONICAL = 8192
_CANONICAL: dict[tuple, "Layout"] = {}


@dataclass(frozen=True, eq=False)
class Layout:
    """A tensor layout in PFN notation; see the module doc."""

    dims: tuple[tuple[Factor, ...], ...]
    shape: tuple[int, ...]
    broadcast: tuple[Broadcast, ...] = field(default=())

    @staticmethod
    def of(dims: list[list[Factor]] | tuple, shape: tuple[int, ...] | None = None,
           broadcast: tuple[Broadcast, ...] = ()) -> "Layout":
        """Build a layout from factor lists; the shape defaults to the factor extents."""
        dims_t = tuple(tuple(d) for d in dims)
        return Layout(dims_t, tuple(shape) if shape is not None else tuple(prod(f.size for f in d) for d in dims_t),
                      tuple(broadcast))

    # ---- structure --------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def extents(self) -> tuple[int, ...]:
        """Padded extent of each dimension: the product of its factor sizes."""
        return tuple(prod(f.size for f in d) for d in self.dims)

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def factors(self) -> list[tuple[int, Factor]]:
        """All factors with their dimension, outermost dimension first."""
        return [(d, f) for d, dim in enumerate(self.dims) for f in dim]

    @property
    def placed_axes(self) -> tuple[str, ...]:
        """Axes named by some factor, in order of first mention (address excluded)."""
        seen: list[str] = []
        for _, f in self.factors:
            if f.axis is not None and f.axis not in seen:
                seen.append(f.axis)
        return tuple(seen)

    def positions(self, axis: str) -> set[int]:
        """The positions of `axis` the factors place elements on."""
        out = {0}
        for _, f in self.factors:
            if f.axis == axis:
                out = spread(out, f.size, f.stride)
        return out

    def adds_copies(self, b: Broadcast) -> bool:
        """Whether a sized B@ item on an axis the factors also place makes copies: at offsets that
        fall between the placed positions (`4_L2B:2` with `B@[2_L2B:1]` puts every element on two
        L2Bs). An item that only restates placed positions (PFN's `B@[4_L2B:2]` next to
        `4_L2B:2`) adds none; a bare item on a placed axis neither."""
        if b.size is None or b.size == 1:
            return False
        return not spread({0}, b.size, b.stride) <= self.positions(b.axis)

    # ---- canonical form ---------------------------------------------------------------------

    def canonical(self) -> "Layout":
        """The equal layout with merged factors, unit strides on size-1 factors and no redundancy
        (computed once per layout: layouts are compared and hashed a lot)."""
        cached = self.__dict__.get("_canonical")
        if cached is None:
            raw = (self.dims, self.shape, self.broadcast)
            cached = _CANONICAL.get(raw)
            if cached is None:
                cached = self._canonical_form()
                object.__setattr__(cached, "_canonical", cached)
                if len(_CANONICAL) >= CACHED_CANONICAL:
                    _CANONICAL.clear()
                _CANONICAL[raw] = cached
            object.__setattr__(self, "_canonical", cached)
        return cached

    def _canonical_form(self) -> "Layout":
        placed_elsewhere = {f.axis for _, f in self.factors if f.axis is not None and f.size > 1}
        kept_unit_axes: set[str] = set()
        dims = []
        for dim in self.dims:
            real = [f for f in dim if f.size > 1]
            units = []
            for f in dim:
                if f.size == 1 and f.axis is not None and f.axis not in placed_elsewhere \
                        and f.axis not in kept_unit_axes:
                    kept_unit_axes.add(f.axis)
                    units.append(Factor(1, f.axis, 1))
            merged = _coalesce(real)
            dims.append(tuple(merged + units) or (Factor(1, ADDRESS, 1),))
        placed = {f.axis for d in dims for f in d if f.axis is not None}
        items = sorted({b for b in self.broadcast if b.axis not in placed or self.adds_copies(b)},
                       key=lambda b: (b.axis, b.size or 0, b.stride))
        items = [Broadcast(b.axis, b.size, 1 if b.size == 1 else b.stride) for b in items]
        return Layout(tuple(dims), self.shape, tuple(dict.fromkeys(items)))

    def key(self) -> tuple:
        """What canonical equality compares (and hashes): shape, dims and broadcasts of the canonical form."""
        key = self.__dict__.get("_key_cache")
        if key is None:
            c = self.canonical()
            key = (c.shape, c.dims, c.broadcast)
            object.__setattr__(self, "_key_cache", key)
        return key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and self.key() == other.key()

    def __hash__(self) -> int:
        """Kept: the key is a tuple of factor dataclasses, hashed afresh on every call, and planning
        looks layouts up in caches millions of times (a MobileViT training step: 17 M hashes)."""
        h = self.__dict__.get("_hash_cache")
        if h is None:
            h = hash(self.key())
            object.__setattr__(self, "_hash_cache", h)
        return h

    # ---- printing ---------------------------------------------------------------------------

    def __str__(self) -> str:
        return self.canonical().format()

    def __repr__(self) -> str:
        return f"Layout({str(self)!r})"

    def format(self, *, with_shape: bool = True, extra_broadcast: tuple[str, ...] = ()) -> str:
        """This layout's text as it stands (not canonicalised); optionally with more `B@` axes."""
        dims = ", ".join("(" + ", ".join(str(f) for f in dim) + ")" for dim in self.dims)
        items = [str(b) for b in self.broadcast] + [a for a in extra_broadcast
                                                   if a not in {b.axis for b in self.broadcast}]
        bcast = f"; B@[{', '.join(items)}]" if items else ""
        shape = ""
        if with_shape:
            shape = "(" + ", ".join(str(s) for s in self.shape) + ("," if len(self.shape) == 1 else "") + ")/"
        return f"{shape}({dims}{bcast})"

    # ---- transformations the compiler uses ----------------------------------------------------

    def with_shape(self, shape: tuple[int, ...]) -> "Layout":
        return Layout(self.dims, tuple(shape), self.broadcast)

    def permute(self, order: tuple[int, ...]) -> "Layout":
        """The layout of `tensor.permute(order)`: the same placement, dimensions reordered."""
        return Layout(tuple(self.dims[i] for i in order), tuple(self.shape[i] for i in order), self.broadcast)


def spread(positions: set[int], size: int, stride: int) -> set[int]:
    """Every position plus each of `size` offsets `stride` apart (a factor's or a B@ item's digit)."""
    return {p + i * stride for p in positions for i in range(size)}


def _coalesce(factors: list[Factor]) -> list[Factor]:
    """Merge neighbours that act as one digit: outer stride == inner size * inner stride, same axis."""
    out: list[Factor] = []
    for f in factors:
        if out and out[-1].axis == f.axis and out[-1].stride == f.size * f.stride:
            outer = out.pop()
            f = Factor(outer.size * f.size, f.axis, f.stride)
        out.append(f)
    return out


def has_lanes(layout: Layout) -> bool:
    """Whether the layout packs elements into the lanes of a long word (a W factor). One without
    lanes holds each element in every lane of its long word."""
    return bool(lane_dims(layout))


def lane_dims(layout: Layout) -> list[int]:
    """The dimensions whose factors pack elements into the lanes (one, or none, in a layout a
    kernel writes: channels for a convolution's output)."""
    return [d for d, f in layout.factors if f.axis == W_AXIS and f.size > 1]


def lane_padding_dims(layout: Layout, lanes: int | None = None) -> list[int]:
    """The dimensions whose long words hold both elements and padding: a dimension packed into
    the lanes (`f.size` positions `below` apart in its index) whose length that block does not
    divide; given the `lanes` of a long word, every packed dimension when the layout's lane
    factors fill fewer. Such a long word moves whole, padding lanes and all; every other padding
    position fills long words of its own, which a gather can write with zeros."""
    dims, packed = [], []
    for d, factors in enumerate(layout.dims):
        for j, f in enumerate(factors):
            if f.axis == W_AXIS and f.size > 1:
                packed.append(d)
                below = prod(g.size for g in factors[j + 1:])
                if layout.shape[d] % (f.size * below) != 0:
                    dims.append(d)
                break
    if packed and lanes is not None and prod(f.size for _, f in layout.factors if f.axis == W_AXIS) < lanes:
        return packed
    return dims


def lanes_innermost(layout: Layout) -> bool:
    """Whether the lanes (if packed) are the innermost digit of one dimension: the layouts whose
    lanes an LM layout can keep, so the only ones a relayout can start from."""
    for dim in layout.dims:
        for k, f in enumerate(dim):
            if f.axis == W_AXIS and f.size > 1:
                return f.stride == 1 and all(g.size == 1 for g in dim[k + 1:])
    return True
