"""``POST /api/workforce/webhooks/leave-approved``: an external HR system's leave
approvals, signed the Standard Webhooks way with ``HEALTHPLATFORM_LEAVE_WEBHOOK_SECRET``
(:mod:`platform_api.webhooks.standard`).

The body is the leave approved, as the Organizations area emits it for approvals made in
the platform (coordination between areas)::

    {leave_request_id, organization_id, user_id, start, end, type, approved_by}

(``start``/``end`` ISO 8601 dates or date-times, ``end`` not before ``start``). Once
verified and checked it is published as ``platform.workforce.leave_approved`` with that
payload (dates as ISO 8601), for the workforce consumers that update rosters; the
``webhook-id`` guards against a redelivery. A body that is not such an approval is kept
as a dead letter naming the field.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field, ValidationError, model_validator

from platform_api.envelope import Envelope
from platform_api.services import request_services
from platform_api.webhooks.inbound import (
    PLATFORM_BODY,
    REFUSALS,
    Inbound,
    WebhookAck,
    accept,
    configured,
    dead_letter_body,
    parse_json,
    require_https,
)
from platform_api.webhooks.standard import verify_standard_webhook

FAMILY = "leave_approved"
TOPIC = "platform.workforce.leave_approved"

router = APIRouter(tags=["webhooks"])


class LeaveApproved(BaseModel):
    leave_request_id: str = Field(min_length=1, max_length=200)
    organization_id: str = Field(min_length=1, max_length=200)
    user_id: str = Field(min_length=1, max_length=200)
    start: date | datetime
    end: date | datetime
    type: str = Field(min_length=1, max_length=100, examples=["annual"])
    approved_by: str = Field(min_length=1, max_length=200)

    @model_validator(mode="after")
    def end_not_before_start(self) -> LeaveApproved:
        start, end = self.start, self.end
        if isinstance(start, datetime) and isinstance(end, datetime) and \
                (start.tzinfo is None) == (end.tzinfo is None):
            backwards = end < start
        else:  # a date and a date-time (or naive and aware): compare the days
            backwards = _day(end) < _day(start)
        if backwards:
            raise ValueError("end is before start")
        return self


def _day(value: date | datetime) -> date:
    return value.date() if isinstance(value, datetime) else value


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error.get("loc", ())) or "body"
    return f"{where}: {error['msg']}"


@router.post("/api/workforce/webhooks/leave-approved", response_model=Envelope[WebhookAck],
             responses=REFUSALS, openapi_extra=PLATFORM_BODY,
             summary="Leave approved in an external HR system (Standard Webhooks signature)")
async def leave_approved_webhook(request: Request) -> Any:
    require_https(request, FAMILY)
    services = request_services(request)
    secret = configured(services.settings.leave_webhook_secret, FAMILY, "LEAVE_WEBHOOK_SECRET")
    body = await request.body()
    webhook_id = verify_standard_webhook(request, body, secret, FAMILY)
    try:
        leave = LeaveApproved.model_validate(parse_json(body))
    except ValidationError as exc:
        return await dead_letter_body(services, FAMILY, body, _first_error(exc))
    except ValueError as exc:
        return await dead_letter_body(services, FAMILY, body, str(exc))
    return await accept(services, FAMILY, [Inbound(webhook_id, TOPIC,
                                                   leave.model_dump(mode="json"))])
