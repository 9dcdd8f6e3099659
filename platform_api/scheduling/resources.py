"""Schedulable resources: a doctor, a room or a piece of equipment is the FHIR actor a
Schedule can name (``Schedule.actor``), in its organization's directory.

Mapping (/api field → FHIR), by ``type`` (the table ``KINDS``):

    type = doctor     → Practitioner      type = room → Location (physicalType ro, mode
    type = equipment  → Device                          instance)
    name            → Practitioner.name[0].text (+ prefix/given/family split from it);
                      Location.name; Device.deviceName[type=user-friendly-name].name
    description     → Location.description; Device.note[0].text; Practitioner: extension
                      urn:healthplatform:extension:description (it has no such element)
    organization_id → owner label meta.security urn:healthplatform:organization|<id>
                      (+ Location.managingOrganization, Device.owner)
    time_zone       → extension urn:healthplatform:extension:time-zone (valueCode, IANA):
                      the zone availability days are read in
    active          → Practitioner.active; Location.status, Device.status active|inactive
    user_id         → Practitioner.identifier urn:healthplatform:user|<user id> (the
                      doctor's account, as every Practitioner of a user carries)
    (kind)          → meta.tag urn:healthplatform:scheduling-resource|<type>: what makes the
                      actor a schedulable resource (lists are one search on it, over the
                      three types)

``practitioner_id`` makes an existing Practitioner of the organization (a doctor's
profile) the resource instead of creating one. Deleting a resource retires it: the tag
goes, it becomes inactive, its Schedules and their future free Slots are deleted; the
actor itself stays, since past appointments name it. A resource with upcoming
appointments is not deleted (409 ``RESOURCE_HAS_APPOINTMENTS``).

Who: the directory is readable by every signed-in user (patients choose a doctor from
it); creating, changing and retiring resources is for those who write the organization's
directory (``ORG:ADMIN``, platform administrators: the policy's
``scheduling-resource.retire``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from fhir_server.caller import CallerFhir
from platform_api.envelope import ApiError, Envelope, conflict, created, not_found
from platform_api.facade import ApiContext, Facade, ItemContext, SearchParam, api_context
from platform_api.scheduling import slots
from platform_api.scheduling.common import (
    EXTENSION,
    JSON,
    RESOURCE_TAG,
    TIME_ZONE_EXTENSION,
    USER_SYSTEM,
    TimeZone,
    instant,
    now_utc,
    organization_of,
    owned_by,
    reference,
    tag_codes,
    version_of,
    with_tag,
)

Kind = Literal["doctor", "room", "equipment"]
DESCRIPTION_EXTENSION = EXTENSION + "description"
ROOM = {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/location-physical-type",
                    "code": "ro", "display": "Room"}]}
NAME_PREFIXES = frozenset({"dr", "dr.", "prof", "prof.", "mr", "mr.", "mrs", "mrs.", "ms",
                           "ms.", "sr", "sr."})
# Appointments that still hold a resource's time.
UPCOMING = "proposed,pending,booked,arrived,checked-in,waitlist"


@dataclass(frozen=True)
class KindMapping:
    fhir_type: str
    status_element: str  # "active" (boolean) or "status" (active | inactive)


KINDS: dict[str, KindMapping] = {
    "doctor": KindMapping("Practitioner", "active"),
    "room": KindMapping("Location", "status"),
    "equipment": KindMapping("Device", "status"),
}
FHIR_KINDS = {m.fhir_type: k for k, m in KINDS.items()}


class ResourceCreate(BaseModel):
    type: Kind = Field(examples=["doctor"])
    name: str = Field(min_length=1, max_length=200, examples=["Dr. Wanjiru Kamau"])
    organization_id: str = Field(min_length=1, max_length=64)
    time_zone: TimeZone = Field(default="UTC", examples=["Africa/Nairobi"],
                                description="IANA time zone of the resource")
    description: str | None = Field(default=None, max_length=2000,
                                    examples=["General practice, antenatal care"])
    user_id: str | None = Field(default=None, max_length=64,
                                description="Doctors: the doctor's user account")
    practitioner_id: str | None = Field(default=None, max_length=64,
                                        description="Doctors: an existing Practitioner of "
                                        "the organization to make schedulable")
    active: bool = True


class ResourceUpdate(BaseModel):
    name: str | None = Field(default=None, min_length=1, max_length=200)
    time_zone: TimeZone | None = None
    description: str | None = Field(default=None, max_length=2000)
    user_id: str | None = Field(default=None, max_length=64)
    active: bool | None = None


class ResourceView(BaseModel):
    id: str
    type: str
    name: str | None = None
    organization_id: str | None = None
    time_zone: str
    description: str | None = None
    user_id: str | None = None
    active: bool
    fhir_reference: str = Field(description="The FHIR actor, e.g. Practitioner/<id>")
    updated_at: str | None = None


class ResourceQuery(BaseModel):
    organization_id: Annotated[str | None, SearchParam(
        "_security", "urn:healthplatform:organization|{}")] = Field(None, max_length=64)
    type: Annotated[Kind | None, SearchParam("_tag", RESOURCE_TAG + "|{}")] = None


# -- mapping ------------------------------------------------------------------------------
def _copy(resource: JSON) -> JSON:
    return orjson.loads(orjson.dumps(resource))  # type: ignore[no-any-return]


def _set_extension(resource: JSON, url: str, value: JSON | None) -> None:
    kept = [e for e in resource.get("extension") or [] if e.get("url") != url]
    if value is not None:
        kept.append({"url": url, **value})
    if kept:
        resource["extension"] = kept
    else:
        resource.pop("extension", None)


def extension_value(resource: JSON, url: str, key: str) -> Any:
    return next((e.get(key) for e in resource.get("extension") or [] if e.get("url") == url),
                None)


def _human_name(text: str) -> JSON:
    words = text.split()
    prefix = [w for w in words[:1] if w.lower() in NAME_PREFIXES]
    rest = words[len(prefix):]
    name: JSON = {"use": "official", "text": text}
    if prefix:
        name["prefix"] = prefix
    if len(rest) > 1:
        name["given"], name["family"] = rest[:-1], rest[-1]
    elif rest:
        name["family"] = rest[0]
    return name


def _new_actor(kind: str, organization_id: str) -> JSON:
    fhir_type = KINDS[kind].fhir_type
    if fhir_type == "Location":
        return {"resourceType": "Location", "status": "active", "mode": "instance",
                "physicalType": ROOM,
                "managingOrganization": {"reference": f"Organization/{organization_id}"}}
    if fhir_type == "Device":
        return {"resourceType": "Device", "status": "active",
                "owner": {"reference": f"Organization/{organization_id}"}}
    return {"resourceType": "Practitioner", "active": True}


def _apply_name(actor: JSON, name: str) -> None:
    kind = actor["resourceType"]
    if kind == "Practitioner":
        actor["name"] = [_human_name(name)]
    elif kind == "Location":
        actor["name"] = name
    else:
        actor["deviceName"] = [{"name": name, "type": "user-friendly-name"}]


def _apply_description(actor: JSON, text: str | None) -> None:
    kind = actor["resourceType"]
    if kind == "Location":
        actor.pop("description", None)
        if text:
            actor["description"] = text
    elif kind == "Device":
        actor.pop("note", None)
        if text:
            actor["note"] = [{"text": text}]
    else:
        _set_extension(actor, DESCRIPTION_EXTENSION, {"valueString": text} if text else None)


def _apply_active(actor: JSON, active: bool) -> None:
    if actor["resourceType"] == "Practitioner":
        actor["active"] = active
    else:
        actor["status"] = "active" if active else "inactive"


def _apply_user(actor: JSON, user_id: str | None) -> None:
    if actor["resourceType"] != "Practitioner":
        return
    identifiers = [i for i in actor.get("identifier") or [] if i.get("system") != USER_SYSTEM]
    if user_id:
        identifiers.append({"system": USER_SYSTEM, "value": user_id})
    if identifiers:
        actor["identifier"] = identifiers
    else:
        actor.pop("identifier", None)


def resource_to_fhir(payload: JSON, ctx: ApiContext | None, existing: JSON | None) -> JSON:
    """The actor with the payload's fields; on update only the fields sent change."""
    if existing is None:
        actor = _new_actor(payload["type"], payload["organization_id"])
    else:
        actor = _copy(existing)
    if "type" in payload:
        actor = with_tag(owned_by(actor, payload["organization_id"]),
                         f"{RESOURCE_TAG}|{payload['type']}")
    if payload.get("name"):
        _apply_name(actor, payload["name"])
    if "description" in payload:
        _apply_description(actor, payload["description"])
    if payload.get("active") is not None:
        _apply_active(actor, payload["active"])
    if "user_id" in payload:
        _apply_user(actor, payload["user_id"])
    if payload.get("time_zone"):
        _set_extension(actor, TIME_ZONE_EXTENSION, {"valueCode": payload["time_zone"]})
    return actor


