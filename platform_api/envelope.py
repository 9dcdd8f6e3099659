"""The /api response envelope, its error codes and pagination (spec: General conventions).

Success: ``{"success": true, "data": ..., "meta": {"page", "limit", "total"}}`` (``meta``
only on paginated lists). Failure: ``{"success": false, "error": {"code", "message"}}``
plus ``field`` for validation errors and ``details`` where a refusal has a list to show
(e.g. the drug interactions that stopped a prescription being signed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import orjson
from fastapi import Query
from pydantic import BaseModel
from starlette.responses import Response

T = TypeVar("T")

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
# No list pages deeper than 10,000 items (fhir_server.search.plan.MAX_OFFSET), so no page
# number beyond that can have items; a bound here keeps absurd numbers (beyond what the
# store's integers hold) from reaching a query: 422 naming ``page``.
MAX_PAGE = 10_000


class ErrorBody(BaseModel):
    code: str
    message: str
    field: str | None = None
    details: list[Any] | None = None


class Envelope(BaseModel, Generic[T]):
    success: bool = True
    data: T


class PageMeta(BaseModel):
    page: int
    limit: int
    total: int


class PageEnvelope(BaseModel, Generic[T]):
    success: bool = True
    data: list[T]
    meta: PageMeta


class ErrorEnvelope(BaseModel):
    success: bool = False
    error: ErrorBody


class ApiError(Exception):
    """An /api refusal: rendered as the error envelope with this status and code."""

    def __init__(self, status: int, code: str, message: str, *, field: str | None = None,
                 headers: dict[str, str] | None = None, details: list[Any] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field
        self.headers = headers or {}
        self.details = details


def not_found(what: str) -> ApiError:
    return ApiError(404, "NOT_FOUND", f"{what} not found")


def forbidden(message: str = "You do not have permission to do this") -> ApiError:
    return ApiError(403, "FORBIDDEN", message)


def unauthorized(message: str = "Authentication required") -> ApiError:
    return ApiError(401, "UNAUTHORIZED", message, headers={"WWW-Authenticate": "Bearer"})


def conflict(code: str, message: str) -> ApiError:
    return ApiError(409, code, message)


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def ok(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"success": True, "data": data}, status_code=status, headers=headers)


def created(data: Any, headers: dict[str, str] | None = None) -> JSONResponse:
    return ok(data, 201, headers)


def error_response(status: int, code: str, message: str, *, field: str | None = None,
                   headers: dict[str, str] | None = None, details: list[Any] | None = None
                   ) -> JSONResponse:
    error: dict[str, Any] = {"code": code, "message": message}
    if field is not None:
        error["field"] = field
    if details is not None:
        error["details"] = details
    return JSONResponse({"success": False, "error": error}, status_code=status, headers=headers)


@dataclass(frozen=True, slots=True)
class Pagination:
    page: int
    limit: int

    @property
    def offset(self) -> int:
        return (self.page - 1) * self.limit

    def respond(self, items: Sequence[Any], total: int) -> JSONResponse:
        return JSONResponse({
            "success": True,
            "data": list(items),
            "meta": {"page": self.page, "limit": self.limit, "total": total},
        })


def pagination(
    page: int = Query(1, ge=1, le=MAX_PAGE, description="Page number, from 1"),
    limit: int = Query(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT, description="Items per page"),
) -> Pagination:
    """FastAPI dependency for the spec's ``page``/``limit`` query parameters."""
    return Pagination(page, limit)
