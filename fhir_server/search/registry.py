"""The search-parameter registry: which parameters each resource type has, and how to
evaluate them.

The data is generated from the official R4 definitions by
``scripts/generate_search_parameters.py`` into ``fhir_server/data/search_parameters.json``.
Parameters of ``Resource`` and ``DomainResource`` apply to every type. Custom
SearchParameter resources (posted to ``/fhir/SearchParameter``) are merged on top when the
registry is built with them, which ``healthplatform reindex`` does (see
:mod:`fhir_server.search.custom`).

Each parameter's FHIRPath expression is compiled once, lazily, into a fast evaluator
(:mod:`fhir_server.search.fhirpath`); expressions outside that subset fall back to
``fhirpathpy`` when it is installed, otherwise the parameter is skipped with a warning.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources
from typing import Any

from fhir_server.search.fhirpath import (
    Compiler,
    Env,
    UnsupportedExpression,
    compile_expression,
    expression_for,
    split_union,
)

log = logging.getLogger(__name__)

# Modifiers each parameter type accepts (SearchParameter.modifier codes; the URL spells
# ``ofType`` as ``:of-type`` and ``type`` as ``:[ResourceType]``). Terminology modifiers
# (in, not-in, below/above on tokens) need a terminology service and are not offered.
MODIFIERS: dict[str, tuple[str, ...]] = {
    "string": ("missing", "exact", "contains"),
    "token": ("missing", "not", "text"),
    "reference": ("missing", "type", "identifier"),
    "date": ("missing",),
    "number": ("missing",),
    "quantity": ("missing",),
    "uri": ("missing", "below", "above"),
    "composite": ("missing",),
    "special": (),
}
# Composite parameters are indexed when their components are a token followed by one value
# of these types (every R4 composite except MolecularSequence's coordinate triples).
COMPOSITE_VALUE_TYPES = frozenset({"token", "quantity", "string", "date", "reference", "number",
                                   "uri"})
# Parameters whose values come from the resources table rather than an expression.
RESOURCE_COLUMNS = frozenset({"_id", "_lastUpdated"})
FULL_TEXT = frozenset({"_text", "_content"})


def modifiers_for(param_type: str, code: str, expression: str | None) -> list[str]:
    """The modifiers a parameter supports (used by the generator and for custom params)."""
    modifiers = list(MODIFIERS.get(param_type, ()))
    if param_type == "token" and (code == "identifier" or (expression or "").endswith(
            ".identifier")):
        modifiers.append("ofType")
    return modifiers


@dataclass(frozen=True, slots=True)
class Component:
    type: str
    expression: str


@dataclass(frozen=True, slots=True)
class SearchParam:
    code: str
    type: str  # string | token | reference | date | number | quantity | uri | composite | special
    url: str
    expression: str | None = None
    targets: tuple[str, ...] = ()
    components: tuple[Component, ...] = ()
    modifiers: tuple[str, ...] = ()
    description: str = ""
    custom: bool = False
    # When the expression is exactly the union of other parameters' expressions
    # (Observation combo-code = code | component-code), their index rows are its rows:
    # nothing extra is extracted or stored, and a search reads those parameters' rows.
    union_of: tuple[str, ...] = ()

    @property
    def stored(self) -> tuple[str, ...]:
        """The parameter codes whose index rows hold this parameter's values."""
        return self.union_of or (self.code,)

    @property
    def searchable(self) -> bool:
        """Whether the server can evaluate this parameter (indexed or a column)."""
        if self.code in RESOURCE_COLUMNS or self.code in FULL_TEXT:
            return True
        if self.type == "special" or not self.expression:
            return False
        if self.type == "composite":
            return _composite_supported(self.components)
        return True


def _composite_supported(components: Sequence[Component]) -> bool:
    return (len(components) == 2 and components[0].type == "token"
            and components[1].type in COMPOSITE_VALUE_TYPES)


def _parts(expression: str | None) -> frozenset[str]:
    return frozenset(_bare(p) for p in split_union(expression)) if expression else frozenset()


