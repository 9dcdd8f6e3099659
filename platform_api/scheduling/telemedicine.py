"""Telemedicine: a video visit for a booked appointment, through the video platform's
server API (:mod:`platform_api.scheduling.video`), recorded as the visit's Encounter.

Mapping (/api field → FHIR Encounter, the *session*):

    session_id     → Encounter.id
    appointment_id → appointment[0] (Appointment/<id>)
    room_name      → identifier[system urn:healthplatform:telemedicine-room].value
    (virtual)      → class = http://terminology.hl7.org/CodeSystem/v3-ActCode|VR
    status         → status: planned (room made) → in-progress (room started or someone
                     joined) → finished (room finished or the session ended)
    started_at, ended_at → period.start / period.end
    participants   → participant[]: one entry per stay in the room, with period (joined
                     → left) and the identity in extension
                     urn:healthplatform:extension:video-identity; the doctor's entries name
                     the Practitioner (individual, type PPRF), the patient's are typed
                     PART (Encounter.participant cannot name a Patient: the patient is
                     Encounter.subject)
    patient        → subject (Patient/<id>); the resource → participant (doctor) or
                     location; serviceProvider and owner label → the organization

Join identities are ``Practitioner/<id>`` and ``Patient/<id>``. ``initiate`` creates
the room and the Encounter (a second call while it is open answers the same session with
fresh tokens: staff get the doctor's and the patient's token, the patient their own);
``status`` and ``participants`` read the Encounter, which the video platform's webhook
keeps current: the events issue publishes its events on the bus as
``platform.video.<event>`` and :func:`on_video_event` applies them (once per event id);
``participants`` also asks the platform who is in the room now. ``end`` closes the room,
finishes the Encounter and fulfils the appointment. Events
``platform.scheduling.telemedicine_started`` and ``..._ended``.

Who (the policy's ``appointment.join-video``; ending: ``appointment.change``): the
appointment's organization's staff who update its scheduling resources, and the
appointment's patient (initiate, status, participants); ending is for staff. A booking
whose patient is not confirmed yet (made without signing in) has no video visit (409
``PATIENT_NOT_CONFIRMED``): the visit's Encounter names its Patient. The Encounter a
patient's ``initiate`` creates and the one ``end`` finishes are written through named
elevations (a patient may not write Encounters, nor the staff a patient's own record);
the video platform's events are applied with rights elevated once, when their handler is
subscribed.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import orjson
from fastapi import APIRouter
from pydantic import BaseModel, Field

from fhir_server.caller import CallerFhir
from fhir_server.store import DuplicateDocument
from platform_api.envelope import conflict, not_found
from platform_api.facade import Facade, ItemContext
from platform_api.scheduling.appointments import (
    STATUS_TABLE,
    actor_of,
    authorize,
    contact_of,
    patient_of,
)
from platform_api.scheduling.common import (
    ATTEMPTS,
    EXTENSION,
    JSON,
    RACE_ERRORS,
    SOURCE,
    instant,
    local_id,
    now_utc,
    organization_of,
    owned_by,
    parse_instant,
    version_of,
)
from platform_api.scheduling.video import video_platform
from platform_api.services import Services

log = logging.getLogger("healthplatform.scheduling")

ROOM_SYSTEM = "urn:healthplatform:telemedicine-room"
IDENTITY_EXTENSION = EXTENSION + "video-identity"
V3_ACT = "http://terminology.hl7.org/CodeSystem/v3-ActCode"
PARTICIPATION = "http://terminology.hl7.org/CodeSystem/v3-ParticipationType"
VIRTUAL = {"system": V3_ACT, "code": "VR", "display": "virtual"}
DOCTOR_TYPE = [{"coding": [{"system": PARTICIPATION, "code": "PPRF",
                            "display": "primary performer"}]}]
PATIENT_TYPE = [{"coding": [{"system": PARTICIPATION, "code": "PART",
                             "display": "Participation"}], "text": "patient"}]
VIDEO_EVENTS = "video_events"  # ids of the platform.video events applied (idempotence)
STARTED = "platform.scheduling.telemedicine_started"
ENDED = "platform.scheduling.telemedicine_ended"
JOINABLE = frozenset({"booked", "arrived", "checked-in"})
OPEN = "planned,in-progress,arrived,triaged,onleave"


class ParticipantView(BaseModel):
    identity: str
    role: str = Field(description="doctor | patient | other")
    reference: str | None = None
    joined_at: str | None = None
    left_at: str | None = None
    connected: bool | None = Field(default=None, description="In the room now (the "
                                   "platform's answer; null when not asked)")


class SessionView(BaseModel):
    session_id: str
    appointment_id: str | None = None
    room_name: str
    status: str
    video_url: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    doctor_token: str | None = Field(default=None, description="Join token of the doctor "
                                     "(staff only)")
    patient_token: str | None = None
    participants: list[ParticipantView] = []


# -- the Encounter ----------------------------------------------------------------------------
def room_of(encounter: JSON) -> str:
    return next((i.get("value", "") for i in encounter.get("identifier") or []
                 if i.get("system") == ROOM_SYSTEM), "")


def identity_of(entry: JSON) -> str | None:
    return next((e.get("valueString") for e in entry.get("extension") or []
                 if e.get("url") == IDENTITY_EXTENSION), None)


def _role(identity: str) -> str:
    kind = identity.split("/")[0]
    return {"Practitioner": "doctor", "Patient": "patient"}.get(kind, "other")


def participant_views(encounter: JSON) -> list[JSON]:
    views = []
    for entry in encounter.get("participant") or []:
        identity = identity_of(entry)
        if identity is None:
            continue
        period = entry.get("period") or {}
        views.append(ParticipantView(
            identity=identity, role=_role(identity),
            reference=(entry.get("individual") or {}).get("reference") or (
                identity if identity.startswith("Patient/") else None),
            joined_at=period.get("start"), left_at=period.get("end")).model_dump())
    return views


def session_view(encounter: JSON, **extra: Any) -> JSON:
    period = encounter.get("period") or {}
    return {**SessionView(
        session_id=encounter["id"],
        appointment_id=local_id((encounter.get("appointment") or [{}])[0], "Appointment"),
        room_name=room_of(encounter), status=encounter["status"],
        started_at=period.get("start"), ended_at=period.get("end")).model_dump(),
        "participants": participant_views(encounter), **extra}


def new_encounter(appointment: JSON, room: str) -> JSON:
    actor = actor_of(appointment)
    encounter: JSON = {
        "resourceType": "Encounter", "status": "planned", "class": VIRTUAL,
        "identifier": [{"system": ROOM_SYSTEM, "value": room}],
        "appointment": [{"reference": f"Appointment/{appointment['id']}"}],
        "subject": {"reference": patient_of(appointment).get("reference")}}
    if (actor.get("reference") or "").startswith("Practitioner/"):
        encounter["participant"] = [{"type": DOCTOR_TYPE, "individual": actor}]
    elif (actor.get("reference") or "").startswith("Location/"):
        encounter["location"] = [{"location": actor}]
    organization = organization_of(appointment)
    if organization:
        encounter["serviceProvider"] = {"reference": f"Organization/{organization}"}
    return owned_by(encounter, organization)


def _joined(encounter: JSON, identity: str, moment: str) -> None:
    entries = encounter.setdefault("participant", [])
    if any(identity_of(e) == identity and (e.get("period") or {}).get("start")
           and not (e.get("period") or {}).get("end") for e in entries):
        return  # already in the room (a repeated join)
    entry: JSON = {"type": PATIENT_TYPE if identity.startswith("Patient/") else DOCTOR_TYPE,
                   "period": {"start": moment},
                   "extension": [{"url": IDENTITY_EXTENSION, "valueString": identity}]}
    if identity.startswith("Practitioner/"):
        entry["individual"] = {"reference": identity}
    entries.append(entry)


def _left(encounter: JSON, identity: str | None, moment: str) -> None:
    for entry in encounter.get("participant") or []:
        period = entry.get("period") or {}
        if (identity is None or identity_of(entry) == identity) and period.get("start") \
                and not period.get("end"):
            period["end"] = max(moment, period["start"])


def _started(encounter: JSON, moment: str) -> None:
    if encounter["status"] == "planned":
        encounter["status"] = "in-progress"
    encounter.setdefault("period", {}).setdefault("start", moment)


def _finished(encounter: JSON, moment: str) -> None:
    if encounter["status"] == "finished":
        return
    _left(encounter, None, moment)
    encounter["status"] = "finished"
    period = encounter.setdefault("period", {})
    period.setdefault("start", moment)
    period["end"] = max(moment, period["start"])


def apply_video_event(encounter: JSON, kind: str, identity: str | None, moment: str
                      ) -> JSON:
    """The Encounter after one of the video platform's room events."""
    changed: JSON = orjson.loads(orjson.dumps(encounter))
    if changed["status"] == "finished":
        return changed
    if kind == "room_started":
        _started(changed, moment)
    elif kind == "participant_joined" and identity:
        _started(changed, moment)
        _joined(changed, identity, moment)
    elif kind == "participant_left" and identity:
        _left(changed, identity, moment)
    elif kind == "room_finished":
        _finished(changed, moment)
    return changed


