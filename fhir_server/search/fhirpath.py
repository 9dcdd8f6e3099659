"""A compiler from FHIRPath (the subset search parameters use) to fast Python closures.

Index extraction runs on every write, so each parameter's expression is parsed once and
turned into nested closures over plain JSON (dicts, lists, str, numbers). The subset
covers every expression in the R4 definitions and what custom SearchParameters commonly
use: paths, ``|`` unions, indexers, ``where(...)``, ``exists()``, ``empty()``, ``not()``,
``first()``, ``last()``, ``ofType(X)`` / ``as X`` / ``.as(X)`` / ``is X``,
``resolve() is X``, ``extension('url')``, ``hasValue()``, ``count()``, ``=``/``!=``/
``<``/``>``/``<=``/``>=``, ``and``/``or``/``xor``, literals, ``%resource`` and ``$this``.

Choice elements need the type system: FHIR JSON writes ``Observation.value[x]`` as
``valueQuantity``, so ``value.ofType(Quantity)`` compiles to the key ``valueQuantity`` and
a bare ``value`` looks for any ``value<Type>`` key. The names of the choice elements come
from the generated registry.

:func:`compile_expression` raises :class:`UnsupportedExpression` for anything else; the
registry then falls back to ``fhirpathpy`` (a complete but much slower interpreter) when
it is installed, or skips the parameter with a logged warning.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

Items = list[Any]
Evaluator = Callable[[Items, "Env"], Items]


class UnsupportedExpression(ValueError):
    """The expression uses FHIRPath outside the compiled subset."""


@dataclass(frozen=True, slots=True)
class Env:
    resource: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Resolved:
    """What ``resolve()`` yields without a database: the type the reference points at."""

    resource_type: str | None


# --- tokens -------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"\s*(?:(?P<string>'(?:[^'\\]|\\.)*')|(?P<number>\d+(?:\.\d+)?)"
    r"|(?P<ident>[A-Za-z_][A-Za-z0-9_]*|`[^`]+`)|(?P<var>[%$][A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<op><=|>=|!=|!~|[.|()\[\],=<>~]))"
)


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    text = text.strip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if not match or match.end() == pos:
            raise UnsupportedExpression(f"cannot read {text[pos:pos + 20]!r}")
        kind = match.lastgroup or ""
        out.append((kind, match.group(kind)))
        pos = match.end()
    return out


# --- AST ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Node:
    kind: str  # member | func | index | binary | literal | var | type | this
    name: str = ""
    base: Node | None = None
    args: tuple[Node, ...] = ()
    value: Any = None


_BINARY_LEVELS: tuple[tuple[str, ...], ...] = (
    ("or", "xor"), ("and",), ("=", "!=", "~", "!~"), ("<", ">", "<=", ">="), ("|",),
    ("is", "as"),
)


class _Parser:
    def __init__(self, text: str):
        self.tokens = _tokens(text)
        self.pos = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        token = self.peek()
        if token is None or (value is not None and token[1] != value):
            raise UnsupportedExpression(f"expected {value or 'more'} at token {self.pos}")
        self.pos += 1
        return token

    def parse(self) -> Node:
        node = self.binary(0)
        if self.peek() is not None:
            raise UnsupportedExpression(f"unexpected {self.peek()}")
        return node

    def binary(self, level: int) -> Node:
        if level == len(_BINARY_LEVELS):
            return self.postfix()
        node = self.binary(level + 1)
        while (token := self.peek()) is not None and token[1] in _BINARY_LEVELS[level]:
            op = self.take()[1]
            if op in ("is", "as"):
                right = Node("type", name=self.type_name())
            else:
                right = self.binary(level + 1)
            node = Node("binary", name=op, args=(node, right))
        return node

    def type_name(self) -> str:
        name = self.take()[1]
        while (token := self.peek()) is not None and token[1] == ".":
            self.take(".")
            name = self.take()[1]  # FHIR.Quantity / System.String → the last part
        return name.strip("`")

    def postfix(self) -> Node:
        node = self.term()
        while (token := self.peek()) is not None and token[1] in (".", "["):
            if self.take()[1] == "[":
                index = self.binary(0)
                self.take("]")
                node = Node("index", base=node, args=(index,))
            else:
                node = self.invocation(node)
        return node

    def invocation(self, base: Node | None) -> Node:
        kind, name = self.take()
        if kind != "ident":
            raise UnsupportedExpression(f"expected a name, got {name!r}")
        name = name.strip("`")
        token = self.peek()
        if token is not None and token[1] == "(":
            self.take("(")
            args: list[Node] = []
            while (token := self.peek()) is not None and token[1] != ")":
                args.append(Node("type", name=self.type_name()) if name in _TYPE_FUNCS
                            else self.binary(0))
                if (token := self.peek()) is not None and token[1] == ",":
                    self.take(",")
            self.take(")")
            return Node("func", name=name, base=base, args=tuple(args))
        return Node("member", name=name, base=base)

    def term(self) -> Node:
        token = self.peek()
        if token is None:
            raise UnsupportedExpression("unexpected end")
        kind, text = token
        if text == "(":
            self.take("(")
            node = self.binary(0)
            self.take(")")
            return node
        if kind == "string":
            self.take()
            return Node("literal", value=_unquote(text))
        if kind == "number":
            self.take()
            return Node("literal", value=float(text) if "." in text else int(text))
        if kind == "var":
            self.take()
            if text in ("%resource", "%rootResource", "%context"):
                return Node("var", name="resource")
            if text == "$this":
                return Node("this")
            raise UnsupportedExpression(f"unknown variable {text}")
        if text in ("true", "false"):
            self.take()
            return Node("literal", value=text == "true")
        return self.invocation(None)


_TYPE_FUNCS = {"ofType", "as", "is"}
_TOTAL_FUNCS = {"exists", "empty", "not", "count", "hasValue"}


def _unquote(text: str) -> str:
    body = text[1:-1]
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t", "r": "\r"}.get(m[1], m[1]), body)


# --- compiler ----------------------------------------------------------------------------

def _flatten_into(out: Items, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, list):
        out.extend(v for v in value if v is not None)
    else:
        out.append(value)


def _capital(type_name: str) -> str:
    return type_name[:1].upper() + type_name[1:]


class Compiler:
    """Turns a parsed expression into an :data:`Evaluator`.

    ``resource_types`` are the names a leading identifier is a type filter for
    (``Observation.code``); ``choices`` the names of polymorphic elements.
    """

    def __init__(self, resource_types: Iterable[str], choices: Iterable[str]):
        self.resource_types = frozenset(resource_types) | {"Resource", "DomainResource"}
        self.choices = frozenset(choices)

    def compile(self, expression: str) -> Evaluator:
        return self.node(_Parser(expression).parse())

    def gates(self, expression: str, *, relative: bool = False) -> frozenset[str] | None:
        """The top-level element names an expression can read, or None when it may read
        anything. A resource holding none of them yields nothing, so extraction skips it
        without evaluating (most of a type's parameters are absent from any one resource).
        A choice element is named by its base (``value`` for ``valueQuantity``)."""
        return self._gates(_Parser(expression).parse(), relative)

    def _gates(self, n: Node, relative: bool = False) -> frozenset[str] | None:
        if n.kind == "binary" and n.name == "|":
            left, right = self._gates(n.args[0], relative), self._gates(n.args[1], relative)
            return None if left is None or right is None else left | right
        if n.kind == "binary" and n.name in ("is", "as"):
            return self._gates(n.args[0], relative)
        if n.kind == "func" and n.name in _TOTAL_FUNCS:
            return None  # exists()/empty()/count()... answer even on an empty input
        typed = self._typed_choice(n)
        if typed is not None:
            return self._gates(typed, relative)
        if relative and n.kind == "member" and n.base is None:
            return frozenset({n.name})
        if n.kind in ("member", "func", "index") and n.base is not None:
            base = n.base
            if base.kind == "member" and base.base is None and base.name in self.resource_types:
                return frozenset({n.name}) if n.kind == "member" else None
            return self._gates(base, relative)
        return None

    def node(self, n: Node) -> Evaluator:
        handler = getattr(self, f"_{n.kind}")
        return handler(n)  # type: ignore[no-any-return]

    # -- terms ------------------------------------------------------------------------
    def _literal(self, n: Node) -> Evaluator:
        value = [n.value]
        return lambda items, env: value

    def _var(self, n: Node) -> Evaluator:
        return lambda items, env: [env.resource]

    def _this(self, n: Node) -> Evaluator:
        return lambda items, env: items

    def _type(self, n: Node) -> Evaluator:
        raise UnsupportedExpression(f"type name {n.name} outside a type operator")

    def _member(self, n: Node) -> Evaluator:
        base = self.node(n.base) if n.base is not None else None
        name = n.name
        if n.base is None and name in self.resource_types:
            return self._root_filter(name)
        step = self._choice_step(name) if name in self.choices else self._plain_step(name)
        if base is None:
            return step
        return lambda items, env: step(base(items, env), env)

    @staticmethod
    def _root_filter(type_name: str) -> Evaluator:
        if type_name in ("Resource", "DomainResource"):
            return lambda items, env: [i for i in items if isinstance(i, dict)]

        def root(items: Items, env: Env) -> Items:
            if len(items) == 1 and items[0] is env.resource:  # the usual case: no copy
                return items if env.resource.get("resourceType") == type_name else []
            return [i for i in items if isinstance(i, dict) and i.get("resourceType") == type_name]
        return root

    @staticmethod
    def _plain_step(name: str) -> Evaluator:
        def step(items: Items, env: Env) -> Items:
            out: Items = []
            for item in items:
                if isinstance(item, dict):
                    _flatten_into(out, item.get(name))
            return out
        return step

    @staticmethod
    def _choice_step(name: str) -> Evaluator:
        size = len(name)

        def step(items: Items, env: Env) -> Items:
            out: Items = []
            for item in items:
                if not isinstance(item, dict):
                    continue
                if name in item:
                    _flatten_into(out, item[name])
                    continue
                for key, value in item.items():
                    if len(key) > size and key.startswith(name) and key[size].isupper():
                        _flatten_into(out, value)
            return out
        return step

    def _index(self, n: Node) -> Evaluator:
        assert n.base is not None
        base, index = self.node(n.base), self.node(n.args[0])

        def pick(items: Items, env: Env) -> Items:
            found = base(items, env)
            position = index(items, env)
            if len(position) != 1 or not isinstance(position[0], int):
                return []
            i = position[0]
            return [found[i]] if 0 <= i < len(found) else []
        return pick

    # -- operators --------------------------------------------------------------------
    def _binary(self, n: Node) -> Evaluator:
        left_node, right_node = n.args
        if n.name in ("is", "as"):
            return self._type_operator(n.name, left_node, right_node.name)
        left, right = self.node(left_node), self.node(right_node)
        if n.name == "|":
            return lambda items, env: _union(left(items, env), right(items, env))
        if n.name in ("and", "or", "xor"):
            return _logic(n.name, left, right)
        compare = _COMPARISONS.get(n.name)
        if compare is None:
            raise UnsupportedExpression(f"operator {n.name}")

        def comparison(items: Items, env: Env) -> Items:
            a, b = left(items, env), right(items, env)
            if not a or not b:
                return []
            if len(a) != 1 or len(b) != 1:
                return [False] if n.name == "=" else ([True] if n.name == "!=" else [])
            return [compare(a[0], b[0])]
        return comparison

    def _type_operator(self, op: str, left_node: Node, type_name: str) -> Evaluator:
        if op == "as":
            return self._of_type(left_node, type_name)
        left = self.node(left_node)

        def is_type(items: Items, env: Env) -> Items:
            found = left(items, env)
            if len(found) != 1:
                return []
            return [_has_type(found[0], type_name)]
        return is_type

    def _typed_choice(self, n: Node) -> Node | None:
        """``value.ofType(Quantity)`` / ``value as Quantity`` → the member ``valueQuantity``."""
        if n.kind == "func" and n.name in ("ofType", "as") and n.args:
            base, type_name = n.base, n.args[0].name
        elif n.kind == "binary" and n.name == "as":
            base, type_name = n.args[0], n.args[1].name
        else:
            return None
        if base is not None and base.kind == "member" and base.name in self.choices:
            return Node("member", name=base.name + _capital(type_name), base=base.base)
        return None

    def _of_type(self, base_node: Node | None, type_name: str) -> Evaluator:
        # value.ofType(Quantity) on a choice element is the JSON key valueQuantity.
        if base_node is not None and base_node.kind == "member" and base_node.name in self.choices:
            return self._member(Node("member", name=base_node.name + _capital(type_name),
                                     base=base_node.base))
        base = self.node(base_node) if base_node is not None else (lambda items, env: items)
        return lambda items, env: [i for i in base(items, env) if _has_type(i, type_name)]

    # -- functions ---------------------------------------------------------------------
    def _func(self, n: Node) -> Evaluator:
        if n.name in ("ofType", "as"):
            return self._of_type(n.base, n.args[0].name)
        base = self.node(n.base) if n.base is not None else (lambda items, env: items)
        builder = _FUNCTIONS.get(n.name)
        if builder is None:
            raise UnsupportedExpression(f"function {n.name}()")
        return builder(self, base, n.args)


def _union(a: Items, b: Items) -> Items:
    out = list(a)
    for item in b:
        if not any(item is o or item == o for o in out):
            out.append(item)
    return out


def _truth(items: Items) -> bool | None:
    if not items:
        return None
    if len(items) == 1 and isinstance(items[0], bool):
        return items[0]
    return True  # a non-empty collection is true in a boolean context


def _logic(op: str, left: Evaluator, right: Evaluator) -> Evaluator:
    def evaluate(items: Items, env: Env) -> Items:
        a, b = _truth(left(items, env)), _truth(right(items, env))
        if op == "and":
            if a is False or b is False:
                return [False]
            return [] if a is None or b is None else [True]
        if op == "or":
            if a is True or b is True:
                return [True]
            return [] if a is None or b is None else [False]
        return [] if a is None or b is None else [a != b]
    return evaluate


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    return bool(a == b)


def _ordered(compare: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    def check(a: Any, b: Any) -> bool:
        try:
            return compare(a, b)
        except TypeError:
            return False
    return check


_COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "=": _equal,
    "!=": lambda a, b: not _equal(a, b),
    "~": lambda a, b: str(a).lower() == str(b).lower(),
    "!~": lambda a, b: str(a).lower() != str(b).lower(),
    "<": _ordered(lambda a, b: a < b),
    ">": _ordered(lambda a, b: a > b),
    "<=": _ordered(lambda a, b: a <= b),
    ">=": _ordered(lambda a, b: a >= b),
}

_PRIMITIVES: dict[str, tuple[type, ...]] = {
    "string": (str,), "code": (str,), "id": (str,), "uri": (str,), "url": (str,),
    "canonical": (str,), "markdown": (str,), "date": (str,), "dateTime": (str,),
    "instant": (str,), "time": (str,), "oid": (str,), "uuid": (str,), "base64Binary": (str,),
    "boolean": (bool,), "integer": (int,), "decimal": (int, float), "positiveInt": (int,),
    "unsignedInt": (int,),
}


def _has_type(item: Any, type_name: str) -> bool:
    if isinstance(item, Resolved):
        return item.resource_type == type_name or type_name in ("Resource", "DomainResource")
    primitive = _PRIMITIVES.get(type_name[:1].lower() + type_name[1:])
    if primitive is not None:
        if isinstance(item, bool):  # bool is an int in Python, not in FHIRPath
            return bool in primitive
        return isinstance(item, primitive)
    if isinstance(item, dict):
        if "resourceType" in item:
            return bool(item["resourceType"] == type_name) or type_name in ("Resource",
                                                                            "DomainResource")
        return True  # complex datatypes carry no type in JSON; the path already chose them
    return False


def reference_type(reference: str, env: Env | None = None) -> str | None:
    """The resource type a reference string points at (relative, absolute or contained)."""
    if reference.startswith("#"):
        if env is not None:
            for contained in env.resource.get("contained") or ():
                if isinstance(contained, dict) and contained.get("id") == reference[1:]:
                    return contained.get("resourceType")
        return None
    if reference.startswith(("urn:uuid:", "urn:oid:")):
        return None
    path = reference.split("?", 1)[0].rstrip("/").split("/")
    if len(path) >= 4 and path[-2] == "_history":
        path = path[:-2]
    if len(path) >= 2 and path[-2][:1].isupper():
        return path[-2]
    return None


def _resolve(item: Any, env: Env) -> Resolved | None:
    if isinstance(item, dict):
        if "resourceType" in item:
            return Resolved(item["resourceType"])
        if isinstance(item.get("reference"), str):
            return Resolved(reference_type(item["reference"], env))
        if isinstance(item.get("type"), str):
            return Resolved(item["type"])
        return None
    if isinstance(item, str):
        return Resolved(reference_type(item, env))
    return None


def _resolve_is(node: Node) -> str | None:
    """The type T of ``resolve() is T`` (50 R4 definitions filter references this way)."""
    if node.kind == "binary" and node.name == "is":
        left, right = node.args
        if left.kind == "func" and left.name == "resolve" and left.base is None:
            return right.name
    return None


def _f_where(c: Compiler, base: Evaluator, args: tuple[Node, ...]) -> Evaluator:
    if len(args) != 1:
        raise UnsupportedExpression("where() takes one argument")
    target = _resolve_is(args[0])
    if target is not None:
        def references_to(items: Items, env: Env) -> Items:
            found = []
            for item in base(items, env):
                resolved = _resolve(item, env)
                if resolved is not None and _has_type(resolved, target):
                    found.append(item)
            return found
        return references_to
    criteria = c.node(args[0])

    def where(items: Items, env: Env) -> Items:
        return [i for i in base(items, env) if _truth(criteria([i], env)) is True]
    return where


def _f_exists(c: Compiler, base: Evaluator, args: tuple[Node, ...]) -> Evaluator:
    if args:
        filtered = _f_where(c, base, args)
        return lambda items, env: [bool(filtered(items, env))]
    return lambda items, env: [bool(base(items, env))]


def _f_empty(c: Compiler, base: Evaluator, args: tuple[Node, ...]) -> Evaluator:
    return lambda items, env: [not base(items, env)]


def _f_not(c: Compiler, base: Evaluator, args: tuple[Node, ...]) -> Evaluator:
    def negate(items: Items, env: Env) -> Items:
        value = _truth(base(items, env))
        return [] if value is None else [not value]
    return negate


def _f_first(c: Compiler, base: Evaluator, args: tuple[Node, ...]) -> Evaluator:
    return lambda items, env: base(items, env)[:1]


def _f_last(c: Compiler, base: Evaluator, args: tuple[Node, ...]) -> Evaluator:
    return lambda items, env: base(items, env)[-1:]


def _f_count(c: Compiler, base: Evaluator, args: tuple[Node, ...]) -> Evaluator:
    return lambda items, env: [len(base(items, env))]


def _f_has_value(c: Compiler, base: Evaluator, args: tuple[Node, ...]) -> Evaluator:
    def has_value(items: Items, env: Env) -> Items:
        found = base(items, env)
        return [len(found) == 1 and not isinstance(found[0], (dict, list))]
    return has_value


def _f_is(c: Compiler, base: Evaluator, args: tuple[Node, ...]) -> Evaluator:
    type_name = args[0].name

    def is_type(items: Items, env: Env) -> Items:
        found = base(items, env)
        return [_has_type(found[0], type_name)] if len(found) == 1 else []
    return is_type


def _f_resolve(c: Compiler, base: Evaluator, args: tuple[Node, ...]) -> Evaluator:
    def resolve(items: Items, env: Env) -> Items:
        return [r for r in (_resolve(i, env) for i in base(items, env)) if r is not None]
    return resolve


def _f_extension(c: Compiler, base: Evaluator, args: tuple[Node, ...]) -> Evaluator:
    if len(args) != 1 or args[0].kind != "literal":
        raise UnsupportedExpression("extension() takes a literal url")
    url = args[0].value

    def extension(items: Items, env: Env) -> Items:
        out: Items = []
        for item in base(items, env):
            if isinstance(item, dict):
                out.extend(e for e in item.get("extension") or ()
                           if isinstance(e, dict) and e.get("url") == url)
        return out
    return extension


_FUNCTIONS: dict[str, Callable[[Compiler, Evaluator, tuple[Node, ...]], Evaluator]] = {
    "where": _f_where, "exists": _f_exists, "empty": _f_empty, "not": _f_not,
    "first": _f_first, "last": _f_last, "count": _f_count, "hasValue": _f_has_value,
    "is": _f_is, "resolve": _f_resolve, "extension": _f_extension,
}


def compile_expression(expression: str, compiler: Compiler) -> Callable[[dict[str, Any]], Items]:
    """``expression`` → ``f(resource) -> list of values``; raises UnsupportedExpression."""
    evaluator = compiler.compile(expression)

    def evaluate(resource: dict[str, Any]) -> Items:
        return evaluator([resource], Env(resource))
    return evaluate


def split_union(expression: str) -> list[str]:
    """Split an expression at its top-level ``|`` (not inside parentheses or strings)."""
    parts, depth, quoted, start = [], 0, False, 0
    for i, char in enumerate(expression):
        if char == "'":
            quoted = not quoted
        elif quoted:
            continue
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "|" and depth == 0:
            parts.append(expression[start:i].strip())
            start = i + 1
    parts.append(expression[start:].strip())
    return [p for p in parts if p]


def _root_of(part: str) -> str:
    match = re.match(r"\(*\s*([A-Za-z_][A-Za-z0-9_]*)", part)
    return match.group(1) if match else ""


def expression_for(expression: str, base: str) -> str:
    """Only the parts of a multi-base expression that start from ``base``.

    Definitions shared by several types (``clinical-patient``) union one path per type;
    each type keeps its own. A part that starts from an element name rather than a type
    (``name | alias`` in InsurancePlan-name) is relative to the base, so it is anchored.
    """
    parts = split_union(expression)
    kept = [p for p in parts if _root_of(p) in (base, "Resource", "DomainResource")]
    if kept:
        return " | ".join(kept)
    relative = [p for p in parts if _root_of(p)[:1].islower()]
    return " | ".join(f"{base}.{p}" for p in relative)
