"""The syntax of FHIRPath as view paths use it: tokens, the syntax tree, the parser.

:func:`parse` turns a path into a :class:`Node` tree (or :class:`UnsupportedPath` for
what is not FHIRPath, or not a form this server compiles: quantity literals, for one);
:mod:`.fhirpath` compiles the tree. Operator precedence is FHIRPath's, lowest first:
``implies``; ``or``/``xor``; ``and``; ``in``/``contains``; equality; comparison; ``|``;
``is``/``as``; ``+``/``-``/``&``; ``*``/``/``/``div``/``mod``; unary sign; invocation
and indexers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


class UnsupportedPath(ValueError):
    """The path is not FHIRPath this server runs (a syntax error, or outside the subset)."""


# --- tokens ------------------------------------------------------------------------------
_TOKEN = re.compile(
    r"\s*(?:(?P<string>'(?:[^'\\]|\\.)*')"
    r"|(?P<date>@T?[0-9][0-9:T.+\-Z]*)"
    r"|(?P<number>\d+(?:\.\d+)?)"
    r"|(?P<ident>[A-Za-z_][A-Za-z0-9_]*|`[^`]+`)"
    r"|(?P<var>%[A-Za-z_][A-Za-z0-9_]*|%`[^`]+`|%'[^']+'|\$[a-z]+)"
    r"|(?P<op><=|>=|!=|!~|[.|()\[\],=<>~+\-*/&{}]))"
)
_KEYWORD_OPS = frozenset({"and", "or", "xor", "implies", "is", "as", "div", "mod", "in",
                          "contains"})
_LEVELS: tuple[tuple[str, ...], ...] = (
    ("implies",), ("or", "xor"), ("and",), ("in", "contains"), ("=", "~", "!=", "!~"),
    ("<", ">", "<=", ">="), ("|",), ("is", "as"), ("+", "-", "&"), ("*", "/", "div", "mod"),
)


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos, text = 0, text.strip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if not match or match.end() == pos:
            raise UnsupportedPath(f"cannot read {text[pos:pos + 20]!r}")
        kind = match.lastgroup or ""
        out.append((kind, match.group(kind)))
        pos = match.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return out


# --- syntax tree ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Node:
    kind: str  # member | func | index | binary | unary | literal | var | this | empty | type
    name: str = ""
    base: Node | None = None
    args: tuple[Node, ...] = ()
    value: Any = None


_TYPE_ARGUMENT = frozenset({"ofType", "as", "is", "getReferenceKey"})


class _Parser:
    def __init__(self, text: str):
        self.tokens = _tokens(text)
        self.pos = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        token = self.peek()
        if token is None or (value is not None and token[1] != value):
            found = "the end" if token is None else repr(token[1])
            raise UnsupportedPath(f"expected {value or 'more'}, found {found}")
        self.pos += 1
        return token

    def parse(self) -> Node:
        if not self.tokens:
            raise UnsupportedPath("the path is empty")
        node = self.binary(0)
        if self.peek() is not None:
            raise UnsupportedPath(f"unexpected {self.peek()[1]!r}")  # type: ignore[index]
        return node

    def _is_op(self, token: tuple[str, str] | None, ops: tuple[str, ...]) -> bool:
        if token is None or token[1] not in ops:
            return False
        return token[0] == "op" or (token[0] == "ident" and token[1] in _KEYWORD_OPS)

    def binary(self, level: int) -> Node:
        if level == len(_LEVELS):
            return self.unary()
        node = self.binary(level + 1)
        while self._is_op(self.peek(), _LEVELS[level]):
            op = self.take()[1]
            right = Node("type", name=self.type_name()) if op in ("is", "as") \
                else self.binary(level + 1)
            node = Node("binary", name=op, args=(node, right))
        return node

    def unary(self) -> Node:
        token = self.peek()
        if token is not None and token[0] == "op" and token[1] in ("+", "-"):
            self.take()
            operand = self.unary()
            return operand if token[1] == "+" else Node("unary", name="-", args=(operand,))
        return self.postfix()

    def type_name(self) -> str:
        kind, name = self.take()
        if kind != "ident":
            raise UnsupportedPath(f"expected a type name, found {name!r}")
        while (token := self.peek()) is not None and token[1] == "." and \
                self.pos + 1 < len(self.tokens) and self.tokens[self.pos + 1][0] == "ident":
            self.take(".")
            name = self.take()[1]  # FHIR.Quantity, System.String → the last part
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
            raise UnsupportedPath(f"expected a name, found {name!r}")
        name = name.strip("`")
        if (token := self.peek()) is not None and token[1] == "(":
            self.take("(")
            args: list[Node] = []
            while (token := self.peek()) is not None and token[1] != ")":
                if name in _TYPE_ARGUMENT and token[0] == "ident":
                    args.append(Node("type", name=self.type_name()))
                else:
                    args.append(self.binary(0))
                if (token := self.peek()) is not None and token[1] == ",":
                    self.take(",")
            self.take(")")
            return Node("func", name=name, base=base, args=tuple(args))
        return Node("member", name=name, base=base)

    def term(self) -> Node:
        token = self.peek()
        if token is None:
            raise UnsupportedPath("the path ends too soon")
        kind, text = token
        if text == "(":
            self.take("(")
            node = self.binary(0)
            self.take(")")
            return node
        if text == "{":
            self.take("{")
            self.take("}")
            return Node("empty")
        self.take()
        if kind == "string":
            return Node("literal", name="string", value=_unquote(text))
        if kind == "number":
            return Node("literal", name="decimal" if "." in text else "integer",
                        value=float(text) if "." in text else int(text))
        if kind == "date":
            return _date_literal(text)
        if kind == "var":
            return Node("var", name=text[1:].strip("`'"))
        if kind == "ident" and text in ("true", "false"):
            return Node("literal", name="boolean", value=text == "true")
        if kind != "ident":
            raise UnsupportedPath(f"unexpected {text!r}")
        self.pos -= 1
        return self.invocation(None)


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f"}


def _unquote(text: str) -> str:
    def escape(match: re.Match[str]) -> str:
        char = match[1]
        if char.startswith("u"):
            return chr(int(char[1:], 16))
        return _ESCAPES.get(char, char)
    return re.sub(r"\\(u[0-9a-fA-F]{4}|.)", escape, text[1:-1])


def _date_literal(text: str) -> Node:
    body = text[1:]
    if body.startswith("T"):
        return Node("literal", name="time", value=body[1:])
    if "T" in body:
        return Node("literal", name="dateTime", value=body.rstrip("T"))
    return Node("literal", name="date", value=body)


def parse(text: str) -> Node:
    """The syntax tree of ``text`` (:class:`UnsupportedPath` when it is not one)."""
    return _Parser(text).parse()
