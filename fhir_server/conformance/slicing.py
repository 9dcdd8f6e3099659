"""Slicing: which slice each item of a sliced element belongs to (R4 Profiling 5.1.0.x,
"Slicing"), by its discriminators.

A discriminator is a path from the item (``system``, ``code.coding.code``, ``url``,
``$this``, ``extension('http://...').value``, ``resolve()``, ``ofType(Quantity)``) and a
type:

- ``value`` / ``pattern``: the value at the path equals (contains) the fixed (pattern)
  value the slice defines there; a required binding there instead: the code is in its
  value set;
- ``exists``: the element at the path is present (the slice requires it) or absent;
- ``type``: the type of the value at the path is one of the slice's types;
- ``profile``: the value at the path conforms to the slice's profile (the validator is
  asked).

What a slice "defines at the path" is found by walking the slice's own child rules; an
extension slice without children names its extension's URL through its type profile.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from fhir_server.conformance.model import Discriminator, ElementRule

_FUNCTION = re.compile(r"^(extension|ofType|as)\((.+)\)$")
MISSING = object()


def split_path(path: str) -> list[str]:
    """``extension('http://a.b/c').value`` → [``extension('http://a.b/c')``, ``value``]."""
    parts, depth, current = [], 0, ""
    for char in path:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "." and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if current:
        parts.append(current)
    return [p for p in parts if p != "$this"]


def values_at(item: Any, path: str, type_code: str | None,
              resolve: Callable[[Any], Any] | None = None) -> list[tuple[Any, str | None]]:
    """The (value, type) pairs at ``path`` from ``item`` (of ``type_code``)."""
    current: list[tuple[Any, str | None]] = [(item, type_code)]
    for step in split_path(path):
        following: list[tuple[Any, str | None]] = []
        function = _FUNCTION.match(step)
        for value, kind in current:
            if step == "resolve()":
                if resolve is not None:
                    target = resolve(value)
                    if isinstance(target, dict):
                        following.append((target, target.get("resourceType")))
                continue
            if function and function.group(1) == "extension":
                url = function.group(2).strip("'\"")
                for ext in (value.get("extension") or ()) if isinstance(value, dict) else ():
                    if isinstance(ext, dict) and ext.get("url") == url:
                        following.append((ext, "Extension"))
                continue
            if function:  # ofType(T) / as(T): keep values of that type
                wanted = function.group(2)
                if kind == wanted or (isinstance(value, dict) and
                                      value.get("resourceType") == wanted):
                    following.append((value, wanted))
                continue
            if not isinstance(value, dict):
                continue
            following += _child(value, step)
        current = following
    return current


def _child(value: dict[str, Any], name: str) -> list[tuple[Any, str | None]]:
    found: list[tuple[Any, str | None]] = []
    if name in value:
        child = value[name]
        for item in child if isinstance(child, list) else [child]:
            found.append((item, None))
        return found
    if name.endswith("[x]"):
        name = name[:-3]
    for key, child in value.items():  # a choice element: valueQuantity for value
        if key.startswith(name) and len(key) > len(name) and key[len(name)].isupper():
            suffix = key[len(name):]
            lowered = suffix[0].lower() + suffix[1:]
            kind = lowered if lowered in _PRIMITIVE_SUFFIXES else suffix
            for item in child if isinstance(child, list) else [child]:
                found.append((item, kind))
    return found


_PRIMITIVE_SUFFIXES = frozenset({"boolean", "integer", "string", "decimal", "uri", "url",
                                 "canonical", "base64Binary", "instant", "date", "dateTime",
                                 "time", "code", "oid", "id", "markdown", "unsignedInt",
                                 "positiveInt", "uuid"})


def rules_at(rule: ElementRule, path: str,
             children_of: Callable[[ElementRule], dict[str, ElementRule]]
             ) -> list[tuple[ElementRule, list[str]]]:
    """The rules of the slice at ``path`` (as far as the slice's rules go), each with the
    part of the path left below it (to be read inside its fixed or pattern value). An
    element sliced again on the way (``code.coding`` with a slice per code) gives its
    slices too: a value any of them fixes tells the slice."""
    steps = split_path(path)
    current: list[tuple[ElementRule, list[str]]] = [(rule, [])]
    for index, step in enumerate(steps):
        following: list[tuple[ElementRule, list[str]]] = []
        for candidate, rest in current:
            if rest or candidate.fixed is not None or candidate.pattern is not None:
                following.append((candidate, rest or steps[index:]))
                continue
            function = _FUNCTION.match(step)
            if function and function.group(1) == "extension":
                url = function.group(2).strip("'\"")
                extension = children_of(candidate).get("extension")
                following += [(s, []) for s in (extension.slices if extension else ())
                              if extension_url(s, children_of) == url]
                continue
            if function:  # ofType(X): the rule itself, restricted to the type
                following.append((candidate, []))
                continue
            children = children_of(candidate)
            child = children.get(step) or children.get(f"{step}[x]")
            if child is not None:
                following += [(child, []), *((s, []) for s in child.slices)]
        current = following
    return current


def rule_at(rule: ElementRule, path: str,
            children_of: Callable[[ElementRule], dict[str, ElementRule]]
            ) -> tuple[ElementRule | None, list[str]]:
    """The first of :func:`rules_at`, or (None, [])."""
    found = rules_at(rule, path, children_of)
    return found[0] if found else (None, [])


def extension_url(rule: ElementRule,
                  children_of: Callable[[ElementRule], dict[str, ElementRule]]) -> str | None:
    """The URL an extension slice stands for: its ``url`` child's fixed value, or its
    type's profile."""
    url_rule = rule.children.get("url")
    if url_rule is not None and isinstance(url_rule.fixed, str):
        return url_rule.fixed
    for type_ref in rule.types:
        if type_ref.code == "Extension" and type_ref.profiles:
            return type_ref.profiles[0].split("|")[0]
    url_rule = children_of(rule).get("url")
    if url_rule is not None and isinstance(url_rule.fixed, str):
        return url_rule.fixed
    return None


def project(value: Any, steps: list[str]) -> list[Any]:
    """The parts of a fixed or pattern value at ``steps`` below it."""
    current = [value]
    for step in steps:
        following = []
        for item in current:
            if isinstance(item, dict) and step in item:
                child = item[step]
                following += child if isinstance(child, list) else [child]
        current = following
    return current


def matches_pattern(value: Any, pattern: Any) -> bool:
    """Whether ``value`` holds everything ``pattern`` has (R4 ElementDefinition.pattern)."""
    if isinstance(pattern, dict):
        if not isinstance(value, dict):
            return False
        return all(key in value and matches_pattern(value[key], expected)
                   for key, expected in pattern.items())
    if isinstance(pattern, list):
        if not isinstance(value, list):
            value = [value]
        return all(any(matches_pattern(v, p) for v in value) for p in pattern)
    return _same(value, pattern)


def matches_fixed(value: Any, fixed: Any) -> bool:
    """Whether ``value`` is exactly ``fixed`` (extensions and ids aside, as the
    reference validator compares)."""
    if isinstance(fixed, dict):
        if not isinstance(value, dict):
            return False
        keys = {k for k in value if k not in ("id", "extension")}
        return keys == set(fixed) and all(matches_fixed(value[k], fixed[k]) for k in fixed)
    if isinstance(fixed, list):
        return isinstance(value, list) and len(value) == len(fixed) and all(
            matches_fixed(v, f) for v, f in zip(value, fixed, strict=True))
    return _same(value, fixed)


def _same(value: Any, expected: Any) -> bool:
    if isinstance(expected, bool) or isinstance(value, bool):
        return value is expected
    if isinstance(expected, int | float) and isinstance(value, int | float):
        return float(value) == float(expected)
    return bool(value == expected)


def discriminator_matches(
    discriminator: Discriminator, item: Any, item_type: str | None, slice_rule: ElementRule,
    children_of: Callable[[ElementRule], dict[str, ElementRule]],
    in_value_set: Callable[[str, Any, str | None], bool | None],
    conforms: Callable[[Any, str], bool],
    resolve: Callable[[Any], Any] | None,
) -> bool | None:
    """Whether ``item`` belongs to ``slice_rule`` by one discriminator; None when the
    slice defines nothing to tell by."""
    kind, path = discriminator.type, discriminator.path
    values = values_at(item, path, item_type, resolve)
    if kind == "exists":
        target, _ = rule_at(slice_rule, path, children_of)
        if target is None:
            return None
        if target.min >= 1:
            return bool(values)
        if target.max == 0:
            return not values
        return None
    if kind == "type":
        target, _ = rule_at(slice_rule, path, children_of)
        wanted = {t.code for t in (target or slice_rule).types}
        if not wanted:
            return None
        for value, value_type in values:
            actual = value_type or (value.get("resourceType") if isinstance(value, dict)
                                    else None)
            if actual in wanted:
                return True
        return False
    if kind == "profile":
        target, _ = rule_at(slice_rule, path, children_of)
        profiles = [p for t in (target or slice_rule).types
                    for p in (t.profiles or t.target_profiles)]
        if not profiles:
            return None
        return any(conforms(value, profile) for value, _ in values for profile in profiles)
    # value / pattern
    if discriminator.path in ("url",) and not slice_rule.children:
        url = extension_url(slice_rule, children_of)
        if url is None:
            return None
        return any(value == url for value, _ in values)
    candidates = rules_at(slice_rule, path, children_of)
    if not candidates:
        return None
    fixed = [v for target, rest in candidates if target.fixed is not None
             for v in (project(target.fixed, rest) if rest else [target.fixed])]
    patterns = [v for target, rest in candidates if target.pattern is not None
                for v in (project(target.pattern, rest) if rest else [target.pattern])]
    if fixed or patterns:
        return any(any(matches_fixed(v, e) for e in fixed) or
                   any(matches_pattern(v, e) for e in patterns) for v, _ in values)
    target = candidates[0][0]
    if target.binding is not None and target.binding.strength == "required" and \
            target.binding.value_set:
        verdicts = [in_value_set(target.binding.value_set, v, t) for v, t in values]
        return any(v is True for v in verdicts)
    if discriminator.path == "url" or discriminator.path.endswith(".url"):
        url = extension_url(slice_rule, children_of)
        if url is not None:
            return any(value == url for value, _ in values)
    return None
