"""What compiled view paths are made of at run time: collections, the context a path
sees, the compiled form, and the semantics of FHIRPath's operators over plain JSON
(three-valued logic, equality, comparison, arithmetic, unions).

:mod:`.fhirpath` compiles paths into these; :mod:`.functions` are the functions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Items = list[Any]


class EvaluationError(ValueError):
    """A path failed on a resource (e.g. arithmetic on several values)."""


class Ctx:
    """What a path sees besides its input: the resource and the ``%rowIndex``."""

    __slots__ = ("resource", "row_index")

    def __init__(self, resource: dict[str, Any], row_index: int = 0):
        self.resource = resource
        self.row_index = row_index


Fn = Callable[[Items, Ctx], Items]
# The fast form of a path that yields at most one value (see Compiled.scalar).
Scalar = Callable[[Any, Ctx], Any]


class _Many:
    """What a scalar form answers when the data holds a list where the R4 definitions
    say one value: the caller evaluates the path's general form instead."""


MANY = _Many()


@dataclass(frozen=True, slots=True)
class Compiled:
    """A compiled path: its function, the FHIR type it ends in (a datatype, a resource or
    a backbone element's schema name such as ``Patient_Contact``; None when unknown), and
    whether it can yield several values (None when unknown).

    ``scalar``, for a path that cannot yield several values and whose steps are plain
    navigation (``subject.reference``, ``value.ofType(Quantity).value``,
    ``getResourceKey()``): the same path as ``scalar(item, ctx)`` → the value or None,
    without building a collection at each step (the common column, five times faster);
    :data:`MANY` where the data disagrees with the definitions."""

    fn: Fn
    type: str | None = None
    many: bool | None = False
    scalar: Scalar | None = None


def identity(items: Items, ctx: Ctx) -> Items:
    return items


def scalar_identity(item: Any, ctx: Ctx) -> Any:
    return item


def many_of(*flags: bool | None) -> bool | None:
    if any(f is True for f in flags):
        return True
    if any(f is None for f in flags):
        return None
    return False


# --- operator semantics ------------------------------------------------------------------------
def single(items: Items, where: str) -> Any:
    if not items:
        return None
    if len(items) > 1:
        raise EvaluationError(f"{where} needs one value, found {len(items)}")
    return items[0]


def truth(items: Items) -> bool | None:
    """A collection as a boolean (FHIRPath singleton evaluation): empty → None."""
    if not items:
        return None
    if len(items) == 1:
        value = items[0]
        return value if isinstance(value, bool) else True
    raise EvaluationError("a condition gave several values")


def logic(op: str, left: Fn, right: Fn) -> Fn:
    def evaluate(items: Items, ctx: Ctx) -> Items:
        a = truth(left(items, ctx))
        if op == "and" and a is False:
            return [False]
        if op == "or" and a is True:
            return [True]
        if op == "implies" and a is False:
            return [True]
        b = truth(right(items, ctx))
        if op == "and":
            result = False if b is False else (True if a and b else None)
        elif op == "or":
            result = True if b is True else (False if a is False and b is False else None)
        elif op == "xor":
            result = None if a is None or b is None else a != b
        else:  # implies, a is True or None
            result = True if b is True else (None if a is None or b is None else False)
        return [] if result is None else [result]
    return evaluate


def union(left: Fn, right: Fn) -> Fn:
    def evaluate(items: Items, ctx: Ctx) -> Items:
        out: Items = []
        for value in (*left(items, ctx), *right(items, ctx)):
            if not any(_equal(value, seen) for seen in out):
                out.append(value)
        return out
    return evaluate


def _equal(a: Any, b: Any) -> bool | None:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b if isinstance(a, bool) and isinstance(b, bool) else False
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    return a == b  # type: ignore[no-any-return]


def _equivalent(a: Any, b: Any) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return " ".join(a.lower().split()) == " ".join(b.lower().split())
    return bool(_equal(a, b))


def equality(op: str, left: Fn, right: Fn) -> Fn:
    negate = op.startswith("!")
    same = _equivalent if "~" in op else _equal

    def evaluate(items: Items, ctx: Ctx) -> Items:
        a, b = left(items, ctx), right(items, ctx)
        if not a or not b:
            if "~" in op:
                return [(not a and not b) != negate]
            return []
        result = len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
        return [result != negate]
    return evaluate


def _comparable(a: Any, b: Any) -> bool:
    numbers = (int, float)
    if isinstance(a, bool) or isinstance(b, bool):
        return False
    return (isinstance(a, numbers) and isinstance(b, numbers)) or (
        isinstance(a, str) and isinstance(b, str))


def comparison(op: str, left: Fn, right: Fn) -> Fn:
    def evaluate(items: Items, ctx: Ctx) -> Items:
        a, b = single(left(items, ctx), op), single(right(items, ctx), op)
        if a is None or b is None:
            return []
        if not _comparable(a, b):
            raise EvaluationError(f"cannot compare {a!r} with {b!r}")
        if op == "<":
            return [a < b]
        if op == ">":
            return [a > b]
        if op == "<=":
            return [a <= b]
        return [a >= b]
    return evaluate


def membership(op: str, left: Fn, right: Fn) -> Fn:
    def evaluate(items: Items, ctx: Ctx) -> Items:
        a, b = left(items, ctx), right(items, ctx)
        element, collection = (a, b) if op == "in" else (b, a)
        if not element:
            return []
        value = single(element, op)
        return [any(_equal(value, other) for other in collection)]
    return evaluate


def concatenate(left: Fn, right: Fn) -> Fn:
    def evaluate(items: Items, ctx: Ctx) -> Items:
        a, b = single(left(items, ctx), "&"), single(right(items, ctx), "&")
        return [f"{'' if a is None else a}{'' if b is None else b}"]
    return evaluate


def arithmetic(op: str, left: Fn, right: Fn) -> Fn:
    def evaluate(items: Items, ctx: Ctx) -> Items:
        a, b = single(left(items, ctx), op), single(right(items, ctx), op)
        if a is None or b is None:
            return []
        if op == "+" and isinstance(a, str) and isinstance(b, str):
            return [a + b]
        if not _comparable(a, b) or isinstance(a, str):
            raise EvaluationError(f"cannot apply {op} to {a!r} and {b!r}")
        if op == "+":
            return [a + b]
        if op == "-":
            return [a - b]
        if op == "*":
            return [a * b]
        if b == 0:
            return []  # FHIRPath: division by zero is empty
        if op == "/":
            return [a / b]
        if op == "div":
            return [int(a // b)]
        return [a % b]
    return evaluate
