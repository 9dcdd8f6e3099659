"""The processing algorithm of SQL on FHIR v2 ("Process a Resource", ``Process(S, N)``)
over compiled selection structures.

A selection structure is compiled once (:mod:`.definition`) into a :class:`Selection`:
the functions of its columns, its iteration (``forEach``, ``forEachOrNull`` or
``repeat``), its nested ``select``s and its ``unionAll``. :meth:`Selection.rows` then
follows the specification step by step for one node: the foci, per focus (with its
``%rowIndex``) one partial row of its own columns, the rows of each nested select and
the union's rows, and the Cartesian product of those parts, each row a tuple of the
structure's columns in the specification's column order. An empty ``forEachOrNull``
gives one row of nulls (``0`` for ``%rowIndex`` columns).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import product
from typing import Any

from fhir_server.views.runtime import MANY, Ctx, Fn, Items, Scalar

Row = tuple[Any, ...]


class ViewError(ValueError):
    """A view failed on a resource (a column found several values, a ``where`` path gave
    something other than a boolean)."""


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    fn: Fn
    collection: bool
    row_index: bool = False  # the path is %rowIndex (0 on an empty forEachOrNull)
    scalar: Scalar | None = None  # the path's fast form (see fhirpath.Compiled)

    def value(self, focus: Any, ctx: Ctx) -> Any:
        if self.scalar is not None and not self.collection:
            single = self.scalar(focus, ctx)
            if single is not MANY:
                return single
        found = self.fn([focus], ctx)
        if self.collection:
            return found
        if not found:
            return None
        if len(found) > 1:
            raise ViewError(f"column {self.name!r} found {len(found)} values; a column "
                            "that may hold several needs collection: true")
        return found[0]


@dataclass(slots=True)
class Selection:
    """One compiled selection structure (``ViewDefinition.select``)."""

    columns: list[Column] = field(default_factory=list)
    selects: list[Selection] = field(default_factory=list)
    union: list[Selection] = field(default_factory=list)
    for_each: Fn | None = None
    or_null: bool = False
    repeat: list[Fn] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        """Its columns in output order: own, nested selects', the union's (first branch)."""
        names = [c.name for c in self.columns]
        for select in self.selects:
            names += select.names
        if self.union:
            names += self.union[0].names
        return names

    def _index_columns(self) -> list[bool]:
        flags = [c.row_index for c in self.columns]
        for select in self.selects:
            flags += select._index_columns()
        if self.union:
            flags += self.union[0]._index_columns()
        return flags

    def null_row(self) -> Row:
        return tuple(0 if flag else None for flag in self._index_columns())

    def foci(self, node: Any, ctx: Ctx) -> Items:
        if self.repeat:
            found: Items = []
            self._traverse(node, ctx, found)
            return found
        if self.for_each is not None:
            return self.for_each([node], ctx)
        return [node]

    def _traverse(self, node: Any, ctx: Ctx, found: Items) -> None:
        for path in self.repeat:
            for child in path([node], ctx):
                found.append(child)
                self._traverse(child, ctx, found)

    def rows(self, node: Any, ctx: Ctx) -> list[Row]:
        if self.for_each is None and not self.repeat and not self.selects \
                and not self.union:  # one row of plain columns: the common view
            return [tuple([column.value(node, ctx) for column in self.columns])]
        iterates = self.for_each is not None or bool(self.repeat)
        foci = self.foci(node, ctx) if iterates else [node]
        out: list[Row] = []
        for index, focus in enumerate(foci):
            here = Ctx(ctx.resource, index) if iterates else ctx
            own = tuple(column.value(focus, here) for column in self.columns)
            if not self.selects and not self.union:
                out.append(own)
                continue
            parts: list[list[Row]] = [[own]]
            parts += [select.rows(focus, here) for select in self.selects]
            if self.union:
                parts.append([row for branch in self.union for row in branch.rows(focus, here)])
            out += [sum(combination, ()) for combination in product(*parts)]
        if not foci and self.or_null:
            out.append(self.null_row())
        return out


Where = Callable[[dict[str, Any], Ctx], bool]


def where_clause(fn: Fn, path: str) -> Where:
    """A ``where`` path as a test of the resource: true keeps it; empty or false drops
    it; anything else is an error (the specification's test "where with path resolving
    to not boolean")."""
    def keeps(resource: dict[str, Any], ctx: Ctx) -> bool:
        found = fn([resource], ctx)
        if not found:
            return False
        if len(found) != 1 or not isinstance(found[0], bool):
            raise ViewError(f"where path {path!r} gave {found!r}, not a boolean")
        return found[0]
    return keeps
