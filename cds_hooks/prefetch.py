"""Prefetch: a service's templates, filled from the hook's context, and resolved when the
CDS client did not send them.

Templates (CDS Hooks 2.0 "Prefetch tokens"): ``{{context.<field>}}`` for a top-level
primitive context field, ``{{context.<field>.<Type>.id}}`` for the ids of the resources
of a type in a context Bundle or list of references (comma-separated, as a search
parameter takes them), and the user tokens ``{{userPractitionerId}}``,
``{{userPractitionerRoleId}}``, ``{{userPatientId}}``, ``{{userRelatedPersonId}}`` from
``context.userId``. A template whose token cannot be filled is not resolved (its key is
absent, as the spec has the client omit it).

What the client sent wins, ``null`` included ("no data"). A key it left out is fetched
from a :class:`FhirSource`:

- :class:`StoreSource`: this server's own store, through the caller-bound FHIR service
  (:class:`~fhir_server.caller.CallerFhir`: only what that caller may see);
- :class:`RemoteSource`: the client's ``fhirServer`` over httpx with its
  ``fhirAuthorization`` bearer token.

A read that finds nothing is ``None``; a search is a searchset Bundle (possibly empty).
When the data cannot be had at all (no source, a refusal, a server error) the call is a
412 (CDS Hooks 2.0: "unable to obtain required data").
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlsplit

import httpx
import orjson

from cds_hooks.models import CdsError, HookRequest
from fhir_server.access import AccessDenied
from fhir_server.caller import CallerFhir
from fhir_server.outcome import FhirError
from fhir_server.search.plan import MAX_COUNT
from fhir_server.store import ResourceGone, ResourceNotFound, StoreError

JSON = dict[str, Any]
TOKEN = re.compile(r"\{\{\s*([A-Za-z][\w.]*)\s*\}\}")
USER_TOKENS = {"userPractitionerId": "Practitioner", "userPractitionerRoleId":
               "PractitionerRole", "userPatientId": "Patient",
               "userRelatedPersonId": "RelatedPerson"}
DEFAULT_COUNT = 100


class PrefetchUnavailable(Exception):
    """The data of a prefetch query could not be had from its source."""


class FhirSource(Protocol):
    async def get(self, query: str) -> JSON | None:
        """A read (``Type/id``: the resource or None) or a search (``Type?...``: a
        searchset Bundle)."""
        ...


def _context_ids(value: Any, resource_type: str) -> list[str]:
    if isinstance(value, dict) and value.get("resourceType") == "Bundle":
        return [str(e["resource"]["id"]) for e in value.get("entry") or []
                if isinstance(e, dict) and isinstance(e.get("resource"), dict)
                and e["resource"].get("resourceType") == resource_type
                and e["resource"].get("id")]
    if isinstance(value, list):
        return [v.split("/", 1)[1] for v in value
                if isinstance(v, str) and v.startswith(resource_type + "/")]
    return []


def token_value(token: str, context: Mapping[str, Any]) -> str | None:
    """The value of one prefetch token, None when it cannot be filled."""
    if token in USER_TOKENS:
        kind, _, user_id = str(context.get("userId") or "").partition("/")
        return user_id if kind == USER_TOKENS[token] and user_id else None
    parts = token.split(".")
    if parts[0] != "context" or len(parts) < 2:
        return None
    value = context.get(parts[1])
    if len(parts) == 2:
        return str(value) if isinstance(value, str | int | float) and \
            not isinstance(value, bool) else None
    if len(parts) == 4 and parts[3] == "id":
        ids = _context_ids(value, parts[2])
        return ",".join(ids) if ids else None
    return None


def render(template: str, context: Mapping[str, Any]) -> str | None:
    """The query of a template, None when one of its tokens cannot be filled."""
    missing = False

    def fill(match: re.Match[str]) -> str:
        nonlocal missing
        value = token_value(match.group(1), context)
        if value is None:
            missing = True
            return ""
        return value
    query = TOKEN.sub(fill, template)
    return None if missing else query


def searchset(resources: Sequence[JSON], total: int | None = None) -> JSON:
    return {"resourceType": "Bundle", "type": "searchset",
            "total": len(resources) if total is None else total,
            "entry": [{"resource": r, "search": {"mode": "match"}} for r in resources]}


def bundle_resources(value: Any) -> list[JSON]:
    """The resources of a prefetched searchset (or one resource) — OperationOutcome
    entries and ``null`` dropped."""
    if not isinstance(value, dict):
        return []
    if value.get("resourceType") != "Bundle":
        return [value]
    return [e["resource"] for e in value.get("entry") or []
            if isinstance(e, dict) and isinstance(e.get("resource"), dict)
            and e["resource"].get("resourceType") != "OperationOutcome"
            and (e.get("search") or {}).get("mode", "match") == "match"]


class StoreSource:
    """Prefetch from this server's store, as the caller sees it."""

    def __init__(self, fhir: CallerFhir):
        self.fhir = fhir

    async def get(self, query: str) -> JSON | None:
        path, _, search = query.partition("?")
        parts = [p for p in path.strip("/").split("/") if p]
        try:
            if len(parts) == 2 and not search:
                return await self.fhir.read_json(parts[0], parts[1])
            if len(parts) != 1:
                raise PrefetchUnavailable(f"not a read or a type search: {query}")
            params = parse_qsl(search, keep_blank_values=True)
            count = next((int(v) for k, v in params if k == "_count" and v.isdigit()),
                         DEFAULT_COUNT)
            plan = await self.fhir.parse([parts[0]], [(k, v) for k, v in params
                                                      if k != "_count"], strict=True)
            plan.count = max(1, min(count, MAX_COUNT))
            page = await self.fhir.search_page(plan)
            return searchset([orjson.loads(s.body) for s in page.resources], page.total)
        except (ResourceNotFound, ResourceGone):
            return None
        except AccessDenied as exc:
            raise PrefetchUnavailable(f"{query}: {exc.issues[0].diagnostics}") from None
        except (FhirError, StoreError, ValueError) as exc:
            raise PrefetchUnavailable(f"{query}: {exc}") from None


