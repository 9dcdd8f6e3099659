"""Inputs at the edge of what the server can represent (issue 32): dates at the
calendar's edges are clamped (a search finds what it can, never a 500), values no date
can stand for are 400 naming the parameter and fail a batch entry alone; integers outside
R4's 32-bit range are refused with the element's path. Through the real app."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import make_clinic_admin

JSON = dict[str, Any]


@pytest.fixture
async def headers(client: httpx.AsyncClient) -> dict[str, str]:
    return (await make_clinic_admin(client))["headers"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("query", [
    "/fhir/Patient?birthdate=gt9999-12-31", "/fhir/Patient?birthdate=9999",
    "/fhir/Patient?birthdate=ap9999-12-31", "/fhir/Patient?birthdate=lt0001-01-01",
    "/fhir/Patient?_lastUpdated=gt9999-12-31T23:59:59Z",
    "/fhir/Patient/_history?_since=9999-12-31T23:59:59Z",
    "/fhir/Observation?date=ge9999-12-31T23:59:59%2B14:00",
    "/fhir/Observation?date=le0001-01-01T00:00:00-14:00",
    "/api/clinical/audit/search?from=9999-12-31",
])
async def test_dates_at_the_calendars_edge_are_searched_not_a_500(
        client: httpx.AsyncClient, headers: dict[str, str], query: str) -> None:
    response = await client.get(query, headers=headers)
    assert response.status_code == 200, response.text


async def test_a_patient_born_on_the_last_day_is_found_by_its_edge(
        client: httpx.AsyncClient, headers: dict[str, str]) -> None:
    created = await client.post("/fhir/Patient", headers=headers, json={
        "resourceType": "Patient", "birthDate": "9999-12-31"})
    assert created.status_code == 201, created.text
    found = await client.get("/fhir/Patient?birthdate=ge9999-12-31", headers=headers)
    assert [e["resource"]["id"] for e in found.json()["entry"]] == [created.json()["id"]]
    after = await client.get("/fhir/Patient?birthdate=gt9999-12-31", headers=headers)
    assert after.json()["entry"] == []


@pytest.mark.parametrize(("query", "parameter"), [
    ("/fhir/Patient?birthdate=gt0000-01-01", "birthdate"),
    ("/fhir/Patient/_history?_since=0000-01-01T00:00:00Z", "_since"),
])
async def test_a_date_no_calendar_has_is_400_naming_the_parameter(
        client: httpx.AsyncClient, headers: dict[str, str], query: str,
        parameter: str) -> None:
    response = await client.get(query, headers=headers)
    assert response.status_code == 400, response.text
    assert parameter in response.text


async def test_a_batch_entry_with_an_impossible_date_fails_alone(
        client: httpx.AsyncClient, headers: dict[str, str]) -> None:
    response = await client.post("/fhir", headers=headers, json={
        "resourceType": "Bundle", "type": "batch", "entry": [
            {"request": {"method": "GET", "url": "Patient?birthdate=gt0000-01-01"}},
            {"request": {"method": "GET", "url": "Patient?birthdate=gt9999-12-31"}},
            {"request": {"method": "GET", "url": "Patient"}}]})
    assert response.status_code == 200, response.text
    statuses = [e["response"]["status"][:3] for e in response.json()["entry"]]
    assert statuses == ["400", "200", "200"]


@pytest.mark.parametrize(("element", "value", "path", "ok"), [
    ("valueInteger", 99999999999999999999999999, "Observation.valueInteger", False),
    ("valueInteger", 2147483648, "Observation.valueInteger", False),
    ("valueInteger", -2147483649, "Observation.valueInteger", False),
    ("valueInteger", 2147483647, "", True),
    ("valueInteger", -2147483648, "", True),
])
async def test_integers_outside_r4s_32_bit_range_are_refused(
        client: httpx.AsyncClient, headers: dict[str, str], element: str, value: int,
        path: str, ok: bool) -> None:
    response = await client.post("/fhir/Observation", headers=headers, json={
        "resourceType": "Observation", "status": "final", "code": {"text": "steps"},
        element: value})
    if ok:
        assert response.status_code == 201, response.text
        return
    assert response.status_code == 400, response.text
    assert response.json()["issue"][0]["expression"] == [path]


async def test_positive_and_unsigned_ints_keep_their_own_lower_bounds(
        client: httpx.AsyncClient, headers: dict[str, str]) -> None:
    body = {"resourceType": "Patient", "multipleBirthInteger": 3}
    assert (await client.post("/fhir/Patient", headers=headers, json=body)).status_code == 201
    plan = {"resourceType": "Observation", "status": "final", "code": {"text": "x"},
            "valueSampledData": {"origin": {"value": 0}, "period": 1, "dimensions": 0,
                                 "data": "1"}}
    refused = await client.post("/fhir/Observation", headers=headers, json=plan)
    assert refused.status_code == 400  # dimensions is a positiveInt
    assert refused.json()["issue"][0]["expression"] == [
        "Observation.valueSampledData.dimensions"]
    plan["valueSampledData"]["dimensions"] = 2**31
    assert (await client.post("/fhir/Observation", headers=headers,
                              json=plan)).status_code == 400
    plan["valueSampledData"]["dimensions"] = 1
    assert (await client.post("/fhir/Observation", headers=headers,
                              json=plan)).status_code == 201


async def test_a_body_less_post_with_a_malformed_body_is_400_and_does_nothing(
        client: httpx.AsyncClient, headers: dict[str, str]) -> None:
    """Result 12: logout with ``{"broken":`` does not revoke the session."""
    json_headers = {**headers, "Content-Type": "application/json"}
    refused = await client.post("/api/auth/logout", headers=json_headers,
                                content=b'{"broken":')
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "INVALID_JSON"
    assert (await client.get("/api/auth/me", headers=headers)).status_code == 200
    done = await client.post("/api/auth/logout", headers=headers)  # no body: allowed
    assert done.status_code == 200
    assert (await client.get("/api/auth/me", headers=headers)).status_code == 401


async def test_blobs_are_0600_in_0700_directories(tmp_path: Any) -> None:
    """Issue 32 result 11, the local blob store (recordings, models)."""
    from platform_api.sessions.blobs import LocalBlobStore, spool

    store = LocalBlobStore(tmp_path / "blobs")

    async def body():  # type: ignore[no-untyped-def]
        yield b"RIFF....WAVEfmt "

    spooled = await spool(body(), store.spool_dir, 1024)
    await store.put_file("recordings/2026/a.wav", spooled.path, "audio/wav")
    target = tmp_path / "blobs" / "recordings" / "2026" / "a.wav"
    assert target.stat().st_mode & 0o777 == 0o600
    for directory in (target.parent, tmp_path / "blobs", store.spool_dir):
        assert directory.stat().st_mode & 0o777 == 0o700
