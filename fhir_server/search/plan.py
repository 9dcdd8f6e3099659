"""A FHIR search, parsed once into a backend-neutral plan that each store adapter compiles.

:func:`parse_search` reads the query parameters of a search (type, system, compartment
or a conditional interaction) against the registry and produces a :class:`SearchPlan`:
AND-ed :class:`Clause` objects, each a set of OR-ed criteria typed by the parameter type
(R4 3.1.1.4: string, token, reference with chains and ``_has``, date, number, quantity,
uri, composite, ``:missing``, ``_id``, ``_lastUpdated``, ``_text``/``_content``), plus
the result parameters (``_sort``, ``_count``, ``_offset``, ``_total``, ``_summary``,
``_elements``, ``_include``/``_revinclude``) and the paging cursor.

Unknown or unsupported parameters are collected in ``plan.ignored`` (the interaction
reports them in an OperationOutcome entry) unless ``strict`` (``Prefer:
handling=strict``), which raises :class:`SearchError`. A malformed value is always an
error: silently ignoring ``birthdate=yesterday`` would return the wrong patients.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from fhir_server.search.dates import date_range, split_prefix
from fhir_server.search.phonetic import PARAM as PHONETIC
from fhir_server.search.phonetic import phonetic_code
from fhir_server.search.registry import SearchParam, SearchRegistry
from fhir_server.search.units import UCUM, canonical_span
from fhir_server.search.values import normalize, number_range, parse_reference

DEFAULT_COUNT = 20
MAX_COUNT = 1000
MAX_OFFSET = 10_000  # how deep a plan may page by offset (the /api lists' page/limit)
MAX_CHAIN_DEPTH = 4
PREFIXES = ("eq", "ne", "gt", "lt", "ge", "le", "sa", "eb", "ap")
SUMMARY_MODES = ("true", "false", "text", "data", "count")
TOTAL_MODES = ("none", "estimate", "accurate")
RESULT_PARAMETERS = frozenset({
    "_sort", "_count", "_offset", "_total", "_summary", "_elements", "_include",
    "_revinclude", "_cursor", "_format", "_pretty", "_type",
})
# Declared unsupported: reported like an unknown parameter (R4 allows not supporting them).
UNSUPPORTED_RESULT_PARAMETERS = frozenset({"_contained", "_containedType", "_query", "_filter",
                                           "_list", "_score"})


class SearchError(ValueError):
    """A search that cannot be run as asked; the HTTP layer answers 400."""

    def __init__(self, message: str, parameter: str | None = None):
        self.parameter = parameter
        super().__init__(message)


# --- criteria (one alternative of an OR) --------------------------------------------------

@dataclass(frozen=True, slots=True)
class StringCriterion:
    value: str  # normalized for prefix/contains, as given for exact, a code for phonetic
    mode: str = "prefix"  # prefix | exact | contains | phonetic


@dataclass(frozen=True, slots=True)
class TokenCriterion:
    system: str | None = None  # None: any system
    code: str | None = None  # None: any code (``system|``)
    no_system: bool = False  # ``|code``: the value has no system
    text: str | None = None  # ``:text``: normalized text to find


@dataclass(frozen=True, slots=True)
class RangeCriterion:
    """date, number and quantity: a prefix and the search value's precision range."""

    prefix: str
    lo: Any
    hi: Any
    value: Any = None  # the number itself (number/quantity: gt/lt compare to it)
    system: str | None = None  # quantity unit
    code: str | None = None
    # quantity in its UCUM base unit: (unit, value, lo, hi)
    canonical: tuple[str, float, float, float] | None = None


@dataclass(frozen=True, slots=True)
class ReferenceCriterion:
    resource_type: str | None = None
    id: str | None = None
    url: str | None = None


@dataclass(frozen=True, slots=True)
class UriCriterion:
    value: str
    mode: str = "eq"  # eq | below | above


@dataclass(frozen=True, slots=True)
class CompositeCriterion:
    head: TokenCriterion
    tail: Any  # criterion of the second component's type
    tail_type: str


@dataclass(frozen=True, slots=True)
class TextCriterion:
    terms: tuple[str, ...]
    column: str  # narrative | content


@dataclass(frozen=True, slots=True)
class ChainCriterion:
    """``subject:Patient.name=x``: the reference points at a target matching ``clause``."""

    target_types: tuple[str, ...]
    clause: Clause