def display_name(actor: JSON) -> str | None:
    kind = actor.get("resourceType")
    if kind == "Practitioner":
        name = (actor.get("name") or [{}])[0]
        return name.get("text") or " ".join([*name.get("given", []), name.get("family", "")]
                                            ).strip() or None
    if kind == "Device":
        return (actor.get("deviceName") or [{}])[0].get("name")
    return actor.get("name")


def is_active(actor: JSON) -> bool:
    if actor.get("resourceType") == "Practitioner":
        return bool(actor.get("active", True))
    return actor.get("status", "active") == "active"


def time_zone_of(actor: JSON) -> str:
    return extension_value(actor, TIME_ZONE_EXTENSION, "valueCode") or "UTC"


def kind_of(actor: JSON) -> str:
    codes = tag_codes(actor, RESOURCE_TAG)
    return codes[0] if codes else FHIR_KINDS.get(actor.get("resourceType", ""), "doctor")


def resource_from_fhir(actor: JSON) -> JSON:
    kind = actor["resourceType"]
    description = (actor.get("description") if kind == "Location" else
                   (actor.get("note") or [{}])[0].get("text") if kind == "Device" else
                   extension_value(actor, DESCRIPTION_EXTENSION, "valueString"))
    user = next((i.get("value") for i in actor.get("identifier") or []
                 if i.get("system") == USER_SYSTEM), None)
    return ResourceView(
        id=actor["id"], type=kind_of(actor), name=display_name(actor),
        organization_id=organization_of(actor), time_zone=time_zone_of(actor),
        description=description, user_id=user, active=is_active(actor),
        fhir_reference=reference(actor), updated_at=(actor.get("meta") or {}).get(
            "lastUpdated"),
    ).model_dump()


