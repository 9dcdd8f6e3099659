"""search-type: ``GET [base]/[type]?...`` and ``POST [base]/[type]/_search``, and the
searchset Bundle every search answers with (system, compartment, ``$everything`` and the
GET entries of batch/transaction bundles build theirs here too).

The Bundle carries the matches (``search.mode = match``), the ``_include``/``_revinclude``
resources (``include``), an OperationOutcome entry (``outcome``) naming the parameters
that were ignored, ``total`` when asked for or cheap to know, and ``self``/``next``/
``previous`` links whose ``_cursor`` is a keyset position: a link stays valid and shows
neither duplicates nor gaps while the data changes.

Unknown or unsupported parameters are ignored and reported (``Prefer: handling=lenient``,
the default) or refused with 400 under ``Prefer: handling=strict``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode

import orjson
from starlette.requests import Request
from starlette.responses import Response

from fhir_server.bundle import bundle, raw
from fhir_server.caller import CallerFhir
from fhir_server.http import FhirResponse, check_format
from fhir_server.interactions.context import FhirContext
from fhir_server.outcome import Issue, operation_outcome
from fhir_server.search.plan import Compartment, SearchPlan
from fhir_server.search.summary import select_elements, summarize
from fhir_server.service import FhirService
from fhir_server.store import StoredResource

Params = list[tuple[str, str]]


def strict_handling(request: Request) -> bool:
    return "handling=strict" in request.headers.get("prefer", "").replace(" ", "")


async def search_params(request: Request) -> Params:
    """Query parameters, plus the form body of ``POST .../_search``."""
    params = list(request.query_params.multi_items())
    if request.method == "POST":
        form = await request.form()
        params += [(k, str(v)) for k, v in form.multi_items()]
    return params


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
    kept = _link_params(params, plan)
    links = {"self": _url(fhir_base, path, kept, plan.cursor.encode() if plan.cursor else None)}
    if page.next is not None:
        links["next"] = _url(fhir_base, path, kept, page.next.encode())
    if page.previous is not None:
        links["previous"] = _url(fhir_base, path, kept, page.previous.encode())
    return bundle("searchset", entries, total=page.total, links=links)


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


def _url(fhir_base: str, path: str, params: Params, cursor: str | None) -> str:
    query = [*params, ("_cursor", cursor)] if cursor else params
    url = f"{fhir_base}/{path}" if path else fhir_base
    return f"{url}?{urlencode(query)}" if query else url


async def search_type(ctx: FhirContext, request: Request, resource_type: str) -> Response:
    check_format(request)
    ctx.service.check_type(resource_type)
    params = await search_params(request)
    result = await run_search(ctx.caller(request), ctx.fhir_base(request), resource_type,
                              [resource_type], params, strict=strict_handling(request))
    return FhirResponse(result)
