"""Rules of the conformance resources themselves (CodeSystem, ValueSet, and the other
canonical resources) that the specification states in prose and the reference validator
checks:

- a canonical ``url`` is absolute (a URL or a URN), in a contained resource too;
- ``ValueSet.compose.include.system`` (and ``exclude``) is an absolute URI, not a
  reference to a contained code system (``#cs``);
- a CodeSystem that ``supplements`` another has ``content`` = ``supplement``, and its
  concepts are codes of the system it supplements (when the server holds it);
- a CodeSystem's properties: a code and a URI are declared once each, a property of the
  standard URIs (``http://hl7.org/fhir/concept-properties#...``) has that property's code
  and type, and each concept's property value has the declared type;
- a StructureDefinition's differential can be made into a snapshot (its paths exist in
  the base, it loosens nothing);
- a SearchParameter derived from an R4 one keeps its type and bases.

Each finding is (severity, IssueType code, rule, message, expression).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from fhir_server.conformance.snapshot import SnapshotError, generate_snapshot
from fhir_server.search.registry import builtin_registry
from fhir_server.terminology.content import TerminologyContent

Finding = tuple[str, str, str, str, str]
CANONICAL_TYPES = frozenset({
    "ActivityDefinition", "CapabilityStatement", "ChargeItemDefinition", "CodeSystem",
    "CompartmentDefinition", "ConceptMap", "EffectEvidenceSynthesis", "EventDefinition",
    "Evidence", "EvidenceVariable", "ExampleScenario", "GraphDefinition",
    "ImplementationGuide", "Library", "Measure", "MessageDefinition", "NamingSystem",
    "OperationDefinition", "PlanDefinition", "Questionnaire", "ResearchDefinition",
    "ResearchElementDefinition", "RiskEvidenceSynthesis", "SearchParameter",
    "StructureDefinition", "StructureMap", "TerminologyCapabilities", "TestScript",
    "ValueSet"})
CONCEPT_PROPERTIES = "http://hl7.org/fhir/concept-properties#"
# The standard concept properties (R4 CodeSystem 4.8.x, "concept-properties") and types.
STANDARD_PROPERTIES = {"inactive": "boolean", "deprecated": "dateTime",
                       "deprecationDate": "dateTime", "notSelectable": "boolean",
                       "parent": "code", "child": "code", "partOf": "code",
                       "synonym": "code", "comment": "string", "itemWeight": "decimal",
                       "status": "code", "retirementDate": "dateTime"}
VALUE_TYPES = {"code": "valueCode", "Coding": "valueCoding", "string": "valueString",
               "integer": "valueInteger", "boolean": "valueBoolean",
               "dateTime": "valueDateTime", "decimal": "valueDecimal"}


def _absolute(uri: str) -> bool:
    return ":" in uri and not uri.startswith("#")


def canonical_problems(resource: dict[str, Any], where: str, *, contained: bool,
                       terminology: TerminologyContent,
                       lookup: Callable[[str], dict[str, Any] | None]) -> list[Finding]:
    kind = resource.get("resourceType")
    found: list[Finding] = []
    url = resource.get("url")
    if kind in CANONICAL_TYPES and isinstance(url, str) and not _absolute(url):
        found.append(("error", "invalid", "canonical-url",
                      f"Canonical URLs {'in contained resources ' if contained else ''}must "
                      f"be absolute URLs ('{url}')", f"{where}.url"))
    if kind == "ValueSet":
        found += _value_set(resource, where)
    elif kind == "CodeSystem":
        found += _code_system(resource, where, terminology)
    elif kind == "StructureDefinition":
        found += _structure_definition(resource, where, lookup)
    elif kind == "SearchParameter":
        found += _search_parameter(resource, where)
    return found


@cache
def _core_search_parameters() -> dict[str, tuple[str, frozenset[str]]]:
    """URL → (type, base types) of the R4 search parameters."""
    found: dict[str, tuple[str, set[str]]] = {}
    for resource_type, params in builtin_registry().by_type.items():
        for param in params.values():
            if param.url:
                found.setdefault(param.url, (param.type, set()))[1].add(resource_type)
    return {url: (kind, frozenset(bases)) for url, (kind, bases) in found.items()}


def _search_parameter(sp: dict[str, Any], where: str) -> list[Finding]:
    """A SearchParameter derived from an R4 one keeps its type and its bases."""
    derived = sp.get("derivedFrom")
    core = _core_search_parameters().get(str(derived).split("|")[0]) if derived else None
    if core is None:
        return []
    kind, bases = core
    found: list[Finding] = []
    if sp.get("type") != kind:
        found.append(("error", "invalid", "searchparameter-derived", f"the type "
                      f"{sp.get('type')} is different to the type {kind} of {derived}, which "
                      "it is derived from", where))
    for base in sp.get("base") or ():
        if base not in bases and "Resource" not in bases:
            found.append(("error", "invalid", "searchparameter-derived", f"the resource type "
                          f"{base} is not a base of {derived}, which it is derived from",
                          where))
    return found


def _value_set(value_set: dict[str, Any], where: str) -> list[Finding]:
    found: list[Finding] = []
    compose: dict[str, Any] = value_set["compose"] \
        if isinstance(value_set.get("compose"), dict) else {}
    for part in ("include", "exclude"):
        for index, include in enumerate(compose.get(part) or ()):
            system = include.get("system") if isinstance(include, dict) else None
            if isinstance(system, str) and not _absolute(system):
                found.append(("error", "invalid", "valueset-system", f"URI values in "
                              f"ValueSet.compose.{part}.system must be absolute ('{system}'): "
                              "a contained code system is named by its own url",
                              f"{where}.compose.{part}[{index}].system"))
    return found


def _code_system(code_system: dict[str, Any], where: str, terminology: TerminologyContent
                 ) -> list[Finding]:
    found: list[Finding] = []
    supplements = code_system.get("supplements")
    if isinstance(supplements, str):
        if code_system.get("content") != "supplement":
            found.append(("error", "invalid", "codesystem-supplement", "a CodeSystem that "
                          "supplements another SHALL have the content 'supplement'",
                          f"{where}.content"))
        base = terminology.code_system(supplements.split("|")[0])
        if base is not None and base.complete:
            for index, concept in enumerate(code_system.get("concept") or ()):
                code = concept.get("code") if isinstance(concept, dict) else None
                if isinstance(code, str) and base.lookup(code) is None:
                    found.append(("error", "code-invalid", "codesystem-supplement",
                                  f"the code '{code}' is not in the supplemented code system "
                                  f"{supplements}", f"{where}.concept[{index}]"))
    declared: dict[str, str] = {}
    uris: set[str] = set()
    for index, prop in enumerate(code_system.get("property") or ()):
        if not isinstance(prop, dict):
            continue
        here = f"{where}.property[{index}]"
        code, uri, kind = prop.get("code"), prop.get("uri"), prop.get("type")
        if isinstance(code, str):
            if code in declared:
                found.append(("error", "invalid", "codesystem-property", f"a property is "
                              f"already defined with the code '{code}'", here))
            declared.setdefault(code, str(kind))
        if isinstance(uri, str):
            if uri in uris:
                found.append(("error", "invalid", "codesystem-property", f"a property is "
                              f"already defined with the URI '{uri}'", here))
            uris.add(uri)
            if uri.startswith(CONCEPT_PROPERTIES):
                standard = uri[len(CONCEPT_PROPERTIES):]
                expected = STANDARD_PROPERTIES.get(standard)
                if expected is not None and kind != expected:
                    found.append(("error", "invalid", "codesystem-property", f"wrong type "
                                  f"'{kind}': the URI '{uri}' identifies a property of type "
                                  f"'{expected}'", here))
                if expected is not None and code != standard and code not in \
                        STANDARD_PROPERTIES:
                    continue
                if expected is not None and code != standard:
                    found.append(("error", "invalid", "codesystem-property", f"the URI "
                                  f"'{uri}' is assigned the code '{standard}', not '{code}'",
                                  here))
    found += _concept_properties(code_system.get("concept") or (), declared, f"{where}.concept")
    return found


def _concept_properties(concepts: Any, declared: dict[str, str], where: str
                        ) -> list[Finding]:
    found: list[Finding] = []
    for index, concept in enumerate(concepts):
        if not isinstance(concept, dict):
            continue
        for number, prop in enumerate(concept.get("property") or ()):
            if not isinstance(prop, dict) or prop.get("code") not in declared:
                continue
            expected = VALUE_TYPES.get(declared[prop["code"]])
            given = next((k for k in prop if k.startswith("value")), None)
            if expected is not None and given is not None and given != expected:
                found.append(("error", "invalid", "codesystem-property", f"the property "
                              f"'{prop['code']}' has a {given[5:]} value, but is declared "
                              f"as {declared[prop['code']]}",
                              f"{where}[{index}].property[{number}]"))
        found += _concept_properties(concept.get("concept") or (), declared,
                                     f"{where}[{index}].concept")
    return found


def _structure_definition(sd: dict[str, Any], where: str,
                          lookup: Callable[[str], dict[str, Any] | None]) -> list[Finding]:
    if sd.get("derivation") != "constraint" or not (sd.get("differential") or {}).get(
            "element") or not sd.get("baseDefinition"):
        return []
    if lookup(str(sd["baseDefinition"]).split("|")[0]) is None:
        return []  # a base the server does not know: nothing to say about the differential
    try:
        generate_snapshot(sd, lookup)
    except SnapshotError as exc:
        return [("error", "invalid", "snapshot", f"the snapshot cannot be generated from the "
                 f"differential: {exc}", where)]
    except (KeyError, TypeError, ValueError) as exc:
        return [("error", "invalid", "snapshot", f"the differential is malformed: {exc}",
                 where)]
    return []
