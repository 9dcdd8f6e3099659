"""Cross-border lookup through national exchanges (local stand-ins): FHIR search by the
national identifier, API key and OAuth2 client credentials, the stored Patient and its
Provenance, the cache, and every way it can fail."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from platform_api.access_rules import OPERATIONS
from platform_api.settings import Settings
from tests.conftest import make_settings
from tests.platform_api.clinic import Clinic, refusal
from tests.platform_api.mpi.conftest import data
from tests.platform_api.mpi.exchange_standin import ExchangeStandIn

KE_SYSTEM = "http://hie.health.go.ke/fhir/NamingSystem/national-id"
GH_SYSTEM = "http://nhia.gov.gh/fhir/NamingSystem/ghana-card"
WANJIRU = {"resourceType": "Patient", "id": "ke-778812",
           "identifier": [{"system": KE_SYSTEM, "value": "27654321"}],
           "name": [{"family": "Kamau", "given": ["Wanjiru"]}], "gender": "female",
           "birthDate": "1990-02-14"}
KOFI = {"resourceType": "Patient", "id": "gh-1",
        "identifier": [{"system": GH_SYSTEM, "value": "GHA-712345678-9"}],
        "name": [{"family": "Mensah", "given": ["Kofi"]}], "gender": "male"}


@pytest.fixture
async def exchanges() -> AsyncIterator[dict[str, ExchangeStandIn]]:
    stand_ins = {
        "KE": ExchangeStandIn(KE_SYSTEM, {"27654321": WANJIRU}, api_key="ke-key-1"),
        "GH": ExchangeStandIn(GH_SYSTEM, {"GHA-712345678-9": KOFI},
                              client=("platform", "s3cret")),
        "UG": ExchangeStandIn("urn:ug:nin", mode="slow", delay=2.0),
        "TZ": ExchangeStandIn("urn:tz:nida", mode="broken", failures=1),
        "RW": ExchangeStandIn("urn:rw:nid", mode="down"),
        "NG": ExchangeStandIn("urn:ng:nin", mode="not_fhir"),
        "ZA": ExchangeStandIn("urn:za:id", mode="invalid"),
    }
    for stand_in in stand_ins.values():
        await stand_in.start()
    yield stand_ins
    for stand_in in stand_ins.values():
        await stand_in.stop()


@pytest.fixture
def settings(tmp_path: Path, exchanges: dict[str, ExchangeStandIn]) -> Settings:
    config: dict[str, Any] = {}
    for country, stand_in in exchanges.items():
        entry: dict[str, Any] = {"base_url": stand_in.url, "identifier_system": stand_in.system,
                                 "timeout_seconds": 0.5}
        if stand_in.api_key:
            entry.update(auth="api_key", api_key=stand_in.api_key)
        if stand_in.client:
            entry.update(auth="oauth2", token_url=f"{stand_in.url}/token",
                         client_id=stand_in.client[0], client_secret=stand_in.client[1])
        config[country] = entry
    return make_settings(tmp_path, cross_border_exchanges=config, cross_border_retries=2)


def url(national_id: str) -> str:
    return f"/api/fhir/cross-border/Patient/{national_id}"


async def test_a_patient_is_found_by_national_id_and_kept_with_its_provenance(
        clinic: Clinic, exchanges):
    found = data(await clinic.get("doctor", url("27654321"), country="KE"))
    assert exchanges["KE"].searches == [f"{KE_SYSTEM}|27654321"]
    assert found["total"] == 1 and found["cached"] is False
    patient = found["patients"][0]
    assert patient["name"] == WANJIRU["name"] and patient["id"] != "ke-778812"
    assert patient["meta"]["tag"][0]["code"] == "KE"
    admin = clinic.h("platform_admin")
    provenance = (await clinic.client.get(f"/fhir/Provenance/{found['provenance_id']}",
                                          headers=admin)).json()
    assert provenance["target"] == [{"reference": f"Patient/{patient['id']}"}]
    assert "KE national health information exchange" in provenance["agent"][0]["who"]["display"]
    assert provenance["entity"][0]["what"]["identifier"]["value"] == exchanges["KE"].url
    again = data(await clinic.get("doctor", url("27654321"), country="ke"))
    assert again["cached"] is True and len(exchanges["KE"].searches) == 1


async def test_a_second_lookup_after_the_cache_updates_the_same_record(clinic: Clinic, app):
    first = data(await clinic.get("doctor", url("27654321"), country="KE"))
    app.state.services.extras["cross_border"].cache.clear()
    second = data(await clinic.get("doctor", url("27654321"), country="KE"))
    assert second["patients"][0]["id"] == first["patients"][0]["id"]


async def test_nobody_found_is_an_empty_answer(clinic: Clinic):
    found = data(await clinic.get("doctor", url("11111111"), country="KE"))
    assert found["total"] == 0 and found["patients"] == [] and found["provenance_id"] is None


async def test_oauth2_client_credentials_are_exchanged_for_a_token_once(
        clinic: Clinic, exchanges):
    for _ in range(2):
        found = data(await clinic.get("doctor", url("GHA-712345678-9"), country="GH"))
        assert found["patients"][0]["name"][0]["family"] == "Mensah"
    assert exchanges["GH"].tokens_issued == ["token-1"]


async def test_a_revoked_token_is_replaced_once(clinic: Clinic, exchanges, app):
    assert (await clinic.get("doctor", url("GHA-712345678-9"), country="GH")).status_code == 200
    exchanges["GH"].tokens_issued.append("token-rotated")  # the exchange revoked token-1
    app.state.services.extras["cross_border"].cache.clear()
    assert (await clinic.get("doctor", url("GHA-712345678-9"), country="GH")).status_code == 200
    assert exchanges["GH"].tokens_issued[-1] == "token-3"


async def test_a_wrong_api_key_is_an_exchange_error(clinic: Clinic, exchanges):
    exchanges["KE"].api_key = "rotated"
    response = await clinic.get("doctor", url("27654321"), country="KE")
    assert refusal(response) == (502, "EXCHANGE_ERROR")
    assert "401" in response.json()["error"]["message"]


async def test_an_unsupported_country_is_400_naming_the_supported_ones(clinic: Clinic):
    response = await clinic.get("doctor", url("27654321"), country="US")
    assert refusal(response) == (400, "UNSUPPORTED_COUNTRY")
    assert response.json()["error"]["field"] == "country"
    assert "KE, GH, NG, ZA, TZ, UG, RW, ET" in response.json()["error"]["message"]


async def test_a_supported_country_without_an_exchange_is_503(clinic: Clinic):
    response = await clinic.get("doctor", url("27654321"), country="ET")
    assert refusal(response) == (503, "EXCHANGE_NOT_CONFIGURED")


async def test_a_slow_exchange_is_504_after_its_retries(clinic: Clinic, exchanges):
    response = await clinic.get("doctor", url("CM12345"), country="UG")
    assert refusal(response) == (504, "EXCHANGE_TIMEOUT")
    assert len(exchanges["UG"].searches) == 3  # the first try and two retries


async def test_a_broken_exchange_is_retried_and_a_dead_one_is_502(clinic: Clinic, exchanges):
    response = await clinic.get("doctor", url("19900214"), country="TZ")
    assert response.status_code == 200 and len(exchanges["TZ"].searches) == 2
    response = await clinic.get("doctor", url("1199"), country="RW")
    assert refusal(response) == (502, "EXCHANGE_ERROR")
    assert len(exchanges["RW"].searches) == 1  # a 500 is not retried


async def test_what_is_not_fhir_is_refused(clinic: Clinic):
    response = await clinic.get("doctor", url("1234"), country="NG")
    assert refusal(response) == (502, "EXCHANGE_INVALID_RESPONSE")
    response = await clinic.get("doctor", url("8001015009087"), country="ZA")
    assert refusal(response) == (502, "EXCHANGE_INVALID_RESPONSE")
    assert "birthDate" in response.json()["error"]["message"]


async def test_the_lookup_needs_credentials_and_a_sane_id(clinic: Clinic):
    assert (await clinic.client.get(url("27654321"), params={"country": "KE"})).status_code \
        == 401
    response = await clinic.get("doctor", url("27654321"))
    assert refusal(response) == (422, "VALIDATION_ERROR")
    response = await clinic.get("doctor", url("bad id!"), country="KE")
    assert refusal(response) == (422, "VALIDATION_ERROR")


async def test_only_staff_who_register_patients_look_them_up_across_borders(
        clinic: Clinic, exchanges):
    """The lookup keeps what it finds with the platform's rights: the policy's rule
    cross-border.lookup decides who may, before the exchange (or the cache) is asked."""
    for who in ("stranger", "billing", "lab"):
        response = await clinic.get(who, url("27654321"), country="KE")
        assert refusal(response) == (403, "FORBIDDEN"), who
    assert exchanges["KE"].searches == []
    for who in ("receptionist", "nurse", "platform_admin"):
        found = data(await clinic.get(who, url("27654321"), country="KE"))
        assert found["total"] == 1, who


async def test_the_lookup_is_served_and_documented_with_named_models(client):
    spec = (await client.get("/openapi.json")).json()
    operation = spec["paths"]["/api/fhir/cross-border/Patient/{national_id}"]["get"]
    assert "$ref" in str(operation["responses"]["200"]["content"]["application/json"])
    assert {"400", "502", "503", "504"} <= set(operation["responses"])
    assert ("GET", "/api/fhir/cross-border/Patient/:national_id", "auth") in \
        OPERATIONS["FHIR and SMART"]
