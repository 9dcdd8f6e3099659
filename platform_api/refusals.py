"""Refusals rendered outside FastAPI's exception handlers (the pure ASGI middlewares).

The same rule as the app's handlers: under ``/fhir`` a FHIR OperationOutcome, elsewhere
the /api envelope, with the status, code, message and headers of the ``ApiError``.
"""

from __future__ import annotations

from starlette.responses import Response

from fhir_server.http import error_response as fhir_error_response
from fhir_server.outcome import FhirError
from platform_api.envelope import ApiError, error_response

# OperationOutcome.issue.code (http://hl7.org/fhir/issue-type) per HTTP status.
_FHIR_ISSUE_CODES = {400: "invalid", 401: "login", 403: "forbidden", 413: "too-costly",
                     429: "throttled"}


def is_fhir_path(path: str) -> bool:
    return path == "/fhir" or path.startswith("/fhir/")


def refusal_response(path: str, error: ApiError) -> Response:
    if is_fhir_path(path):
        code = _FHIR_ISSUE_CODES.get(error.status, "processing")
        return fhir_error_response(FhirError.of(error.status, code, error.message,
                                                headers=error.headers))
    return error_response(error.status, error.code, error.message, field=error.field,
                          headers=error.headers)
