"""``$run`` (SQL on FHIR v2 ViewDefinitionRun): a view's rows, synchronously.

- ``POST [base]/ViewDefinition/$run`` and the system-level ``[base]/$viewdefinition-run``
  (GET or POST): the view is ``viewReference`` (a stored ViewDefinition) or
  ``viewResource`` (inline), exactly one of them;
- ``GET|POST [base]/ViewDefinition/[id]/$run``: the stored view ``id`` (neither
  parameter may be given).

The rows are those of the ``resource`` parameters when the request supplies any (nothing
of the server's is read), otherwise of the server's resources of the view's type that
the caller may search (:mod:`fhir_server.views.source`: the access policy applies as to
any search; ``_since``, ``patient``, ``group`` narrow it), at most ``_limit`` of them.
``_format`` (or ``Accept``): ``json`` (default), ``ndjson``, ``csv`` (``header``
default true), ``parquet``.

The answer streams: a page of resources is read, its rows written and sent, then the
next, so memory stays one page (Parquet: one row group) whatever the size. The first
page is made before the response starts, so what fails at once (a path that finds
several values for a single column) is a 422 OperationOutcome; a failure further on
ends the stream early (the status line is already sent).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from fhir_server.caller import CallerFhir
from fhir_server.http import read_json_body
from fhir_server.interactions.context import FhirContext
from fhir_server.outcome import FhirError
from fhir_server.views.definition import CompiledView
from fhir_server.views.engine import Row, ViewError
from fhir_server.views.output import EXTENSIONS, FORMATS, output_format, row_writer
from fhir_server.views.request import (
    Common,
    Param,
    body_params,
    count,
    inline_view,
    query_params,
    reference,
    referenced_view,
    resource,
    stored_compiled,
    stored_view,
    unknown,
)
from fhir_server.views.source import pages, resolve_scope

log = logging.getLogger("healthplatform.views")
OPERATION = "$run"
JSON = dict[str, Any]


@dataclass(slots=True)
class RunRequest:
    common: Common = field(default_factory=Common)
    view_reference: Param | None = None
    view_resource: Param | None = None
    limit: int | None = None
    resources: list[JSON] = field(default_factory=list)


async def run_type(ctx: FhirContext, request: Request) -> Response:
    """``[base]/ViewDefinition/$run`` and ``[base]/$viewdefinition-run``."""
    asked = await _request(request)
    caller = ctx.caller(request)
    if (asked.view_reference is None) == (asked.view_resource is None):
        raise FhirError.of(400, "required", "Either viewReference or viewResource parameter "
                           "is required when invoking at type level (exactly one)")
    if asked.view_resource is not None:
        view = inline_view(resource(asked.view_resource, "ViewDefinition"), "viewResource")
    else:
        assert asked.view_reference is not None
        where = asked.view_reference.where
        stored = await referenced_view(caller, reference(asked.view_reference), where)
        view = stored_compiled(stored, "viewReference")
    return await _run(caller, request, view, asked)


async def run_instance(ctx: FhirContext, request: Request, resource_id: str) -> Response:
    """``[base]/ViewDefinition/[id]/$run``."""
    asked = await _request(request)
    if asked.view_reference is not None or asked.view_resource is not None:
        raise FhirError.of(400, "invalid", "At instance level the view is the one in the "
                           "URL: neither viewReference nor viewResource may be given",
                           "viewReference" if asked.view_reference else "viewResource")
    caller = ctx.caller(request)
    view = stored_compiled(await stored_view(caller, resource_id, "id"), "ViewDefinition")
    return await _run(caller, request, view, asked)


async def _request(request: Request) -> RunRequest:
    params = query_params(list(request.query_params.multi_items()))
    if request.method == "POST":
        params += body_params(await read_json_body(request), f"A POST {OPERATION}")
    asked = RunRequest()
    for param in params:
        if asked.common.take(param):
            continue
        if param.name == "viewReference":
            asked.view_reference = _once(asked.view_reference, param)
        elif param.name == "viewResource":
            asked.view_resource = _once(asked.view_resource, param)
        elif param.name == "_limit":
            asked.limit = count(param)
        elif param.name == "resource":
            asked.resources.append(resource(param))
        else:
            raise unknown(param, OPERATION)
    if asked.common.fmt is None:
        asked.common.fmt = _accepted(request)
    return asked


def _once(current: Param | None, param: Param) -> Param:
    if current is not None:
        raise FhirError.of(400, "invalid", f"{param.name} may be given once", param.where)
    return param


def _accepted(request: Request) -> str:
    """The format an ``Accept`` header asks for (json when it names none we serve)."""
    for item in request.headers.get("accept", "").split(","):
        media = item.split(";")[0].strip().lower()
        if media and media not in ("*/*", "application/*"):
            try:
                return output_format(media, "Accept")
            except FhirError:
                continue
    return "json"


async def _run(caller: CallerFhir, request: Request, view: CompiledView, asked: RunRequest
               ) -> Response:
    common = asked.common
    assert common.fmt is not None
    if asked.resources:
        if common.patients or common.groups or common.since:
            raise FhirError.of(400, "invalid", "patient, group and _since filter the "
                               "server's data: not with resource parameters",
                               "patient" if common.patients else
                               "group" if common.groups else "_since")
        batches = _given(asked.resources)
    else:
        scope = await resolve_scope(caller, view.resource, common.since, common.patients,
                                    common.groups)
        batches = _stored(caller, view.resource, scope)
    chunks = _chunks(view, batches, common.fmt, common.header, asked.limit)
    try:
        first = await anext(chunks)
    except ViewError as exc:
        raise FhirError.of(422, "processing", str(exc)) from None
    headers = {}
    if common.fmt == "parquet":
        name = view.name or "view"
        headers["Content-Disposition"] = \
            f'attachment; filename="{name}.{EXTENSIONS[common.fmt]}"'
    return StreamingResponse(_then(first, chunks), media_type=FORMATS[common.fmt],
                             headers=headers)


async def _given(resources: list[JSON]) -> AsyncIterator[list[bytes]]:
    yield [orjson.dumps(r) for r in resources]


async def _stored(caller: CallerFhir, resource_type: str, scope: Any
                  ) -> AsyncIterator[list[bytes]]:
    async for bodies, _position in pages(caller, resource_type, scope):
        yield bodies


async def _chunks(view: CompiledView, batches: AsyncIterator[list[bytes]], fmt: str,
                  header: bool, limit: int | None) -> AsyncIterator[bytes]:
    """The response's bytes: the format's opening, each page's rows, its closing."""
    writer = row_writer(fmt, view.columns, header=header)
    opening = writer.begin()
    left = limit
    async for bodies in batches:
        rows: list[Row] = []
        for body in bodies:
            rows += view.rows(orjson.loads(body))
            if left is not None and len(rows) >= left:
                break
        if left is not None:
            rows = rows[:left]
            left -= len(rows)
        chunk = writer.write(rows)
        if opening or chunk:
            yield opening + chunk
            opening = b""
        if left == 0:
            break
    yield opening + writer.end()


async def _then(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield first
    try:
        async for chunk in rest:
            yield chunk
    except ViewError as exc:
        # The status line has gone: the stream ends short, and the log says why.
        log.warning("$run stopped: %s", exc)
        raise