resources = Facade(
    resource="Practitioner", also=("Location", "Device"), name="Resource",
    create=ResourceCreate, update=ResourceUpdate, view=ResourceView, query=ResourceQuery,
    to_fhir=resource_to_fhir, from_fhir=resource_from_fhir,
    fixed=[("_tag", RESOURCE_TAG + "|")], tags=["scheduling"],
    summaries={"list": "List schedulable resources (doctors, rooms, equipment)",
               "get": "A schedulable resource",
               "update": "Change a schedulable resource (only the fields sent change)"},
)


async def load_resource(ctx: ApiContext, resource_id: str) -> JSON:
    """A schedulable resource the caller may see (404 unknown or not schedulable)."""
    return await resources.load(ctx, resource_id)


async def find_resource(fhir: CallerFhir, resource_id: str) -> JSON | None:
    """A schedulable resource as ``fhir``'s caller sees it (the directory: every signed-in
    user; a public booking reads it with the rights it was elevated to)."""
    for fhir_type in FHIR_KINDS:
        found = await fhir.find_json(fhir_type, resource_id)
        if found is not None and tag_codes(found, RESOURCE_TAG):
            return found
    return None


router = APIRouter(tags=["scheduling"])


@router.post("/api/resources", status_code=201, response_model=Envelope[ResourceView],
             summary="Register a schedulable resource (doctor, room or equipment)")
async def create_resource(body: ResourceCreate, ctx: ApiContext = Depends(api_context)
                          ) -> Any:
    payload = body.model_dump(exclude_unset=True)
    payload.setdefault("type", body.type)
    payload.setdefault("time_zone", body.time_zone)
    practitioner_id = payload.pop("practitioner_id", None)
    if practitioner_id is None:
        stored = await resources.create_from(ctx, payload)
        return created(resources.from_fhir(stored))
    if body.type != "doctor":
        raise ApiError(422, "VALIDATION_ERROR", "practitioner_id is for doctors",
                       field="practitioner_id")
    current = await ctx.fhir.find_json("Practitioner", practitioner_id)
    if current is None:
        raise not_found("Practitioner")
    if tag_codes(current, RESOURCE_TAG):
        raise conflict("RESOURCE_EXISTS", "This practitioner is already a schedulable "
                       "resource")
    item: ItemContext[Any] = ItemContext(ctx.request, ctx.principal, ctx.services, ctx.access,
                                         ctx.fhir, None, current, None)
    saved = await item.save(resource_to_fhir(payload, ctx, current))
    return created(resources.from_fhir(saved))


resources.mount(router, "/api/resources", ops=("list", "get", "update"))


@resources.route("DELETE", "/{resource_id}", summary="Retire a schedulable resource "
                 "(its schedules and future free slots go; refused while appointments are "
                 "upcoming)")
async def delete_resource(ctx: ItemContext[Any]) -> JSON:
    actor = ctx.resource
    ctx.authorize("scheduling-resource.retire", organization_of(actor))
    # The organization's administrators write its directory and its scheduling resources
    # (the role table): the retirement is theirs to write, with their own rights.
    upcoming = await ctx.fhir.match_ids("Appointment", [
        ("actor", reference(actor)), ("date", f"ge{instant(now_utc())}"),
        ("status", UPCOMING)], limit=1)
    if upcoming:
        raise conflict("RESOURCE_HAS_APPOINTMENTS", "The resource has upcoming "
                       "appointments; cancel or reschedule them first")
    retired = with_tag(_copy(actor), f"{RESOURCE_TAG}|{kind_of(actor)}", present=False)
    _apply_active(retired, False)
    return await slots.retire_actor(ctx.fhir, actor, retired, version_of(actor))
