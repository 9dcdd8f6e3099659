"""Dead letter queue administration: ``/admin/dlq`` (spec: Events, Dead letter queue).

Entries are the ``dead_letters`` documents written by the event bus (a handler failed or
an event could not be decoded) and by the HL7v2 gateway (topic
``platform.hl7.message_failed``: a message that did not parse, was rejected for its header
(AR: message type, version or processing id this gateway does not take), or failed mapping
or storage; the view shows its raw text, type and control id). Retrying re-delivers the
entry's original event through the bus, so whichever handler owns the topic processes it
again; an entry that fails again is replaced by the new failure, so one failed event is
one entry.

``alert`` in the depth report is raised when the queue is deeper than
``dlq_alert_depth`` or its oldest entry is older than ``dlq_alert_age_seconds``:
either means events are being lost to follow-up, not just delayed.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel

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
    fields = {k: entry.get(k) for k in DeadLetterView.model_fields}
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
             summary="Re-deliver a failed event to its handlers")
async def retry(request: Request, entry_id: str,
                principal: Principal = Depends(require_platform_admin)) -> Any:
    services = request_services(request)
    entry = await services.store.get_document(DEAD_LETTERS, entry_id)
    if entry is None:
        raise not_found("Dead letter")
    # The old entry goes either way: on failure the bus has written the new failure.
    succeeded = await services.bus.deliver_raw(entry["original_payload"])
    async with services.store.unit_of_work() as uow:
        uow.delete_document(DEAD_LETTERS, entry_id)
        await uow.commit()
    if not succeeded:
        latest = await services.store.find_documents(
            DEAD_LETTERS, {"event_id": entry.get("event_id")}, limit=1, order_by="created_at",
            descending=True)
        detail = latest[0]["error"] if latest else "the handler failed again"
        raise ApiError(409, "RETRY_FAILED", f"The event failed again: {detail}")
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
