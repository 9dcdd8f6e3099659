"""search-type: ``GET [base]/[type]?...`` and ``POST [base]/[type]/_search``.

This is the foundation's search: ``_id``, ``_lastUpdated`` (all date prefixes with
precision ranges), ``_count`` and offset paging. Unknown parameters are ignored and
reported in an OperationOutcome entry (``Prefer: handling=lenient``, the default) or
refused with 400 under ``Prefer: handling=strict``.
"""

from __future__ import annotations

from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response

from fhir_server.bundle import bundle, search_entry
from fhir_server.http import FhirResponse, check_format
from fhir_server.interactions.context import FhirContext
from fhir_server.outcome import FhirError, Issue, operation_outcome
from fhir_server.search.dates import date_range, split_prefix

DEFAULT_COUNT = 20
MAX_COUNT = 1000
RESULT_PARAMS = {"_count", "_offset", "_format", "_total"}
SUPPORTED = {"_id", "_lastUpdated"}


def _last_updated_bounds(values: list[str]) -> list[tuple[str, str]]:
    bounds: list[tuple[str, str]] = []
    for value in values:
        prefix, text = split_prefix(value)
        try:
            lo, hi = date_range(text)
        except ValueError as exc:
            raise FhirError.of(400, "value", f"_lastUpdated: {exc}", "_lastUpdated") from None
        match prefix:
            case "eq" | "ap":
                bounds += [(">=", lo), ("<", hi)]
            case "gt" | "sa":
                bounds.append((">=", hi))
            case "ge":
                bounds.append((">=", lo))
            case "lt" | "eb":
                bounds.append(("<", lo))
            case "le":
                bounds.append(("<", hi))
            case _:
                raise FhirError.of(400, "not-supported",
                                   f"_lastUpdated prefix {prefix!r} is not supported here",
                                   "_lastUpdated")
    return bounds


def strict_handling(request: Request) -> bool:
    return "handling=strict" in request.headers.get("prefer", "").replace(" ", "")


async def search_type(ctx: FhirContext, request: Request, resource_type: str) -> Response:
    check_format(request)
    ctx.service.check_type(resource_type)
    params = list(request.query_params.multi_items())
    if request.method == "POST":
        form = await request.form()
        params += [(k, str(v)) for k, v in form.multi_items()]
    ids: list[str] | None = None
    last_updated: list[str] = []
    ignored: list[str] = []
    for name, value in params:
        if name == "_id":
            wanted = [v for v in value.split(",") if v]
            ids = wanted if ids is None else [i for i in ids if i in wanted]
        elif name == "_lastUpdated":
            last_updated.append(value)
        elif name not in RESULT_PARAMS:
            ignored.append(name)
    if ignored and strict_handling(request):
        raise FhirError.of(400, "not-supported",
                           f"Unknown or unsupported search parameter(s): {', '.join(ignored)}",
                           *ignored)
    count = _non_negative(request, "_count", DEFAULT_COUNT, MAX_COUNT)
    offset = _non_negative(request, "_offset", 0, None)
    found, total = await ctx.service.store.list_ids(
        resource_type, ids=ids, last_updated=_last_updated_bounds(last_updated),
        count=count, offset=offset,
    )
    base = ctx.fhir_base(request)
    kept = [(k, v) for k, v in params if k not in ignored and k not in ("_offset",)]
    self_url = f"{base}/{resource_type}"
    links = {"self": f"{self_url}?{urlencode([*kept, ('_offset', str(offset))])}"}
    if offset + count < total:
        links["next"] = f"{self_url}?{urlencode([*kept, ('_offset', str(offset + count))])}"
    if offset > 0:
        previous = max(offset - count, 0)
        links["previous"] = f"{self_url}?{urlencode([*kept, ('_offset', str(previous))])}"
    entries = [search_entry(s, base) for s in found]
    if ignored:
        outcome = operation_outcome([Issue(
            "warning", "not-supported",
            f"Ignored unknown or unsupported search parameter(s): {', '.join(ignored)}",
            tuple(ignored),
        )])
        entries.append({"resource": outcome, "search": {"mode": "outcome"}})
    return FhirResponse(bundle("searchset", entries, total=total, links=links))


def _non_negative(request: Request, name: str, default: int, maximum: int | None) -> int:
    value = request.query_params.get(name)
    if value is None:
        return default
    if not value.isdigit():
        raise FhirError.of(400, "value", f"{name} must be a non-negative integer", name)
    return min(int(value), maximum) if maximum is not None else int(value)