def _moment(value: Any) -> str:
    """An event's ``created_at`` (Unix seconds, as LiveKit sends it, or ISO 8601)."""
    try:
        if isinstance(value, int | float) or (isinstance(value, str) and value.isdigit()):
            return instant(datetime.fromtimestamp(float(value), UTC))
        if isinstance(value, str) and value:
            return instant(parse_instant(value))
    except (ValueError, OverflowError, OSError):
        pass
    return instant(now_utc())


async def on_video_event(fhir: CallerFhir, event: JSON) -> None:
    """Apply a ``platform.video.*`` event to its session's Encounter, once per event id;
    events of rooms that are not video visits are none of ours. ``fhir``: the rights the
    handler was elevated to."""
    payload = event.get("payload") or {}
    room = payload.get("room_name")
    if not room:
        return
    event_id = str(payload.get("id") or event["id"])
    for _attempt in range(ATTEMPTS):
        found = await fhir.search("Encounter", [("identifier", f"{ROOM_SYSTEM}|{room}")])
        if not found:
            return
        encounter = found[0]
        kind = payload.get("event") or event["topic"].rsplit(".", 1)[-1]
        changed = apply_video_event(encounter, kind, payload.get("participant_identity"),
                                    _moment(payload.get("created_at")))
        try:
            async with fhir.unit() as unit:
                unit.insert_document(VIDEO_EVENTS, event_id, {
                    "id": event_id, "room_name": room, "event": kind,
                    "encounter_id": encounter["id"]})
                if changed != encounter:
                    await unit.update(changed, if_match=version_of(encounter))
                await unit.commit()
        except DuplicateDocument:
            return  # applied before: a redelivery
        except RACE_ERRORS:
            continue
        return
    raise RuntimeError(f"the Encounter of room {room} kept changing")


