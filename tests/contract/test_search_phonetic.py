"""Phonetic search (``phonetic``: names that sound alike) as every adapter answers it."""

from __future__ import annotations

from tests.conftest import make_clinic_admin
from tests.contract.conftest import FHIR


def person(resource_type: str, family: str, *given: str) -> dict:
    return {"resourceType": resource_type, "name": [{"family": family, "given": list(given)}]}


async def test_phonetic_search_finds_spelling_variants(adapter_client):
    client = adapter_client
    user = await make_clinic_admin(client)
    headers = {**user["headers"], **FHIR}
    ids = {}
    for resource in (person("Patient", "Otieno", "Mohammed"), person("Patient", "Smith", "Grace"),
                     person("Patient", "Mahmoud", "Kwame"),
                     person("Practitioner", "Okafor", "Chidi")):
        created = await client.post(f"/fhir/{resource['resourceType']}", json=resource,
                                    headers=headers)
        assert created.status_code == 201, created.text
        ids[resource["name"][0]["family"]] = created.json()["id"]

    async def found(path: str, value: str) -> list[str]:
        response = await client.get(f"/fhir/{path}", params={"phonetic": value},
                                    headers=headers)
        assert response.status_code == 200, response.text
        return [e["resource"]["id"] for e in response.json().get("entry", [])]

    assert await found("Patient", "Muhammad") == [ids["Otieno"]]  # a given name
    assert await found("Patient", "Smyth") == [ids["Smith"]]  # a family name
    assert await found("Patient", "Kwami") == [ids["Mahmoud"]]
    assert await found("Patient", "Smart") == []
    assert await found("Practitioner", "Okaafor") == [ids["Okafor"]]
    refused = await client.get("/fhir/Patient", params={"phonetic": "123"}, headers=headers)
    assert refused.status_code == 400
    assert "phonetic" in refused.text