@dataclass(frozen=True, slots=True)
class HasCriterion:
    """``_has:Observation:patient:code=x``: some Observation whose ``patient`` points here
    matches ``clause``."""

    resource_type: str
    reference_param: str
    clause: Clause


@dataclass(frozen=True, slots=True)
class Clause:
    """One search parameter occurrence: its criteria are OR-ed; clauses are AND-ed."""

    param: str  # parameter code (_id, _lastUpdated, _has, _text... included)
    type: str  # string | token | reference | date | number | quantity | uri | composite
    #            | id | lastUpdated | text | has | compartment
    criteria: tuple[Any, ...] = ()
    modifier: str | None = None
    negate: bool = False  # token :not
    missing: bool | None = None  # :missing=true|false
    # composite parameters: the component types, for adapters that need them
    component_types: tuple[str, ...] = ()
    # the parameters whose index values these are (more than one for a union such as
    # Observation combo-code = code | component-code); empty: ``param`` itself
    stored: tuple[str, ...] = ()

    @property
    def index_params(self) -> tuple[str, ...]:
        return self.stored or (self.param,)


@dataclass(frozen=True, slots=True)
class SortKey:
    param: str
    type: str
    descending: bool = False
    stored: tuple[str, ...] = ()  # as Clause.stored

    @property
    def index_params(self) -> tuple[str, ...]:
        return self.stored or (self.param,)


@dataclass(frozen=True, slots=True)
class Include:
    source_type: str
    param: str  # "*" for every reference parameter
    target_type: str | None = None
    iterate: bool = False
    reverse: bool = False
    stored: tuple[str, ...] = ()  # as Clause.stored


@dataclass(frozen=True, slots=True)
class Compartment:
    """Membership of a compartment (R4 3.1.1.1): resources whose listed reference
    parameters point at the owner; with ``include_owner`` the owner itself too."""

    owner_type: str
    owner_id: str
    members: dict[str, tuple[str, ...]]  # resource type → reference parameters
    include_owner: bool = False


@dataclass(frozen=True, slots=True)
class AccessGrant:
    """One alternative of a plan's access filter (see :mod:`fhir_server.access`, which
    builds them from a caller's grants): a resource passes when it is of one of ``types``
    (``None``: any) and matches every condition that is set. A plan passes a resource
    when any of its alternatives does.

    - ``owners``: one of these ``_security`` labels (the owning organizations);
    - ``identifiers``: one of these ``identifier`` values;
    - ``patients``: one of these Patients, or in the compartment of one of them through
      the reference parameters ``members`` lists for its type;
    - ``tokens``: for each ``(parameter, criteria)``, one of the criteria in that token
      parameter (a SMART granular scope such as ``?category=...|laboratory``).
    """

    types: frozenset[str] | None
    owners: tuple[TokenCriterion, ...] | None = None
    identifiers: tuple[TokenCriterion, ...] | None = None
    patients: tuple[str, ...] | None = None
    members: dict[str, tuple[str, ...]] = field(default_factory=dict)
    tokens: tuple[tuple[str, tuple[TokenCriterion, ...]], ...] | None = None

    def covers(self, resource_type: str) -> bool:
        return self.types is None or resource_type in self.types

    @property
    def unconditional(self) -> bool:
        return (self.owners is None and self.identifiers is None and self.patients is None
                and self.tokens is None)


