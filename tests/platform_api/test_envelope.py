"""The /api envelope on every kind of answer, errors included."""

from __future__ import annotations

import httpx
import orjson
from asgi_lifespan import LifespanManager
from fastapi import APIRouter

from platform_api.app import create_app
from tests.conftest import make_settings, register_and_login


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
    async with LifespanManager(app, startup_timeout=30):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            response = await client.get("/api/boom", headers={"X-Request-ID": "api-boom-1"})
    assert response.status_code == 500
    assert response.headers["x-request-id"] == "api-boom-1"  # to quote when reporting it
    assert response.json() == {"success": False, "error": {
        "code": "INTERNAL_ERROR", "message": "An internal error occurred"}}
    assert "hunter2" not in response.text


async def test_request_id_header_is_returned(client):
    response = await client.get("/healthz", headers={"X-Request-ID": "trace-123"})
    assert response.headers["x-request-id"] == "trace-123"
    assert len((await client.get("/healthz")).headers["x-request-id"]) >= 16


async def test_malformed_json_says_what_is_wrong_and_where_not_as_a_field(client):
    user = await register_and_login(client)
    response = await client.post(
        "/api/organizations", content=b'{"name": "Kibera Community Clinic",\n "type": clinic}',
        headers={**user["headers"], "Content-Type": "application/json"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "INVALID_JSON" and "field" not in error
    assert error["message"] == ("The request body is not valid JSON: Expecting value at "
                                "line 2, column 10")


async def test_a_body_sent_without_the_json_content_type_gets_a_hint(client):
    user = await register_and_login(client)
    form = await client.post("/api/organizations", content=b"name=Kibera+Community+Clinic",
                             headers={**user["headers"],
                                      "Content-Type": "application/x-www-form-urlencoded"})
    assert form.status_code == 415
    assert form.json()["error"] == {
        "code": "UNSUPPORTED_MEDIA_TYPE",
        "message": "The body must be JSON sent with Content-Type: application/json (this "
                   "request said application/x-www-form-urlencoded)"}
    bare = await client.post("/api/organizations", content=b'{"name": "Kibera"}',
                             headers=user["headers"])
    assert bare.status_code == 415
    assert "sent no Content-Type" in bare.json()["error"]["message"]
    empty = await client.post("/api/organizations",
                              headers={**user["headers"], "Content-Type": "application/json"})
    assert empty.status_code == 422 and empty.json()["error"]["field"] == "body"
    wrong_field = await client.post("/api/organizations", json={"type": "clinic"},
                                    headers=user["headers"])
    assert wrong_field.status_code == 422 and wrong_field.json()["error"]["field"] == "name"


async def test_openapi_lists_routes_with_models(client):
    spec = (await client.get("/openapi.json")).json()
    assert "/api/patients" in spec["paths"] and "/api/auth/login" in spec["paths"]
    post = spec["paths"]["/api/patients"]["post"]
    assert "requestBody" in post and "201" in post["responses"]
    assert "PatientCreate" in spec["components"]["schemas"]


async def test_fhir_errors_are_operation_outcomes_on_the_fhir_path(tmp_path, monkeypatch,
                                                                   caplog):
    """/fhir/* skips FastAPI's layers (platform_api.app.FhirFastPath): its errors are
    still answered by the app's handlers, an unexpected one as a 500 that leaks nothing
    and is logged with its traceback."""
    from fhir_server.service import FhirService
    from tests.conftest import register_and_login

    app = create_app(make_settings(tmp_path))
    async with LifespanManager(app, startup_timeout=30):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            anonymous = await client.get("/fhir/Patient/p1")
            assert anonymous.status_code == 401
            assert anonymous.json()["issue"][0]["code"] == "login"
            user = await register_and_login(client)
            headers = {**user["headers"], "X-Request-ID": "fhir-boom-1"}
            unknown = await client.get("/fhir/Patient/p1/_history/1/more", headers=headers)
            assert unknown.status_code == 404
            assert unknown.json()["resourceType"] == "OperationOutcome"
            wrong = await client.post("/fhir/Patient/p1", headers=headers, json={})
            assert wrong.status_code == 405 and "PUT" in wrong.headers["allow"]

            async def broken(*args, **kwargs):
                raise RuntimeError("secret database password is hunter2")

            monkeypatch.setattr(FhirService, "read", broken)
            monkeypatch.setattr(FhirService, "read_json", broken)
            with caplog.at_level("ERROR"):
                response = await client.get("/fhir/Patient/p1", headers=headers)
    assert response.status_code == 500
    assert response.json()["resourceType"] == "OperationOutcome"
    assert response.json()["issue"][0]["code"] == "exception"
    assert "hunter2" not in response.text
    assert response.headers["x-request-id"] == "fhir-boom-1"
    assert any("hunter2" in (r.exc_text or "") or (r.exc_info and "hunter2" in
               str(r.exc_info[1])) for r in caplog.records)


async def test_a_page_number_beyond_any_list_is_422_naming_page(client):
    from tests.conftest import make_clinic_admin

    clinic = await make_clinic_admin(client)
    for path in ("/api/developer/keys", f"/api/organizations/{clinic['org_id']}/patients",
                 "/api/labs"):
        for page in ("99999999999999999999", "10001"):
            response = await client.get(f"{path}?page={page}", headers=clinic["headers"])
            assert response.status_code == 422, (path, response.text)
            assert response.json()["error"]["field"] == "page"
def test_an_error_may_carry_details_and_otherwise_does_not():
    from platform_api.envelope import error_response

    finding = {"severity": "high", "description": "Increased risk of bleeding",
               "drugs": ["Warfarin", "Aspirin"], "recommendation": "Monitor INR"}
    listed = orjson.loads(error_response(409, "DRUG_INTERACTION", "Interaction found",
                                         details=[finding]).body)
    assert listed["error"]["details"] == [finding]
    plain = orjson.loads(error_response(404, "NOT_FOUND", "Patient not found").body)
    assert "details" not in plain["error"]
