"""Parser for PFN's layout notation (layout_notation.md, section 2.2).

    layout := [ shape "/" ] "(" dim { "," dim } [ ";" bcast ] ")"
    shape  := "(" INT { "," INT } [ "," ] ")"
    dim    := "(" factor { "," factor } ")"
    factor := INT [ "_" AXIS ] [ ":" INT ]
    bcast  := "B@[" item { "," item } "]"
    item   := AXIS | INT "_" AXIS [ ":" INT ]

Whitespace between tokens is insignificant (PFN's own material is inconsistent about it).
A hand-written recursive descent keeps every error at a character position with what was
expected there, which is what a user fixing a layout string needs.
"""

from __future__ import annotations

from ..errors import LayoutError
from .layout import Broadcast, Factor, Layout


def parse(text: str) -> Layout:
    """Parse a layout string; raises `LayoutError` with the position of the first problem."""
    return _Parser(text).layout()


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    # ---- tokens -----------------------------------------------------------------------------

    def _skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def _peek(self) -> str:
        self._skip()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def _fail(self, expected: str) -> LayoutError:
        self._skip()
        found = repr(self.text[self.pos]) if self.pos < len(self.text) else "the end of the text"
        return LayoutError(f"layout syntax error at character {self.pos + 1}: expected {expected}, found {found}",
                           text=self.text, position=self.pos, expected=expected)

    def _expect(self, char: str, what: str | None = None) -> None:
        if self._peek() != char:
            raise self._fail(what or repr(char))
        self.pos += 1

    def _accept(self, char: str) -> bool:
        if self._peek() == char:
            self.pos += 1
            return True
        return False

    def _int(self, what: str) -> int:
        self._skip()
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos].isdigit():
            self.pos += 1
        if start == self.pos:
            raise self._fail(what)
        value = int(self.text[start:self.pos])
        if value <= 0:
            self.pos = start
            raise self._fail(f"{what} greater than 0")
        return value

    def _name(self, what: str) -> str:
        start = self.pos
        if self.pos < len(self.text) and (self.text[self.pos].isalpha()):
            while self.pos < len(self.text) and (self.text[self.pos].isalnum()):
                self.pos += 1
        if start == self.pos:
            raise self._fail(what)
        return self.text[start:self.pos]

    # ---- grammar ----------------------------------------------------------------------------

    def layout(self) -> Layout:
        shape: tuple[int, ...] | None = None
        self._expect("(", "'(' to open the layout")
        if self._peek().isdigit():  # "(256,16)/..." : a shape prefix, not a dimension group
            shape = self._shape_rest()
            self._expect("/", "'/' after the shape")
            self._expect("(", "'(' to open the layout")
        dims = [self._dim()]
        broadcast: tuple[Broadcast, ...] = ()
        while True:
            if self._accept(","):
                dims.append(self._dim())
            elif self._accept(";"):
                broadcast = self._broadcast()
                self._expect(")", "')' to close the layout")
                break
            else:
                self._expect(")", "',' and another dimension, ';' and B@[...], or ')' to close the layout")
                break
        if self._peek():
            raise self._fail("the end of the layout")
        layout = Layout.of(dims, shape, broadcast)
        if shape is not None:
            self._check_shape(layout)
        return layout

    def _shape_rest(self) -> tuple[int, ...]:
        sizes = [self._int("a dimension size")]
        while self._accept(","):
            if self._peek() == ")":
                break
            sizes.append(self._int("a dimension size"))
        self._expect(")", "',' or ')' in the shape")
        return tuple(sizes)

    def _dim(self) -> list[Factor]:
        self._expect("(", "'(' to open a dimension's factors")
        factors = [self._factor()]
        while self._accept(","):
            factors.append(self._factor())
        self._expect(")", "',' and another factor, or ')' to close the dimension")
        return factors

    def _factor(self) -> Factor:
        size = self._int("a factor size")
        axis = None
        if self._accept("_"):
            axis = self._name("an axis name after '_'")
        stride = self._int("a stride") if self._accept(":") else 1
        return Factor(size, axis, stride)

    def _broadcast(self) -> tuple[Broadcast, ...]:
        self._skip()
        if not self.text.startswith("B@", self.pos):
            raise self._fail("'B@[' after ';'")
        self.pos += 2
        self._expect("[", "'[' after 'B@'")
        items = [self._broadcast_item()]
        while self._accept(","):
            items.append(self._broadcast_item())
        self._expect("]", "',' and another axis, or ']'")
        return tuple(items)

    def _broadcast_item(self) -> Broadcast:
        if self._peek().isdigit():
            size = self._int("a size")
            self._expect("_", "'_' and an axis name")
            axis = self._name("an axis name")
            stride = self._int("a stride") if self._accept(":") else 1
            return Broadcast(axis, size, stride)
        return Broadcast(self._name("an axis name or N_AXIS:stride"))

    def _check_shape(self, layout: Layout) -> None:
        if len(layout.shape) != layout.rank:
            raise LayoutError(f"the shape {layout.shape} has {len(layout.shape)} dimensions but the layout has "
                              f"{layout.rank} factor groups", text=self.text, position=0,
                              expected=f"{layout.rank} sizes in the shape")
        for d, (size, extent) in enumerate(zip(layout.shape, layout.extents)):
            if size > extent:
                raise LayoutError(f"dimension {d} has size {size} but its factors cover only {extent} positions "
                                  f"({', '.join(str(f) for f in layout.dims[d])})", text=self.text, position=0,
                                  expected=f"factors whose sizes multiply to at least {size}")
