"""Request bodies over ``max_body_bytes`` get 413 before a handler reads them: a declared
Content-Length at once, a chunked body as soon as it passes the limit."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import orjson
import pytest

from platform_api.settings import Settings
from tests.conftest import make_settings

LIMIT = 2048


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path, max_body_bytes=LIMIT)


def oversized_patient() -> bytes:
    note = "Allergic to penicillin; " * 200  # about 5 KB
    return orjson.dumps({"resourceType": "Patient", "text": {"status": "generated",
                                                            "div": f"<div>{note}</div>"}})


async def chunks(body: bytes, size: int = 512) -> AsyncIterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start:start + size]


async def test_declared_oversized_api_body_gets_413_envelope(client: httpx.AsyncClient) -> None:
    body = orjson.dumps({"email": "amina@clinic.example.org", "password": "x" * 4000})
    response = await client.post("/api/auth/login", content=body,
                                 headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    assert response.json() == {"success": False, "error": {
        "code": "PAYLOAD_TOO_LARGE",
        "message": f"Request body is larger than the limit of {LIMIT} bytes"}}


async def test_declared_oversized_fhir_body_gets_413_operation_outcome(
    client: httpx.AsyncClient, user: dict[str, object]
) -> None:
    response = await client.post("/fhir/Patient", content=oversized_patient(),
                                 headers={**user["headers"],  # type: ignore[dict-item]
                                          "Content-Type": "application/fhir+json"})
    assert response.status_code == 413
    outcome = response.json()
    assert outcome["resourceType"] == "OperationOutcome"
    assert outcome["issue"][0]["code"] == "too-costly"


async def test_chunked_oversized_body_is_cut_off_with_413(
    client: httpx.AsyncClient, user: dict[str, object]
) -> None:
    headers = {**user["headers"], "Content-Type": "application/fhir+json"}  # type: ignore[dict-item]
    response = await client.post("/fhir/Patient", content=chunks(oversized_patient()),
                                 headers=headers)
    assert "content-length" not in response.request.headers
    assert response.status_code == 413
    assert response.json()["issue"][0]["code"] == "too-costly"
    api = await client.post("/api/auth/login", content=chunks(b'{"email": "' + b"a" * 4000),
                            headers={"Content-Type": "application/json"})
    assert api.status_code == 413 and api.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"


async def test_bodies_within_the_limit_pass(
    client: httpx.AsyncClient, clinic_admin: dict[str, object]
) -> None:
    patient = {"resourceType": "Patient", "name": [{"family": "Odhiambo", "given": ["Amina"]}]}
    headers = {**clinic_admin["headers"],  # type: ignore[dict-item]
               "Content-Type": "application/fhir+json"}
    assert (await client.post("/fhir/Patient", json=patient, headers=headers)).status_code == 201
    chunked = await client.post("/fhir/Patient", content=chunks(orjson.dumps(patient), 16),
                                headers=headers)
    assert chunked.status_code == 201
