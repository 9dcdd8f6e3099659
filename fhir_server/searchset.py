"""The searchset Bundle: how every search answers, whichever door asked.

``run_search`` parses (unless given a plan) and runs a search as the caller — what it
may see only (:class:`~fhir_server.caller.CallerFhir`) — and builds the Bundle: the
matches (``search.mode = match``), the ``_include``/``_revinclude`` resources
(``include``), an OperationOutcome entry (``outcome``) naming the parameters that were
ignored, ``total`` when asked for or cheap to know, and ``self``/``next``/``previous``
links. The links carry a ``_cursor`` (a keyset position: a link stays valid and shows
neither duplicates nor gaps while the data changes), or, when the search paged by
``_offset``, the next and previous offsets.

Used by the search interactions (type, system, compartment), ``$everything`` and the GET
entries of batch and transaction bundles; nothing here reads an HTTP request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode

import orjson

from fhir_server.bundle import bundle, raw
from fhir_server.caller import CallerFhir
from fhir_server.outcome import Issue, operation_outcome
from fhir_server.search.plan import Compartment, SearchPlan
from fhir_server.search.summary import select_elements, summarize
from fhir_server.service import FhirService
from fhir_server.store import SearchPage, StoredResource

Params = list[tuple[str, str]]


async def run_search(fhir: CallerFhir, fhir_base: str, path: str,
                     resource_types: Sequence[str], params: Params, *, strict: bool,
                     all_types: bool = False, compartment: Compartment | None = None,
                     plan: SearchPlan | None = None) -> dict[str, Any]:
    """Parse and run a search as the caller (what it may see only), and build its
    searchset Bundle."""
    if plan is None:
        plan = await fhir.parse(resource_types, params, strict=strict, base_url=fhir_base,
                                all_types=all_types)
    plan.compartment = compartment
    page = await fhir.search_page(plan)
    service = fhir.service
    entries: list[dict[str, Any]] = []
    if plan.summary != "count" and plan.count:
        entries += [_entry(service, plan, s, fhir_base, "match") for s in page.resources]
        entries += [_entry(service, plan, s, fhir_base, "include") for s in page.included]
    if plan.ignored:
        entries.append(_ignored_entry(plan))
    return bundle("searchset", entries, total=page.total,
                  links=_links(fhir_base, path, params, plan, page))


def _links(fhir_base: str, path: str, params: Params, plan: SearchPlan, page: SearchPage
           ) -> dict[str, str]:
    kept = _link_params(params, plan)
    if any(name == "_offset" for name, _ in params):  # paged by offset: links by offset
        kept = [(k, v) for k, v in kept if k != "_offset"]
        links = {"self": _url(fhir_base, path, [*kept, ("_offset", str(plan.offset))])}
        if page.next is not None:
            links["next"] = _url(fhir_base, path,
                                 [*kept, ("_offset", str(plan.offset + plan.count))])
        if plan.offset > 0:
            links["previous"] = _url(fhir_base, path,
                                     [*kept, ("_offset", str(max(0, plan.offset - plan.count)))])
        return links
    cursor = plan.cursor.encode() if plan.cursor else None
    links = {"self": _url(fhir_base, path, kept, cursor)}
    if page.next is not None:
        links["next"] = _url(fhir_base, path, kept, page.next.encode())
    if page.previous is not None:
        links["previous"] = _url(fhir_base, path, kept, page.previous.encode())
    return links


def _entry(service: FhirService, plan: SearchPlan, stored: StoredResource, fhir_base: str,
           mode: str) -> dict[str, Any]:
    resource: Any = raw(stored)
    if plan.summary in ("true", "text", "data") or plan.elements:
        body = orjson.loads(stored.body)
        if plan.elements:
            body = select_elements(body, plan.elements, service.registry)
        else:
            assert plan.summary is not None
            body = summarize(body, plan.summary, service.registry)
        resource = body
    return {"fullUrl": f"{fhir_base}/{stored.resource_type}/{stored.id}", "resource": resource,
            "search": {"mode": mode}}


def _ignored_entry(plan: SearchPlan) -> dict[str, Any]:
    names = tuple(name for name, _why in plan.ignored)
    details = "; ".join(f"{name}: {why}" for name, why in plan.ignored)
    outcome = operation_outcome([Issue(
        "warning", "not-supported",
        f"Ignored unknown or unsupported search parameter(s): {details}", names,
    )])
    return {"resource": outcome, "search": {"mode": "outcome"}}


def _link_params(params: Params, plan: SearchPlan) -> Params:
    ignored = {name for name, _why in plan.ignored}
    return [(k, v) for k, v in params if k != "_cursor" and k not in ignored]


def _url(fhir_base: str, path: str, params: Params, cursor: str | None = None) -> str:
    query = [*params, ("_cursor", cursor)] if cursor else params
    url = f"{fhir_base}/{path}" if path else fhir_base
    return f"{url}?{urlencode(query)}" if query else url


