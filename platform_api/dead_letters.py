"""Dead letter queue administration: ``/admin/dlq`` (spec: Events, Dead letter queue).

Entries are the ``dead_letters`` documents written by the event bus (a consumer failed
after its retries, or an event could not be decoded; ``consumer`` names the consumer that
failed) and by the HL7v2 gateway (topic ``platform.hl7.message_failed``: a message that
did not parse, was rejected for its header (AR: message type, version or processing id
this gateway does not take), or failed mapping or storage; the view shows its raw text,
type and control id). Retrying runs the entry's original event again in this process, by
the consumer that failed on it (or, for an entry naming none, by every consumer of its
topic here), through the same idempotency guard as a delivery, so a consumer that had
already handled the event does not handle it twice. Success removes the entry; a failure
keeps it, with the new error, ``retry_count`` one higher and ``last_retried_at``, and
answers 409 ``RETRY_FAILED``.

``alert`` in the depth report is raised when the queue is deeper than
``dlq_alert_depth`` or its oldest entry is older than ``dlq_alert_age_seconds``:
either means events are being lost to follow-up, not just delayed.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel

from fhir_server.clock import now_instant
from platform_api.auth.dependencies import require_platform_admin
from platform_api.auth.principal import Principal
from platform_api.envelope import (
    ApiError,
    Envelope,
    PageEnvelope,
    Pagination,
    not_found,
    ok,
    pagination,
)
from platform_api.events import DEAD_LETTERS
from platform_api.services import request_services

router = APIRouter(prefix="/admin/dlq", tags=["dead letters"])


class DeadLetterView(BaseModel):
    id: str
    event_id: str | None = None
    topic: str | None = None
    original_payload: str
    error: str
    created_at: str
    # HL7v2 messages (topic platform.hl7.message_failed): what was received, as text.
    raw_message: str | None = None
    message_type: str | None = None
    control_id: str | None = None
    consumer: str | None = None
    retry_count: int = 0
    last_retried_at: str | None = None


class DepthView(BaseModel):
    depth: int
    alert: bool
    oldest_event: str | None


class RetryView(BaseModel):
    id: str
    retried: bool


class DiscardView(BaseModel):
    id: str
    deleted: bool


def _view(entry: dict[str, Any]) -> dict[str, Any]:
    fields = {k: entry[k] for k in DeadLetterView.model_fields if entry.get(k) is not None}
    return DeadLetterView.model_validate(fields).model_dump()


@router.get("", response_model=PageEnvelope[DeadLetterView], summary="List failed events")
async def list_dead_letters(
    request: Request, page: Pagination = Depends(pagination),
    topic: str | None = Query(None, description="Only entries of this topic"),
    principal: Principal = Depends(require_platform_admin),
) -> Any:
    store = request_services(request).store
    where = {"topic": topic} if topic else None
    entries = await store.find_documents(DEAD_LETTERS, where, limit=page.limit,
                                         offset=page.offset, order_by="created_at")
    return page.respond([_view(e) for e in entries], await store.count_documents(DEAD_LETTERS,
                                                                                 where))


@router.get("/depth", response_model=Envelope[DepthView],
            summary="Queue depth, alert flag and oldest entry")
async def depth(request: Request, principal: Principal = Depends(require_platform_admin)
                ) -> Any:
    services = request_services(request)
    store = services.store
    count = await store.count_documents(DEAD_LETTERS)
    oldest = await store.find_documents(DEAD_LETTERS, limit=1, order_by="created_at")
    oldest_at = oldest[0]["created_at"] if oldest else None
    settings = services.settings
    too_old = False
    if oldest_at is not None:
        age = datetime.now(UTC) - datetime.fromisoformat(oldest_at.replace("Z", "+00:00"))
        too_old = age.total_seconds() > settings.dlq_alert_age_seconds
    alert = count > settings.dlq_alert_depth or too_old
    return ok({"depth": count, "alert": alert, "oldest_event": oldest_at})


@router.post("/{entry_id}/retry", response_model=Envelope[RetryView],
             summary="Run a failed event again by the consumer that failed on it")
async def retry(request: Request, entry_id: str,
                principal: Principal = Depends(require_platform_admin)) -> Any:
    services = request_services(request)
    store = services.store
    entry = await store.get_document(DEAD_LETTERS, entry_id)
    if entry is None:
        raise not_found("Dead letter")
    error = await services.bus.retry(entry["original_payload"], entry.get("consumer"))
    async with store.unit_of_work() as uow:
        if error is None:
            uow.delete_document(DEAD_LETTERS, entry_id)
        else:
            uow.put_document(DEAD_LETTERS, entry_id, {
                **entry, "error": error, "retry_count": int(entry.get("retry_count") or 0) + 1,
                "last_retried_at": now_instant()})
        await uow.commit()
    if error is not None:
        raise ApiError(409, "RETRY_FAILED", f"The event failed again: {error}")
    return ok({"id": entry_id, "retried": True})


@router.delete("/{entry_id}", response_model=Envelope[DiscardView],
               summary="Discard a dead letter permanently")
async def discard(request: Request, entry_id: str,
                  principal: Principal = Depends(require_platform_admin)) -> Any:
    store = request_services(request).store
    if await store.get_document(DEAD_LETTERS, entry_id) is None:
        raise not_found("Dead letter")
    async with store.unit_of_work() as uow:
        uow.delete_document(DEAD_LETTERS, entry_id)
        await uow.commit()
    return ok({"id": entry_id, "deleted": True})
