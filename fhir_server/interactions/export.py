"""Bulk Data export (FHIR Bulk Data Access IG 2.0): kick-off, status, files, cancel.

- ``GET|POST [base]/$export``, ``[base]/Patient/$export``, ``[base]/Group/[id]/$export``
  (parameters: :mod:`fhir_server.bulk.request`) need ``Prefer: respond-async`` and
  answer **202** with ``Content-Location``: the job's status URL. A client with an export
  still running gets **429** with ``Retry-After``.
- ``GET [base]/$export-status/[job]``: **202** with ``X-Progress`` and ``Retry-After``
  while it runs; **200** with the manifest once complete (``transactionTime``,
  ``request``, ``requiresAccessToken``, ``output`` per type with ``count``, ``error``)
  and ``Expires``; a failed export answers **500** with an OperationOutcome saying why.
  ``DELETE`` on it cancels the export and removes its files (**202**).
- ``GET [base]/$export-file/[job]/[Type].ndjson``: one output file
  (``application/fhir+ndjson``).

Status and files are the exporting client's only: any other caller gets 404, as for an
export that does not exist. The jobs themselves are :class:`~fhir_server.bulk.jobs.BulkExports`,
which the app passes in the context's extras (``BULK_EXPORTS``); without it the operation
is 501.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import FileResponse, Response

from fhir_server.bulk.exporter import ERRORS, check_filters, check_requested_types, file_name
from fhir_server.bulk.jobs import COMPLETED, FAILED, BulkExports, expires_header, retry_after
from fhir_server.bulk.request import (
    GROUP,
    NDJSON,
    PATIENT,
    SYSTEM,
    parse_request,
)
from fhir_server.http import FhirResponse, check_format, parameter_values, read_json_body
from fhir_server.interactions.context import FhirContext
from fhir_server.outcome import FhirError, information
from fhir_server.validation import resource_types

BULK_EXPORTS = "bulk_exports"


async def export_system(ctx: FhirContext, request: Request) -> Response:
    return await _kick_off(ctx, request, SYSTEM)


async def export_patients(ctx: FhirContext, request: Request) -> Response:
    return await _kick_off(ctx, request, PATIENT)


async def export_group(ctx: FhirContext, request: Request, group_id: str) -> Response:
    return await _kick_off(ctx, request, GROUP, group_id)


async def _kick_off(ctx: FhirContext, request: Request, level: str,
                    group_id: str | None = None) -> Response:
    check_format(request)
    jobs = bulk_jobs(ctx)
    prefer = request.headers.get("prefer", "")
    if "respond-async" not in prefer:
        raise FhirError.of(400, "required", "$export runs asynchronously: send "
                           "'Prefer: respond-async'", "Prefer")
    if request.method == "POST":
        params = parameter_values(await read_json_body(request), "A POST $export")
    else:
        params = list(request.query_params.multi_items())
    caller = ctx.caller(request)
    level_types = None
    if level != SYSTEM:
        registry = await ctx.service.refresh_registry()
        level_types = frozenset({"Patient", *registry.compartment_types("Patient")})
    export = parse_request(params, level=level, url=str(request.url),
                           known_types=frozenset(resource_types()), level_types=level_types,
                           group_id=group_id, strict="handling=strict" in prefer)
    check_requested_types(caller, export)
    await check_filters(ctx.service, export)
    if group_id is not None:
        await caller.read("Group", group_id)  # 404 unknown, 403 not the caller's
    job_id = await jobs.kick_off(caller, export)
    return FhirResponse(information("The export has started; poll Content-Location"),
                        status_code=202, headers={
                            "Content-Location": _status_url(ctx, request, job_id)})


async def export_status(ctx: FhirContext, request: Request, job_id: str) -> Response:
    job = await bulk_jobs(ctx).job(ctx.caller(request), job_id)
    if job["status"] == FAILED:
        raise FhirError.of(500, "exception", job["error"] or "The export failed")
    if job["status"] != COMPLETED:
        progress = job["progress"]
        step = min(progress["step"] + 1, max(progress["steps"], 1))
        return Response(status_code=202, headers={
            "X-Progress": f"{progress['exported']} resources exported "
                          f"(step {step} of {progress['steps'] or '?'})",
            "Retry-After": str(retry_after(job))})
    base = ctx.fhir_base(request)
    files = job["progress"]["files"]

    def entry(resource_type: str) -> dict[str, object]:
        return {"type": "OperationOutcome" if resource_type == ERRORS else resource_type,
                "url": f"{base}/$export-file/{job_id}/{file_name(resource_type)}",
                "count": files[resource_type]["count"]}

    manifest = {
        "transactionTime": job["transaction_time"],
        "request": job["request"]["url"],
        "requiresAccessToken": True,
        "output": [entry(t) for t in sorted(files) if t != ERRORS and files[t]["count"]],
        "error": [entry(ERRORS)] if ERRORS in files else [],
    }
    return FhirResponse(manifest, media_type="application/json",
                        headers={"Expires": expires_header(job)})


async def cancel_export(ctx: FhirContext, request: Request, job_id: str) -> Response:
    await bulk_jobs(ctx).cancel(ctx.caller(request), job_id)
    return FhirResponse(information(f"Export {job_id} cancelled and its files removed"),
                        status_code=202)


async def export_file(ctx: FhirContext, request: Request, job_id: str, name: str
                      ) -> Response:
    path = await bulk_jobs(ctx).file(ctx.caller(request), job_id, name)
    return FileResponse(path, media_type=FILE_TYPES.get(path.suffix, NDJSON))


# A $viewdefinition-export's files are of the format asked; $export's are NDJSON.
FILE_TYPES = {".parquet": "application/vnd.apache.parquet", ".csv": "text/csv",
              ".json": "application/json", ".ndjson": NDJSON}


def bulk_jobs(ctx: FhirContext) -> BulkExports:
    jobs: BulkExports | None = ctx.extras.get(BULK_EXPORTS)
    if jobs is None:
        raise FhirError.of(501, "not-supported", "$export is not offered here")
    return jobs


def _status_url(ctx: FhirContext, request: Request, job_id: str) -> str:
    return f"{ctx.fhir_base(request)}/$export-status/{job_id}"
