"""The validator: a resource walked beside the element rules of its StructureDefinitions.

For each element of the instance it checks, as the reference validator does:

- that the element is defined (an unknown JSON property is an error), is an array
  exactly when it repeats, and appears within its cardinality (``min``..``max``);
- its type: a choice element's JSON name names one of its types; a primitive is the JSON
  type its type is written as, in its format (:mod:`.primitives`); a complex element is
  an object, validated against its type's definition (or the children the profile gives
  it); a resource (``contained``, ``Bundle.entry.resource``) against its own type;
- ``fixed[x]`` and ``pattern[x]`` values, ``minValue``/``maxValue``, ``maxLength``;
- bindings and codes (:mod:`.bindings`); references (:mod:`.references`); narrative
  XHTML (:mod:`.narrative`); attachments (:mod:`.attachments`); Bundles (:mod:`.bundles`);
- slicing (:mod:`.slicing`): each item's slice, each slice's cardinality, closed and
  ordered slicing;
- extensions: against their definitions (found by URL), where they may be used, and an
  unknown one as :attr:`Options.unknown_extensions` says;
- every invariant (``constraint``) of the element and of its type (:mod:`.invariants`).

Issues are OperationOutcome issues with a FHIRPath location (``Patient.name[0].given``)
and the rule that failed. A run is synchronous and reads a
:class:`~fhir_server.conformance.canonicals.ConformanceContext` (profiles, terminology)
loaded beforehand.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from fhir_server.conformance import invariants
from fhir_server.conformance.attachments import attachment_problems
from fhir_server.conformance.bindings import CODED_TYPES, check_binding, check_coding
from fhir_server.conformance.bundles import bundle_problems
from fhir_server.conformance.canonical_rules import canonical_problems
from fhir_server.conformance.canonicals import ConformanceContext
from fhir_server.conformance.definitions import (
    is_primitive,
    resource_type_names,
    shipped_structure_definitions,
    specializes,
    type_ancestors,
)
from fhir_server.conformance.model import ElementRule, Profile, TypeRef
from fhir_server.conformance.narrative import narrative_problems
from fhir_server.conformance.primitives import check_primitive, compare_limit
from fhir_server.conformance.references import (
    BundleIndex,
    contained_ids,
    parse_reference,
    reference_problem,
)
from fhir_server.conformance.slicing import (
    discriminator_matches,
    extension_url,
    matches_fixed,
    matches_pattern,
)
from fhir_server.outcome import Issue

MAX_ISSUES = 500  # a run stops collecting after this many
# HL7's extensions the reference validator knows beyond the R4 core (the extensions pack,
# other versions' extensions, its tools, terminology): not shipped here, so not an error.
HL7_DOMAINS = re.compile(r"^(http://hl7\.org/fhir/(StructureDefinition|[0-9.]+/StructureDefinition"
                         r"|tools/StructureDefinition)/|http://terminology\.hl7\.org/)")
# Elements every resource and element may carry whatever their definition says.
ID_PATTERN_TYPES = frozenset({"id"})
RESOURCE_ID_MAX = 64


@dataclass(frozen=True, slots=True)
class Options:
    """How a run judges what the definitions leave open."""

    # An extension whose definition the server does not have: "error" (the reference
    # validator's default), "warning" or "information".
    unknown_extensions: str = "error"
    check_codes: bool = True  # codes against the code systems and value sets held
    best_practice: bool = False  # report best-practice invariants (dom-6) as warnings
    # also validate against the profiles a resource claims (meta.profile) that the
    # server knows; an unknown one is a warning
    meta_profiles: bool = True
    # an Observation with a vital sign's LOINC code conforms to the vital signs profile
    # of that sign (R4 Observation, "Vital Signs": SHALL), whether it claims it or not
    vital_signs: bool = True


@dataclass(slots=True)
class _Frame:
    """The resource being walked: for %resource, contained references and Bundles."""

    resource: dict[str, Any]
    root: dict[str, Any]
    contained: dict[str, dict[str, Any]]
    bundle: BundleIndex | None
    full_url: str | None
    env: invariants.Env
    functions: dict[str, Any]


class Validation:
    """One validation run (module docstring)."""

    def __init__(self, context: ConformanceContext, options: Options | None = None):
        self.context = context
        self.options = options or Options()
        self.issues: list[Issue] = []
        self._seen: set[tuple[str, str, str]] = set()
        # the primitive element whose '_' companion is being walked (its extensions'
        # context is that element, not Element)
        self._companion_of: ElementRule | None = None

    # -- entry points ---------------------------------------------------------------------
    def resource(self, resource: Any, profiles: Sequence[str] = (), path: str | None = None,
                 *, frame: _Frame | None = None, full_url: str | None = None) -> None:
        """Validate ``resource`` against its type's definition, or against ``profiles``
        (each a canonical URL) when given."""
        if not isinstance(resource, dict):
            self.issue("error", "structure", path or "Resource", "a resource must be a JSON "
                       "object", "structure")
            return
        resource_type = resource.get("resourceType")
        where = path or str(resource_type or "Resource")
        if not isinstance(resource_type, str) or resource_type not in resource_type_names():
            self.issue("error", "invalid", where, f"unknown resource type "
                       f"{resource_type!r}" if resource_type else "resourceType is missing",
                       "resource-type")
            return
        base = self.context.type_profile(resource_type)
        if base is None or base.abstract:
            self.issue("error", "invalid", where, f"{resource_type} is an abstract type",
                       "resource-type")
            return
        inner = self._frame(resource, frame, full_url)
        chosen: list[Profile] = []
        claimed = [p for p in (resource.get("meta") or {}).get("profile") or ()
                   if isinstance(p, str) and p not in profiles] \
            if self.options.meta_profiles and isinstance(resource.get("meta"), dict) else []
        if self.options.vital_signs and resource_type == "Observation" and not profiles:
            claimed += [p for p in self._vital_sign_profiles(resource) if p not in claimed]
        for canonical in [*profiles, *claimed]:
            profile = self.context.profile(canonical)
            if profile is None:
                if canonical in claimed:
                    self.issue("warning", "not-found", f"{where}.meta.profile", f"the profile "
                               f"{canonical} has not been checked because it is unknown",
                               "profile-unknown")
                    continue
                self.issue("error", "not-found", where, f"the profile {canonical} is not "
                           "known to the server", "profile-unknown")
                continue
            if not specializes(resource_type, profile.type):
                self.issue("error", "invalid", where, f"the profile {canonical} is for "
                           f"{profile.type} resources, not {resource_type}", "profile-type")
                continue
            chosen.append(profile)
        self._resource_id(resource, where)
        for profile in chosen or [base]:
            self._element(resource, profile.root, resource_type, where, inner, profile)
        for severity, code, rule, message, expression in canonical_problems(
                resource, where, contained=frame is not None and full_url is None,
                terminology=self.context.terminology,
                lookup=self.context.structure_definition):
            self.issue(severity, code, expression, message, rule)
        for rid in invariants.unreferenced_contained(resource):
            self.issue("error", "invariant", where, "Constraint failed: dom-3: 'If the "
                       "resource is contained in another resource, it SHALL be referred to "
                       f"from elsewhere in the resource or SHALL refer to the containing "
                       f"resource' (the contained resource '{rid}' is not referenced)",
                       "dom-3", "http://hl7.org/fhir/StructureDefinition/DomainResource")
        if resource_type == "Bundle":
            for severity, code, rule, message, expression in bundle_problems(resource, where):
                self.issue(severity, code, expression, message, rule)

    # -- issues -----------------------------------------------------------------------------
    def issue(self, severity: str, code: str, expression: str, message: str, rule: str = "",
              source: str = "") -> None:
        key = (expression, message, severity)
        if key in self._seen or len(self.issues) >= MAX_ISSUES:
            return
        self._seen.add(key)
        self.issues.append(Issue(severity, code, f"{expression}: {message}", (expression,),
                                 rule, source))

    @property
    def errors(self) -> list[Issue]:
        return [i for i in self.issues if i.severity in ("error", "fatal")]

    # -- frames -----------------------------------------------------------------------------
    def _frame(self, resource: dict[str, Any], outer: _Frame | None, full_url: str | None
               ) -> _Frame:
        root = outer.root if outer is not None else resource
        bundle = outer.bundle if outer is not None else None
        if resource.get("resourceType") == "Bundle":
            bundle = BundleIndex.of(resource)
        contained = outer.contained if outer is not None and resource is not root and \
            full_url is None else contained_ids(resource)
        env = invariants.Env(resource, root if full_url is None else resource)
        frame = _Frame(resource, env.root, contained, bundle,
                       full_url if full_url is not None else (outer.full_url if outer else None),
                       env, {})
        env.resolver = lambda reference: self._resolve(frame, reference)
        frame.functions = invariants.functions_for(env)
        return frame

    def _resolve(self, frame: _Frame, reference: str) -> dict[str, Any] | None:
        if reference.startswith("#"):
            return frame.contained.get(reference[1:])
        if frame.bundle is not None:
            found = frame.bundle.resolve(reference, frame.full_url)
            return found[0] if len(found) == 1 else None
        return None

    def _vital_sign_profiles(self, observation: dict[str, Any]) -> list[str]:
        """The vital signs profiles an Observation's LOINC code calls for: the general
        one and the sign's own (bodytemp for 8310-5...)."""
        code = observation.get("code")
        codings = code.get("coding") if isinstance(code, dict) else None
        loinc = {c.get("code") for c in codings or () if isinstance(c, dict)
                 and c.get("system") == LOINC}
        if not loinc:
            return []
        engine = self.context.terminology.engine
        if not any(engine.membership(VITAL_SIGN_CODES, LOINC, str(c)).result for c in loinc):
            return []
        found = [VITAL_SIGNS]
        for url, magic in _vital_sign_codes(self.context).items():
            if magic in loinc:
                found.append(url)
        return found

    def _resource_id(self, resource: dict[str, Any], where: str) -> None:
        rid = resource.get("id")
        if not isinstance(rid, str):
            return
        if len(rid) > RESOURCE_ID_MAX:
            self.issue("error", "value", f"{where}.id", f"invalid resource id: too long "
                       f"({len(rid)} characters, at most {RESOURCE_ID_MAX})", "resource-id")
        elif not all(c.isascii() and (c.isalnum() or c in "-.") for c in rid):
            self.issue("error", "value", f"{where}.id", f"invalid resource id: invalid "
                       f"characters ('{rid}'): only A-Z, a-z, 0-9, '-' and '.'",
                       "resource-id")

    # -- the tree of rules --------------------------------------------------------------------
    def children_of(self, rule: ElementRule, type_code: str | None = None
                    ) -> dict[str, ElementRule]:
        """The child rules of ``rule``: its own (a backbone element, or a profile's
        constraints on a type's children, over the type's), the element a content
        reference names, or its type's definition's."""
        if rule.content_reference is not None:
            target = rule.profile.by_id.get(rule.content_reference)
            if target is None:
                base = self.context.type_profile(rule.content_reference.split(".")[0])
                target = base.by_id.get(rule.content_reference) if base else None
            return self.children_of(target) if target is not None else {}
        code = type_code or (rule.types[0].code if len(rule.types) == 1 else None)
        if code is None and rule is rule.profile.root:
            code = rule.profile.type
        if code in (None, "BackboneElement", "Element") and rule.children:
            return rule.children
        type_rule = self._type_root(rule, code)
        if type_rule is None or type_rule is rule:
            return rule.children
        if not rule.children:
            return self.children_of(type_rule)
        merged = dict(self.children_of(type_rule))
        merged.update(rule.children)
        return merged

    def _type_root(self, rule: ElementRule, code: str | None) -> ElementRule | None:
        if code is None:
            return None
        type_ref = rule.type_for(code)
        profiles = type_ref.profiles if type_ref is not None else ()
        if rule is rule.profile.root:
            base = rule.profile.base_definition
            profile = self.context.profile(base) if base and rule.profile.derivation == \
                "constraint" else None
            if profile is None or profile.root is rule:
                return None
            return profile.root if not rule.children else None
        for canonical in profiles:
            if code == "Extension":
                break  # an extension's profile is applied by _extension
            profile = self.context.profile(canonical)
            if profile is not None:
                return profile.root
        base_profile = self.context.type_profile(code)
        return base_profile.root if base_profile is not None else None

    def _keys(self, rule: ElementRule, children: dict[str, ElementRule]
              ) -> dict[str, tuple[ElementRule, str | None]]:
        """JSON property name → (child rule, type code) for a set of children."""
        keys: dict[str, tuple[ElementRule, str | None]] = {}
        for child in children.values():
            if child.choice:
                base = child.json_name
                for type_ref in child.types:
                    keys[base + type_ref.suffix] = (child, type_ref.code)
            else:
                keys[child.name] = (child, None)
        return keys

    # -- elements -----------------------------------------------------------------------------
    def _element(self, value: dict[str, Any], rule: ElementRule, type_code: str | None,
                 path: str, frame: _Frame, profile: Profile) -> None:
        """A complex element (or a resource) against ``rule``."""
        children = self.children_of(rule, type_code)
        keys = self._keys(rule, children)
        groups: dict[str, list[tuple[str, str | None]]] = {}
        is_resource = "resourceType" in value and rule is profile.root
        for key in value:
            if key == "resourceType" and is_resource:
                continue
            name = key[1:] if key.startswith("_") else key
            hit = keys.get(name)
            if hit is None:
                if key == "fhir_comments":
                    self.issue("error", "structure", path, "Unrecognized property "
                               "'fhir_comments' (JSON has no comments in FHIR R4)",
                               "unknown-element")
                    continue
                self.issue("error", "structure", f"{path}.{key}", f"unknown element "
                           f"'{key}' (not defined for {rule.path})", "unknown-element")
                continue
            child, code = hit
            if key.startswith("_") and not is_primitive(code or (child.types[0].code
                                                                 if child.types else "")):
                self.issue("error", "structure", f"{path}.{key}", f"'{key}': only primitive "
                           "elements have a '_' companion", "unknown-element")
                continue
            groups.setdefault(child.id, []).append((name, code))
        for child in children.values():
            self._child(value, child, groups.get(child.id, []), path, frame, profile)
        self._invariants(value, rule, type_code, path, frame, profile)

    def _child(self, parent: dict[str, Any], rule: ElementRule,
               present: list[tuple[str, str | None]], path: str, frame: _Frame,
               profile: Profile) -> None:
        names = list(dict.fromkeys(name for name, _ in present)) if len(present) > 1 else ()
        if len(names) > 1:
            self.issue("error", "structure", f"{path}.{names[1]}", f"only one type of "
                       f"{rule.json_name}[x] may be given ({', '.join(names)} are)",
                       "choice-type")
        items: list[tuple[Any, Any, str | None, str]] = []
        for name, code in present[:1]:
            items = self._items(parent, name, rule, code, path)
        if rule.slicing is not None or rule.slices:
            self._sliced(rule, items, path, frame, profile)
        else:
            for value, companion, code, where in items:
                self._item(value, companion, rule, code, where, frame, profile)
        self._cardinality(rule, len(items), path, profile)

    def _items(self, parent: dict[str, Any], name: str, rule: ElementRule,
               code: str | None, path: str) -> list[tuple[Any, Any, str | None, str]]:
        """(value, '_' companion, type, expression) of each item of a property."""
        value, companion = parent.get(name), parent.get(f"_{name}")
        where = f"{path}.{name}"
        if rule.repeats:
            if (value is not None and not isinstance(value, list)) or \
                    (companion is not None and not isinstance(companion, list)):
                self.issue("error", "structure", where, f"the property {name} must be a JSON "
                           "array, not a single value", "array")
                value = [value] if value is not None and not isinstance(value, list) else value
                companion = [companion] if companion is not None and \
                    not isinstance(companion, list) else companion
            values = value or []
            companions = companion or []
            if value == [] or companion == []:
                self.issue("error", "structure", where, "an array cannot be empty: leave the "
                           "property out when it has no values", "array-empty")
            count = max(len(values), len(companions))
            found = []
            for index in range(count):
                item = values[index] if index < len(values) else None
                extra = companions[index] if index < len(companions) else None
                if item is None and extra is None:
                    self.issue("error", "structure", f"{where}[{index}]", "null is not "
                               "allowed in an array (only beside a value in the other "
                               "array of a primitive)", "array-null")
                    continue
                found.append((item, extra, code, f"{where}[{index}]"))
            return found
        if isinstance(value, list) or isinstance(companion, list):
            self.issue("error", "structure", where, f"the property {name} must be a single "
                       "value, not a JSON array", "array")
            return []
        if value is None and companion is None:
            if name in parent or f"_{name}" in parent:
                self.issue("error", "structure", where, "null is not a value: leave the "
                           "property out instead", "null")
            return []
        return [(value, companion, code, where)]

    def _cardinality(self, rule: ElementRule, count: int, path: str, profile: Profile) -> None:
        if count < rule.min:
            self.issue("error", "required", path, f"{rule.path}: minimum required = "
                       f"{rule.min}, but only found {count} (from {profile.url})",
                       "cardinality-min")
        if rule.max is not None and count > rule.max:
            self.issue("error", "structure", path, f"{rule.path}: max allowed = {rule.max}, "
                       f"but found {count} (from {profile.url})", "cardinality-max")

    def _item(self, value: Any, companion: Any, rule: ElementRule, code: str | None,
              path: str, frame: _Frame, profile: Profile) -> None:
        """One item of an element against ``rule`` (its type ``code`` when a choice)."""
        type_ref = rule.type_for(code)
        chosen = code or (type_ref.code if type_ref else None)
        if chosen is None and rule.content_reference is not None:
            chosen = "BackboneElement"
        if chosen is None and len(rule.types) > 1:
            chosen = rule.types[0].code
        if chosen is not None and is_primitive(chosen):
            self._primitive(value, companion, rule, chosen, path, frame, profile)
            return
        if not isinstance(value, dict):
            self.issue("error", "structure", path, f"must be a JSON object (a {chosen}), not "
                       f"{_json_kind(value)}", "type")
            return
        if chosen == "Resource" or (chosen in resource_type_names() and "resourceType" in
                                    value):
            self._contained(value, rule, type_ref, path, frame)
            return
        if chosen == "Extension":
            self._extension(value, rule, path, frame, profile)
            return
        if not invariants.has_value_or_children(value):
            self.issue("error", "invariant", path, "All FHIR elements must have a @value or "
                       "children (ele-1)", "ele-1",
                       "http://hl7.org/fhir/StructureDefinition/Element")
        self._element(value, rule, chosen, path, frame, profile)
        self._values(value, rule, chosen, path)
        self._typed_rules(value, rule, chosen, path, frame)

    def _primitive(self, value: Any, companion: Any, rule: ElementRule, code: str, path: str,
                   frame: _Frame, profile: Profile) -> None:
        if value is not None:
            if isinstance(value, dict | list):
                self.issue("error", "structure", path, f"must be a {code} value, not "
                           f"{_json_kind(value)}", "type")
                return
            if rule.name == "id" and rule.path.count(".") == 0:
                return
            for severity, issue_code, message in check_primitive(code, value):
                self.issue(severity, issue_code, path, message, f"type-{code}")
            self._values(value, rule, code, path)
            if code == "xhtml" and isinstance(value, str):
                for message in narrative_problems(value):
                    self.issue("error", "value", path, message, "txt-1",
                               "http://hl7.org/fhir/StructureDefinition/Narrative")
            if self.options.check_codes and rule.binding is not None and \
                    code in ("code", "string", "uri"):
                self._binding(rule, code, value, path)
        elif code == "code" and rule.binding is not None and rule.binding.strength == \
                "required" and self.options.check_codes:
            self.issue("error", "code-invalid", path, "no code provided, and a code is "
                       f"required from the value set {rule.binding.value_set}",
                       "binding-required")
        if companion is not None:
            if not isinstance(companion, dict):
                self.issue("error", "structure", path, "the '_' companion of a primitive must "
                           "be a JSON object (id and extension)", "type")
            elif not companion:
                self.issue("error", "invariant", path, "the '_' companion of a primitive has "
                           "neither an id nor extensions (ele-1)", "ele-1",
                           "http://hl7.org/fhir/StructureDefinition/Element")
            else:
                element = self.context.type_profile("Element")
                if element is not None:
                    outer, self._companion_of = self._companion_of, rule
                    try:
                        self._element(companion, element.root, "Element", path, frame,
                                      element)
                    finally:
                        self._companion_of = outer
        if not invariants.has_value_or_children(value, companion):
            self.issue("error", "invariant", path, "All FHIR elements must have a @value or "
                       "children (ele-1)", "ele-1",
                       "http://hl7.org/fhir/StructureDefinition/Element")

    def _values(self, value: Any, rule: ElementRule, code: str | None, path: str) -> None:
        """fixed[x], pattern[x], minValue/maxValue, maxLength."""
        if rule.fixed is not None and not matches_fixed(value, rule.fixed):
            self.issue("error", "value", path, f"the value must be exactly "
                       f"{_show(rule.fixed)} (fixed in {rule.profile.url})", "fixed")
        if rule.pattern is not None and not matches_pattern(value, rule.pattern):
            self.issue("error", "value", path, f"the value must match the pattern "
                       f"{_show(rule.pattern)} (from {rule.profile.url})", "pattern")
        if rule.max_length is not None and isinstance(value, str) and \
                len(value) > rule.max_length:
            self.issue("error", "too-long", path, f"the value is longer than the "
                       f"{rule.max_length} characters allowed", "max-length")
        for limit, below in ((rule.min_value, True), (rule.max_value, False)):
            if limit is None or code is None:
                continue
            actual, bound = value, limit
            if isinstance(value, dict) and isinstance(limit, dict):  # Quantity
                actual, bound = value.get("value"), limit.get("value")
                if value.get("code") != limit.get("code") and limit.get("code"):
                    continue  # different units: not comparable without conversion
                code = "decimal"
            order = compare_limit(code, actual, bound)
            if order is None:
                continue
            if below and order < 0:
                self.issue("error", "value", path, f"the value {actual} is below the minimum "
                           f"{bound}", "min-value")
            elif not below and order > 0:
                self.issue("error", "value", path, f"the value {actual} is above the maximum "
                           f"{bound}", "max-value")

    def _typed_rules(self, value: dict[str, Any], rule: ElementRule, code: str | None,
                     path: str, frame: _Frame) -> None:
        """What a data type's prose requires, and terminology."""
        if code == "Reference":
            self._reference(value, rule, path, frame)
        elif code == "Period" and not invariants.period_in_order(value):
            self.issue("error", "invariant", path, "Constraint failed: per-1: 'If present, "
                       "start SHALL have a lower value than end'", "per-1",
                       "http://hl7.org/fhir/StructureDefinition/Period")
        elif code == "Attachment":
            for element, issue_code, message in attachment_problems(value):
                self.issue("error", issue_code, f"{path}.{element}", message, "attachment")
        if not self.options.check_codes:
            return
        if code == "Coding":
            self._coding(value, path)
        elif code == "CodeableConcept":
            for index, coding in enumerate(value.get("coding") or ()):
                if isinstance(coding, dict):
                    self._coding(coding, f"{path}.coding[{index}]")
        if rule.binding is not None and code in CODED_TYPES and not (
                rule.choice and code == "Quantity"):
            # a choice element's binding is for its coded types: the reference validator
            # does not hold a Quantity of value[x] to it (vital signs' component units)
            if not (code != "Quantity" and _units_only(self.context, rule.binding)):
                self._binding(rule, code, value, path)

    def _coding(self, coding: dict[str, Any], path: str) -> None:
        terminology = self.context.terminology
        for severity, code, rule, message, where in check_coding(terminology, coding):
            self.issue(severity, code, path + where, message, rule)

    def _binding(self, rule: ElementRule, code: str, value: Any, path: str) -> None:
        assert rule.binding is not None
        for severity, issue_code, name, message, where in check_binding(
                self.context.terminology, rule.binding, code, value):
            self.issue(severity, issue_code, path + where, message, name)

    # -- references ------------------------------------------------------------------------------
    def _reference(self, value: dict[str, Any], rule: ElementRule, path: str, frame: _Frame
                   ) -> None:
        reference = value.get("reference")
        if not isinstance(reference, str):
            return
        problem = reference_problem(reference)
        if problem is not None:
            self.issue("error", "value", f"{path}.reference", problem, "reference-format")
            return
        parsed = parse_reference(reference)
        target_type = parsed.resource_type
        if parsed.kind == "contained":
            if reference == "#":
                return
            target = frame.contained.get(parsed.id or "")
            if target is None:
                self.issue("error", "invariant", path, f"the local reference '{reference}' "
                           "names no contained resource (ref-1: SHALL have a contained "
                           "resource if a local reference is provided)", "ref-1",
                           "http://hl7.org/fhir/StructureDefinition/Reference")
                return
            target_type = target.get("resourceType")
        elif frame.bundle is not None:
            found = frame.bundle.resolve(reference, frame.full_url)
            if len(found) == 1:
                target_type = found[0].get("resourceType")
        declared = value.get("type")
        if isinstance(declared, str) and target_type is not None and declared != target_type \
                and parsed.kind in ("relative", "contained"):
            self.issue("error", "invalid", f"{path}.type", f"the type '{declared}' does not "
                       f"match the reference's type ({target_type})", "reference-type")
        if target_type is None:
            return
        allowed = self._target_types(rule)
        if allowed and not any(specializes(target_type, t) for t in allowed):
            self.issue("error", "structure", path, f"the type '{target_type}' is not a valid "
                       f"target for this element (must be one of {', '.join(sorted(allowed))})",
                       "reference-target")

    def _target_types(self, rule: ElementRule) -> set[str]:
        found: set[str] = set()
        for type_ref in rule.types:
            if type_ref.code != "Reference":
                continue
            for canonical in type_ref.target_profiles:
                profile = self.context.profile(canonical)
                found.add(profile.type if profile is not None else canonical.rsplit("/", 1)[-1])
        return found - {"Resource"} if "Resource" not in found else set()

    # -- resources inside resources --------------------------------------------------------------
    def _contained(self, value: dict[str, Any], rule: ElementRule, type_ref: TypeRef | None,
                   path: str, frame: _Frame) -> None:
        profiles = list(type_ref.profiles) if type_ref is not None else []
        full_url = None
        if rule.path == "Bundle.entry.resource":
            entry_path = path.rsplit(".", 1)[0]
            full_url = self._entry_url(frame.resource, entry_path)
        if rule.name == "contained":
            if isinstance(value.get("contained"), list) and value["contained"]:
                self.issue("error", "invariant", path, "a contained resource cannot contain "
                           "resources (dom-2)", "dom-2")
            if value.get("meta", {}).get("versionId") or value.get("meta", {}).get(
                    "lastUpdated"):
                self.issue("error", "invariant", path, "a contained resource cannot have "
                           "meta.versionId or meta.lastUpdated (dom-4)", "dom-4")
        self.resource(value, [p for p in profiles if p and not p.endswith("/Resource")],
                      path, frame=frame, full_url=full_url if full_url else None)

    @staticmethod
    def _entry_url(bundle: dict[str, Any], entry_path: str) -> str | None:
        index = entry_path.rsplit("[", 1)[-1].rstrip("]")
        try:
            entry = (bundle.get("entry") or [])[int(index)]
        except (ValueError, IndexError):
            return None
        url = entry.get("fullUrl") if isinstance(entry, dict) else None
        return url if isinstance(url, str) else ""

    # -- extensions ---------------------------------------------------------------------------
    def _extension(self, value: dict[str, Any], rule: ElementRule, path: str, frame: _Frame,
                   profile: Profile, definition: Profile | None = None) -> None:
        url = value.get("url")
        if not invariants.extension_value_or_extensions(value):
            self.issue("error", "invariant", path, "an extension must have either extensions "
                       "or a value[x], not both (ext-1)", "ext-1",
                       "http://hl7.org/fhir/StructureDefinition/Extension")
        if not isinstance(url, str):
            self.issue("error", "required", path, "Extension.url is required in order to "
                       "identify, use and validate the extension", "extension-url")
            base = self.context.type_profile("Extension")
            if base is not None:
                self._element(value, base.root, "Extension", path, frame, base)
            return
        if definition is None and rule.slice_name is not None and rule.children and \
                not any(t.profiles for t in rule.types):
            # a part of a complex extension, defined inline by the slice
            self._element(value, rule, "Extension", path, frame, rule.profile)
            return
        if definition is None:
            definition = self._extension_definition(rule, url)
        if definition is None:
            self._unknown_extension(value, rule, url, path, frame)
            return
        if "|" in url:
            self.issue("error", "value", path, "the extension URL must not contain a version",
                       "extension-url")
        self._extension_context(definition, rule, path)
        self._element(value, definition.root, "Extension", path, frame, definition)
        self._values(value, definition.root, "Extension", path)

    def _extension_definition(self, rule: ElementRule, url: str) -> Profile | None:
        for type_ref in rule.types:
            for canonical in type_ref.profiles:
                if canonical.split("|")[0] == url.split("|")[0]:
                    return self.context.profile(canonical)
        return self.context.profile(url.split("|")[0])

    def _unknown_extension(self, value: dict[str, Any], rule: ElementRule, url: str,
                           path: str, frame: _Frame) -> None:
        severity = self.options.unknown_extensions
        if ":" not in url and rule.path.startswith("Extension.extension"):
            # a part of a complex extension the server does not know: named relative to
            # it, judged with it
            base = self.context.type_profile("Extension")
            if base is not None:
                self._element(value, base.root, "Extension", path, frame, base)
            return
        if rule.name == "modifierExtension":
            severity = "error"  # a modifier the server does not know changes the meaning
        elif HL7_DOMAINS.match(url) and severity == "error":
            # HL7's own extensions (other versions, tools, terminology): defined, only not
            # shipped here
            severity = "warning"
        self.issue(severity, "structure", path, f"the extension {url} is unknown (its "
                   "definition could not be found), so it is not allowed here"
                   if severity == "error" else f"the extension {url} is unknown, so it "
                   "could not be checked", "extension-unknown")
        base = self.context.type_profile("Extension")
        if base is not None:
            self._element(value, base.root, "Extension", path, frame, base)

    def _extension_context(self, definition: Profile, rule: ElementRule, path: str) -> None:
        if not definition.contexts:
            return
        owner = self._companion_of
        if owner is not None and rule.path.startswith("Element."):
            container = owner.path
            container_types = {a for t in owner.types for a in type_ancestors(t.code)}
        else:
            container = rule.path.rsplit(".", 1)[0] if "." in rule.path else rule.path
            container_types = self._container_types(rule)
        for kind, expression in definition.contexts:
            if kind == "element":
                # a context on a child of this element is accepted here too, as the
                # reference validator does (structuredefinition-fhir-type on type.code)
                if expression in ("Element", "Resource", "DomainResource", "BackboneElement") \
                        or expression == container or expression in container_types \
                        or container.startswith(expression + ".") \
                        or expression.startswith(container + "."):
                    return
                if any(specializes(t, expression) for t in container_types):
                    return
            elif kind == "extension":
                if "Extension" in container_types or container.endswith("Extension"):
                    return
            elif kind == "fhirpath":
                return  # not checked: accepted
        allowed = ", ".join(e for _, e in definition.contexts)
        self.issue("error", "structure", path, f"the extension {definition.url} is not allowed "
                   f"to be used at this point (allowed: {allowed}; this element is "
                   f"{container})", "extension-context")

    def _container_types(self, rule: ElementRule) -> set[str]:
        """The types of the element that holds the extension: its profile's type when it is
        the root, or the types its parent element declares."""
        profile = rule.profile
        parent_id = rule.id.rsplit(".", 1)[0]
        parent = profile.by_id.get(parent_id)
        if parent is None or parent is profile.root:
            return set(type_ancestors(profile.type))
        types = {t.code for t in parent.types}
        return {a for t in types for a in type_ancestors(t)} | types

    # -- slicing ---------------------------------------------------------------------------------
    def _sliced(self, rule: ElementRule, items: list[tuple[Any, Any, str | None, str]],
                path: str, frame: _Frame, profile: Profile) -> None:
        slicing = rule.slicing
        slices = rule.slices
        assigned: list[ElementRule | None] = []
        for value, _companion, code, _where in items:
            assigned.append(self._slice_of(rule, value, code, frame) if slices else None)
        counts = {id(s): 0 for s in slices}
        last_position = -1
        for (value, companion, code, where), match in zip(items, assigned, strict=True):
            if match is not None:
                counts[id(match)] += 1
                position = slices.index(match)
                if slicing is not None and slicing.ordered and position < last_position:
                    self.issue("error", "structure", where, f"the item is in slice "
                               f"'{match.slice_name}', which must come before the slices of "
                               "earlier items (ordered slicing)", "slicing-order")
                last_position = max(last_position, position)
                self._item(value, companion, match, code, where, frame, profile)
                continue
            if slicing is not None and slices and slicing.rules == "closed":
                self.issue("error", "structure", where, f"the item matches none of the slices "
                           f"of {rule.path}, and the slicing is closed", "slicing-closed")
            elif slicing is not None and slicing.rules == "openAtEnd" and last_position >= 0 \
                    and any(m is not None for m in assigned[assigned.index(match) + 1:]):
                self.issue("error", "structure", where, "items not in a slice must come after "
                           "the sliced ones (openAtEnd)", "slicing-order")
            self._item(value, companion, rule, code, where, frame, profile)
        for slice_rule in slices:
            count = counts[id(slice_rule)]
            if count < slice_rule.min:
                self.issue("error", "required", path, f"{rule.path}:{slice_rule.slice_name}: "
                           f"minimum required = {slice_rule.min}, but only found {count} "
                           f"(from {profile.url})", "cardinality-min")
            if slice_rule.max is not None and count > slice_rule.max:
                self.issue("error", "structure", path, f"{rule.path}:{slice_rule.slice_name}: "
                           f"max allowed = {slice_rule.max}, but found {count} (from "
                           f"{profile.url})", "cardinality-max")

    def _slice_of(self, rule: ElementRule, value: Any, code: str | None, frame: _Frame
                  ) -> ElementRule | None:
        slicing = rule.slicing
        discriminators = slicing.discriminators if slicing is not None else ()
        for slice_rule in rule.slices:
            if not discriminators:
                if rule.name in ("extension", "modifierExtension") and isinstance(value, dict):
                    if value.get("url") == extension_url(slice_rule, self.children_of):
                        return slice_rule
                continue
            verdicts = [discriminator_matches(
                d, value, code, slice_rule, self.children_of, self._in_value_set,
                lambda item, canonical: self._conforms(item, canonical, frame),
                lambda item: self._resolve(frame, str(item["reference"]))
                if isinstance(item, dict) and isinstance(item.get("reference"), str) else None)
                for d in discriminators]
            if verdicts and all(v is True or v is None for v in verdicts) and \
                    any(v is True for v in verdicts):
                return slice_rule
        return None

    def _in_value_set(self, canonical: str, value: Any, type_code: str | None) -> bool | None:
        engine = self.context.terminology.engine
        pairs: list[tuple[str | None, str]] = []
        if isinstance(value, str):
            pairs = [(None, value)]
        elif isinstance(value, dict):
            codings = value.get("coding") if "coding" in value else [value]
            pairs = [(c.get("system"), c["code"]) for c in codings or ()
                     if isinstance(c, dict) and isinstance(c.get("code"), str)]
        verdicts = [engine.membership(canonical, s, c).result for s, c in pairs]
        if any(v is True for v in verdicts):
            return True
        return None if any(v is None for v in verdicts) else False

    def _conforms(self, value: Any, canonical: str, frame: _Frame) -> bool:
        profile = self.context.profile(canonical)
        if profile is None:
            return False
        trial = Validation(self.context, self.options)
        if isinstance(value, dict) and "resourceType" in value:
            trial.resource(value, [canonical], frame=frame)
        elif isinstance(value, dict):
            trial._item(value, None, profile.root, profile.type, "x", frame, profile)
        return not trial.errors

    # -- invariants -------------------------------------------------------------------------------
    def _invariants(self, value: dict[str, Any], rule: ElementRule, type_code: str | None,
                    path: str, frame: _Frame, profile: Profile) -> None:
        constraints = list(rule.constraints)
        keys = {c.key for c in constraints}
        type_root = None
        if type_code is not None and rule is not rule.profile.root and not rule.children:
            base = self.context.type_profile(type_code)
            type_root = base.root if base is not None else None
        if type_root is not None:
            constraints += [c for c in type_root.constraints if c.key not in keys]
        if not constraints:
            return
        type_path = type_code if type_root is not None or rule is rule.profile.root else \
            rule.path
        if rule is rule.profile.root:
            type_path = rule.profile.type
        if type_path in ("BackboneElement", None):
            type_path = rule.path
        for constraint in constraints:
            if constraint.key in invariants.NATIVE:
                continue
            if constraint.best_practice and not self.options.best_practice:
                continue
            compiled = invariants.compile_constraint(constraint)
            outcome = invariants.evaluate(compiled, value, type_path, frame.env,
                                          frame.functions)
            if outcome is True:
                continue
            if outcome is False:
                severity = "error" if constraint.severity == "error" else "warning"
                self.issue(severity, "invariant", path, f"Constraint failed: {constraint.key}: "
                           f"'{constraint.human}'", constraint.key, constraint.source)
            else:
                self.issue("information", "informational", path, f"the invariant "
                           f"{constraint.key} could not be checked: {outcome}",
                           constraint.key, constraint.source)


