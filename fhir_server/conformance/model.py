"""A StructureDefinition's snapshot compiled into a tree of element rules, once per profile.

The snapshot is a flat list of ElementDefinitions; validation needs it as a tree it can
walk beside an instance: each :class:`ElementRule` knows its children by name, its slices,
its types, and the JSON property names it answers to (``valueQuantity`` for the
``Quantity`` type of ``value[x]``, ``_birthDate`` for the extensions of a primitive).

An element whose children the snapshot does not list (``Patient.name``, a HumanName) is
validated against its type's own definition; ``contentReference`` elements
(``Questionnaire.item.item``) against the element they name. Both are resolved by the
validator through the profile registry, so a rule tree never holds another profile.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fhir_server.conformance.definitions import is_primitive

FHIR_TYPE_EXTENSION = "http://hl7.org/fhir/StructureDefinition/structuredefinition-fhir-type"
SYSTEM_TYPES = "http://hl7.org/fhirpath/System."
# FHIRPath system types the snapshots give ``id`` and ``url`` elements, as FHIR types.
SYSTEM_TYPE_NAMES = {"String": "string", "Boolean": "boolean", "Integer": "integer",
                     "Decimal": "decimal", "Date": "date", "DateTime": "dateTime",
                     "Time": "time"}


@dataclass(frozen=True, slots=True)
class TypeRef:
    code: str  # a FHIR type: string, HumanName, Reference, BackboneElement, Resource...
    profiles: tuple[str, ...] = ()
    target_profiles: tuple[str, ...] = ()
    aggregation: tuple[str, ...] = ()

    @property
    def suffix(self) -> str:
        """The type's name in a choice element's JSON name (``valueDateTime``)."""
        return self.code[:1].upper() + self.code[1:]


@dataclass(frozen=True, slots=True)
class Binding:
    strength: str  # required | extensible | preferred | example
    value_set: str | None
    description: str = ""


@dataclass(frozen=True, slots=True)
class Discriminator:
    type: str  # value | exists | pattern | type | profile
    path: str


@dataclass(frozen=True, slots=True)
class Slicing:
    discriminators: tuple[Discriminator, ...]
    rules: str  # closed | open | openAtEnd
    ordered: bool


@dataclass(frozen=True, slots=True)
class Constraint:
    key: str
    severity: str  # error | warning
    human: str
    expression: str
    source: str  # the StructureDefinition that defines it
    best_practice: bool = False


@dataclass(eq=False, slots=True)
class ElementRule:
    """One ElementDefinition of a snapshot, with its place in the tree."""

    id: str
    path: str
    name: str  # the last path segment: ``name``, ``value[x]``
    min: int
    max: int | None  # None: unbounded
    repeats: bool  # a JSON array (the base definition's max is not 1)
    types: tuple[TypeRef, ...]
    profile: Profile
    slice_name: str | None = None
    content_reference: str | None = None
    children: dict[str, ElementRule] = field(default_factory=dict)
    slicing: Slicing | None = None
    slices: list[ElementRule] = field(default_factory=list)
    fixed: Any = None
    fixed_type: str | None = None
    pattern: Any = None
    pattern_type: str | None = None
    min_value: Any = None
    max_value: Any = None
    max_length: int | None = None
    binding: Binding | None = None
    constraints: tuple[Constraint, ...] = ()
    is_modifier: bool = False
    must_support: bool = False
    # filled by the validator on first use: JSON name → (rule, type code)
    keys: dict[str, tuple[ElementRule, str | None]] | None = None

    @property
    def choice(self) -> bool:
        return self.name.endswith("[x]")

    @property
    def json_name(self) -> str:
        return self.name[:-3] if self.name.endswith("[x]") else self.name

    def type_for(self, code: str | None) -> TypeRef | None:
        if code is None:
            return self.types[0] if len(self.types) == 1 else None
        return next((t for t in self.types if t.code == code), None)

    def __repr__(self) -> str:
        return f"ElementRule({self.id})"


@dataclass(eq=False, slots=True)
class Profile:
    """A StructureDefinition compiled: its identity and its tree of element rules."""

    url: str
    version: str | None
    name: str
    type: str
    kind: str  # primitive-type | complex-type | resource | logical
    derivation: str  # specialization | constraint
    base_definition: str | None
    abstract: bool
    definition: dict[str, Any]  # the StructureDefinition itself
    root: ElementRule = field(init=False)
    by_id: dict[str, ElementRule] = field(default_factory=dict)
    contexts: tuple[tuple[str, str], ...] = ()  # an extension's (type, expression) contexts
    context_invariants: tuple[str, ...] = ()

    @property
    def title(self) -> str:
        return self.definition.get("title") or self.name or self.url


def _type_code(type_json: dict[str, Any]) -> str:
    code = str(type_json.get("code", ""))
    if code.startswith(SYSTEM_TYPES):
        for extension in type_json.get("extension") or ():
            if extension.get("url") == FHIR_TYPE_EXTENSION:
                return str(extension.get("valueUrl") or extension.get("valueUri"))
        return SYSTEM_TYPE_NAMES.get(code[len(SYSTEM_TYPES):], "string")
    return code


def _types(element: dict[str, Any]) -> tuple[TypeRef, ...]:
    return tuple(TypeRef(_type_code(t), tuple(t.get("profile") or ()),
                         tuple(t.get("targetProfile") or ()),
                         tuple(t.get("aggregation") or ()))
                 for t in element.get("type") or ())


def _max(value: Any) -> int | None:
    return None if value in (None, "*") else int(value)


def _prefixed(element: dict[str, Any], prefix: str) -> tuple[Any, str | None]:
    """The value of ``fixed[x]`` / ``pattern[x]`` / ``minValue[x]``... and its type."""
    for key, value in element.items():
        if key.startswith(prefix) and len(key) > len(prefix) and key[len(prefix)].isupper():
            return value, key[len(prefix):]
    return None, None


def _constraints(element: dict[str, Any], sd_url: str) -> tuple[Constraint, ...]:
    found = []
    for c in element.get("constraint") or ():
        expression = c.get("expression")
        if not expression:
            continue
        best_practice = any(e.get("url", "").endswith("elementdefinition-bestpractice")
                            and e.get("valueBoolean") for e in c.get("extension") or ())
        found.append(Constraint(str(c.get("key")), str(c.get("severity", "error")),
                                str(c.get("human", "")), str(expression),
                                str(c.get("source") or sd_url), best_practice))
    return tuple(found)


def _binding(element: dict[str, Any]) -> Binding | None:
    binding = element.get("binding")
    if not binding or "strength" not in binding:
        return None
    return Binding(binding["strength"], binding.get("valueSet"), binding.get("description", ""))


def _slicing(element: dict[str, Any]) -> Slicing | None:
    slicing = element.get("slicing")
    if not slicing:
        return None
    return Slicing(tuple(Discriminator(d.get("type", "value"), d.get("path", "$this"))
                         for d in slicing.get("discriminator") or ()),
                   slicing.get("rules", "open"), bool(slicing.get("ordered", False)))


def _element_id(element: dict[str, Any]) -> str:
    if element.get("id"):
        return str(element["id"])
    path = str(element["path"])  # pre-R4 snapshots without ids: path and slice name
    return f"{path}:{element['sliceName']}" if element.get("sliceName") else path


def _parent_id(element_id: str) -> str | None:
    """``Patient.identifier:nhs.system`` → ``Patient.identifier:nhs``."""
    dot = element_id.rfind(".")
    return element_id[:dot] if dot > 0 else None


def _sliced_id(element_id: str) -> str | None:
    """The element a slice slices: ``Patient.extension:race`` → ``Patient.extension``;
    None when ``element_id`` is no slice."""
    last = element_id[element_id.rfind(".") + 1:]
    if ":" not in last:
        return None
    return element_id[:element_id.rfind(":")]


def compile_profile(sd: dict[str, Any]) -> Profile:
    """Compile a StructureDefinition's snapshot (``ValueError`` when it has none)."""
    elements = (sd.get("snapshot") or {}).get("element") or []
    if not elements:
        raise ValueError(f"StructureDefinition {sd.get('url')} has no snapshot")
    profile = Profile(
        url=str(sd.get("url")), version=sd.get("version"), name=str(sd.get("name", "")),
        type=str(sd.get("type") or elements[0]["path"].split(".")[0]),
        kind=str(sd.get("kind", "resource")), derivation=str(sd.get("derivation", "")),
        base_definition=sd.get("baseDefinition"), abstract=bool(sd.get("abstract")),
        definition=sd,
        contexts=tuple((str(c.get("type")), str(c.get("expression")))
                       for c in sd.get("context") or ()),
        context_invariants=tuple(sd.get("contextInvariant") or ()))
    url = profile.url
    for index, element in enumerate(elements):
        element_id = _element_id(element)
        path = str(element["path"])
        base = element.get("base") or {}
        fixed, fixed_type = _prefixed(element, "fixed")
        pattern, pattern_type = _prefixed(element, "pattern")
        min_value, _ = _prefixed(element, "minValue")
        max_value, _ = _prefixed(element, "maxValue")
        reference = element.get("contentReference")
        rule = ElementRule(
            id=element_id, path=path, name=path.rsplit(".", 1)[-1],
            min=int(element.get("min", 0)), max=_max(element.get("max")),
            repeats=index > 0 and _max(base.get("max", element.get("max"))) != 1,
            types=_types(element), profile=profile, slice_name=element.get("sliceName"),
            content_reference=str(reference).split("#", 1)[-1] if reference else None,
            slicing=_slicing(element), fixed=fixed, fixed_type=fixed_type, pattern=pattern,
            pattern_type=pattern_type, min_value=min_value, max_value=max_value,
            max_length=element.get("maxLength"), binding=_binding(element),
            constraints=_constraints(element, url),
            is_modifier=bool(element.get("isModifier")),
            must_support=bool(element.get("mustSupport")))
        if index == 0:
            profile.root = rule
            profile.by_id[element_id] = rule
            continue
        profile.by_id[element_id] = rule
        sliced = _sliced_id(element_id)
        if sliced is not None and sliced in profile.by_id:
            profile.by_id[sliced].slices.append(rule)
            continue
        parent = profile.by_id.get(_parent_id(element_id) or "")
        if parent is None:
            raise ValueError(f"StructureDefinition {url}: element {element_id} has no parent "
                             "in the snapshot")
        if rule.name in parent.children and sliced is None:
            # a repeated path without slice name (old snapshots re-slicing): keep the first
            continue
        parent.children[rule.name] = rule
    return profile


def primitive_rule(rule: ElementRule, code: str | None) -> bool:
    """Whether the item of ``rule`` (of type ``code``) is a JSON primitive."""
    chosen = code if code is not None else (rule.types[0].code if rule.types else "")
    return is_primitive(chosen)