@dataclass(frozen=True, slots=True)
class Cursor:
    """Keyset position: the sort tuple of the row a page ends (or starts) at."""

    key: tuple[Any, ...]
    backwards: bool = False

    def encode(self) -> str:
        raw = orjson.dumps({"k": list(self.key), "b": self.backwards})
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> Cursor:
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            data = orjson.loads(raw)
            return cls(tuple(data["k"]), bool(data.get("b")))
        except (binascii.Error, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            raise SearchError("_cursor is not a cursor this server issued", "_cursor") from None


@dataclass(slots=True)
class SearchPlan:
    resource_types: tuple[str, ...]  # one for a type search; several for system search
    clauses: list[Clause] = field(default_factory=list)
    sort: list[SortKey] = field(default_factory=list)
    count: int = DEFAULT_COUNT
    offset: int = 0  # matches skipped before the page (at most MAX_OFFSET)
    cursor: Cursor | None = None
    total: str | None = None  # none | estimate | accurate; None: when cheap
    summary: str | None = None
    elements: tuple[str, ...] = ()
    includes: list[Include] = field(default_factory=list)
    revincludes: list[Include] = field(default_factory=list)
    ignored: list[tuple[str, str]] = field(default_factory=list)  # (parameter, why unused)
    compartment: Compartment | None = None
    all_types: bool = False  # system search without _type
    # What the caller may see (None: everything); set by the FHIR service, never parsed
    # from the query. Adapters apply it to the matches, the includes, the targets of
    # chains and _has, and to conditions re-checked inside a commit.
    access: tuple[AccessGrant, ...] | None = None

    @property
    def resource_type(self) -> str:
        return self.resource_types[0]


# --- escaping (R4 3.1.1.4.9) ---------------------------------------------------------------

def split_escaped(text: str, separator: str) -> list[str]:
    """Split at ``separator`` unless escaped with a backslash; escapes are kept."""
    if "\\" not in text:  # the usual case (and on every conditional write): no escapes
        return text.split(separator)
    parts, current, i = [], [], 0
    while i < len(text):
        char = text[i]
        if char == "\\" and i + 1 < len(text):
            current.append(text[i:i + 2])
            i += 2
            continue
        if char == separator:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
        i += 1
    parts.append("".join(current))
    return parts


def unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in ",|$\\":
            out.append(text[i + 1])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


# --- the parser --------------------------------------------------------------------------

@dataclass
class _Context:
    registry: SearchRegistry
    base_url: str  # e.g. https://x/fhir: absolute references to it are made relative
    strict: bool
    ignored: list[tuple[str, str]]

    def ignore(self, name: str, why: str) -> None:
        if self.strict:
            raise SearchError(f"{name}: {why}", name)
        self.ignored.append((name, why))


def parse_search(
    registry: SearchRegistry,
    resource_types: Sequence[str],
    params: Sequence[tuple[str, str]],
    *,
    strict: bool = False,
    base_url: str = "",
    all_types: bool = False,
) -> SearchPlan:
    """Parse ``params`` (name, value pairs, repeated names AND-ed) into a plan."""
    plan = SearchPlan(tuple(resource_types), all_types=all_types)
    ctx = _Context(registry, base_url.rstrip("/"), strict, plan.ignored)
    for name, value in params:
        if name in RESULT_PARAMETERS or name.startswith(("_include:", "_revinclude:")):
            _result_parameter(ctx, plan, name, value)
        elif name in UNSUPPORTED_RESULT_PARAMETERS:
            ctx.ignore(name, "not supported by this server")
        else:
            clause = _clause(ctx, plan.resource_types, name, value, depth=0)
            if clause is not None:
                plan.clauses.append(clause)
    return plan


def _result_parameter(ctx: _Context, plan: SearchPlan, name: str, value: str) -> None:
    if name == "_count":
        if not value.isdigit():
            raise SearchError("_count must be a non-negative integer", name)
        plan.count = min(int(value), MAX_COUNT)
    elif name == "_offset":
        # As HAPI FHIR and Blaze read it: skip this many matches. Bounded, because each
        # page walks every skipped match again; deeper pages follow the next links.
        if not value.isdigit() or int(value) > MAX_OFFSET:
            raise SearchError(f"_offset must be an integer from 0 to {MAX_OFFSET}; page "
                              "further by following the next links", name)
        plan.offset = int(value)
    elif name == "_total":
        if value not in TOTAL_MODES:
            raise SearchError(f"_total must be one of {', '.join(TOTAL_MODES)}", name)
        plan.total = value
    elif name == "_summary":
        if value not in SUMMARY_MODES:
            raise SearchError(f"_summary must be one of {', '.join(SUMMARY_MODES)}", name)
        plan.summary = None if value == "false" else value
    elif name == "_elements":
        # Both "birthDate" and "Patient.birthDate" are seen in the wild.
        plan.elements = tuple(e.strip().rsplit(".", 1)[-1] for e in value.split(",")
                              if e.strip())
    elif name == "_sort":
        keys = [_sort_key(ctx, plan.resource_types, k) for k in value.split(",") if k]
        plan.sort = [k for k in keys if k is not None]
    elif name.startswith(("_include", "_revinclude")):
        for include in _include(ctx, plan.resource_types, name, value):
            (plan.revincludes if include.reverse else plan.includes).append(include)
    elif name == "_cursor":
        plan.cursor = Cursor.decode(value)


def _sort_key(ctx: _Context, resource_types: tuple[str, ...], key: str) -> SortKey | None:
    descending = key.startswith("-")
    code = key.lstrip("-")
    if code in ("_id", "_lastUpdated"):
        return SortKey(code, "id" if code == "_id" else "lastUpdated", descending)
    types = {p.type for t in resource_types if (p := ctx.registry.param(t, code))}
    if len(types) != 1 or len(resource_types) != 1:
        ctx.ignore(f"_sort={key}", "no such parameter to sort by (system searches sort by "
                   "_id or _lastUpdated only)")
        return None
    param_type = types.pop()
    if param_type not in ("string", "token", "date", "number", "quantity", "uri", "reference"):
        ctx.ignore(f"_sort={key}", f"{param_type} parameters cannot be sorted by")
        return None
    param = ctx.registry.param(resource_types[0], code)
    assert param is not None
    return SortKey(code, param_type, descending, param.union_of)


def _include(ctx: _Context, resource_types: tuple[str, ...], name: str, value: str
             ) -> list[Include]:
    """``_include=Type:param[:Target]``, ``_include=*``, ``_include:iterate=...``."""
    base, _, modifier = name.partition(":")
    if modifier not in ("", "iterate", "recurse"):  # recurse: the R3 spelling of iterate
        ctx.ignore(name, f"unknown modifier :{modifier}")
        return []
    iterate = modifier != ""
    reverse = base == "_revinclude"
    if value == "*":
        return [Include(t, "*", None, iterate, reverse) for t in resource_types]
    parts = value.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
        raise SearchError(f"{name} must look like Type:param[:TargetType] or *", name)
    source, code = parts[0], parts[1]
    target = parts[2] if len(parts) == 3 else None
    if not reverse and source not in resource_types and not iterate:
        ctx.ignore(f"{name}={value}", f"{source} is not the type searched")
        return []
    stored: tuple[str, ...] = ()
    if code != "*":
        param = ctx.registry.param(source, code)
        if param is None or param.type != "reference":
            ctx.ignore(f"{name}={value}", f"{source} has no reference parameter {code!r}")
            return []
        stored = param.union_of
    return [Include(source, code, target, iterate, reverse, stored)]


def _split_name(name: str) -> tuple[str, str | None, str | None]:
    """``subject:Patient.name`` → (subject, Patient, name); ``name:exact`` → (name, exact, None)."""
    head, dot, rest = name.partition(".")
    code, _, modifier = head.partition(":")
    return code, modifier or None, rest if dot else None


def _clause(ctx: _Context, resource_types: tuple[str, ...], name: str, value: str, depth: int
            ) -> Clause | None:
    if name.startswith("_has:"):
        return _has(ctx, resource_types, name, value, depth)
    code, modifier, chain = _split_name(name)
    params = _params(ctx, resource_types, code)
    if params is None:
        ctx.ignore(name, "unknown search parameter")
        return None
    param = params[0]
    if chain is not None:
        return _chain(ctx, param, modifier, chain, value, depth)
    if modifier == "missing":
        if value not in ("true", "false"):
            raise SearchError(f"{name} must be true or false", name)
        return Clause(code, _clause_type(param), missing=value == "true", stored=param.union_of)
    if not param.searchable:
        ctx.ignore(name, "not supported by this server")
        return None
    if modifier is not None and not _modifier_allowed(param, modifier):
        ctx.ignore(name, f"modifier :{modifier} is not supported on {param.type} parameters")
        return None
    values = [v for v in split_escaped(value, ",") if v != ""]
    if not values:
        raise SearchError(f"{name} has no value", name)
    criteria = tuple(_criterion(ctx, param, modifier, v, name) for v in values)
    return Clause(code, _clause_type(param), criteria, modifier, negate=modifier == "not",
                  component_types=tuple(c.type for c in param.components),
                  stored=param.union_of)


def _params(ctx: _Context, resource_types: tuple[str, ...], code: str
            ) -> list[SearchParam] | None:
    """The parameter on every type searched (same type on all), or None."""
    found = [ctx.registry.param(t, code) for t in resource_types]
    if not found or any(p is None for p in found):
        return None
    params = [p for p in found if p is not None]
    if len({p.type for p in params}) != 1:
        return None
    return params


def _clause_type(param: SearchParam) -> str:
    if param.code == "_id":
        return "id"
    if param.code == "_lastUpdated":
        return "lastUpdated"
    if param.code in ("_text", "_content"):
        return "text"
    return param.type


def _modifier_allowed(param: SearchParam, modifier: str) -> bool:
    if modifier == "of-type":
        return "ofType" in param.modifiers
    if param.type == "reference" and modifier[:1].isupper():
        return not param.targets or modifier in param.targets
    if param.code == "_id":
        return modifier in ("not", "missing")
    return modifier in param.modifiers


def _criterion(ctx: _Context, param: SearchParam, modifier: str | None, raw: str, name: str
               ) -> Any:
    kind = _clause_type(param)
    try:
        if kind in ("string",):
            if param.code == PHONETIC:
                return _phonetic(raw)
            return _string(raw, modifier)
        if kind in ("token", "id"):
            return _token(raw, modifier)
        if kind in ("date", "lastUpdated"):
            return _date(raw)
        if kind == "number":
            return _number(raw)
        if kind == "quantity":
            return _quantity(raw)
        if kind == "reference":
            return _reference(ctx, param, raw, modifier)
        if kind == "uri":
            return UriCriterion(unescape(raw), modifier if modifier in ("below", "above") else "eq")
        if kind == "text":
            return _text(param, raw)
        if kind == "composite":
            return _composite(ctx, param, raw, name)
    except ValueError as exc:
        raise SearchError(f"{name}: {exc}", name) from None
    raise SearchError(f"{name}: parameters of type {kind} cannot be searched", name)


def _string(raw: str, modifier: str | None) -> StringCriterion:
    value = unescape(raw)
    if modifier == "exact":
        return StringCriterion(value, "exact")
    return StringCriterion(normalize(value), "contains" if modifier == "contains" else "prefix")


def _phonetic(raw: str) -> StringCriterion:
    """A name that sounds like the value (see :mod:`fhir_server.search.phonetic`)."""
    code = phonetic_code(unescape(raw))
    if not code:
        raise ValueError("a phonetic search needs a name with letters")
    return StringCriterion(code, "phonetic")


def _token(raw: str, modifier: str | None) -> TokenCriterion:
    if modifier == "text":
        return TokenCriterion(text=normalize(unescape(raw)))
    if modifier == "of-type":
        parts = [unescape(p) for p in split_escaped(raw, "|")]
        if len(parts) != 3 or not parts[1] or not parts[2]:
            raise ValueError("of-type takes system|code|value")
        return TokenCriterion(parts[0] or None, f"{parts[1]}|{parts[2]}")
    parts = split_escaped(raw, "|")
    if len(parts) == 1:
        return TokenCriterion(None, unescape(parts[0]))
    if len(parts) != 2:
        raise ValueError(f"{raw!r} is not [system]|[code]")
    system, code = unescape(parts[0]), unescape(parts[1])
    if not system:
        return TokenCriterion(None, code, no_system=True)
    return TokenCriterion(system, code or None)


def _date(raw: str) -> RangeCriterion:
    prefix, text = split_prefix(raw)
    lo, hi = date_range(text)
    return RangeCriterion(prefix, lo, hi)


def _number(raw: str) -> RangeCriterion:
    prefix, text = split_prefix(raw)
    value, lo, hi = number_range(text)
    return RangeCriterion(prefix, lo, hi, value)


def _quantity(raw: str) -> RangeCriterion:
    parts = [unescape(p) for p in split_escaped(raw, "|")]
    if len(parts) not in (1, 3):
        raise ValueError(f"{raw!r} is not [prefix]number|system|code")
    prefix, text = split_prefix(parts[0])
    value, lo, hi = number_range(text)
    system = parts[1] or None if len(parts) == 3 else None
    code = parts[2] or None if len(parts) == 3 else None
    if code is not None and system in (UCUM, None):
        span, point = canonical_span(lo, hi, code), canonical_span(value, value, code)
        if span is not None and point is not None:
            return RangeCriterion(prefix, lo, hi, value, system, code,
                                  (span[0], point[1], span[1], span[2]))
    return RangeCriterion(prefix, lo, hi, value, system, code)


def _reference(ctx: _Context, param: SearchParam, raw: str, modifier: str | None
               ) -> ReferenceCriterion | TokenCriterion:
    value = unescape(raw)
    if modifier == "identifier":
        return _token(raw, None)
    if ctx.base_url and value.startswith(ctx.base_url + "/"):
        value = value[len(ctx.base_url) + 1:]
    parsed = parse_reference(value)
    if parsed.url is not None:
        return ReferenceCriterion(parsed.resource_type, None, parsed.url)
    resource_type = parsed.resource_type
    if modifier is not None and modifier[:1].isupper():
        if resource_type is not None and resource_type != modifier:
            raise ValueError(f"{value!r} is not a {modifier}")
        resource_type = modifier
    if resource_type is None and len(param.targets) == 1:
        resource_type = param.targets[0]
    return ReferenceCriterion(resource_type, parsed.id)


def _text(param: SearchParam, raw: str) -> TextCriterion:
    terms = tuple(t for t in "".join(c if c.isalnum() else " " for c in normalize(raw)).split())
    if not terms:
        raise ValueError("give at least one word")
    return TextCriterion(terms, "narrative" if param.code == "_text" else "content")


def _composite(ctx: _Context, param: SearchParam, raw: str, name: str) -> CompositeCriterion:
    parts = split_escaped(raw, "$")
    if len(parts) != len(param.components):
        raise ValueError(f"{raw!r} needs {len(param.components)} components separated by $")
    head = _token(parts[0], None)
    tail_type = param.components[1].type
    tail_param = SearchParam(param.code, tail_type, "")
    tail = _criterion(ctx, tail_param, None, parts[1], name)
    return CompositeCriterion(head, tail, tail_type)


def _chain(ctx: _Context, param: SearchParam, modifier: str | None, rest: str, value: str,
           depth: int) -> Clause | None:
    name = f"{param.code}{':' + modifier if modifier else ''}.{rest}"
    if param.type != "reference":
        ctx.ignore(name, f"{param.code} is not a reference parameter, so it cannot be chained")
        return None
    if depth >= MAX_CHAIN_DEPTH:
        raise SearchError(f"Chains are limited to {MAX_CHAIN_DEPTH} levels", name)
    targets = (modifier,) if modifier else param.targets
    inner_name = rest
    usable = tuple(t for t in targets if _params(ctx, (t,), _split_name(inner_name)[0]))
    if not usable:
        ctx.ignore(name, f"no target of {param.code} has the parameter {_split_name(rest)[0]!r}")
        return None
    inner = _clause(ctx, usable, inner_name, value, depth + 1)
    if inner is None:
        return None
    return Clause(param.code, "reference", (ChainCriterion(usable, inner),),
                  stored=param.union_of)


def _has(ctx: _Context, resource_types: tuple[str, ...], name: str, value: str, depth: int
         ) -> Clause | None:
    parts = name.split(":", 3)
    if len(parts) != 4 or not all(parts[1:]):
        raise SearchError("_has must look like _has:Type:reference:parameter", name)
    _, source, reference, inner_name = parts
    if depth >= MAX_CHAIN_DEPTH:
        raise SearchError(f"_has is limited to {MAX_CHAIN_DEPTH} levels", name)
    ref_param = ctx.registry.param(source, reference)
    if ref_param is None or ref_param.type != "reference":
        ctx.ignore(name, f"{source} has no reference parameter {reference!r}")
        return None
    if ref_param.targets and not set(resource_types) & set(ref_param.targets):
        ctx.ignore(name, f"{source}.{reference} cannot point at {', '.join(resource_types)}")
        return None
    inner = _clause(ctx, (source,), inner_name, value, depth + 1)
    if inner is None:
        return None
    return Clause("_has", "has", (HasCriterion(source, reference, inner),))


def compartment(registry: SearchRegistry, owner_type: str, owner_id: str,
                resource_types: Sequence[str], *, include_owner: bool = False) -> Compartment:
    """The compartment of ``owner_type/owner_id`` restricted to ``resource_types``."""
    members = {t: params for t in resource_types
               if (params := registry.compartment_params(owner_type, t))}
    return Compartment(owner_type, owner_id, members, include_owner)