VITAL_SIGNS = "http://hl7.org/fhir/StructureDefinition/vitalsigns"
VITAL_SIGN_CODES = "http://hl7.org/fhir/ValueSet/observation-vitalsignresult"
LOINC = "http://loinc.org"
UCUM = "http://unitsofmeasure.org"


def _units_only(context: ConformanceContext, binding: Any) -> bool:
    """Whether a binding's value set holds UCUM units only (it binds a Quantity's unit,
    nothing else)."""
    value_set = context.terminology.value_set(binding.value_set or "")
    includes = ((value_set or {}).get("compose") or {}).get("include") or ()
    return bool(includes) and all(i.get("system") == UCUM for i in includes)


def _vital_sign_codes(context: ConformanceContext) -> dict[str, str]:
    """The profile of each vital sign → the LOINC code it fixes (read from the shipped
    profiles derived from the vital signs profile), worked out once per context."""
    cached = context.cache.get("vital-sign-codes")
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    found: dict[str, str] = {}
    context.cache["vital-sign-codes"] = found
    for url, sd in shipped_structure_definitions().items():
        if sd.get("baseDefinition") != VITAL_SIGNS:
            continue
        profile = context.profile(url)
        for rule in profile.by_id.values() if profile is not None else ():
            if rule.path == "Observation.code.coding.code" and isinstance(rule.fixed, str):
                found[url] = rule.fixed
    return found


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if value is None:
        return "null"
    return "an object"


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def validate(context: ConformanceContext, resource: Any, profiles: Iterable[str] = (),
             options: Options | None = None) -> list[Issue]:
    """Every issue of ``resource`` (against ``profiles`` when given, else its type)."""
    run = Validation(context, options)
    run.resource(resource, list(profiles))
    return run.issues