def subscribe_video_events(services: Services) -> None:
    # The video platform's events come from no caller: they are applied with rights
    # elevated once, here.
    fhir = services.policy.elevate("video events: record joins, departures and the end of "
                                   "a visit in its Encounter")

    async def handler(event: JSON) -> None:
        await on_video_event(fhir, event)
    services.bus.subscribe("platform.video.>", handler)


# -- routes -------------------------------------------------------------------------------------
def _is_staff(ctx: ItemContext[Any]) -> bool:
    """Whether the caller works the appointment (its doctor's token is theirs to get)."""
    return ctx.may("appointment.change", organization_of(ctx.resource))


async def open_session(fhir: CallerFhir, appointment_id: str) -> JSON | None:
    found = await fhir.search("Encounter", [
        ("appointment", f"Appointment/{appointment_id}"), ("class", f"{V3_ACT}|VR"),
        ("status", OPEN), ("_sort", "-_lastUpdated")])
    return found[0] if found else None


async def _session(ctx: ItemContext[Any]) -> JSON:
    """The session of the path, when it is the appointment's (404 otherwise); read as
    the caller (staff and the patient read the visit's Encounter)."""
    encounter = await ctx.fhir.find_json("Encounter", ctx.path["session_id"])
    if encounter is None or local_id((encounter.get("appointment") or [{}])[0],
                                     "Appointment") != ctx.id or not room_of(encounter):
        raise not_found("Telemedicine session")
    return encounter


def _may_join(ctx: ItemContext[Any]) -> None:
    authorize(ctx, "appointment.join-video", ctx.resource)


telemedicine = Facade(
    resource="Appointment", name="Appointment", create=SessionView, view=SessionView,
    to_fhir=lambda payload, ctx, existing: existing or {}, from_fhir=lambda view: view,
    tags=["scheduling"],
)
router = APIRouter(tags=["scheduling"])
telemedicine.mount(router, "/api/appointments", ops=())


@telemedicine.route("POST", "/{resource_id}/telemedicine/initiate", status_code=201,
                    summary="Start the video visit of a booked appointment: its room and "
                            "join tokens")
async def initiate(ctx: ItemContext[Any]) -> JSON:
    _may_join(ctx)
    appointment = ctx.resource
    if appointment["status"] not in JOINABLE:
        raise conflict("APPOINTMENT_NOT_BOOKED", f"A video visit needs a booked "
                       f"appointment (this one is {appointment['status']!r})")
    platform = video_platform(ctx.services)
    platform.require_configured()
    if contact_of(appointment) is not None:
        raise conflict("PATIENT_NOT_CONFIRMED", "Confirm whom this booking is for (POST "
                       "/api/appointments/{id}/confirm-patient) before its video visit")
    fhir = ctx.elevate("appointment.join-video: find or create the visit's Encounter")
    encounter = await open_session(fhir, ctx.id)
    if encounter is None:
        encounter = await _new_session(ctx, fhir, appointment)
    else:
        await platform.create_room(room_of(encounter), metadata=_room_metadata(appointment))
    room = room_of(encounter)
    patient = patient_of(appointment)
    tokens = {"patient_token": platform.join_token(room, patient.get("reference", ""),
                                                   patient.get("display"))}
    doctor = actor_of(appointment)
    if _is_staff(ctx) and (doctor.get("reference") or "").startswith("Practitioner/"):
        tokens["doctor_token"] = platform.join_token(room, doctor["reference"],
                                                     doctor.get("display"))
    return session_view(encounter, video_url=platform.join_url, **tokens)


