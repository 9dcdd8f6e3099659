"""``$viewdefinition-export`` (SQL on FHIR v2 ViewDefinitionExport): views' rows to files,
asynchronously, on the Bulk Data export jobs (:mod:`fhir_server.bulk.jobs`: one export per
client at a time, resumed after a restart, files kept for the retention period).

- ``POST [base]/ViewDefinition/$viewdefinition-export`` and
  ``POST [base]/$viewdefinition-export`` with ``Prefer: respond-async`` and a
  ``Parameters`` body: one or more ``view`` (parts ``name``, and ``viewReference`` or
  ``viewResource``), ``_format`` (``ndjson`` default, ``csv``, ``json``, ``parquet``),
  ``header``, ``_since``, ``patient``, ``group``, ``clientTrackingId``. Every view is
  checked before anything starts (all the problems in one OperationOutcome); a view of a
  type the caller may never search is a 403. **202** with ``Content-Location`` (the status
  URL) and a Parameters body (``exportId``, ``status`` accepted, ``location``).
- ``GET [base]/$viewdefinition-export-status/[id]``: **202** (``X-Progress``,
  ``Retry-After``, Parameters ``status`` in-progress) while it runs, then **303 See Other**
  to the result URL (completed or failed); ``DELETE`` cancels it and removes its files.
- ``GET [base]/$viewdefinition-export-result/[id]``: **200** Parameters (``exportId``,
  ``clientTrackingId``, ``status``, ``_format``, ``exportStartTime``, ``exportEndTime``,
  ``exportDuration``, and per view an ``output`` with its ``name`` and each file's
  ``location``), with ``Expires``; a failed export **500** with an OperationOutcome.
- Files: ``GET [base]/$export-file/[id]/[file]``, as ``$export``'s.

Status, result and files are the exporting client's only (404 for anyone else).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from fhir_server.access import SEARCH, may_touch_type
from fhir_server.bulk.jobs import COMPLETED, FAILED, expires_header, retry_after
from fhir_server.bulk.view_exporter import ExportedView, ViewExportRequest, is_view_export
from fhir_server.caller import CallerFhir
from fhir_server.http import FhirResponse, read_json_body
from fhir_server.interactions.context import FhirContext
from fhir_server.interactions.export import bulk_jobs
from fhir_server.outcome import FhirError, Issue
from fhir_server.views.definition import SQL_NAME, CompiledView
from fhir_server.views.request import (
    Common,
    Param,
    body_params,
    inline_view,
    query_params,
    reference,
    referenced_view,
    resource,
    stored_compiled,
    text,
    unknown,
)
from fhir_server.views.source import Scope, resolve_scope

OPERATION = "$viewdefinition-export"
JSON = dict[str, Any]


async def export_views(ctx: FhirContext, request: Request) -> Response:
    jobs = bulk_jobs(ctx)
    if "respond-async" not in request.headers.get("prefer", ""):
        raise FhirError.of(400, "required", f"{OPERATION} runs asynchronously: send "
                           "'Prefer: respond-async'", "Prefer")
    params = [*query_params(list(request.query_params.multi_items())),
              *body_params(await read_json_body(request), f"A POST {OPERATION}")]
    common, tracking, views = Common(), None, []
    for param in params:
        if common.take(param):
            continue
        if param.name == "view":
            views.append(param)
        elif param.name == "clientTrackingId":
            tracking = text(param)
        else:
            raise unknown(param, OPERATION)
    if not views:
        raise FhirError.of(400, "required", "At least one view parameter is required",
                           "view")
    caller = ctx.caller(request)
    exported = await _views(caller, views)
    scope = Scope(common.since)
    for resource_type in sorted({compiled.resource for compiled, _ in exported}):
        scope = await resolve_scope(caller, resource_type, common.since, common.patients,
                                    common.groups)
    export = ViewExportRequest(str(request.url), tuple(v for _, v in exported),
                               common.fmt or "ndjson", common.header, scope.since,
                               scope.patients, tracking)
    job_id = await jobs.kick_off(caller, export)
    status_url = f"{ctx.fhir_base(request)}/$viewdefinition-export-status/{job_id}"
    body = _parameters([("exportId", "valueString", job_id),
                        ("clientTrackingId", "valueString", tracking),
                        ("status", "valueCode", "accepted"),
                        ("location", "valueUri", status_url)])
    return FhirResponse(body, status_code=202, headers={"Content-Location": status_url})


async def _views(caller: CallerFhir, views: list[Param]) -> list[tuple[CompiledView,
                                                                       ExportedView]]:
    """Each ``view`` parameter resolved and compiled, all checked before one fails."""
    issues: list[Issue] = []
    found: list[tuple[CompiledView, ExportedView]] = []
    names: set[str] = set()
    for i, param in enumerate(views):
        try:
            compiled, view = await _view(caller, param)
            name = _name(param) or compiled.name or f"view{i + 1}"
            if not SQL_NAME.match(name) or name in names:
                raise FhirError.of(400, "invalid", f"Output name {name!r}: each view needs "
                                   "its own name of letters, digits and _", param.where)
            if not may_touch_type(caller.access, SEARCH, compiled.resource):
                raise FhirError.of(403, "forbidden", f"{caller.access.describe().capitalize()} "
                                   f"may not search {compiled.resource} resources",
                                   param.where)
            names.add(name)
            found.append((compiled, ExportedView(name, view)))
        except FhirError as exc:
            if len(views) == 1:
                raise
            issues += exc.issues
    if issues:
        raise FhirError(400, issues)
    return found


async def _view(caller: CallerFhir, param: Param) -> tuple[CompiledView, JSON]:
    references = [p for p in param.parts if p.name == "viewReference"]
    inline = [p for p in param.parts if p.name == "viewResource"]
    for part in param.parts:
        if part.name not in ("name", "viewReference", "viewResource"):
            raise unknown(part, f"{OPERATION} view")
    if len(references) + len(inline) != 1:
        raise FhirError.of(400, "required", "Each view needs one viewReference or one "
                           "viewResource", param.where)
    if inline:
        view = resource(inline[0], "ViewDefinition")
        return inline_view(view, inline[0].where), view
    view = await referenced_view(caller, reference(references[0]), references[0].where)
    return stored_compiled(view, references[0].where), view


def _name(param: Param) -> str | None:
    return next((text(p) for p in param.parts if p.name == "name"), None)


def _parameters(entries: list[tuple[str, str, Any]]) -> JSON:
    return {"resourceType": "Parameters", "parameter": [
        {"name": name, kind: value} for name, kind, value in entries if value is not None]}


async def _view_job(ctx: FhirContext, request: Request, job_id: str) -> JSON:
    job = await bulk_jobs(ctx).job(ctx.caller(request), job_id)
    if not is_view_export(job["request"]):
        raise FhirError.of(404, "not-found", f"No view export {job_id!r} of yours")
    return job


async def export_status(ctx: FhirContext, request: Request, job_id: str) -> Response:
    job = await _view_job(ctx, request, job_id)
    if job["status"] in (COMPLETED, FAILED):
        result = f"{ctx.fhir_base(request)}/$viewdefinition-export-result/{job_id}"
        return Response(status_code=303, headers={"Location": result})
    progress = job["progress"]
    return FhirResponse(
        _parameters([("exportId", "valueString", job_id),
                     ("status", "valueCode", "in-progress")]),
        status_code=202, headers={
            "X-Progress": f"{progress.get('exported', 0)} rows exported (view "
                          f"{min(progress.get('view', 0) + 1, progress.get('steps') or 1)} "
                          f"of {progress.get('steps') or '?'})",
            "Retry-After": str(retry_after(job))})


async def cancel_export(ctx: FhirContext, request: Request, job_id: str) -> Response:
    await _view_job(ctx, request, job_id)
    await bulk_jobs(ctx).cancel(ctx.caller(request), job_id)
    return Response(status_code=202)


async def export_result(ctx: FhirContext, request: Request, job_id: str) -> Response:
    job = await _view_job(ctx, request, job_id)
    if job["status"] == FAILED:
        raise FhirError.of(500, "exception", f"Export failed: {job['error'] or 'see logs'}")
    if job["status"] != COMPLETED:
        return await export_status(ctx, request, job_id)
    asked = ViewExportRequest.from_json(job["request"])
    base = ctx.fhir_base(request)
    files = job["progress"]["files"]
    started: float = job["created"]
    ended: float = job.get("finished") or started
    outputs = []
    for view in asked.views:
        locations = [{"name": "location",
                      "valueUri": f"{base}/$export-file/{job_id}/{file}"}
                     for file in sorted(files, key=_part_order) if files[file]["view"] ==
                     view.name]
        outputs.append({"name": "output", "part": [
            {"name": "name", "valueString": view.name}, *locations]})
    body = _parameters([
        ("exportId", "valueString", job_id),
        ("clientTrackingId", "valueString", asked.client_tracking_id),
        ("status", "valueCode", "completed"), ("_format", "valueCode", asked.format),
        ("exportStartTime", "valueInstant", _instant(started)),
        ("exportEndTime", "valueInstant", _instant(ended)),
        ("exportDuration", "valueInteger", max(0, round(ended - started)))])
    body["parameter"] += outputs
    return FhirResponse(body, headers={"Expires": expires_header(job)})


def _part_order(file: str) -> tuple[str, int]:
    stem, _, rest = file.partition(".part")
    number = rest.split(".", 1)[0]
    return stem, int(number) if number.isdigit() else 0


def _instant(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds").replace(
        "+00:00", "Z")
