"""Conversations and messages of an organization as FHIR Communication, pushed live to
the participants over server-sent events.

Mapping (/api → FHIR Communication):

- a **conversation** is a Communication (category ``urn:healthplatform:communication-
  category|conversation``, status in-progress): subject → ``topic.text``; participants
  → ``recipient[]`` (a member as a reference carrying their user identifier
  ``urn:healthplatform:user|<id>``, and their Practitioner when they have one; a patient
  as ``Patient/<id>``), the creator included; creator → ``sender``; created → ``sent``;
  the organization → owner label. A conversation with one patient also has them as
  ``subject``, so it is in the patient's compartment.
- a **message** is a Communication (category ``…|message``, status completed):
  ``partOf`` the conversation; text → ``payload[0].contentString``; author → ``sender``;
  the other participants → ``recipient[]``; ``sent``.

Who sees what: the policy decides who may read and write Communications (members whose
role has clinical or messaging rights; a patient in their own compartment), and the
area narrows it: **a member sees only the conversations they take part in** (lists
search ``recipient:identifier=urn:healthplatform:user|<id>``, or ``recipient=Patient/<own
record>`` for a patient participant; reading or posting in another conversation is
404), platform administrators see them all. Participants added to a conversation must be
members of the organization (422 otherwise) or patients the creator may see.

Live messages: ``GET /api/organizations/:org_id/conversations/:id/stream`` is a
``text/event-stream`` (server-sent events, keep-alive comments every 15 s): a ``ready``
event once the subscription holds, then one ``message`` event per new message (``id``:
the message id; ``data``: the message as the messages list shows it). A client that
reconnects with ``Last-Event-ID`` first receives the messages sent after that one. New
messages reach the stream through the event bus (``platform.messaging.message_sent``,
``message_id``, ``conversation_id``, ``organization_id``, ``sender``, ``sent``), so a
message written by any door of this process is pushed once its commit is relayed; with
a multi-process transport each process must receive every such event (a fan-out
subscription) to serve its own streams.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.sse import EventSourceResponse, ServerSentEvent
from pydantic import BaseModel, Field, model_validator

from fhir_server.access import AccessDenied
from fhir_server.caller import CallerFhir
from fhir_server.clock import now_instant
from platform_api.envelope import (
    ApiError,
    Envelope,
    PageEnvelope,
    Pagination,
    created,
    not_found,
    pagination,
)
from platform_api.events import Event
from platform_api.facade import (
    ApiContext,
    Facade,
    OrganizationScope,
    api_context,
    require_organization,
    require_patient,
    staged_body,
)
from platform_api.fhir_values import (
    local_id,
    reference,
    referenced_user,
    user_identifier,
    user_reference,
)
from platform_api.organizations.members import MEMBERS
from platform_api.policy.subject import USER_SYSTEM
from platform_api.services import Services

JSON = dict[str, Any]
CATEGORY_SYSTEM = "urn:healthplatform:communication-category"
MESSAGE_SENT = "platform.messaging.message_sent"
HUB = "message_hub"
QUEUE_SIZE = 256


class Participant(BaseModel):
    user_id: str | None = Field(default=None, max_length=64,
                                description="A member of the organization")
    patient_id: str | None = Field(default=None, max_length=64, description="A patient")

    @model_validator(mode="after")
    def _one(self) -> Participant:
        if (self.user_id is None) == (self.patient_id is None):
            raise ValueError("a participant is either a user_id or a patient_id")
        return self


class ConversationCreate(BaseModel):
    subject: str = Field(min_length=1, max_length=200, examples=["Amina Odhiambo: follow-up "
                                                                 "after discharge"])
    participants: list[Participant] = Field(min_length=1, max_length=50)
    message: str | None = Field(default=None, max_length=10_000,
                                description="A first message")


class ParticipantView(BaseModel):
    user_id: str | None = None
    patient_id: str | None = None
    name: str | None = None


class ConversationView(BaseModel):
    id: str
    subject: str | None
    participants: list[ParticipantView]
    created_by: str | None
    created_at: str | None
    status: str


class MessageCreate(BaseModel):
    text: str = Field(min_length=1, max_length=10_000,
                      examples=["Please bring the discharge summary to the clinic on Monday."])


class MessageView(BaseModel):
    id: str
    conversation_id: str | None
    text: str | None
    sender: ParticipantView
    sent_at: str | None


# -- mapping --------------------------------------------------------------------------------------
def _category(code: str) -> list[JSON]:
    return [{"coding": [{"system": CATEGORY_SYSTEM, "code": code}]}]


def participant_view(ref: JSON) -> JSON:
    return {"user_id": referenced_user(ref), "patient_id": local_id(ref, "Patient"),
            "name": ref.get("display")}


def conversation_view(conversation: JSON) -> JSON:
    return ConversationView.model_validate({
        "id": conversation["id"], "subject": (conversation.get("topic") or {}).get("text"),
        "participants": [participant_view(r) for r in conversation.get("recipient", [])],
        "created_by": referenced_user(conversation.get("sender")),
        "created_at": conversation.get("sent"), "status": conversation.get("status", "")}
    ).model_dump()


def message_view(message: JSON) -> JSON:
    return MessageView.model_validate({
        "id": message["id"],
        "conversation_id": local_id((message.get("partOf") or [{}])[0], "Communication"),
        "text": ((message.get("payload") or [{}])[0]).get("contentString"),
        "sender": participant_view(message.get("sender") or {}),
        "sent_at": message.get("sent")}).model_dump()


def _me(ctx: ApiContext, org_id: str) -> JSON:
    """The caller as a participant: a member by their user identifier, else their own
    Patient record."""
    subject = ctx.access.subject
    if subject.patient_id is not None and not ctx.may("organization.work-in", org_id):
        return reference("Patient", subject.patient_id, ctx.principal.email)
    practitioner = min(subject.practitioner_ids) if subject.practitioner_ids else None
    return user_reference(ctx.principal, practitioner)


def _same(a: JSON, b: JSON) -> bool:
    user = referenced_user(a)
    if user is not None:
        return user == referenced_user(b)
    return local_id(a, "Patient") is not None and local_id(a, "Patient") == local_id(b,
                                                                                  "Patient")


def takes_part(ctx: ApiContext, conversation: JSON) -> bool:
    me = _me(ctx, ctx.path["org_id"])
    return any(_same(me, r) for r in conversation.get("recipient", []))


def _participation(ctx: ApiContext, query: Any) -> list[tuple[str, str]]:
    """The conversations the caller takes part in (all of them for platform
    administrators)."""
    if ctx.may("conversation.read-any", ctx.path["org_id"]):
        return []
    me = _me(ctx, ctx.path["org_id"])
    if (user := referenced_user(me)) is not None:
        return [("recipient:identifier", f"{USER_SYSTEM}|{user}")]
    return [("recipient", str(me["reference"]))]


@dataclass
class ConversationScope(OrganizationScope):
    """An organization's conversations: for its members, and for patients who take part
    in them (their own record is a participant; checked per conversation)."""

    async def enter(self, ctx: ApiContext, value: str) -> None:
        if ctx.access.subject.patient_id is not None and \
                not ctx.may("organization.work-in", value):
            # A patient: which conversations they take part in is checked per conversation.
            if await ctx.fhir.find_json("Organization", value) is None:
                raise not_found("Organization")
            return
        await require_organization(ctx, value)



conversations = Facade(
    resource="Communication", name="Conversation", create=ConversationCreate,
    view=ConversationView, from_fhir=conversation_view,
    scope=ConversationScope(), fixed=[("category", f"{CATEGORY_SYSTEM}|conversation")],
    list_criteria=_participation, sort="-sent", tags=["messaging"],
    summaries={"list": "The conversations the caller takes part in"},
)
messages = Facade(
    resource="Communication", name="Message", create=MessageCreate, view=MessageView,
    from_fhir=message_view, scope=ConversationScope(),
    fixed=[("category", f"{CATEGORY_SYSTEM}|message")], sort="sent", tags=["messaging"],
)


async def _participant_refs(ctx: ApiContext, org_id: str, wanted: list[Participant]
                            ) -> list[JSON]:
    """References of the participants: members of the organization (by user id) or
    patients the caller may see; 422 naming the first that is neither."""
    refs: list[JSON] = []
    for n, person in enumerate(wanted):
        if person.user_id is not None:
            member = await ctx.services.store.get_document(MEMBERS, f"{org_id}:{person.user_id}")
            if member is None:
                raise ApiError(422, "VALIDATION_ERROR", f"participants.{n}.user_id: not a "
                               "member of this organization", field=f"participants.{n}.user_id")
            name = " ".join(p for p in (member.get("first_name"), member.get("last_name")) if p)
            practitioners = await ctx.fhir.match_ids("Practitioner", [(
                "identifier", f"{USER_SYSTEM}|{person.user_id}")], limit=1)
            ref: JSON = {"type": "Practitioner", "identifier": user_identifier(person.user_id),
                         "display": name or member.get("email") or person.user_id}
            if practitioners:
                ref["reference"] = f"Practitioner/{practitioners[0]}"
            refs.append(ref)
        else:
            assert person.patient_id is not None
            patient = await require_patient(ctx, person.patient_id)
            name = (patient.get("name") or [{}])[0]
            display = " ".join([*name.get("given", []), name.get("family", "")]).strip()
            refs.append(reference("Patient", person.patient_id, display or None))
    return refs


def _message(conversation: JSON, sender: JSON, text: str, org_id: str) -> JSON:
    message: JSON = {
        "resourceType": "Communication", "status": "completed",
        "category": _category("message"),
        "partOf": [reference("Communication", conversation["id"])], "sent": now_instant(),
        "sender": sender, "payload": [{"contentString": text}],
        "recipient": [r for r in conversation.get("recipient", []) if not _same(r, sender)]
        or [sender]}
    if conversation.get("subject"):
        message["subject"] = conversation["subject"]
    return OrganizationScope().stamp(message, org_id)


def _sent_event(message: JSON, conversation_id: str, org_id: str) -> JSON:
    return {"message_id": message["id"], "conversation_id": conversation_id,
            "organization_id": org_id, "sender": participant_view(message["sender"]),
            "sent": message["sent"]}


# -- routes ---------------------------------------------------------------------------------------
router = APIRouter(tags=["messaging"])
CONVERSATIONS = "/api/organizations/{org_id}/conversations"


@router.post(CONVERSATIONS, status_code=201, response_model=Envelope[ConversationView],
             summary="Start a conversation with members and patients (and a first message)")
async def start_conversation(org_id: str, body: ConversationCreate,
                             ctx: ApiContext = Depends(api_context)) -> Any:
    await require_organization(ctx, org_id)
    me = _me(ctx, org_id)
    others = await _participant_refs(ctx, org_id, body.participants)
    participants = [me, *(r for r in others if not _same(r, me))]
    conversation: JSON = OrganizationScope().stamp({
        "resourceType": "Communication", "status": "in-progress",
        "category": _category("conversation"), "topic": {"text": body.subject},
        "sent": now_instant(), "sender": me, "recipient": participants}, org_id)
    patients = [r for r in participants if local_id(r, "Patient")]
    if len(patients) == 1:
        conversation["subject"] = {"reference": patients[0]["reference"]}
    unit = ctx.unit()
    async with unit:
        staged = await unit.create(conversation, expected_type="Communication")
        if body.message:
            first = _message({**conversation, "id": staged.id}, me, body.message, org_id)
            sent = await unit.create(first, expected_type="Communication")
            unit.emit(MESSAGE_SENT, _sent_event({**first, "id": sent.id}, staged.id, org_id),
                      source_service="messaging")
        await unit.commit()
    return created(conversation_view(staged_body(staged)))


async def participating(ctx: ApiContext, conversation_id: str) -> JSON:
    """The conversation, when the caller takes part in it (404 otherwise: its existence
    is not theirs to know)."""
    try:
        conversation = await conversations.load(ctx, conversation_id)
    except AccessDenied:  # a patient asking about another patient's conversation
        raise not_found("Conversation") from None
    if not takes_part(ctx, conversation) and \
            not ctx.may("conversation.read-any", ctx.path["org_id"]):
        raise not_found("Conversation")
    return conversation


MESSAGES = CONVERSATIONS + "/{conversation_id}/messages"


@router.get(MESSAGES, response_model=PageEnvelope[MessageView],
            summary="The messages of a conversation the caller takes part in, oldest first")
async def list_messages(org_id: str, conversation_id: str,
                        page: Pagination = Depends(pagination),
                        ctx: ApiContext = Depends(api_context)) -> Any:
    await participating(ctx, conversation_id)
    found, total = await messages.search(ctx, page, [
        ("part-of", f"Communication/{conversation_id}")])
    return page.respond([message_view(m) for m in found], total)


@router.post(MESSAGES, status_code=201, response_model=Envelope[MessageView],
             summary="Send a message in a conversation (pushed to the participants' streams)")
async def send_message(org_id: str, conversation_id: str, body: MessageCreate,
                       ctx: ApiContext = Depends(api_context)) -> Any:
    conversation = await participating(ctx, conversation_id)
    message = _message(conversation, _me(ctx, org_id), body.text, org_id)
    unit = ctx.unit()
    async with unit:
        staged = await unit.create(message, expected_type="Communication")
        unit.emit(MESSAGE_SENT, _sent_event({**message, "id": staged.id}, conversation_id,
                                            org_id), source_service="messaging")
        await unit.commit()
    return created(message_view(staged_body(staged)))


conversations.mount(router, CONVERSATIONS, ops=("list",))


# -- live: server-sent events ---------------------------------------------------------------------
@dataclass
class MessageHub:
    """The streams open in this process, by conversation; fed by the bus."""

    services: Services
    _listeners: dict[str, set[asyncio.Queue[JSON]]] = field(default_factory=dict)
    _seen: dict[str, None] = field(default_factory=dict)  # event ids, oldest first
    _fhir: CallerFhir | None = None

    @property
    def fhir(self) -> CallerFhir:
        """The platform's rights, once per hub: the streams' listeners were checked to
        take part in their conversation before they listen (``participating``)."""
        if self._fhir is None:
            self._fhir = self.services.policy.elevate(
                "messaging streams: read each sent message to push it to its "
                "conversation's participants")
        return self._fhir

    @contextlib.contextmanager
    def listen(self, conversation_id: str) -> Iterator[asyncio.Queue[JSON]]:
        queue: asyncio.Queue[JSON] = asyncio.Queue(QUEUE_SIZE)
        self._listeners.setdefault(conversation_id, set()).add(queue)
        try:
            yield queue
        finally:
            listeners = self._listeners.get(conversation_id, set())
            listeners.discard(queue)
            if not listeners:
                self._listeners.pop(conversation_id, None)

    async def on_message_sent(self, event: Event) -> None:
        """Push a committed message to its conversation's streams (once per event id: the
        bus may deliver an event twice)."""
        if event["id"] in self._seen:
            return
        self._seen[event["id"]] = None
        if len(self._seen) > 10_000:
            self._seen.pop(next(iter(self._seen)))
        payload = event["payload"]
        listeners = self._listeners.get(payload.get("conversation_id", ""))
        if not listeners:
            return
        stored = await self.fhir.find_json("Communication", payload["message_id"])
        if stored is None:
            return
        view = message_view(stored)
        for queue in list(listeners):
            if queue.full():  # a client that stopped reading: it reconnects with
                continue      # Last-Event-ID and gets what it missed
            queue.put_nowait(view)


def message_hub(services: Services) -> MessageHub:
    hub = services.extras.get(HUB)
    if hub is None:
        hub = services.extras[HUB] = MessageHub(services)
    return hub  # type: ignore[no-any-return]


def start(services: Services) -> None:
    """At startup: feed the live streams from the bus."""
    services.bus.subscribe(MESSAGE_SENT, message_hub(services).on_message_sent)


async def _stream_access(org_id: str, conversation_id: str,
                         ctx: ApiContext = Depends(api_context)) -> ApiContext:
    """Checked before the stream starts, so a refusal is a plain 403/404 answer."""
    await participating(ctx, conversation_id)
    return ctx


async def _missed(ctx: ApiContext, conversation_id: str, last_id: str) -> list[JSON]:
    last = await ctx.fhir.find_json("Communication", last_id)
    if last is None or not last.get("sent"):
        return []
    return await ctx.fhir.search("Communication", [
        ("part-of", f"Communication/{conversation_id}"), ("sent", f"gt{last['sent']}"),
        ("_sort", "sent")])


@router.get(CONVERSATIONS + "/{conversation_id}/stream", response_class=EventSourceResponse,
            summary="New messages of a conversation, live (server-sent events)",
            responses={200: {"content": {"text/event-stream": {}},
                             "description": "`ready`, then one `message` event per message"}})
async def stream_messages(request: Request, conversation_id: str,
                          ctx: ApiContext = Depends(_stream_access)
                          ) -> AsyncIterator[ServerSentEvent]:
    hub = message_hub(ctx.services)
    with hub.listen(conversation_id) as queue:
        yield ServerSentEvent(event="ready", data={"conversation_id": conversation_id},
                              retry=3000)
        last_id = request.headers.get("last-event-id")
        replayed: set[str] = set()
        if last_id:
            for missed in await _missed(ctx, conversation_id, last_id):
                replayed.add(missed["id"])
                yield ServerSentEvent(event="message", id=missed["id"],
                                      data=message_view(missed))
        while True:
            view = await queue.get()
            if view["id"] not in replayed:  # sent while the missed ones were read
                yield ServerSentEvent(event="message", id=view["id"], data=view)
