"""What a Subscription asks for, checked when it is written, and whether a resource
matches it.

``criteria`` is a search (``Observation?code=http://loinc.org|2339-0&subject=Patient/1``)
parsed by the search engine, so an unknown type or parameter is refused with the same
message as the search would give (400 naming ``Subscription.criteria``). Channels:
``rest-hook`` (an http(s) ``endpoint``; ``header`` lines ``Name: value``) and
``websocket``; ``email``, ``sms`` and ``message`` are refused as not offered.

Matching one written resource against hundreds of subscriptions must be cheap, so the
usual criteria are decided in memory from the resource's own search-index rows (the rows
the store indexes it with): tokens, references (not chained), strings and ``_id``, as the
store's search would decide them (:mod:`fhir_server.search.matching`). A subscription with
any other clause (dates, quantities, chains, ``_has``, modifiers) is decided by the store:
its search with ``_id`` of the resource added.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from fhir_server.http import parse_query
from fhir_server.outcome import FhirError
from fhir_server.search.matching import plain_token, system_matches
from fhir_server.search.plan import Clause, ReferenceCriterion, SearchPlan, StringCriterion
from fhir_server.service import FhirService
from fhir_server.store.port import IndexRows
from fhir_server.validation import is_resource_type
from platform_api.outbound import Guard, OutboundError, OutboundRefused

JSON = dict[str, Any]
CHANNELS = ("rest-hook", "websocket")
BACKPORT_CONTENT = ("http://hl7.org/fhir/uv/subscriptions-backport/StructureDefinition/"
                    "backport-payload-content")
CONTENTS = ("empty", "id-only", "full-resource")


@dataclass(frozen=True, slots=True)
class Criteria:
    text: str
    resource_type: str
    params: tuple[tuple[str, str], ...]
    plan: SearchPlan
    in_memory: bool  # every clause decided from the index rows
    # Index keys, one of which a matching resource must have (see ``keys_of``): those of
    # its first token or reference clause; empty when it has none (checked every time).
    keys: frozenset[tuple[str, str]] = frozenset()


async def parse_criteria(service: FhirService, text: Any) -> Criteria:
    if not isinstance(text, str) or not text.strip():
        raise FhirError.of(400, "required", "A Subscription needs criteria: a search such "
                           "as Observation?code=http://loinc.org|2339-0",
                           "Subscription.criteria")
    resource_type, _, query = text.strip().partition("?")
    if not is_resource_type(resource_type):
        raise FhirError.of(400, "invalid", f"criteria: {resource_type!r} is not a resource "
                           "type", "Subscription.criteria")
    params = tuple(parse_query(query)) if query else ()
    try:
        plan = await service.parse([resource_type], params, strict=True)
    except FhirError as exc:
        raise FhirError.of(400, "invalid", f"criteria: {exc}", "Subscription.criteria"
                           ) from None
    in_memory = all(_decidable(c) for c in plan.clauses)
    return Criteria(text.strip(), resource_type, params, plan, in_memory,
                    next((k for c in plan.clauses if (k := _clause_keys(c))), frozenset()))


def _clause_keys(clause: Clause) -> frozenset[tuple[str, str]]:
    """What a resource matching the clause must have among its index keys: a token's
    ``(param, code)``, a reference's ``(param, id)``; empty when the clause cannot say."""
    if clause.type == "token" and plain_token(clause):
        return frozenset((p, str(c.code)) for p in clause.index_params for c in clause.criteria)
    if clause.type == "reference" and _decidable(clause) and all(
            c.id is not None for c in clause.criteria):
        return frozenset((p, str(c.id)) for p in clause.index_params for c in clause.criteria)
    return frozenset()


def keys_of(rows: IndexRows) -> set[tuple[str, str]]:
    """The index keys of a resource: each token ``(param, code)`` and reference
    ``(param, id)`` it is indexed with."""
    keys = {(r[0], r[2]) for r in rows.rows.get("token", ()) if r[2] is not None}
    keys.update((r[0], r[2]) for r in rows.rows.get("reference", ()) if r[2] is not None)
    return keys


def check_channel(subscription: JSON) -> None:
    channel = subscription.get("channel") or {}
    kind = channel.get("type")
    if kind not in CHANNELS:
        raise FhirError.of(400, "not-supported", f"channel.type {kind!r} is not offered: use "
                           "rest-hook or websocket", "Subscription.channel.type")
    if kind == "rest-hook":
        endpoint = urlsplit(str(channel.get("endpoint") or ""))
        if endpoint.scheme not in ("http", "https") or not endpoint.netloc:
            raise FhirError.of(400, "required", "A rest-hook needs an http(s) endpoint",
                               "Subscription.channel.endpoint")
    for i, line in enumerate(channel.get("header") or []):
        name, colon, _ = str(line).partition(":")
        if not colon or not name.strip() or " " in name.strip():
            raise FhirError.of(400, "value", "Each header is 'Name: value'",
                               f"Subscription.channel.header[{i}]")
    if payload_content(subscription) not in (None, *CONTENTS):
        raise FhirError.of(400, "value", f"The payload content is one of {', '.join(CONTENTS)}",
                           "Subscription.channel.payload.extension")


