"""The facade kit: a facade declared with mappers, a scope, filters, a status table and
events gets its routes — lists are one FHIR search scoped to what the caller may see,
writes go through the access policy, refused moves are 409 INVALID_TRANSITION."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import APIRouter
from pydantic import BaseModel, Field

from fhir_server.access import SYSTEM
from fhir_server.caller import CallerFhir
from fhir_server.store import StoreError
from platform_api.app import create_app
from platform_api.envelope import ApiError, Pagination
from platform_api.facade import (
    ApiContext,
    Events,
    Facade,
    ItemContext,
    OrganizationScope,
    SearchParam,
    StatusTable,
    Unique,
    Write,
    _fixed_hold,
    create_unique,
    is_duplicate,
    search_page,
)
from platform_api.policy.roles import ORG_BILLING, ORG_NURSE
from tests.conftest import add_member, make_clinic_admin, make_settings, register_and_login

RoomStatus = Literal["active", "suspended", "inactive"]


class RoomCreate(BaseModel):
    name: str = Field(min_length=1, max_length=100)
    floor: str | None = None


class RoomView(RoomCreate):
    id: str
    status: str


class RoomQuery(BaseModel):
    status: Annotated[RoomStatus | None, SearchParam("status")] = None
    name: Annotated[str | None, SearchParam("name")] = None


def room_to_fhir(payload: dict, ctx: ApiContext, existing: dict | None) -> dict:
    location = dict(existing) if existing else {"resourceType": "Location", "status": "active",
                                                "mode": "instance"}
    location["name"] = payload.get("name", location.get("name"))
    if payload.get("floor"):
        location["description"] = f"Floor {payload['floor']}"
    return location


def room_from_fhir(location: dict) -> dict:
    floor = location.get("description", "").removeprefix("Floor ") or None
    return {"id": location["id"], "name": location["name"], "floor": floor,
            "status": location["status"]}


ROOM_STATUS = StatusTable.of(active=["suspended", "inactive"], suspended=["active", "inactive"],
                             inactive=[])
rooms = Facade(resource="Location", name="Room", create=RoomCreate, view=RoomView,
               query=RoomQuery, to_fhir=room_to_fhir, from_fhir=room_from_fhir,
               scope=OrganizationScope(), statuses=ROOM_STATUS, sort="name",
               events=Events(created="platform.test.room_created"), tags=["test rooms"])
router = APIRouter()
rooms.mount(router, "/api/test-orgs/{org_id}/rooms")
rooms.action("close", to="inactive", summary="Close a room", event="platform.test.room_closed")


class RoomStatusChange(BaseModel):
    status: RoomStatus
    reason: str | None = None


rooms.status_route(body=RoomStatusChange, summary="Change a room's status",
                   event="platform.test.room_status_changed",
                   change=lambda room, ctx: {**room, "description": ctx.body.reason}
                   if ctx.body.reason else room)


@rooms.route("POST", "/{resource_id}/rename", body=RoomCreate, summary="Rename a room")
async def rename(ctx: ItemContext[RoomCreate]) -> dict[str, Any]:
    assert ctx.body is not None
    return await ctx.save({**ctx.resource, "name": ctx.body.name})


# -- a facade whose writes bring a companion along, with a unique rule that may not apply,
# async list criteria and a date filter ----------------------------------------------------
changes: list[str] = []


class WardQuery(BaseModel):
    since: Annotated[datetime | None, SearchParam("_lastUpdated", "ge{}")] = None
    name: str | None = None


async def cleaning_service(write: Write) -> dict:
    """Each ward has its cleaning service (a HealthcareService at the ward), written,
    renamed and deleted with it in the same unit of work."""
    changes.append(write.change)
    service_id = f"cleaning-{write.resource['id']}"
    if write.change == "deleted":
        await write.unit.delete("HealthcareService", service_id)
        return write.resource
    service = {"resourceType": "HealthcareService", "id": service_id,
               "name": f"Cleaning of {write.resource['name']}",
               "location": [{"reference": f"Location/{write.resource['id']}"}]}
    await write.unit.update(service)
    return {**write.resource, "alias": ["cleaned daily"]}


async def named(ctx: ApiContext, query: WardQuery | None) -> list[tuple[str, str]]:
    if query is not None and query.name == "forbidden":
        raise ApiError(403, "FORBIDDEN", "not that one")
    return [("name", query.name)] if query is not None and query.name else []


def same_floor_name(location: dict) -> list[tuple[str, str]]:
    # Only a ward with a floor can clash; an unplaced one has nothing to compare.
    return [("name:exact", location["name"])] if location.get("description", "").startswith(
        "Floor") else []


wards = Facade(resource="Location", name="Ward", create=RoomCreate, view=RoomView,
               query=WardQuery, to_fhir=room_to_fhir, from_fhir=room_from_fhir,
               scope=OrganizationScope(), alongside=cleaning_service, list_criteria=named,
               unique=Unique(same_floor_name, "WARD_EXISTS", "Such a ward exists"),
               tags=["test wards"])
ward_router = APIRouter()
wards.mount(ward_router, "/api/test-orgs/{org_id}/wards")


ASSET_TAG = "urn:healthplatform:test-asset"


class AssetCreate(BaseModel):
    kind: Literal["room", "device"]
    name: str


class AssetView(AssetCreate):
    id: str


def asset_to_fhir(payload: dict, ctx: ApiContext, existing: dict | None) -> dict:
    tag = {"meta": {"tag": [{"system": ASSET_TAG, "code": payload["kind"]}]}}
    if payload["kind"] == "room":
        return {"resourceType": "Location", "name": payload["name"], **tag}
    return {"resourceType": "Device", "deviceName": [{"name": payload["name"],
                                                      "type": "user-friendly-name"}], **tag}


def asset_from_fhir(resource: dict) -> dict:
    name = resource.get("name") or resource["deviceName"][0]["name"]
    return {"id": resource["id"], "name": name,
            "kind": "room" if resource["resourceType"] == "Location" else "device"}


# A facade over two FHIR types (``also``), narrowed by a tag (``fixed``), with an item
# route naming a second path parameter.
assets = Facade(resource="Location", also=("Device",), name="Asset", create=AssetCreate,
                view=AssetView, to_fhir=asset_to_fhir, from_fhir=asset_from_fhir,
                scope=OrganizationScope(), fixed=[("_tag", ASSET_TAG + "|")])
assets.mount(router, "/api/test-orgs/{org_id}/assets", ops=("list", "create", "get", "delete"))


@assets.route("GET", "/{resource_id}/labels/{label}", summary="An asset with a label")
async def labelled(ctx: ItemContext[Any]) -> dict[str, Any]:
    return {**ctx.resource, "name": f"{asset_from_fhir(ctx.resource)['name']} "
            f"[{ctx.path['label']}]"}


WARD = "http://terminology.hl7.org/CodeSystem/v3-RoleCode|HU"


def ward_to_fhir(payload: dict, ctx: ApiContext, existing: dict | None) -> dict:
    system, code = WARD.split("|")
    return {"resourceType": "Location", "name": payload["name"],
            "type": [{"coding": [{"system": system, "code": code}]}]}


# A facade narrowed by a token search parameter of its type (``type``): a get checks it too.
hospital_units = Facade(
    resource="Location", name="Hospital unit", create=RoomCreate, view=AssetView,
    to_fhir=ward_to_fhir, from_fhir=lambda r: {"id": r["id"], "name": r["name"], "kind": "room"},
    scope=OrganizationScope(), fixed=[("type", WARD)])
hospital_units.mount(router, "/api/test-orgs/{org_id}/hospital-units", ops=("create", "get"))


@pytest.fixture
async def kit(tmp_path) -> Any:
    app = create_app(make_settings(tmp_path))
    app.include_router(router)
    app.include_router(ward_router)
    async with LifespanManager(app, startup_timeout=30):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            yield app, client


async def test_generated_routes_do_crud_through_fhir_owned_by_the_scope(kit):
    _app, client = kit
    admin = await make_clinic_admin(client)
    h, base = admin["headers"], f"/api/test-orgs/{admin['org_id']}/rooms"
    created = await client.post(base, json={"name": "Theatre 1", "floor": "2"}, headers=h)
    assert created.status_code == 201, created.text
    room = created.json()["data"]
    assert room == {"id": room["id"], "name": "Theatre 1", "floor": "2", "status": "active"}
    fhir = (await client.get(f"/fhir/Location/{room['id']}", headers=h)).json()
    assert fhir["name"] == "Theatre 1" and fhir["mode"] == "instance"
    assert {"system": "urn:healthplatform:organization", "code": admin["org_id"]} in fhir[
        "meta"]["security"]
    await client.post(base, json={"name": "Ward A"}, headers=h)
    listing = (await client.get(f"{base}?limit=1&page=2", headers=h)).json()
    assert listing["meta"] == {"page": 2, "limit": 1, "total": 2}
    assert [r["name"] for r in listing["data"]] == ["Ward A"]  # sorted by name
    updated = await client.put(f"{base}/{room['id']}", json={"name": "Theatre One"}, headers=h)
    assert updated.json()["data"]["name"] == "Theatre One"
    assert updated.json()["data"]["floor"] == "2"
    deleted = await client.delete(f"{base}/{room['id']}", headers=h)
    assert deleted.json()["data"] == {"id": room["id"], "deleted": True}
    gone = await client.get(f"{base}/{room['id']}", headers=h)
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "NOT_FOUND"


async def test_query_models_become_search_parameters(kit):
    _app, client = kit
    admin = await make_clinic_admin(client)
    h, base = admin["headers"], f"/api/test-orgs/{admin['org_id']}/rooms"
    ward = (await client.post(base, json={"name": "Ward B"}, headers=h)).json()["data"]
    await client.post(base, json={"name": "Pharmacy"}, headers=h)
    await client.post(f"{base}/{ward['id']}/close", headers=h)
    closed = (await client.get(f"{base}?status=inactive", headers=h)).json()
    assert [r["name"] for r in closed["data"]] == ["Ward B"] and closed["meta"]["total"] == 1
    named = (await client.get(f"{base}?name=pharm", headers=h)).json()
    assert [r["name"] for r in named["data"]] == ["Pharmacy"]
    bad = await client.get(f"{base}?status=demolished", headers=h)
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "VALIDATION_ERROR"


async def test_lists_and_gets_stay_inside_the_scope_and_the_callers_organizations(kit):
    app, client = kit
    kibera = await make_clinic_admin(client)
    mathare = await make_clinic_admin(client, name="Mathare North Health Centre")
    room = (await client.post(f"/api/test-orgs/{kibera['org_id']}/rooms",
                              json={"name": "Theatre 1"}, headers=kibera["headers"])
            ).json()["data"]
    # Another organization's administrator: refused at the scope, and cannot reach the
    # room through their own scope either.
    other = await client.get(f"/api/test-orgs/{kibera['org_id']}/rooms",
                             headers=mathare["headers"])
    assert other.status_code == 403 and other.json()["error"]["code"] == "FORBIDDEN"
    through_own = await client.get(f"/api/test-orgs/{mathare['org_id']}/rooms/{room['id']}",
                                   headers=mathare["headers"])
    assert through_own.status_code == 404
    mine = (await client.get(f"/api/test-orgs/{mathare['org_id']}/rooms",
                             headers=mathare["headers"])).json()
    assert mine["data"] == [] and mine["meta"]["total"] == 0
    # A member whose role cannot touch the directory: lists nothing, cannot create.
    clerk = await register_and_login(client, first_name="Baraka", last_name="Mwangi")
    await add_member(app, kibera["org_id"], clerk, ORG_BILLING)
    refused = await client.post(f"/api/test-orgs/{kibera['org_id']}/rooms",
                                json={"name": "Store"}, headers=clerk["headers"])
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "FORBIDDEN"


def recorded(app: Any, topic: str) -> list[dict[str, Any]]:
    """The events of ``topic`` the bus delivers from now on."""
    seen: list[dict[str, Any]] = []

    async def handler(event: dict[str, Any]) -> None:
        seen.append(event)
    app.state.services.bus.subscribe(topic, handler)
    return seen


async def test_status_actions_follow_the_table_and_emit_their_event(kit):
    app, client = kit
    closed_events = recorded(app, "platform.test.room_closed")
    admin = await make_clinic_admin(client)
    h, base = admin["headers"], f"/api/test-orgs/{admin['org_id']}/rooms"
    room = (await client.post(base, json={"name": "Ward C"}, headers=h)).json()["data"]
    closed = await client.post(f"{base}/{room['id']}/close", headers=h)
    assert closed.status_code == 200 and closed.json()["data"]["status"] == "inactive"
    again = await client.post(f"{base}/{room['id']}/close", headers=h)
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "INVALID_TRANSITION"
    await app.state.services.bus.drain()
    assert [e["payload"]["id"] for e in closed_events] == [room["id"]]


async def test_status_routes_move_to_the_bodys_status_through_the_table(kit):
    app, client = kit
    moved_events = recorded(app, "platform.test.room_status_changed")
    admin = await make_clinic_admin(client)
    h, base = admin["headers"], f"/api/test-orgs/{admin['org_id']}/rooms"
    room = (await client.post(base, json={"name": "Ward D"}, headers=h)).json()["data"]
    moved = await client.put(f"{base}/{room['id']}/status",
                             json={"status": "suspended", "reason": "Floor 3"}, headers=h)
    assert moved.status_code == 200, moved.text
    assert moved.json()["data"]["status"] == "suspended"
    assert moved.json()["data"]["floor"] == "3"  # the change hook ran before the save
    await client.put(f"{base}/{room['id']}/status", json={"status": "inactive"}, headers=h)
    refused = await client.put(f"{base}/{room['id']}/status", json={"status": "active"},
                               headers=h)
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "INVALID_TRANSITION"
    unknown = await client.put(f"{base}/{room['id']}/status", json={"status": "burnt"},
                               headers=h)
    assert unknown.status_code == 422 and unknown.json()["error"]["field"] == "status"
    await app.state.services.bus.drain()
    assert [e["payload"]["status"] for e in moved_events] == ["suspended", "inactive"]


async def test_custom_item_routes_get_the_loaded_resource_and_save_through_the_policy(kit):
    app, client = kit
    admin = await make_clinic_admin(client)
    base = f"/api/test-orgs/{admin['org_id']}/rooms"
    room = (await client.post(base, json={"name": "Ward D"}, headers=admin["headers"])
            ).json()["data"]
    renamed = await client.post(f"{base}/{room['id']}/rename", json={"name": "Ward Delta"},
                                headers=admin["headers"])
    assert renamed.status_code == 200 and renamed.json()["data"]["name"] == "Ward Delta"
    nurse = await register_and_login(client, first_name="Achieng", last_name="Otieno")
    await add_member(app, admin["org_id"], nurse, ORG_NURSE)
    read = await client.get(f"{base}/{room['id']}", headers=nurse["headers"])
    assert read.status_code == 200  # the directory is everyone's to read
    refused = await client.post(f"{base}/{room['id']}/rename", json={"name": "Mine"},
                                headers=nurse["headers"])
    assert refused.status_code == 403


async def test_creates_answer_from_the_commit_and_emit_their_event(kit):
    app, client = kit
    created_events = recorded(app, "platform.test.room_created")
    admin = await make_clinic_admin(client)
    base = f"/api/test-orgs/{admin['org_id']}/rooms"
    created = (await client.post(base, json={"name": "Ward E"}, headers=admin["headers"])
               ).json()["data"]
    await app.state.services.bus.drain()
    assert [e["payload"] for e in created_events] == [created]
    history = await app.state.services.store.history("Location", created["id"])
    assert history.total == 1


async def test_generated_routes_validate_and_need_credentials(kit):
    _app, client = kit
    admin = await make_clinic_admin(client)
    base = f"/api/test-orgs/{admin['org_id']}/rooms"
    assert (await client.get(base)).status_code == 401
    invalid = await client.post(base, json={"name": ""}, headers=admin["headers"])
    assert invalid.status_code == 422 and invalid.json()["error"]["field"] == "name"
    deep = await client.get(f"{base}?page=600&limit=20", headers=admin["headers"])
    assert deep.status_code == 422 and deep.json()["error"]["field"] == "page"


async def test_the_openapi_document_shows_the_models_and_the_scope_parameter(kit):
    _app, client = kit
    spec = (await client.get("/openapi.json")).json()
    listing = spec["paths"]["/api/test-orgs/{org_id}/rooms"]["get"]
    names = {p["name"] for p in listing["parameters"]}
    assert {"org_id", "page", "limit", "status", "name"} <= names
    create = spec["paths"]["/api/test-orgs/{org_id}/rooms"]["post"]
    assert create["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "RoomCreate")
    assert "/api/test-orgs/{org_id}/rooms/{resource_id}/close" in spec["paths"]


def test_status_table_allows_listed_moves_only():
    orders = StatusTable.of(draft=["active", "revoked"], active=["completed", "revoked"])
    orders.check("draft", "active")
    with pytest.raises(ApiError) as info:
        orders.check("completed", "active")
    assert info.value.status == 409 and info.value.code == "INVALID_TRANSITION"
    with pytest.raises(ApiError):
        orders.check("active", "draft")
    assert orders.move({"status": "draft"}, "active") == {"status": "active"}


async def test_a_record_stored_with_a_wrongly_shaped_element_is_viewed_without_it(kit):
    """Records stored before validation caught their shape: the view shows what is sound
    (the list, the get) instead of answering 500."""
    app, client = kit
    admin = await make_clinic_admin(client)
    services = app.state.services
    legacy = {"resourceType": "Location", "id": "legacy-theatre", "name": "Theatre 2",
              "status": "active", "description": 2, "mode": ["instance"],
              "meta": {"security": [{"system": "urn:healthplatform:organization",
                                     "code": admin["org_id"]}]}}
    async with services.store.unit_of_work() as uow:
        uow.create("Location", legacy["id"], legacy, index=services.fhir.indexer(legacy))
        await uow.commit()
    base = f"/api/test-orgs/{admin['org_id']}/rooms"
    listed = await client.get(base, headers=admin["headers"])
    assert listed.status_code == 200, listed.text
    assert listed.json()["data"] == [{"id": "legacy-theatre", "name": "Theatre 2",
                                      "floor": None, "status": "active"}]
    got = await client.get(f"{base}/legacy-theatre", headers=admin["headers"])
    assert got.json()["data"]["name"] == "Theatre 2"


async def test_a_fault_of_the_view_itself_is_not_hidden():
    sound_but_unnamed = {"resourceType": "Location", "id": "l1", "status": "active"}
    with pytest.raises(KeyError):  # room_from_fhir needs a name the resource may lack
        await rooms.render(None, [sound_but_unnamed])  # type: ignore[arg-type]


async def test_alongside_stages_companions_with_every_write(kit):
    app, client = kit
    changes.clear()
    admin = await make_clinic_admin(client)
    h, base = admin["headers"], f"/api/test-orgs/{admin['org_id']}/wards"
    ward = (await client.post(base, json={"name": "Ward F"}, headers=h)).json()["data"]
    fhir = (await client.get(f"/fhir/Location/{ward['id']}", headers=h)).json()
    assert fhir["alias"] == ["cleaned daily"]  # the resource as alongside returned it
    service = (await client.get(f"/fhir/HealthcareService/cleaning-{ward['id']}", headers=h)
               ).json()
    assert service["name"] == "Cleaning of Ward F"
    await client.put(f"{base}/{ward['id']}", json={"name": "Ward Foxtrot"}, headers=h)
    service = (await client.get(f"/fhir/HealthcareService/cleaning-{ward['id']}", headers=h)
               ).json()
    assert service["name"] == "Cleaning of Ward Foxtrot"
    await client.delete(f"{base}/{ward['id']}", headers=h)
    gone = await client.get(f"/fhir/HealthcareService/cleaning-{ward['id']}", headers=h)
    assert gone.status_code == 410
    assert changes == ["created", "updated", "deleted"]
    # A companion the caller may not write fails the whole write.
    nurse = await register_and_login(client, first_name="Achieng", last_name="Otieno")
    await add_member(app, admin["org_id"], nurse, ORG_NURSE)
    refused = await client.post(base, json={"name": "Ward G"}, headers=nurse["headers"])
    assert refused.status_code == 403
    assert (await client.get(base, headers=h)).json()["meta"]["total"] == 0


async def test_unique_without_criteria_compares_nothing(kit):
    _app, client = kit
    admin = await make_clinic_admin(client)
    h, base = admin["headers"], f"/api/test-orgs/{admin['org_id']}/wards"
    for _ in range(2):  # no floor: nothing to compare by
        assert (await client.post(base, json={"name": "Annex"}, headers=h)).status_code == 201
    assert (await client.post(base, json={"name": "Maternity", "floor": "1"}, headers=h)
            ).status_code == 201
    clash = await client.post(base, json={"name": "Maternity", "floor": "1"}, headers=h)
    assert clash.status_code == 409 and clash.json()["error"]["code"] == "WARD_EXISTS"


async def test_list_criteria_may_be_async_and_date_filters_are_iso_8601(kit):
    _app, client = kit
    admin = await make_clinic_admin(client)
    h, base = admin["headers"], f"/api/test-orgs/{admin['org_id']}/wards"
    await client.post(base, json={"name": "Paediatrics"}, headers=h)
    await client.post(base, json={"name": "Theatre"}, headers=h)
    named_list = (await client.get(f"{base}?name=paed", headers=h)).json()
    assert [w["name"] for w in named_list["data"]] == ["Paediatrics"]
    refused = await client.get(f"{base}?name=forbidden", headers=h)
    assert refused.status_code == 403
    recent = (await client.get(f"{base}?since=2000-01-01T00:00:00Z", headers=h)).json()
    assert recent["meta"]["total"] == 2
    future = (await client.get(f"{base}?since=2999-01-01T00:00:00%2B03:00", headers=h)).json()
    assert future["meta"]["total"] == 0


def test_fixed_criteria_hold_on_categories_codes_and_statuses():
    panel = {"code": {"coding": [{"system": "http://loinc.org", "code": "85353-1"}]},
             "category": [{"coding": [{"code": "vital-signs"}]}], "status": "final"}
    assert _fixed_hold(panel, [("code", "http://loinc.org|85353-1")])
    assert not _fixed_hold(panel, [("code", "http://loinc.org|8867-4")])
    assert _fixed_hold(panel, [("category", "laboratory,vital-signs"),
                               ("status", "final,amended")])
    assert not _fixed_hold(panel, [("status", "preliminary")])


async def test_a_facade_spans_several_types_narrowed_by_a_tag(kit):
    _app, client = kit
    admin = await make_clinic_admin(client)
    h, base = admin["headers"], f"/api/test-orgs/{admin['org_id']}/assets"
    room = (await client.post(base, json={"kind": "room", "name": "Theatre 2"}, headers=h)
            ).json()["data"]
    scanner = (await client.post(base, json={"kind": "device", "name": "CT scanner"},
                                 headers=h)).json()["data"]
    listing = (await client.get(base, headers=h)).json()
    assert listing["meta"]["total"] == 2
    assert {a["name"] for a in listing["data"]} == {"Theatre 2", "CT scanner"}
    got = (await client.get(f"{base}/{scanner['id']}", headers=h)).json()["data"]
    assert got == {"id": scanner["id"], "name": "CT scanner", "kind": "device"}
    labelled = await client.get(f"{base}/{room['id']}/labels/sterile", headers=h)
    assert labelled.json()["data"]["name"] == "Theatre 2 [sterile]"
    # a Location of the organization without the tag is not an asset
    plain = (await client.post("/fhir/Location", headers=h, json={
        "resourceType": "Location", "name": "Corridor"})).json()
    assert (await client.get(f"{base}/{plain['id']}", headers=h)).status_code == 404
    assert (await client.get(base, headers=h)).json()["meta"]["total"] == 2
    deleted = await client.delete(f"{base}/{scanner['id']}", headers=h)
    assert deleted.status_code == 200
    assert (await client.get(f"/fhir/Device/{scanner['id']}", headers=h)).status_code == 410
    schema = (await client.get("/openapi.json")).json()
    params = schema["paths"]["/api/test-orgs/{org_id}/assets/{resource_id}/labels/{label}"][
        "get"]["parameters"]
    assert {p["name"] for p in params} == {"org_id", "resource_id", "label"}
async def test_search_page_is_one_page_with_its_includes_and_the_exact_total(kit):
    app, client = kit
    admin = await make_clinic_admin(client)
    base = f"/api/test-orgs/{admin['org_id']}/rooms"
    for name in ("Ward A", "Ward B", "Ward C"):
        await client.post(base, json={"name": name}, headers=admin["headers"])
    fhir = CallerFhir(app.state.services.fhir, SYSTEM)
    found = await search_page(fhir, "Location", [
        ("_sort", "name"), ("_include", "Location:organization")], Pagination(2, 2))
    assert [r["name"] for r in found.resources] == ["Ward C"] and found.total == 3
    assert found.included == []  # no managingOrganization on these
    with pytest.raises(ApiError) as deep:
        await search_page(fhir, "Location", [], Pagination(1000, 100))
    assert deep.value.field == "page"


async def test_create_unique_fails_the_whole_unit_when_a_match_exists(kit):
    app, _client = kit
    fhir = CallerFhir(app.state.services.fhir, SYSTEM)
    device = {"resourceType": "Device", "identifier": [{"system": "urn:test:asset",
                                                         "value": "ECG-7"}]}
    criteria = [("identifier", "urn:test:asset|ECG-7")]
    unit = fhir.unit()
    async with unit:
        first = await create_unique(unit, device, criteria)
        await unit.commit()
    assert first.created
    unit = fhir.unit()
    with pytest.raises(StoreError) as refused:
        async with unit:
            await create_unique(unit, device, criteria)
            note = await unit.create({"resourceType": "Basic", "code": {"text": "depends"}})
            await unit.commit()
    assert is_duplicate(refused.value)
    assert await app.state.services.fhir.find_json("Basic", note.id) is None  # rolled back


async def test_a_get_checks_fixed_token_criteria_of_the_type(kit):
    _app, client = kit
    admin = await make_clinic_admin(client)
    h, base = admin["headers"], f"/api/test-orgs/{admin['org_id']}/hospital-units"
    ward = (await client.post(base, json={"name": "Maternity"}, headers=h)).json()["data"]
    assert (await client.get(f"{base}/{ward['id']}", headers=h)).status_code == 200
    other = (await client.post("/fhir/Location", headers=h, json={
        "resourceType": "Location", "name": "Pharmacy store", "type": [{"coding": [{
            "system": "http://terminology.hl7.org/CodeSystem/v3-RoleCode",
            "code": "PHARM"}]}]})).json()
    assert (await client.get(f"{base}/{other['id']}", headers=h)).status_code == 404