class RemoteSource:
    """Prefetch from the client's FHIR server with its access token."""

    def __init__(self, client: httpx.AsyncClient, base: str, token: str | None):
        self.client, self.base = client, base.rstrip("/")
        self.headers = {"Accept": "application/fhir+json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"

    async def get(self, query: str) -> JSON | None:
        url = f"{self.base}/{query.lstrip('/')}"
        if urlsplit(url).netloc != urlsplit(self.base).netloc:
            raise PrefetchUnavailable(f"{query} leaves the FHIR server")
        try:
            response = await self.client.get(url, headers=self.headers)
        except httpx.HTTPError as exc:
            raise PrefetchUnavailable(f"{url}: {type(exc).__name__}: {exc}") from None
        if response.status_code in (404, 410):
            return None
        if response.status_code != 200:
            raise PrefetchUnavailable(f"{url} answered {response.status_code}")
        try:
            found = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            raise PrefetchUnavailable(f"{url} did not answer JSON") from None
        if not isinstance(found, dict):
            raise PrefetchUnavailable(f"{url} did not answer a FHIR resource")
        return found


class UnavailableSource:
    """A source that cannot be read, and says why (a FHIR server named but unusable): the
    call fails with 412 only if it needs data the client did not send."""

    def __init__(self, reason: str):
        self.reason = reason

    async def get(self, query: str) -> JSON | None:
        raise PrefetchUnavailable(f"{query}: {self.reason}")


async def resolve(templates: Mapping[str, str], request: HookRequest,
                  source: FhirSource | None) -> dict[str, Any]:
    """The prefetch data of ``templates``: the client's, the rest fetched from
    ``source`` (412 when they cannot be had)."""
    given = request.prefetch or {}
    found: dict[str, Any] = {k: given[k] for k in templates if k in given}
    wanted = {key: query for key, template in templates.items() if key not in found
              and (query := render(template, request.context)) is not None}
    if not wanted:
        return found
    if source is None:
        raise CdsError(412, "Prefetch data is missing and no FHIR server can be reached "
                       f"for it: {', '.join(sorted(wanted))} (send it in prefetch, or "
                       "send fhirServer and fhirAuthorization)", "prefetch")
    keys = list(wanted)
    try:
        values = await asyncio.gather(*(source.get(wanted[k]) for k in keys))
    except PrefetchUnavailable as exc:
        raise CdsError(412, f"Required data could not be obtained: {exc}", "prefetch") from None
    found.update(zip(keys, values, strict=True))
    return found
