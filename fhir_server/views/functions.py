"""The FHIRPath functions a view path may call, each a factory compiling a call:
``factory(compiler, base, arguments)`` → :class:`~.runtime.Compiled`.

The shareable profile's (``where``, ``exists``, ``empty``, ``first``, ``ofType`` is the
compiler's, ``extension``, ``join``, ``lowBoundary``, ``highBoundary``), the ones SQL on
FHIR adds (``getResourceKey``, ``getReferenceKey``), and common ones beyond (``select``,
``all``, ``not``, ``last``, ``tail``, ``skip``, ``take``, ``single``, ``count``,
``distinct``, ``hasValue``, ``iif``, ``toString``, ``toInteger``, string functions).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from fhir_server.views.runtime import (
    MANY,
    Compiled,
    Ctx,
    EvaluationError,
    Items,
    many_of,
    single,
    truth,
    union,
)
from fhir_server.views.syntax import Node, UnsupportedPath

if TYPE_CHECKING:
    from fhir_server.views.fhirpath import PathCompiler


Factory = Callable[["PathCompiler", Compiled, tuple[Node, ...]], Compiled]


def _arity(name: str, args: tuple[Node, ...], low: int, high: int) -> None:
    if not low <= len(args) <= high:
        wanted = str(low) if low == high else f"{low} to {high}"
        raise UnsupportedPath(f"{name}() takes {wanted} argument(s), got {len(args)}")


def _per_item(c: PathCompiler, base: Compiled, arg: Node) -> Compiled:
    """An argument evaluated on each item of the base (``where``, ``select``, ``exists``)."""
    return c.node(arg, base.type, False)


def _f_where(c: PathCompiler, base: Compiled, args: tuple[Node, ...]) -> Compiled:
    _arity("where", args, 1, 1)
    criterion, fn = _per_item(c, base, args[0]).fn, base.fn

    def where(items: Items, ctx: Ctx) -> Items:
        return [i for i in fn(items, ctx) if truth(criterion([i], ctx)) is True]
    return Compiled(where, base.type, base.many)


def _f_select(c: PathCompiler, base: Compiled, args: tuple[Node, ...]) -> Compiled:
    _arity("select", args, 1, 1)
    projection, fn = _per_item(c, base, args[0]), base.fn

    def select(items: Items, ctx: Ctx) -> Items:
        return [v for i in fn(items, ctx) for v in projection.fn([i], ctx)]
    return Compiled(select, projection.type, many_of(base.many, projection.many))


def _f_exists(c: PathCompiler, base: Compiled, args: tuple[Node, ...]) -> Compiled:
    _arity("exists", args, 0, 1)
    if args:
        base = _f_where(c, base, args)
    fn = base.fn
    return Compiled(lambda items, ctx: [bool(fn(items, ctx))], "boolean", False)


def _f_all(c: PathCompiler, base: Compiled, args: tuple[Node, ...]) -> Compiled:
    _arity("all", args, 1, 1)
    criterion, fn = _per_item(c, base, args[0]).fn, base.fn
    return Compiled(lambda items, ctx: [all(truth(criterion([i], ctx)) is True
                                            for i in fn(items, ctx))], "boolean", False)


def _f_empty(c: PathCompiler, base: Compiled, args: tuple[Node, ...]) -> Compiled:
    _arity("empty", args, 0, 0)
    fn = base.fn
    return Compiled(lambda items, ctx: [not fn(items, ctx)], "boolean", False)


def _f_not(c: PathCompiler, base: Compiled, args: tuple[Node, ...]) -> Compiled:
    _arity("not", args, 0, 0)
    fn = base.fn

    def negate(items: Items, ctx: Ctx) -> Items:
        value = truth(fn(items, ctx))
        return [] if value is None else [not value]
    return Compiled(negate, "boolean", False)


def _f_first(c: PathCompiler, base: Compiled, args: tuple[Node, ...]) -> Compiled:
    _arity("first", args, 0, 0)
    fn = base.fn
    return Compiled(lambda items, ctx: fn(items, ctx)[:1], base.type, False)


def _f_last(c: PathCompiler, base: Compiled, args: tuple[Node, ...]) -> Compiled:
    _arity("last", args, 0, 0)
    fn = base.fn
    return Compiled(lambda items, ctx: fn(items, ctx)[-1:], base.type, False)


def _f_single(c: PathCompiler, base: Compiled, args: tuple[Node, ...]) -> Compiled:
    _arity("single", args, 0, 0)
    fn = base.fn

    def single(items: Items, ctx: Ctx) -> Items:
        found = fn(items, ctx)
        if len(found) > 1:
            raise EvaluationError("single() found several values")
        return found
    return Compiled(single, base.type, False)


def _f_tail(c: PathCompiler, base: Compiled, args: tuple[Node, ...]) -> Compiled:
    _arity("tail", args, 0, 0)
    fn = base.fn
    return Compiled(lambda items, ctx: fn(items, ctx)[1:], base.type, base.many)


def _slicer(name: str) -> Factory:
    def factory(c: PathCompiler, base: Compiled, args: tuple[Node, ...]) -> Compiled:
        _arity(name, args, 1, 1)
        count, fn = c.node(args[0], None, False).fn, base.fn

        def sliced(items: Items, ctx: Ctx) -> Items:
            n = single(count(items, ctx), name)
            if not isinstance(n, int):
                raise EvaluationError(f"{name}() takes an integer")
            found = fn(items, ctx)
            return found[n:] if name == "skip" else found[:max(n, 0)]
        return Compiled(sliced, base.type, base.many)
    return factory


def _f_count(c: PathCompiler, base: Compiled, args: tuple[Node, ...]) -> Compiled:
    _arity("count", args, 0, 0)
    fn = base.fn
    return Compiled(lambda items, ctx: [len(fn(items, ctx))], "integer", False)


def _f_distinct(c: PathCompiler, base: Compiled, args: tuple[Node, ...]) -> Compiled:
    _arity("distinct", args, 0, 0)
    return Compiled(union(base.fn, lambda items, ctx: []), base.type, base.many)


def _f_has_value(c: PathCompiler, base: Compiled, args: tuple[Node, ...]) -> Compiled:
    _arity("hasValue", args, 0, 0)
    fn = base.fn

    def has_value(items: Items, ctx: Ctx) -> Items:
        found = fn(items, ctx)
        return [len(found) == 1 and not isinstance(found[0], dict | list)]
    return Compiled(has_value, "boolean", False)


def _f_iif(c: PathCompiler, base: Compiled, args: tuple[Node, ...]) -> Compiled:
    _arity("iif", args, 2, 3)
    condition = c.node(args[0], base.type, base.many).fn
    then = c.node(args[1], base.type, base.many)
    otherwise = c.node(args[2], base.type, base.many) if len(args) == 3 else None
    fn = base.fn

    def iif(items: Items, ctx: Ctx) -> Items:
        focus = fn(items, ctx)
        if truth(condition(focus, ctx)) is True:
            return then.fn(focus, ctx)
        return otherwise.fn(focus, ctx) if otherwise is not None else []
    return Compiled(iif, then.type if otherwise is None or otherwise.type == then.type
                    else None, many_of(then.many, otherwise.many if otherwise else False))


def _f_join(c: PathCompiler, base: Compiled, args: tuple[Node, ...]) -> Compiled:
    _arity("join", args, 0, 1)
    separator = c.node(args[0], None, False).fn if args else (lambda items, ctx: [""])
    fn = base.fn

    def join(items: Items, ctx: Ctx) -> Items:
        found = fn(items, ctx)
        sep = single(separator(items, ctx), "join") or ""
        return [str(sep).join(_as_text(v) for v in found)]
    return Compiled(join, "string", False)


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _f_to_string(c: PathCompiler, base: Compiled, args: tuple[Node, ...]) -> Compiled:
    _arity("toString", args, 0, 0)
    fn = base.fn

    def to_string(items: Items, ctx: Ctx) -> Items:
        value = single(fn(items, ctx), "toString")
        return [] if value is None or isinstance(value, dict) else [_as_text(value)]
    return Compiled(to_string, "string", False)


def _f_to_integer(c: PathCompiler, base: Compiled, args: tuple[Node, ...]) -> Compiled:
    _arity("toInteger", args, 0, 0)
    fn = base.fn

    def to_integer(items: Items, ctx: Ctx) -> Items:
        value = single(fn(items, ctx), "toInteger")
        if isinstance(value, bool):
            return [int(value)]
        if isinstance(value, int):
            return [value]
        if isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value):
            return [int(value)]
        return []
    return Compiled(to_integer, "integer", False)


def _string_function(name: str, arity: int, apply: Callable[..., Any], result: str
                     ) -> Factory:
    """A function of one string input and ``arity`` arguments."""
    def factory(c: PathCompiler, base: Compiled, args: tuple[Node, ...]) -> Compiled:
        _arity(name, args, arity, arity)
        arguments = [c.node(a, None, False).fn for a in args]
        fn = base.fn

        def evaluate(items: Items, ctx: Ctx) -> Items:
            value = single(fn(items, ctx), name)
            if value is None:
                return []
            if not isinstance(value, str):
                raise EvaluationError(f"{name}() applies to a string")
            values = [single(a(items, ctx), name) for a in arguments]
            if any(v is None for v in values):
                return []
            return [apply(value, *values)]
        return Compiled(evaluate, result, False)
    return factory


def _f_extension(c: PathCompiler, base: Compiled, args: tuple[Node, ...]) -> Compiled:
    _arity("extension", args, 1, 1)
    url_fn, fn = c.node(args[0], None, False).fn, base.fn

    def extension(items: Items, ctx: Ctx) -> Items:
        url = single(url_fn(items, ctx), "extension")
        out: Items = []
        for item in fn(items, ctx):
            if isinstance(item, dict):
                out.extend(e for e in item.get("extension") or ()
                           if isinstance(e, dict) and e.get("url") == url)
        return out
    return Compiled(extension, "Extension", True)


def _f_resource_key(c: PathCompiler, base: Compiled, args: tuple[Node, ...]) -> Compiled:
    """``getResourceKey()``: the resource's id (this server's ids are its keys)."""
    _arity("getResourceKey", args, 0, 0)
    fn = base.fn

    def resource_key(items: Items, ctx: Ctx) -> Items:
        return [i["id"] for i in fn(items, ctx) if isinstance(i, dict) and i.get("id")]
    scalar = None
    if base.scalar is not None:
        inner = base.scalar

        def scalar(item: Any, ctx: Ctx) -> Any:
            found = inner(item, ctx)
            if found is MANY:
                return MANY
            return found.get("id") if found.__class__ is dict else None
    return Compiled(resource_key, "id", base.many, scalar)


_REFERENCE = re.compile(
    r"^(?:.*/)?(?P<type>[A-Z][A-Za-z]+)/(?P<id>[A-Za-z0-9\-.]{1,64})(?:/_history/[^/]+)?$")


def reference_key(reference: Any, wanted: str | None = None) -> str | None:
    """The key (the target's id) a reference's literal ``Type/id`` (relative, or at the
    end of an absolute URL) points at; None for another type or no literal reference."""
    if not isinstance(reference, dict):
        return None
    literal = reference.get("reference")
    if not isinstance(literal, str):
        return None
    match = _REFERENCE.match(literal)
    if match is None or (wanted is not None and match["type"] != wanted):
        return None
    return match["id"]


def _f_reference_key(c: PathCompiler, base: Compiled, args: tuple[Node, ...]) -> Compiled:
    _arity("getReferenceKey", args, 0, 1)
    if args and args[0].kind != "type":
        raise UnsupportedPath("getReferenceKey() takes a resource type name")
    wanted = args[0].name if args else None
    fn = base.fn

    def key(items: Items, ctx: Ctx) -> Items:
        return [k for i in fn(items, ctx) if (k := reference_key(i, wanted)) is not None]
    scalar = None
    if base.scalar is not None:
        inner = base.scalar

        def scalar(item: Any, ctx: Ctx) -> Any:
            found = inner(item, ctx)
            return MANY if found is MANY else reference_key(found, wanted)
    return Compiled(key, "id", base.many, scalar)


def _boundary(high: bool) -> Factory:
    name = "highBoundary" if high else "lowBoundary"

    def factory(c: PathCompiler, base: Compiled, args: tuple[Node, ...]) -> Compiled:
        _arity(name, args, 0, 1)
        fn, static = base.fn, base.type

        def boundary(items: Items, ctx: Ctx) -> Items:
            value = single(fn(items, ctx), name)
            found = None if value is None else boundary_of(value, static, high)
            return [] if found is None else [found]
        result = "dateTime" if static in ("instant", "Period") else static
        return Compiled(boundary, result, False)
    return factory


def boundary_of(value: Any, static: str | None, high: bool) -> Any:
    """The lowest or highest value ``value`` may stand for, given its precision."""
    if isinstance(value, dict):  # a Period: its start's low, its end's high boundary
        edge = value.get("end" if high else "start")
        return None if edge is None else boundary_of(edge, "dateTime", high)
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return _decimal_boundary(value, high)
    if not isinstance(value, str):
        return None
    kind = static if static in ("date", "dateTime", "instant", "time") else _shape(value)
    if kind == "date":
        return _date_boundary(value, high)
    if kind in ("dateTime", "instant"):
        return _datetime_boundary(value, high)
    if kind == "time":
        return _time_boundary(value, high)
    return None


def _shape(text: str) -> str | None:
    if re.fullmatch(r"\d{4}(-\d{2}(-\d{2})?)?", text):
        return "date"
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}T.*", text):
        return "dateTime"
    if re.fullmatch(r"\d{2}(:\d{2}(:\d{2}(\.\d+)?)?)?", text):
        return "time"
    return None


def _decimal_boundary(value: int | float, high: bool) -> float | None:
    try:
        number = Decimal(str(value))
    except InvalidOperation:
        return None
    exponent = number.as_tuple().exponent
    places = -exponent if isinstance(exponent, int) and exponent < 0 else 0
    half = Decimal(5) * Decimal(10) ** -(places + 1)
    return float(number + half if high else number - half)


def _days_in(year: int, month: int) -> int:
    import calendar
    return calendar.monthrange(year, month)[1]


def _date_boundary(text: str, high: bool) -> str | None:
    parts = text.split("-")
    try:
        year = int(parts[0])
        month = int(parts[1]) if len(parts) > 1 else (12 if high else 1)
        day = int(parts[2]) if len(parts) > 2 else (_days_in(year, month) if high else 1)
    except ValueError:
        return None
    return f"{year:04d}-{month:02d}-{day:02d}"


_DATETIME = re.compile(r"^(?P<date>\d{4}(?:-\d{2}(?:-\d{2})?)?)(?:T(?P<time>[0-9:.]+)?"
                       r"(?P<zone>Z|[+-]\d{2}:\d{2})?)?$")


def _datetime_boundary(text: str, high: bool) -> str | None:
    match = _DATETIME.match(text)
    if match is None:
        return None
    day = _date_boundary(match["date"], high)
    clock = _time_boundary(match["time"], high) if match["time"] else (
        "23:59:59.999" if high else "00:00:00.000")
    # No time zone: the widest span the instant may stand for (UTC+14 to UTC-12).
    zone = match["zone"] or ("-12:00" if high else "+14:00")
    return None if day is None or clock is None else f"{day}T{clock}{zone}"


def _time_boundary(text: str, high: bool) -> str | None:
    match = re.fullmatch(r"(\d{2})(?::(\d{2})(?::(\d{2})(?:\.(\d+))?)?)?", text)
    if match is None:
        return None
    hours, minutes, seconds, fraction = match.groups()
    fill = "59" if high else "00"
    minutes = minutes or fill
    seconds = seconds or fill
    millis = (fraction + "000")[:3] if fraction else ("999" if high else "000")
    return f"{hours}:{minutes}:{seconds}.{millis}"


FUNCTIONS: dict[str, Factory] = {
    "where": _f_where, "select": _f_select, "exists": _f_exists, "all": _f_all,
    "empty": _f_empty, "not": _f_not, "first": _f_first, "last": _f_last,
    "single": _f_single, "tail": _f_tail, "skip": _slicer("skip"), "take": _slicer("take"),
    "count": _f_count, "distinct": _f_distinct, "hasValue": _f_has_value, "iif": _f_iif,
    "join": _f_join, "toString": _f_to_string, "toInteger": _f_to_integer,
    "extension": _f_extension, "getResourceKey": _f_resource_key,
    "getReferenceKey": _f_reference_key, "lowBoundary": _boundary(False),
    "highBoundary": _boundary(True),
    "startsWith": _string_function("startsWith", 1, lambda s, p: s.startswith(p), "boolean"),
    "endsWith": _string_function("endsWith", 1, lambda s, p: s.endswith(p), "boolean"),
    "contains": _string_function("contains", 1, lambda s, p: p in s, "boolean"),
    "lower": _string_function("lower", 0, str.lower, "string"),
    "upper": _string_function("upper", 0, str.upper, "string"),
    "length": _string_function("length", 0, len, "integer"),
    "substring": _string_function("substring", 1, lambda s, i: s[i:], "string"),
    "matches": _string_function("matches", 1, lambda s, p: re.search(p, s) is not None,
                                "boolean"),
}
SUPPORTED_FUNCTIONS = frozenset({*FUNCTIONS, "ofType", "as", "is"})