async def check_endpoint_address(subscription: JSON, guard: Guard) -> None:
    """Refuse, when the Subscription is written, a rest-hook endpoint the outbound guard
    would refuse (platform_api/outbound.py: loopback, private, link-local, shared,
    reserved, metadata addresses; a literal one or a name resolving to one): the server
    would otherwise post for anyone who may subscribe to what they cannot reach
    themselves. A name that does not resolve yet is let through: every delivery checks
    the address it connects to again."""
    channel = subscription.get("channel") or {}
    if channel.get("type") != "rest-hook":
        return
    endpoint = str(channel.get("endpoint") or "")
    split = urlsplit(endpoint)
    host = split.hostname or ""
    try:
        await guard.addresses(endpoint, host, split.port or 0)
    except OutboundRefused:
        raise FhirError.of(400, "security", f"The endpoint's host {host!r} is on a local, "
                           "private or reserved network, which this server does not post "
                           "to (HEALTHPLATFORM_OUTBOUND_ALLOW opens a clinic's own network)",
                           "Subscription.channel.endpoint") from None
    except OutboundError:  # does not resolve now: checked again at each delivery
        return


def payload_content(subscription: JSON) -> str | None:
    """The backport's payload content (``empty`` | ``id-only`` | ``full-resource``), or
    None for an R4 subscription without it."""
    channel = subscription.get("channel") or {}
    for extension in (channel.get("_payload") or {}).get("extension") or []:
        if extension.get("url") == BACKPORT_CONTENT:
            return str(extension.get("valueCode"))
    return None


def headers_of(subscription: JSON) -> dict[str, str]:
    found = {}
    for line in (subscription.get("channel") or {}).get("header") or []:
        name, _, value = str(line).partition(":")
        found[name.strip()] = value.strip()
    return found


# -- deciding in memory ------------------------------------------------------------------
def _decidable(clause: Clause) -> bool:
    if clause.type in ("token", "id"):
        return plain_token(clause) or (clause.type == "id" and not clause.modifier)
    if clause.type == "reference":
        return (not clause.modifier and clause.missing is None
                and all(isinstance(c, ReferenceCriterion) for c in clause.criteria))
    if clause.type == "string":
        return clause.missing is None and all(
            isinstance(c, StringCriterion) and c.mode in ("prefix", "exact", "contains")
            for c in clause.criteria)
    return False


def matches_rows(criteria: Criteria, resource_id: str, rows: IndexRows) -> bool:
    """Whether the resource with these index rows matches (``criteria.in_memory`` only)."""
    return all(_clause_matches(c, resource_id, rows) for c in criteria.plan.clauses)


def _clause_matches(clause: Clause, resource_id: str, rows: IndexRows) -> bool:
    params = clause.index_params
    if clause.type == "id":
        return any(c.code == resource_id for c in clause.criteria)
    if clause.type == "token":
        found = [(r[1], r[2]) for r in rows.rows.get("token", ()) if r[0] in params]
        return any(code == c.code and system_matches(c, system)
                   for c in clause.criteria for system, code in found)
    if clause.type == "reference":
        found = [r for r in rows.rows.get("reference", ()) if r[0] in params]
        return any(_reference_matches(c, r) for c in clause.criteria for r in found)
    found = [r for r in rows.rows.get("string", ()) if r[0] in params]
    return any(_string_matches(c, r) for c in clause.criteria for r in found)


def _reference_matches(criterion: ReferenceCriterion, row: Any) -> bool:
    _, target_type, target_id, url = row
    if criterion.id is not None:
        return target_id == criterion.id and criterion.resource_type in (None, target_type)
    return criterion.url is not None and url == criterion.url


def _string_matches(criterion: StringCriterion, row: Any) -> bool:
    _, value, exact = row
    if criterion.mode == "exact":
        return bool(exact == criterion.value)
    if criterion.mode == "contains":
        return criterion.value in str(value)
    return str(value).startswith(criterion.value)


async def matches(service: FhirService, criteria: Criteria, resource: JSON,
                  rows: IndexRows | None) -> bool:
    """Whether the current ``resource`` matches ``criteria``: in memory when it can be
    decided there, else by the store (the search with ``_id`` added)."""
    if resource.get("resourceType") != criteria.resource_type:
        return False
    if criteria.in_memory and rows is not None:
        return matches_rows(criteria, resource["id"], rows)
    plan = await service.parse([criteria.resource_type],
                               [*criteria.params, ("_id", resource["id"])], strict=True)
    return bool(await service.match_plan(plan, 1))