def _bare(part: str) -> str:
    """A union part without enclosing parentheses: ``(Observation.code)`` → ``Observation.code``."""
    part = part.strip()
    while part.startswith("(") and part.endswith(")") and _balanced(part[1:-1]):
        part = part[1:-1].strip()
    return part


def _balanced(text: str) -> bool:
    depth = 0
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


def _signature(param: SearchParam) -> tuple[str, tuple[Component, ...]]:
    return param.type, param.components


def derive_unions(params: dict[str, SearchParam]) -> dict[str, SearchParam]:
    """Mark the parameters of one type that are unions of others (see ``union_of``)."""
    parts = {code: _parts(p.expression) for code, p in params.items()}
    derived = dict(params)
    for code, param in params.items():
        wanted = parts[code]
        if len(wanted) < 2 or code in RESOURCE_COLUMNS:
            continue
        candidates = sorted(
            (other for other, p in params.items()
             if other != code and _signature(p) == _signature(param) and not p.union_of
             and parts[other] and parts[other] < wanted),
            key=lambda other: -len(parts[other]))
        remaining, chosen = set(wanted), []
        for other in candidates:
            if parts[other] <= remaining:
                chosen.append(other)
                remaining -= parts[other]
        if not remaining:
            derived[code] = replace(param, union_of=tuple(sorted(chosen)))
    return derived


def _param(raw: Mapping[str, Any], custom: bool = False) -> SearchParam:
    return SearchParam(
        code=raw["code"], type=raw["type"], url=raw.get("url", ""),
        expression=raw.get("expression"), targets=tuple(raw.get("target", ())),
        components=tuple(Component(c["type"], c["expression"])
                         for c in raw.get("components", ())),
        modifiers=tuple(raw.get("modifiers", ())), description=raw.get("description", ""),
        custom=custom,
    )


@cache
def _data() -> dict[str, Any]:
    text = resources.files("fhir_server.data").joinpath("search_parameters.json").read_text()
    return json.loads(text)  # type: ignore[no-any-return]


Evaluate = Callable[[dict[str, Any]], list[Any]]
RelativeEvaluate = Callable[[Any, dict[str, Any]], list[Any]]


@dataclass
class SearchRegistry:
    """Parameters per resource type, with compiled evaluators. Immutable once built."""

    by_type: dict[str, dict[str, SearchParam]]
    choice_elements: frozenset[str]
    patient_compartment: dict[str, tuple[str, ...]]
    elements: dict[str, dict[str, list[str]]]
    version: str = "builtin"
    _evaluators: dict[tuple[str, str], Evaluate | None] = field(default_factory=dict)
    _relative: dict[tuple[str, str], RelativeEvaluate | None] = field(default_factory=dict)
    _compiler: Compiler | None = None
    skipped: list[str] = field(default_factory=list)

    # -- lookups -------------------------------------------------------------------------
    def params(self, resource_type: str) -> dict[str, SearchParam]:
        """All parameters of a type, the Resource/DomainResource ones included."""
        return self.by_type.get(resource_type) or self.by_type.get("Resource", {})

    def param(self, resource_type: str, code: str) -> SearchParam | None:
        return self.params(resource_type).get(code)

    def compartment_params(self, compartment: str, resource_type: str) -> tuple[str, ...]:
        if compartment != "Patient":
            return ()
        return self.patient_compartment.get(resource_type, ())

    def compartment_types(self, compartment: str) -> list[str]:
        return sorted(self.patient_compartment) if compartment == "Patient" else []

    # -- evaluation ----------------------------------------------------------------------
    def evaluator(self, resource_type: str, expression: str) -> Evaluate | None:
        """The compiled evaluator of an expression (cached); None when unusable."""
        key = (resource_type, expression)
        if key not in self._evaluators:
            self._evaluators[key] = self._compile(expression)
        return self._evaluators[key]

    def relative_evaluator(self, expression: str) -> RelativeEvaluate | None:
        """An evaluator of an expression relative to an element (composite components)."""
        key = ("", expression)
        if key not in self._relative:
            try:
                evaluator = self.compiler.compile(expression)
            except UnsupportedExpression as exc:
                log.warning("composite component skipped (%s): %s", exc, expression)
                self.skipped.append(expression)
                self._relative[key] = None
            else:
                self._relative[key] = lambda element, resource: evaluator([element],
                                                                          Env(resource))
        return self._relative[key]

    def gates(self, expression: str, *, relative: bool = False) -> frozenset[str] | None:
        """Top-level elements an expression reads (see :meth:`Compiler.gates`)."""
        try:
            return self.compiler.gates(expression, relative=relative)
        except UnsupportedExpression:
            return None

    @property
    def compiler(self) -> Compiler:
        if self._compiler is None:
            self._compiler = Compiler(self.by_type.keys(), self.choice_elements)
        return self._compiler

    def _compile(self, expression: str) -> Evaluate | None:
        try:
            return compile_expression(expression, self.compiler)
        except UnsupportedExpression as exc:
            fallback = _fhirpathpy(expression)
            if fallback is None:
                log.warning("search expression skipped (%s): %s", exc, expression)
                self.skipped.append(expression)
            return fallback

    def with_custom(self, definitions: Iterable[Mapping[str, Any]], version: str
                    ) -> SearchRegistry:
        """A registry with custom SearchParameter resources merged over the built-ins."""
        by_type = {t: dict(ps) for t, ps in self.by_type.items()}
        for definition in definitions:
            for base in definition.get("base") or ():
                if base not in by_type and base not in ("Resource", "DomainResource"):
                    continue
                param = custom_param(definition, base)
                if param is None:
                    continue
                targets = list(by_type) if base in ("Resource", "DomainResource") else [base]
                for resource_type in targets:
                    by_type[resource_type][param.code] = param
        by_type = {t: derive_unions({c: replace(p, union_of=()) for c, p in ps.items()})
                   for t, ps in by_type.items()}
        return SearchRegistry(by_type, self.choice_elements, self.patient_compartment,
                              self.elements, version)


