"""Feedback on the platform and on the care received: ``/api/feedback``.

Feedback is what users think of the service (a category, a rating, a text), not a record
of anyone's care, so it is kept as platform documents (collection ``feedback``), as the
CDS Hooks feedback is, not as FHIR. Fields: ``id``, ``category``, ``rating`` (1-5),
``text``, ``organization_id`` (the organization it is about, if any), ``status``,
``resolution`` (the staff's note), ``user_id`` (None when anonymous), ``anonymous``,
``created_at``, ``updated_at``, ``triaged_by``, and for anonymous entries the text's
fingerprint (:mod:`.spam`).

Who sees what (the policy's ``feedback.read``, ``feedback.triage``, ``feedback.edit``):
a user their own; the ORG:ADMIN of an organization the feedback about it
(``?organization_id=``); platform administrators all. Triage (``PATCH`` with
``status``, ``resolution``) is for platform administrators and, for feedback about
their organization, its ORG:ADMIN; the author may change the category, rating and text
while it is still new. Status table: new → in-review | resolved | dismissed; in-review →
resolved | dismissed; resolved and dismissed → in-review (reopened); 409
``INVALID_TRANSITION`` otherwise.

``POST /api/feedback/anonymous`` (no credentials) stores no identity at all (no user, no
address); it is budgeted per client address by the access table's ``feedback`` rate
class (429 with ``Retry-After``) and refused when the spam checks find links, a text
sent again within a day, floods of one character or word, or a size out of bounds (422
``SPAM_REJECTED``).

Events ``platform.feedback.received`` and ``platform.feedback.updated`` (``feedback_id``,
``category``, ``rating``, ``organization_id``, ``anonymous``: never the text) and
``platform.feedback.status_changed`` (also ``status``, ``previous_status``,
``changed_by``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field

from fhir_server.caller import CallerFhir
from fhir_server.clock import now_instant
from fhir_server.ids import new_id
from platform_api.envelope import (
    ApiError,
    Envelope,
    ErrorEnvelope,
    PageEnvelope,
    Pagination,
    created,
    not_found,
    ok,
    pagination,
)
from platform_api.facade import ApiContext, StatusTable, api_context, conflict_responses
from platform_api.feedback.spam import (
    MAX_CHARS,
    REPEAT_WINDOW_SECONDS,
    fingerprint,
    spam_reason,
)
from platform_api.services import Services

JSON = dict[str, Any]
FEEDBACK = "feedback"
FINGERPRINTS = "feedback_fingerprints"
TOPIC = "platform.feedback."
Category = Literal["bug", "feature", "usability", "care", "billing", "other"]
FeedbackStatus = Literal["new", "in-review", "resolved", "dismissed"]
FEEDBACK_STATUS = StatusTable.of(new=("in-review", "resolved", "dismissed"),
                                 in_review=("resolved", "dismissed"),
                                 resolved=("in-review",), dismissed=("in-review",))


class FeedbackCreate(BaseModel):
    category: Category = Field(examples=["usability"])
    rating: int | None = Field(default=None, ge=1, le=5)
    text: str = Field(min_length=1, max_length=MAX_CHARS,
                      examples=["Booking a follow-up took three screens; one would do."])
    organization_id: str | None = Field(default=None, min_length=1, max_length=64,
                                        description="The organization it is about")


class FeedbackUpdate(BaseModel):
    category: Category | None = None
    rating: int | None = Field(default=None, ge=1, le=5)
    text: str | None = Field(default=None, min_length=1, max_length=MAX_CHARS)
    status: FeedbackStatus | None = None
    resolution: str | None = Field(default=None, max_length=2000)


class FeedbackView(BaseModel):
    id: str
    category: str
    rating: int | None = None
    text: str
    organization_id: str | None = None
    status: str
    resolution: str | None = None
    user_id: str | None = None
    anonymous: bool
    created_at: str
    updated_at: str
    triaged_by: str | None = None


class Received(BaseModel):
    id: str
    status: str
    created_at: str


def view(entry: JSON) -> JSON:
    return FeedbackView.model_validate(
        {k: entry.get(k) for k in FeedbackView.model_fields}).model_dump()


def _services(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


async def _organization_exists(fhir: CallerFhir, org_id: str | None) -> None:
    """404 naming the field unless ``org_id`` is an Organization (the directory: every
    signed-in user reads it)."""
    if org_id and await fhir.find_json("Organization", org_id) is None:
        raise ApiError(404, "NOT_FOUND", "Organization not found", field="organization_id")


async def _store(services: Services, entry: JSON, topic: str, payload: JSON,
                 fingertext_printof: str | None = None) -> None:
    async with services.store.unit_of_work() as uow:
        uow.put_document(FEEDBACK, entry["id"], entry)
        if fingertext_printof is not None:
            uow.put_document(FINGERPRINTS, fingertext_printof,
                             {"id": fingertext_printof, "seen_at": entry["updated_at"]})
        uow.emit(TOPIC + topic, payload, source_service="feedback")
        await uow.commit()


def _received(entry: JSON) -> JSON:
    return {"feedback_id": entry["id"], "category": entry["category"],
            "rating": entry.get("rating"), "organization_id": entry.get("organization_id"),
            "anonymous": entry["anonymous"]}


def _new_entry(body: FeedbackCreate, user_id: str | None) -> JSON:
    now = now_instant()
    return {"id": new_id(), "category": body.category, "rating": body.rating,
            "text": body.text.strip(), "organization_id": body.organization_id,
            "status": "new", "resolution": None, "user_id": user_id,
            "anonymous": user_id is None, "created_at": now, "updated_at": now,
            "triaged_by": None}


router = APIRouter(tags=["feedback"])


@router.post("/api/feedback", status_code=201, response_model=Envelope[FeedbackView],
             summary="Give feedback (category, rating, text)")
async def give_feedback(body: FeedbackCreate, ctx: ApiContext = Depends(api_context)) -> Any:
    await _organization_exists(ctx.fhir, body.organization_id)
    entry = _new_entry(body, ctx.principal.user_id)
    await _store(ctx.services, entry, "received", _received(entry))
    return created(view(entry))


@router.post("/api/feedback/anonymous", status_code=201, response_model=Envelope[Received],
             summary="Give feedback without signing in (no identity kept; rate limited, "
                     "spam refused)",
             responses={422: {"model": ErrorEnvelope, "description": "VALIDATION_ERROR, "
                                                                     "or SPAM_REJECTED "
                                                                     "naming the check"}})
async def give_anonymous_feedback(body: FeedbackCreate, request: Request) -> Any:
    services = _services(request)
    reason = spam_reason(body.text)
    text_print = fingerprint(body.text)
    if reason is None:
        seen = await services.store.get_document(FINGERPRINTS, text_print)
        if seen is not None and _within(seen["seen_at"], REPEAT_WINDOW_SECONDS):
            reason = "the same text was sent already"
    if reason is not None:
        raise ApiError(422, "SPAM_REJECTED", f"Refused as spam: {reason}", field="text")
    if body.organization_id:  # no caller to read the directory as: the platform looks
        await _organization_exists(services.policy.elevate(
            "feedback.anonymous: check the organization it is about exists"),
            body.organization_id)
    entry = {**_new_entry(body, None), "fingerprint": text_print}
    await _store(services, entry, "received", _received(entry), fingertext_printof=text_print)
    return created(Received(id=entry["id"], status="new",
                            created_at=entry["created_at"]).model_dump())


def _within(instant: str, seconds: int) -> bool:
    seen = datetime.fromisoformat(instant.replace("Z", "+00:00"))
    return datetime.now(UTC) - seen < timedelta(seconds=seconds)


# -- reading ------------------------------------------------------------------------------------
def _about(entry: JSON) -> str | None:
    org_id = entry.get("organization_id")
    return org_id if isinstance(org_id, str) else None


async def _load(ctx: ApiContext, feedback_id: str) -> JSON:
    entry = await ctx.services.store.get_document(FEEDBACK, feedback_id)
    if entry is None:
        raise not_found("Feedback")
    ctx.authorize("feedback.read", _about(entry), user_id=entry.get("user_id"))
    return entry


@router.get("/api/feedback", response_model=PageEnvelope[FeedbackView],
            summary="Feedback: your own; an organization's (its ORG:ADMIN); all "
                    "(platform administrators)")
async def list_feedback(
    ctx: ApiContext = Depends(api_context), page: Pagination = Depends(pagination),
    status: Annotated[FeedbackStatus | None, Query()] = None,
    category: Annotated[Category | None, Query()] = None,
    organization_id: Annotated[str | None, Query(max_length=64)] = None,
    mine: Annotated[bool, Query(description="Only your own, whoever you are")] = False,
) -> Any:
    where: JSON = {}
    if organization_id:
        where["organization_id"] = organization_id
    # Those who triage it see all of it (an organization's ORG:ADMIN, with its id; a
    # platform administrator, any); anyone else their own.
    if mine or not ctx.may("feedback.triage", organization_id):
        where["user_id"] = ctx.principal.user_id
    if status:
        where["status"] = status
    if category:
        where["category"] = category
    store = ctx.services.store
    found = await store.find_documents(FEEDBACK, where or None, limit=page.limit,
                                       offset=page.offset, order_by="created_at",
                                       descending=True)
    return page.respond([view(e) for e in found],
                        await store.count_documents(FEEDBACK, where or None))


@router.get("/api/feedback/{feedback_id}", response_model=Envelope[FeedbackView],
            summary="One feedback entry (yours, or one you triage)")
async def get_feedback(feedback_id: str, ctx: ApiContext = Depends(api_context)) -> Any:
    return ok(view(await _load(ctx, feedback_id)))


@router.patch("/api/feedback/{feedback_id}", response_model=Envelope[FeedbackView],
              summary="Triage feedback (staff: status, resolution) or edit your own while "
                      "it is new",
              responses=conflict_responses({"INVALID_TRANSITION": "the status table has no "
                                            "such move", "FEEDBACK_TRIAGED": "the author "
                                            "edits only feedback that is still new"}))
async def update_feedback(feedback_id: str, body: FeedbackUpdate,
                          ctx: ApiContext = Depends(api_context)) -> Any:
    entry = await _load(ctx, feedback_id)
    change = body.model_dump(exclude_unset=True)
    triage = {k: change.pop(k) for k in ("status", "resolution") if k in change}
    if triage:
        ctx.authorize("feedback.triage", _about(entry))
    if change:
        ctx.authorize("feedback.edit", user_id=entry.get("user_id"))
        if entry["status"] != "new":
            raise ApiError(409, "FEEDBACK_TRIAGED", "Feedback under review or closed "
                           "cannot be edited")
    previous = entry["status"]
    updated = {**entry, **{k: v for k, v in change.items() if v is not None}}
    if "resolution" in triage:
        updated["resolution"] = triage["resolution"]
    topic, payload = "updated", _received(updated)
    if triage.get("status") and triage["status"] != previous:
        updated = FEEDBACK_STATUS.move(updated, triage["status"])
        topic = "status_changed"
        payload = {**payload, "status": updated["status"], "previous_status": previous,
                   "changed_by": ctx.principal.user_id}
    if triage:
        updated["triaged_by"] = ctx.principal.user_id
    updated["updated_at"] = now_instant()
    await _store(ctx.services, updated, topic, payload)
    return ok(view(updated))


__all__ = ["FEEDBACK", "FINGERPRINTS", "FeedbackView", "router"]