def _room_metadata(appointment: JSON) -> str:
    return orjson.dumps({"appointment_id": appointment["id"],
                         "organization_id": organization_of(appointment)}).decode()


async def _new_session(ctx: ItemContext[Any], fhir: CallerFhir, appointment: JSON) -> JSON:
    """Create the room, then its Encounter; the room's name is the appointment's and the
    session's number, and the Encounter is created only if no other request created the
    same one first (conditional on the room identifier)."""
    earlier = await fhir.match_ids("Encounter", [
        ("appointment", f"Appointment/{appointment['id']}"), ("class", f"{V3_ACT}|VR")],
        limit=100)
    room = f"visit-{appointment['id']}-{len(earlier) + 1}"
    await video_platform(ctx.services).create_room(room, metadata=_room_metadata(appointment))
    async with fhir.unit() as unit:
        staged = await unit.create(new_encounter(appointment, room),
                                   if_none_exist=[("identifier", f"{ROOM_SYSTEM}|{room}")])
        unit.after_writes(lambda staging: None if staged.existing else staging.emit(
            STARTED, {"session_id": staged.result.id if staged.result else staged.id,
                      "appointment_id": appointment["id"], "room_name": room,
                      "organization_id": organization_of(appointment)},
            source_service=SOURCE))
        await unit.commit()
    assert staged.result is not None
    return orjson.loads(staged.result.body)  # type: ignore[no-any-return]


@telemedicine.route("GET", "/{resource_id}/telemedicine/status/{session_id}",
                    summary="A video visit's status, as the video platform's events left it")
async def status(ctx: ItemContext[Any]) -> JSON:
    _may_join(ctx)
    return session_view(await _session(ctx))


@telemedicine.route("GET", "/{resource_id}/telemedicine/{session_id}/participants",
                    summary="Who joined the video visit, and who is in the room now")
async def participants(ctx: ItemContext[Any]) -> JSON:
    _may_join(ctx)
    encounter = await _session(ctx)
    view = session_view(encounter)
    if encounter["status"] == "finished":
        return view
    live = await video_platform(ctx.services).list_participants(room_of(encounter))
    present = {p.identity: p for p in live or []}
    for item in view["participants"]:
        item["connected"] = item["identity"] in present and item["left_at"] is None
    recorded = {p["identity"] for p in view["participants"]}
    for person in present.values():
        if person.identity not in recorded:  # joined before the webhook told us
            view["participants"].append(ParticipantView(
                identity=person.identity, role=_role(person.identity),
                joined_at=person.joined_at, connected=True).model_dump())
    return view


@telemedicine.route("POST", "/{resource_id}/telemedicine/end/{session_id}",
                    summary="End the video visit: the room closes, the appointment is "
                            "fulfilled")
async def end(ctx: ItemContext[Any]) -> JSON:
    authorize(ctx, "appointment.change", ctx.resource)
    encounter = await _session(ctx)
    if encounter["status"] == "finished":
        return session_view(encounter)
    await video_platform(ctx.services).delete_room(room_of(encounter))
    # The visit's Encounter is in the patient's record, which the staff need not be able
    # to write (a patient with their own record, seen without a consent).
    fhir = ctx.elevate("appointment.change: finish the visit's Encounter, fulfil the "
                       "appointment")
    for _attempt in range(ATTEMPTS):
        current = await fhir.read_json("Encounter", encounter["id"])
        appointment = await fhir.read_json("Appointment", ctx.id)
        moment = instant(now_utc())
        finished = apply_video_event(current, "room_finished", None, moment)
        try:
            async with fhir.unit() as unit:
                await unit.update(finished, if_match=version_of(current))
                if "fulfilled" in STATUS_TABLE.moves.get(appointment["status"], ()):
                    await unit.update({**appointment, "status": "fulfilled"},
                                      if_match=version_of(appointment))
                unit.emit(ENDED, {"session_id": current["id"], "appointment_id": ctx.id,
                                  "room_name": room_of(current), "ended_at": moment,
                                  "ended_by": ctx.principal.user_id}, source_service=SOURCE)
                await unit.commit()
        except RACE_ERRORS:
            continue
        return session_view(finished)
    raise conflict("CONFLICT", "The session kept changing while it was being ended; retry")