def custom_param(definition: Mapping[str, Any], base: str) -> SearchParam | None:
    """A SearchParam from a SearchParameter resource, for one of its base types."""
    code, param_type = definition.get("code"), definition.get("type")
    expression = definition.get("expression")
    if not isinstance(code, str) or param_type not in MODIFIERS or not expression:
        return None
    part = expression_for(expression, base)
    return _param({
        "code": code, "type": param_type, "url": definition.get("url", ""),
        "expression": part or expression, "target": definition.get("target", ()),
        "components": [], "description": definition.get("description", ""),
        "modifiers": modifiers_for(param_type, code, part),
    }, custom=True)


def _fhirpathpy(expression: str) -> Evaluate | None:
    try:
        from fhirpathpy import compile as fhirpath_compile
        from fhirpathpy.models import models
    except ImportError:
        return None
    try:
        compiled = fhirpath_compile(expression, model=models["r4"])
    except Exception as exc:  # the library raises bare Exceptions on syntax it rejects
        log.warning("search expression skipped (fhirpathpy: %s): %s", exc, expression)
        return None

    def evaluate(resource: dict[str, Any]) -> list[Any]:
        try:
            return list(compiled(resource, {}))
        except Exception as exc:  # a runtime gap in the library must not fail a write
            log.warning("fhirpathpy failed on %s: %s", expression, exc)
            return []
    log.info("search expression evaluated by fhirpathpy: %s", expression)
    return evaluate


@cache
def builtin_registry() -> SearchRegistry:
    data = _data()
    common: dict[str, SearchParam] = {}
    for base in ("Resource", "DomainResource"):
        for raw in data["resources"].get(base, ()):
            common[raw["code"]] = _param(raw)
    by_type: dict[str, dict[str, SearchParam]] = {"Resource": dict(common)}
    for resource_type in data["elements"]:
        params = dict(common)
        for raw in data["resources"].get(resource_type, ()):
            params[raw["code"]] = _param(raw)
        by_type[resource_type] = derive_unions(params)
    return SearchRegistry(
        by_type=by_type,
        choice_elements=frozenset(data["choiceElements"]),
        patient_compartment={k: tuple(v) for k, v in data["patientCompartment"].items()},
        elements=data["elements"],
    )
