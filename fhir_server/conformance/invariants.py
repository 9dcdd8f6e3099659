"""Invariants: the ``constraint`` FHIRPath expressions of the StructureDefinitions,
evaluated with ``fhirpathpy``, each expression parsed once.

Three things keep them affordable on every element of every resource:

- **Guards.** Most constraints only look at a few children of the element they sit on
  (``dom-2``: ``contained.contained.empty()``; ``pat-1``: ``name``, ``telecom``,
  ``address``, ``organization`` of each contact). When the expression reaches the element
  only through such names (no ``%resource``, ``$this``, ``children()`` at its top), and
  the element has none of them, the result is the one the expression gives on an empty
  element, computed once at compile time, and the interpreter is not run.
- **Native universal rules.** ``ele-1`` (every element has a value or children),
  ``ext-1`` (an extension has a value or extensions, not both) and ``ref-1`` (a local
  reference names a contained resource) sit on every element, extension and reference;
  they are structural, checked in Python (tests compare them with the expressions on the
  same data), as is ``dom-3`` (each contained resource is referenced), which fhirpathpy
  cannot evaluate, and ``per-1`` (a Period starts before it ends), where fhirpathpy
  compares a date and a dateTime as if they had one precision. ``txt-1``/``txt-2``
  (``htmlChecks()``, which is no FHIRPath function) are
  :mod:`fhir_server.conformance.narrative`'s.
- **One context per run.** The interpreter's context (variables, functions) is built
  once per validation, not once per expression.

``fhirpathpy`` lacks ``hasValue()``, ``resolve()``, ``memberOf()`` and ``conformsTo()``;
they are supplied here (``resolve()`` finds contained resources and Bundle entries).
``trace()`` is silenced. An expression the interpreter cannot evaluate is reported as
``information`` (never as a failure of the resource).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from functools import cache
from typing import Any

from fhirpathpy.engine import do_eval
from fhirpathpy.engine.invocations.constants import constants
from fhirpathpy.engine.nodes import ResourceNode
from fhirpathpy.engine.util import get_data, process_user_invocation_table
from fhirpathpy.models import models
from fhirpathpy.parser import parse

from fhir_server.conformance.model import Constraint

log = logging.getLogger(__name__)

MODEL = models["r4"]
# An expression that gives no result does not fail its invariant (fhirpathpy gives none
# where its own gaps are, and a write must not be refused for those).
EMPTY_RESULT = True
# Constraints checked structurally by the validator, not through the interpreter: the
# universal ones (every element, every extension, every Reference), those that call
# htmlChecks(), and dom-3, which fhirpathpy cannot evaluate (its as() takes one item,
# and dom-3 applies it to every descendant).
NATIVE = frozenset({"ele-1", "ext-1", "txt-1", "txt-2", "ref-1", "dom-3", "per-1"})
# Functions whose argument is evaluated once per input item: when the input is empty the
# argument is never evaluated, so what it reaches does not matter to the guard.
ITERATING = frozenset({"where", "all", "exists", "select", "repeat", "any", "aggregate",
                       # trace(name, x) passes its input through: x never changes a result
                       "trace"})
# FHIRPath constants that do not depend on the instance.
CONSTANTS = frozenset({"ucum", "sct", "loinc"})


@dataclass(frozen=True, slots=True)
class Compiled:
    constraint: Constraint
    parsed: dict[str, Any] | None
    guard: frozenset[str] | None  # None: always evaluate
    empty_result: bool | None  # the result on an element none of whose names are guarded
    error: str | None = None  # the expression could not be parsed


@dataclass(slots=True)
class Env:
    """What the expressions of one validation share: ``%resource``, ``%rootResource``,
    and a resolver for ``resolve()``."""

    resource: dict[str, Any]
    root: dict[str, Any]
    resolver: Callable[[str], dict[str, Any] | None] | None = None


def _has_value(inputs: list[Any]) -> list[bool]:
    return [len(inputs) == 1 and not isinstance(inputs[0], dict | list)
            and inputs[0] is not None]


def _true(_inputs: list[Any], *_args: Any) -> list[bool]:
    return [True]


def _functions(env: Env | None) -> dict[str, Any]:
    def resolve(inputs: list[Any]) -> list[Any]:
        found = []
        for item in inputs:
            reference = item.get("reference") if isinstance(item, dict) else item
            if isinstance(reference, str) and env is not None and env.resolver is not None:
                target = env.resolver(reference)
                if target is not None:
                    found.append(ResourceNode.create_node(target, target.get("resourceType")))
        return found

    return process_user_invocation_table({
        "hasValue": {"fn": _has_value, "arity": {0: []}},
        "htmlChecks": {"fn": _true, "arity": {0: []}},
        "conformsTo": {"fn": _true, "arity": {1: ["String"]}},
        "memberOf": {"fn": _true, "arity": {1: ["String"]}},
        "resolve": {"fn": resolve, "arity": {0: []}},
        "trace": {"fn": lambda inputs, *_: inputs, "arity": {0: [], 1: ["String"],
                                                              2: ["String", "Any"]}},
    })


# Expressions of the R4 definitions that say less than their text, corrected as the
# reference validator corrects them: (key, published expression) → the one evaluated.
CORRECTED = {
    ("que-12", "enableWhen.count() > 2 implies enableBehavior.exists()"):
        "enableWhen.count() > 1 implies enableBehavior.exists()",
}


@cache
def compile_constraint(constraint: Constraint) -> Compiled:
    """Parse once; work out the guard and the empty-element result."""
    expression = CORRECTED.get((constraint.key, constraint.expression),
                               constraint.expression)
    try:
        parsed = parse(expression)
    except Exception as exc:  # fhirpathpy raises bare Exceptions on syntax errors
        log.warning("invariant %s: cannot parse %r: %s", constraint.key,
                    constraint.expression, exc)
        return Compiled(constraint, None, None, None, str(exc))
    guard = _guard(parsed)
    empty_result = None
    if guard is not None:
        outcome = _run(parsed, {}, None, Env({}, {}), _functions(None))
        empty_result = outcome if isinstance(outcome, bool) else None
        if empty_result is None:
            guard = None
    return Compiled(constraint, parsed, guard, empty_result)


def applies(compiled: Compiled, node: Any) -> bool:
    """Whether the interpreter must run on ``node`` (see the guards above)."""
    if compiled.guard is None or not isinstance(node, dict):
        return True
    for key in node:
        name = key[1:] if key.startswith("_") else key
        for guarded in compiled.guard:
            if name.startswith(guarded):
                return True
    return False


def evaluate(compiled: Compiled, node: Any, path: str | None, env: Env,
             functions: dict[str, Any]) -> bool | str:
    """True or False as the invariant holds on ``node`` (typed as ``path``, e.g.
    ``Patient.contact`` or ``Period``); a message when it cannot be evaluated."""
    if compiled.parsed is None:
        return f"the expression cannot be parsed ({compiled.error})"
    if not applies(compiled, node):
        assert compiled.empty_result is not None
        return compiled.empty_result
    try:
        outcome = _run(compiled.parsed, node, path, env, functions)
    except Exception as exc:  # the interpreter's failures are bare Exceptions
        return f"{type(exc).__name__}: {exc}"
    if outcome is None:
        return "the expression did not give a single boolean"
    return outcome


def functions_for(env: Env) -> dict[str, Any]:
    return _functions(env)


def _run(parsed: dict[str, Any], node: Any, path: str | None, env: Env,
         functions: dict[str, Any]) -> bool | None:
    constants.reset()
    focus = ResourceNode.create_node(node, path)
    resource = ResourceNode.create_node(env.resource, env.resource.get("resourceType"))
    root = ResourceNode.create_node(env.root, env.root.get("resourceType"))
    ctx = {
        "dataRoot": [focus],
        "vars": {"context": focus, "resource": resource, "rootResource": root,
                 "ucum": "http://unitsofmeasure.org", "sct": "http://snomed.info/sct",
                 "loinc": "http://loinc.org"},
        "model": MODEL,
        "userInvocationTable": functions,
        "traceFn": _silent,
    }
    result = do_eval(ctx, [focus], parsed["children"][0])
    values = [get_data(item) for item in result]
    if not values:
        return EMPTY_RESULT
    if len(values) == 1 and isinstance(values[0], bool):
        return values[0]
    if len(values) == 1 and not isinstance(values[0], bool | int | Decimal | str):
        return True
    return None


def _silent(_label: str, _value: Any) -> None:
    return None


# -- the guard --------------------------------------------------------------------------
class _Unguarded(Exception):
    """The expression reaches the element other than through named children."""


def _guard(parsed: dict[str, Any]) -> frozenset[str] | None:
    names: set[str] = set()
    try:
        _top(parsed["children"][0], names)
    except _Unguarded:
        return None
    return frozenset(names) if names else None


def _top(node: dict[str, Any], names: set[str]) -> None:
    """Collect the child names ``node`` (evaluated on the element itself) reaches."""
    kind = node["type"]
    if kind == "InvocationExpression":
        first, *rest = node["children"]
        _top(first, names)
        for step in rest:
            _step(step, names)
        return
    if kind in ("TermExpression", "InvocationTerm"):
        for child in node.get("children") or ():
            _top(child, names)
        return
    if kind == "MemberInvocation":
        names.add(_identifier(node))
        return
    if kind in ("LiteralTerm", "StringLiteral", "NumberLiteral", "BooleanLiteral",
                "NullLiteral", "QuantityLiteral", "DateTimeLiteral", "TimeLiteral",
                "Quantity", "Unit", "DateTimePrecision", "PluralDateTimePrecision",
                "TypeSpecifier", "QualifiedIdentifier", "Identifier"):
        return
    if kind == "ExternalConstantTerm":
        if _constant_name(node) not in CONSTANTS:
            raise _Unguarded
        return
    if kind in ("FunctionInvocation", "ThisInvocation", "IndexInvocation",
                "TotalInvocation"):
        raise _Unguarded  # a function of the element itself (children(), iif(), ...)
    if kind == "TypeExpression":  # x is T / x as T
        _top(node["children"][0], names)
        return
    # operators and parentheses: every operand is evaluated on the element
    for child in node.get("children") or ():
        _top(child, names)


def _step(node: dict[str, Any], names: set[str]) -> None:
    """A step after the first of a path (``.where(...)``, ``.name``): it sees the items
    before it, not the element; only the arguments of non-iterating functions are
    evaluated on the element again (FHIRPath: ``union(x)`` evaluates ``x`` at the root)."""
    if node["type"] != "FunctionInvocation":
        return
    function = node["children"][0]
    name = _identifier(function)
    if name in ITERATING:
        return
    for child in function.get("children") or ():
        if child["type"] == "ParamList":
            for argument in child.get("children") or ():
                _top(argument, names)


def _identifier(node: dict[str, Any]) -> str:
    for child in node.get("children") or ():
        if child["type"] == "Identifier":
            return str(child.get("text", "")).strip("`")
        found = _identifier(child)
        if found:
            return found
    return ""


def _constant_name(node: dict[str, Any]) -> str:
    text = str(node.get("text", ""))
    return text.lstrip("%").strip("`'")


# -- the native universal rules -----------------------------------------------------------
def has_value_or_children(value: Any, companion: Any = None) -> bool:
    """ele-1: a primitive has a value or extensions; a complex element has children
    other than ``id``."""
    if isinstance(value, dict):
        return any(key != "id" for key in value)
    if value is not None:
        return True
    return isinstance(companion, dict) and any(key != "id" for key in companion)


def unreferenced_contained(resource: dict[str, Any]) -> list[str]:
    """dom-3: the ids of contained resources nothing in the resource refers to (by
    ``#id`` in a reference, canonical or uri), unless they refer to their container
    (``#``)."""
    contained = [c for c in resource.get("contained") or () if isinstance(c, dict)]
    if not contained:
        return []
    used: set[str] = set()
    _local_references(resource, used)
    missing = []
    for item in contained:
        rid = item.get("id")
        if not isinstance(rid, str) or f"#{rid}" in used:
            continue
        inner: set[str] = set()
        _local_references(item, inner)
        if "#" not in inner:
            missing.append(rid)
    return missing


def _local_references(value: Any, found: set[str]) -> None:
    if isinstance(value, dict):
        for child in value.values():
            _local_references(child, found)
    elif isinstance(value, list):
        for child in value:
            _local_references(child, found)
    elif isinstance(value, str) and value.startswith("#"):
        found.add(value)


def period_in_order(period: dict[str, Any]) -> bool:
    """per-1 with FHIRPath's comparison of date/times: at the precision both have; equal
    there while one is more precise is no answer, and the invariant fails (as the
    reference validator decides)."""
    start, end = period.get("start"), period.get("end")
    if not isinstance(start, str) or not isinstance(end, str):
        return True
    a, b = _instant_parts(start), _instant_parts(end)
    common = min(len(a), len(b))
    if a[:common] != b[:common]:
        return a[:common] < b[:common]
    return len(a) == len(b)


def _instant_parts(text: str) -> tuple[str, ...]:
    """A date/time as comparable parts, in UTC when it has a time (year, month, day, hour,
    minute, second with fraction)."""
    if "T" not in text:
        return tuple(text.split("-"))
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return tuple(text.replace("T", "-").replace(":", "-").split("-"))
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return (f"{moment.year:04d}", f"{moment.month:02d}", f"{moment.day:02d}",
            f"{moment.hour:02d}", f"{moment.minute:02d}",
            f"{moment.second:02d}.{moment.microsecond:06d}")


def extension_value_or_extensions(extension: dict[str, Any]) -> bool:
    """ext-1: an extension has extensions or a value[x], not both."""
    has_extensions = bool(extension.get("extension"))
    has_value = any(key.startswith("value") and len(key) > 5 and key[5].isupper()
                    for key in extension)
    return has_extensions != has_value
