"""Rooms and beds of an organization as FHIR Location.

Mapping (/api → FHIR Location), a room (or ward):
    name → Location.name
    kind → Location.physicalType (location-physical-type ``wa`` ward | ``ro`` room) and
           the tag ``urn:healthplatform:location-kind|<ward|room>`` (R4 has no search
           parameter on physicalType; the tag is what lists search)
    description → Location.description
    status → Location.status (active)
    (scope) → Location.managingOrganization and the owner label of the organization
    beds[] → one Location each: physicalType ``bd``, tag ``…location-kind|bed``,
             ``partOf`` the room, ``operationalStatus`` from v2 table 0116 (U unoccupied:
             ``free``; O occupied; H housekeeping; C closed; K contaminated; I isolated)

A room and its beds are created in one unit of work; the list shows each room with its
beds (one search for the page's beds: ``Location?partof=...``). Beds are occupied and
freed by admissions (:mod:`platform_api.organizations.admissions`), which move the bed's
``operationalStatus`` under ``If-Match``. Who may create rooms: whoever the policy lets
create Locations for the organization (its ``ORG:ADMIN``: Location is directory data);
every member may list them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field, field_validator

from fhir_server.ids import new_id
from platform_api.envelope import Envelope, created
from platform_api.facade import (
    ApiContext,
    Events,
    Facade,
    OrganizationScope,
    SearchParam,
    api_context,
    staged_body,
)
from platform_api.fhir_values import local_id

JSON = dict[str, Any]
KIND_TAG = "urn:healthplatform:location-kind"
PHYSICAL_TYPES = "http://terminology.hl7.org/CodeSystem/location-physical-type"
BED_STATUS_SYSTEM = "http://terminology.hl7.org/CodeSystem/v2-0116"
PHYSICAL = {"ward": ("wa", "Ward"), "room": ("ro", "Room"), "bed": ("bd", "Bed")}
# /api bed status ⇄ v2-0116 bed status
BED_STATUSES = {"free": ("U", "Unoccupied"), "occupied": ("O", "Occupied"),
                "housekeeping": ("H", "Housekeeping"), "closed": ("C", "Closed"),
                "contaminated": ("K", "Contaminated"), "isolated": ("I", "Isolated")}
BED_STATUS_OF_CODE = {code: status for status, (code, _) in BED_STATUSES.items()}
ROOM_CREATED = "platform.organization.room_created"
MAX_BEDS = 200
RoomKind = Literal["ward", "room"]


class RoomCreate(BaseModel):
    name: str = Field(min_length=1, max_length=100, examples=["Maternity Ward"])
    kind: RoomKind = "ward"
    description: str | None = Field(default=None, max_length=1000)
    beds: list[Annotated[str, Field(min_length=1, max_length=50)]] = Field(
        default_factory=list, max_length=MAX_BEDS, examples=[["M1", "M2", "M3"]],
        description="The names of the room's beds")

    @field_validator("beds")
    @classmethod
    def _unique(cls, beds: list[str]) -> list[str]:
        if len({b.strip().casefold() for b in beds}) != len(beds):
            raise ValueError("bed names must be unique in a room")
        return [b.strip() for b in beds]


class BedView(BaseModel):
    id: str
    name: str
    status: str


class RoomView(BaseModel):
    id: str
    name: str
    kind: str
    description: str | None = None
    status: str
    beds: list[BedView] = []
    beds_total: int = 0
    beds_free: int = 0
    updated_at: str | None = None


class RoomQuery(BaseModel):
    kind: Annotated[RoomKind | None, SearchParam("_tag", KIND_TAG + "|{}")] = None
    name: Annotated[str | None, SearchParam("name")] = Field(None, max_length=100)


def kind_of(location: JSON) -> str | None:
    for tag in (location.get("meta") or {}).get("tag") or []:
        if tag.get("system") == KIND_TAG:
            return tag.get("code")  # type: ignore[no-any-return]
    return None


def location_resource(name: str, kind: str, org_id: str, **elements: Any) -> JSON:
    code, display = PHYSICAL[kind]
    return {"resourceType": "Location", "status": "active", "name": name, "mode": "instance",
            "meta": {"tag": [{"system": KIND_TAG, "code": kind}]},
            "physicalType": {"coding": [{"system": PHYSICAL_TYPES, "code": code,
                                         "display": display}]},
            "managingOrganization": {"reference": f"Organization/{org_id}"}, **elements}


def with_bed_status(bed: JSON, status: str) -> JSON:
    code, display = BED_STATUSES[status]
    return {**bed, "operationalStatus": {"system": BED_STATUS_SYSTEM, "code": code,
                                         "display": display}}


def bed_status(bed: JSON) -> str:
    return BED_STATUS_OF_CODE.get((bed.get("operationalStatus") or {}).get("code", ""),
                                  "free")


def room_to_fhir(payload: JSON, ctx: ApiContext, existing: JSON | None) -> JSON:
    room = location_resource(payload["name"], payload.get("kind", "ward"), ctx.path["org_id"])
    if payload.get("description"):
        room["description"] = payload["description"]
    return room


def room_view(room: JSON, beds: list[JSON]) -> JSON:
    bed_views = [{"id": b["id"], "name": b.get("name", ""), "status": bed_status(b)}
                 for b in sorted(beds, key=lambda b: str(b.get("name", "")))]
    return RoomView(
        id=room["id"], name=room.get("name", ""), kind=kind_of(room) or "room",
        description=room.get("description"), status=room.get("status", "active"),
        beds=[BedView(**b) for b in bed_views], beds_total=len(bed_views),
        beds_free=sum(1 for b in bed_views if b["status"] == "free"),
        updated_at=(room.get("meta") or {}).get("lastUpdated"),
    ).model_dump()


async def room_views(ctx: ApiContext, rooms_found: list[JSON]) -> list[JSON]:
    """Each room with its beds: one search for the beds of the whole page."""
    if not rooms_found:
        return []
    beds = await ctx.fhir.search("Location", [
        ("partof", ",".join(f"Location/{r['id']}" for r in rooms_found)),
        ("_tag", f"{KIND_TAG}|bed")])
    by_room: dict[str, list[JSON]] = {}
    for bed in beds:
        by_room.setdefault(local_id(bed.get("partOf"), "Location") or "", []).append(bed)
    return [room_view(r, by_room.get(r["id"], [])) for r in rooms_found]


rooms = Facade(
    resource="Location", name="Room", create=RoomCreate, view=RoomView, query=RoomQuery,
    to_fhir=room_to_fhir, from_fhir=lambda r: room_view(r, []), views=room_views,
    scope=OrganizationScope(), fixed=[("_tag", f"{KIND_TAG}|ward,{KIND_TAG}|room")],
    sort="name", events=Events(created=ROOM_CREATED), tags=["organizations"],
    summaries={"list": "List an organization's rooms and wards, with their beds"},
)

router = APIRouter(tags=["organizations"])
ROOMS = "/api/organizations/{org_id}/rooms"


@router.post(ROOMS, status_code=201, response_model=Envelope[RoomView],
             summary="Create a room or ward with its beds")
async def create_room(org_id: str, body: RoomCreate,
                      ctx: ApiContext = Depends(api_context)) -> Any:
    await rooms.enter(ctx)
    scope = OrganizationScope()
    room = scope.stamp({**room_to_fhir(body.model_dump(), ctx, None), "id": new_id()},
                       org_id)
    beds = [scope.stamp(with_bed_status(location_resource(
        name, "bed", org_id, partOf={"reference": f"Location/{room['id']}",
                                     "display": body.name}), "free"), org_id)
        for name in body.beds]
    unit = ctx.unit()
    async with unit:
        stored_room = await unit.create(room, resource_id=room["id"], expected_type="Location")
        stored_beds = [await unit.create(bed, expected_type="Location") for bed in beds]
        unit.emit(ROOM_CREATED, {"organization_id": org_id, "room_id": room["id"],
                                 "name": body.name, "kind": body.kind,
                                 "beds": [s.id for s in stored_beds]},
                  source_service="organizations")
        await unit.commit()
    return created(room_view(staged_body(stored_room), [staged_body(s) for s in stored_beds]))


rooms.mount(router, ROOMS, ops=("list",))
