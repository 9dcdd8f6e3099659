"""The /api envelope on every kind of answer, errors included."""

from __future__ import annotations

import httpx
from asgi_lifespan import LifespanManager
from fastapi import APIRouter

from platform_api.app import create_app
from tests.conftest import make_settings


async def test_unknown_route_is_404_envelope(client):
    response = await client.get("/api/no-such-thing")
    assert response.status_code == 404
    assert response.json() == {"success": False,
                               "error": {"code": "NOT_FOUND", "message": "Route not found"}}


async def test_healthz_is_public(client):
    response = await client.get("/healthz")
    assert response.status_code == 200 and response.json()["status"] == "ok"


async def test_internal_error_leaks_no_stack_trace(tmp_path):
    app = create_app(make_settings(tmp_path))
    router = APIRouter()

    @router.get("/api/boom")
    async def boom() -> None:
        raise RuntimeError("secret database password is hunter2")

    app.include_router(router)
    async with LifespanManager(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            response = await client.get("/api/boom")
    assert response.status_code == 500
    assert response.json() == {"success": False, "error": {
        "code": "INTERNAL_ERROR", "message": "An internal error occurred"}}
    assert "hunter2" not in response.text


async def test_request_id_header_is_returned(client):
    response = await client.get("/healthz", headers={"X-Request-ID": "trace-123"})
    assert response.headers["x-request-id"] == "trace-123"
    assert len((await client.get("/healthz")).headers["x-request-id"]) >= 16


async def test_openapi_lists_routes_with_models(client):
    spec = (await client.get("/openapi.json")).json()
    assert "/api/patients" in spec["paths"] and "/api/auth/login" in spec["paths"]
    post = spec["paths"]["/api/patients"]["post"]
    assert "requestBody" in post and "201" in post["responses"]
    assert "PatientCreate" in spec["components"]["schemas"]
