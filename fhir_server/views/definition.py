"""A ViewDefinition checked and compiled once: :func:`compile_view`.

The checks are the specification's ("Validate Columns") and this server's: the view
names a resource type; each ``select`` has at most one of ``forEach``,
``forEachOrNull`` and ``repeat``; column and constant names are SQL names
(``^[A-Za-z][A-Za-z0-9_]*$``) and column names are unique across the view; the branches
of a ``unionAll`` give the same column names in the same order; every ``path`` is
FHIRPath this server compiles (:mod:`.fhirpath`); a column whose path can yield several
values (``name.family`` on a Patient) says ``collection: true``; a ``where`` path is
boolean when its type is known. Each problem is an :class:`~fhir_server.outcome.Issue`
naming the element (``ViewDefinition.select[0].column[1].path``); all of them are
reported at once (:class:`ViewInvalid`).

The result, :class:`CompiledView`, is the row function the operations run:
``view.rows(resource)`` follows the processing algorithm (:mod:`.engine`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from fhir_server.outcome import FhirError, Issue
from fhir_server.views.engine import Column, Row, Selection, ViewError, Where, where_clause
from fhir_server.views.fhirpath import PathCompiler
from fhir_server.views.runtime import Compiled, Ctx, EvaluationError, Items
from fhir_server.views.syntax import UnsupportedPath
from fhir_server.views.types import ColumnType, column_type

JSON = dict[str, Any]
SQL_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
ITERATIONS = ("forEach", "forEachOrNull", "repeat")


class ViewInvalid(FhirError):
    """The ViewDefinition cannot run: a 400 (or the status the operation gives) whose
    issues name each element at fault."""

    def __init__(self, issues: list[Issue], status: int = 400):
        super().__init__(status, issues)


@dataclass(frozen=True, slots=True)
class ViewColumn:
    name: str
    path: str
    type: ColumnType
    description: str | None = None


@dataclass(slots=True)
class CompiledView:
    """A view ready to run: its resource type, columns (in output order), and
    :meth:`rows`."""

    resource: str
    name: str | None
    columns: list[ViewColumn]
    selection: Selection
    wheres: list[Where] = field(default_factory=list)
    source: JSON = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def rows(self, resource: JSON) -> list[Row]:
        """The rows ``resource`` gives (none for another type or one a ``where``
        drops); :class:`ViewError` when a path fails on it."""
        if resource.get("resourceType") != self.resource:
            return []
        ctx = Ctx(resource, 0)
        try:
            for keeps in self.wheres:
                if not keeps(resource, ctx):
                    return []
            return self.selection.rows(resource, ctx)
        except EvaluationError as exc:
            raise ViewError(f"{self.resource}/{resource.get('id')}: {exc}") from None

    def dicts(self, resource: JSON) -> list[JSON]:
        names = self.names
        return [dict(zip(names, row, strict=True)) for row in self.rows(resource)]


class _Builder:
    """One pass over a ViewDefinition: checks everything, compiles what is sound."""

    def __init__(self, view: JSON, known_type: Any, where: str, strict: bool):
        self.view = view
        self.strict = strict
        self.root = where
        self.issues: list[Issue] = []
        self.known_type = known_type
        self.columns: dict[str, ViewColumn] = {}
        self.compiler = PathCompiler(None)

    def fail(self, element: str, message: str, code: str = "invalid") -> None:
        self.issues.append(Issue("error", code, f"{element}: {message}", (element,)))

    def build(self) -> CompiledView:
        view, root = self.view, self.root
        if not isinstance(view, dict):
            raise ViewInvalid([Issue("error", "structure", "A ViewDefinition must be a "
                                     "JSON object", (root,))])
        resource = view.get("resource")
        if not isinstance(resource, str) or not resource:
            self.fail(f"{root}.resource", "the resource type the view reads is required",
                      "required")
        elif not self.known_type(resource):
            self.fail(f"{root}.resource", f"{resource!r} is not a resource type",
                      "not-supported")
        if view.get("name") is not None and not _sql_name(view.get("name")):
            self.fail(f"{root}.name", "must match ^[A-Za-z][A-Za-z0-9_]*$ (a SQL name)")
        self.compiler = PathCompiler(resource if isinstance(resource, str) else None,
                                     self._constants(view.get("constant")))
        selects = view.get("select")
        if not isinstance(selects, list) or not selects:
            self.fail(f"{root}.select", "a view needs at least one select", "required")
            selects = []
        top = Selection(selects=[self._select(s, f"{root}.select[{i}]",
                                              self.compiler.resource_type, False)
                                 for i, s in enumerate(selects)])
        wheres = self._wheres(view.get("where"))
        if self.issues:
            raise ViewInvalid(self.issues)
        if len(top.selects) == 1:  # the view's rows are its one select's rows
            top = top.selects[0]
        return CompiledView(str(resource), view.get("name"), list(self.columns.values()),
                            top, wheres, view)

    # -- constants -------------------------------------------------------------------------
    def _constants(self, constants: Any) -> dict[str, tuple[Items, str]]:
        found: dict[str, tuple[Items, str]] = {}
        if constants is None:
            return found
        if not isinstance(constants, list):
            self.fail(f"{self.root}.constant", "must be a list")
            return found
        for i, constant in enumerate(constants):
            where = f"{self.root}.constant[{i}]"
            if not isinstance(constant, dict):
                self.fail(where, "must be an object")
                continue
            name = constant.get("name")
            if not _sql_name(name):
                self.fail(f"{where}.name", "must match ^[A-Za-z][A-Za-z0-9_]*$")
                continue
            values = [(k, v) for k, v in constant.items() if k.startswith("value")]
            if len(values) != 1:
                self.fail(where, "needs exactly one value[x]", "required")
                continue
            key, value = values[0]
            fhir_type = key[5:6].lower() + key[6:]
            found[str(name)] = ([value], fhir_type)
        return found

    # -- selects ---------------------------------------------------------------------------
    def _select(self, select: Any, where: str, context: str | None, many: bool | None
                ) -> Selection:
        if not isinstance(select, dict):
            self.fail(where, "a select must be an object", "structure")
            return Selection()
        present = [k for k in ITERATIONS if select.get(k) is not None]
        if len(present) > 1:
            self.fail(where, f"at most one of forEach, forEachOrNull and repeat (found "
                      f"{', '.join(present)})")
        result = Selection(or_null="forEachOrNull" in present)
        focus, focus_many = context, many
        iteration = present[0] if present else None
        if iteration == "repeat":
            focus, focus_many = self._repeat(select["repeat"], f"{where}.repeat", context,
                                             result)
        elif iteration is not None:
            compiled = self._path(select[iteration], f"{where}.{iteration}", context, many)
            if compiled is not None:
                result.for_each = compiled.fn
                focus, focus_many = compiled.type, False
        for i, column in enumerate(_list(select.get("column"), f"{where}.column", self)):
            built = self._column(column, f"{where}.column[{i}]", focus, focus_many)
            if built is not None:
                result.columns.append(built)
        for i, nested in enumerate(_list(select.get("select"), f"{where}.select", self)):
            result.selects.append(self._select(nested, f"{where}.select[{i}]", focus,
                                               focus_many))
        branches = _list(select.get("unionAll"), f"{where}.unionAll", self)
        if branches:
            self._union(branches, f"{where}.unionAll", focus, focus_many, result)
        return result

    def _repeat(self, paths: Any, where: str, context: str | None, result: Selection
                ) -> tuple[str | None, bool]:
        if not isinstance(paths, list) or not paths:
            self.fail(where, "repeat takes a list of paths")
            return context, False
        types = set()
        for i, path in enumerate(paths):
            compiled = self._path(path, f"{where}[{i}]", context, False)
            if compiled is not None:
                result.repeat.append(compiled.fn)
                types.add(compiled.type)
        return (types.pop() if len(types) == 1 else None), False

    def _union(self, branches: list[Any], where: str, focus: str | None,
               focus_many: bool | None, result: Selection) -> None:
        before = dict(self.columns)
        first_names: list[str] | None = None
        first_columns: dict[str, ViewColumn] = {}
        for i, branch in enumerate(branches):
            self.columns = dict(before)  # each branch's names against those before it
            compiled = self._select(branch, f"{where}[{i}]", focus, focus_many)
            names = compiled.names
            if first_names is None:
                first_names = names
                first_columns = dict(self.columns)
            elif names != first_names:
                self.fail(f"{where}[{i}]", f"the branches of a unionAll must give the same "
                          f"columns in the same order: {names} is not {first_names}")
            result.union.append(compiled)
        self.columns = first_columns or before

    # -- columns and paths -------------------------------------------------------------------
    def _column(self, column: Any, where: str, focus: str | None, many: bool | None
                ) -> Column | None:
        if not isinstance(column, dict):
            self.fail(where, "a column must be an object", "structure")
            return None
        name, path = column.get("name"), column.get("path")
        if not isinstance(name, str) or not name:
            self.fail(f"{where}.name", "a column needs a name", "required")
            return None
        if not _sql_name(name):
            self.fail(f"{where}.name", f"{name!r} must match ^[A-Za-z][A-Za-z0-9_]*$ "
                      "(a SQL name)")
        if name in self.columns:
            self.fail(f"{where}.name", f"the column {name!r} is already defined")
        collection = column.get("collection") is True
        compiled = self._path(path, f"{where}.path", focus, many)
        if compiled is None:
            return None
        if self.strict and compiled.many is True and not collection:
            self.fail(f"{where}.collection", f"the path {path!r} can give several values: "
                      "set collection: true (or pick one, e.g. with first())")
        declared = column.get("type") if isinstance(column.get("type"), str) else None
        kind = column_type(declared, compiled.type, collection,
                           column.get("tag") if isinstance(column.get("tag"), list) else None)
        text = str(path)  # a string: _path compiled it
        self.columns[name] = ViewColumn(name, text, kind, column.get("description"))
        return Column(name, compiled.fn, collection, text.strip() == "%rowIndex",
                      compiled.scalar)

    def _path(self, path: Any, where: str, context: str | None, many: bool | None
              ) -> Compiled | None:
        if not isinstance(path, str) or not path.strip():
            self.fail(where, "a FHIRPath expression (a string) is required", "required")
            return None
        try:
            return self.compiler.compile(path, context, many)
        except UnsupportedPath as exc:
            self.fail(where, f"{path!r} is not FHIRPath this server runs: {exc}",
                      "not-supported")
            return None

    def _wheres(self, wheres: Any) -> list[Where]:
        found: list[Where] = []
        for i, clause in enumerate(_list(wheres, f"{self.root}.where", self)):
            where = f"{self.root}.where[{i}].path"
            path = clause.get("path") if isinstance(clause, dict) else None
            compiled = self._path(path, where, self.compiler.resource_type, False)
            if compiled is None:
                continue
            if compiled.type not in (None, "boolean"):
                self.fail(where, f"{path!r} gives {compiled.type}, not a boolean")
                continue
            found.append(where_clause(compiled.fn, str(path)))
        return found


def _list(value: Any, where: str, builder: _Builder) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        builder.fail(where, "must be a list", "structure")
        return []
    return value


def _sql_name(name: Any) -> bool:
    return isinstance(name, str) and SQL_NAME.match(name) is not None


def compile_view(view: Any, *, known_type: Any = None, where: str = "ViewDefinition",
                 strict: bool = True) -> CompiledView:
    """``view`` (a ViewDefinition as JSON) checked and compiled; :class:`ViewInvalid`
    naming every element at fault. ``where``: how issues name the view
    (``viewResource`` in a ``$run``). ``known_type``: which resource types exist (the
    server's, by default).

    ``strict`` (stored views, and what runs them): a column whose path *can* give several
    values must say ``collection: true``, as the specification's definition of
    ``collection`` asks of a ViewDefinition. Not strict (a view sent inline to
    ``$run``): only a column that *does* find several values in a resource fails, which
    is all the specification's processing algorithm checks."""
    if known_type is None:
        from fhir_server.definitions import is_resource_type
        known_type = is_resource_type
    return _Builder(view, known_type, where, strict).build()


def view_issues(view: Any) -> list[Issue]:
    """Everything wrong with a ViewDefinition to be stored (strict: see
    :func:`compile_view`); empty when it compiles."""
    try:
        compile_view(view, strict=True)
    except ViewInvalid as exc:
        return exc.issues
    return []


__all__ = ["CompiledView", "ViewColumn", "ViewError", "ViewInvalid", "compile_view"]
