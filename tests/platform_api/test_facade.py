"""The facade kit: a facade declared with mappers gets CRUD routes with the envelope,
pagination and its access rule; status tables refuse moves they do not list."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from pydantic import BaseModel, Field

from platform_api.app import create_app
from platform_api.envelope import ApiError
from platform_api.facade import Access, Facade, MappingContext, StatusTable, platform_admin_only
from tests.conftest import make_admin, make_settings, register_and_login


class RoomCreate(BaseModel):
    name: str = Field(min_length=1)
    floor: str | None = None


class RoomView(RoomCreate):
    id: str
    status: str


def room_to_fhir(payload: dict, ctx: MappingContext, existing: dict | None) -> dict:
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


rooms = Facade(resource="Location", name="Room", create_model=RoomCreate, view_model=RoomView,
               to_fhir=room_to_fhir, from_fhir=room_from_fhir,
               access=Access(write=platform_admin_only))


@pytest.fixture
async def kit_client(tmp_path) -> Any:
    app = create_app(make_settings(tmp_path))
    app.include_router(rooms.routes("/api/test-rooms"))
    async with LifespanManager(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            yield app, client


async def test_generated_routes_do_crud_through_fhir(kit_client):
    app, client = kit_client
    admin = await make_admin(app, client)
    h = admin["headers"]
    created = await client.post("/api/test-rooms", json={"name": "Theatre 1", "floor": "2"},
                                headers=h)
    assert created.status_code == 201, created.text
    room = created.json()["data"]
    assert room == {"id": room["id"], "name": "Theatre 1", "floor": "2", "status": "active"}
    fhir = (await client.get(f"/fhir/Location/{room['id']}", headers=h)).json()
    assert fhir["name"] == "Theatre 1" and fhir["mode"] == "instance"
    await client.post("/api/test-rooms", json={"name": "Ward A"}, headers=h)
    listing = (await client.get("/api/test-rooms?limit=1&page=2", headers=h)).json()
    assert listing["meta"] == {"page": 2, "limit": 1, "total": 2} and len(listing["data"]) == 1
    updated = await client.put(f"/api/test-rooms/{room['id']}", json={"name": "Theatre One"},
                               headers=h)
    assert updated.json()["data"]["name"] == "Theatre One"
    assert updated.json()["data"]["floor"] == "2"
    deleted = await client.delete(f"/api/test-rooms/{room['id']}", headers=h)
    assert deleted.json()["data"] == {"id": room["id"], "deleted": True}
    gone = await client.get(f"/api/test-rooms/{room['id']}", headers=h)
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "NOT_FOUND"


async def test_generated_routes_enforce_access_and_validation(kit_client):
    _app, client = kit_client
    nurse = await register_and_login(client, first_name="Achieng", last_name="Otieno")
    refused = await client.post("/api/test-rooms", json={"name": "Ward B"},
                                headers=nurse["headers"])
    assert refused.status_code == 403
    assert (await client.get("/api/test-rooms")).status_code == 401
    invalid = await client.post("/api/test-rooms", json={"name": ""}, headers=nurse["headers"])
    assert invalid.status_code == 422 and invalid.json()["error"]["field"] == "name"


def test_status_table_allows_listed_moves_only():
    orders = StatusTable.of(draft=["active", "revoked"], active=["completed", "revoked"])
    orders.check("draft", "active")
    with pytest.raises(ApiError) as info:
        orders.check("completed", "active")
    assert info.value.status == 409 and info.value.code == "INVALID_TRANSITION"
    with pytest.raises(ApiError):
        orders.check("active", "draft")
