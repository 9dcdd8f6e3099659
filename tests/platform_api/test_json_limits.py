"""JSON bodies beyond the depth or element bounds are refused before any parser sees
them, with an answer naming the limit; one client's deeply nested body never fails
another client's write."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import pytest

from platform_api.json_limits import JsonLimitExceeded, JsonLimits, check_json_text
from tests.conftest import make_clinic_admin

FHIR = {"Content-Type": "application/fhir+json"}
NESTED_URL = "http://example.org/fhir/StructureDefinition/nested-note"


def nested_patient(levels: int) -> dict[str, Any]:
    extension: dict[str, Any] = {"url": NESTED_URL, "valueString": "innermost"}
    for _ in range(levels):
        extension = {"url": NESTED_URL, "extension": [extension]}
    return {"resourceType": "Patient", "name": [{"family": "Chebet", "given": ["Faith"]}],
            "extension": [extension]}


def nested_patient_text(levels: int) -> bytes:
    """``nested_patient(levels)`` as JSON text: deeper than any JSON encoder writes."""
    opening = b'{"url": "%s", "extension": [' % NESTED_URL.encode()
    innermost = b'{"url": "%s", "valueString": "innermost"}' % NESTED_URL.encode()
    return (b'{"resourceType": "Patient", "name": [{"family": "Chebet"}], "extension": ['
            + opening * levels + innermost + b"]}" * levels + b"]}")


def nested_array_text(levels: int, innermost: bytes) -> bytes:
    return b"[" * levels + innermost + b"]" * levels


def patient(family: str, given: str) -> dict[str, Any]:
    return {"resourceType": "Patient", "name": [{"family": family, "given": [given]}],
            "gender": "female", "birthDate": "1990-02-14"}


# -- the measure ---------------------------------------------------------------------
def test_an_ordinary_resource_passes_without_being_measured() -> None:
    check_json_text(orjson.dumps(patient("Wambui", "Njeri")), JsonLimits(max_depth=8))


def test_depth_beyond_the_limit_names_the_limit() -> None:
    with pytest.raises(JsonLimitExceeded) as refused:
        check_json_text(nested_patient_text(60), JsonLimits(max_depth=100))
    assert refused.value.status == 400
    assert "limit is 100" in str(refused.value)
    assert "HEALTHPLATFORM_MAX_JSON_DEPTH" in str(refused.value)


def test_brackets_inside_strings_open_nothing() -> None:
    """1,000 opening brackets in a narrative, escaped quotes among them: depth 3."""
    note = '[{"not": "nested"}] \\" [[[[' * 200
    body = orjson.dumps({**patient("Auma", "Grace"), "text": {"status": "generated",
                                                               "div": f"<div>{note}</div>"}})
    check_json_text(body, JsonLimits(max_depth=10))


def test_too_many_elements_is_413_naming_the_limit() -> None:
    names = [{"family": "Mwangi", "given": ["Peter"]} for _ in range(400)]
    body = orjson.dumps({"resourceType": "Patient", "name": names})
    with pytest.raises(JsonLimitExceeded) as refused:
        check_json_text(body, JsonLimits(max_elements=1000))
    assert refused.value.status == 413
    assert "limit is 1,000" in str(refused.value)


# -- over HTTP -----------------------------------------------------------------------
async def test_a_deeply_nested_fhir_body_gets_400_naming_the_limit(
        client: httpx.AsyncClient, clinic_admin: dict[str, Any]) -> None:
    response = await client.post("/fhir/Patient", content=nested_patient_text(300),
                                 headers={**clinic_admin["headers"], **FHIR})
    assert response.status_code == 400
    outcome = response.json()
    assert outcome["resourceType"] == "OperationOutcome"
    assert "the limit is 100" in outcome["issue"][0]["diagnostics"]
    search = await client.get("/fhir/Patient?family=Chebet", headers=clinic_admin["headers"])
    assert search.json()["total"] == 0


async def test_a_deeply_nested_api_body_gets_400_in_the_envelope(
        client: httpx.AsyncClient) -> None:
    # deeper than the standard library's parser can go
    nested = nested_array_text(2000, b'"Nairobi"')
    response = await client.post(
        "/api/auth/register", headers={"Content-Type": "application/json"},
        content=b'{"email": "kipchoge@clinic.example.org", "password": "marathon in '
                b'Eldoret", "first_name": "Eliud", "last_name": "Kipchoge", "address": '
                + nested + b"}")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "JSON_TOO_DEEP"
    assert "HEALTHPLATFORM_MAX_JSON_DEPTH" in response.json()["error"]["message"]


async def test_a_json_hl7_ingest_body_is_bounded_too(client: httpx.AsyncClient) -> None:
    clinic = await make_clinic_admin(client)
    message = b'{"message": ' * 500 + b'"MSH|^~\\\\&|LAB"' + b"}" * 500
    response = await client.post("/api/lab/hl7-ingest", content=message,
                                 headers={**clinic["headers"],
                                          "Content-Type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "JSON_TOO_DEEP"


async def test_a_resource_with_too_many_elements_gets_413(
        client: httpx.AsyncClient, clinic_admin: dict[str, Any]) -> None:
    names = [{"family": "Mwangi", "given": ["Peter", "Kamau"]} for _ in range(60_000)]
    response = await client.post("/fhir/Patient", headers={**clinic_admin["headers"], **FHIR},
                                 content=orjson.dumps({"resourceType": "Patient",
                                                       "name": names}))
    assert response.status_code == 413
    assert "HEALTHPLATFORM_MAX_JSON_ELEMENTS" in response.json()["issue"][0]["diagnostics"]


async def test_a_poisoned_request_among_concurrent_valid_writes_fails_alone(
        client: httpx.AsyncClient, clinic_admin: dict[str, Any]) -> None:
    headers = {**clinic_admin["headers"], **FHIR}
    families = ["Odhiambo", "Wanjiru", "Mensah", "Achieng", "Kiprono", "Nyambura",
                "Otieno", "Kamau", "Njoroge", "Atieno", "Mutua", "Chebet"]

    async def create(body: bytes) -> httpx.Response:
        return await client.post("/fhir/Patient", content=body, headers=headers)

    answers = await asyncio.gather(
        *(create(orjson.dumps(patient(family, "Amina"))) for family in families[:6]),
        create(nested_patient_text(400)),
        *(create(orjson.dumps(patient(family, "Amina"))) for family in families[6:]))
    assert answers[6].status_code == 400
    assert [a.status_code for i, a in enumerate(answers) if i != 6] == [201] * len(families)


async def test_a_valid_body_reaches_the_route_unchanged(
        client: httpx.AsyncClient, clinic_admin: dict[str, Any]) -> None:
    body = nested_patient(20)  # 43 levels: within the limit
    response = await client.post("/fhir/Patient", content=orjson.dumps(body),
                                 headers={**clinic_admin["headers"], **FHIR})
    assert response.status_code == 201, response.text
    stored = response.json()
    assert stored["extension"] == body["extension"]
