"""The caller-bound FHIR service's units of work: a unit acting with another access
(``FhirUnit.acting_as``) stages into the same unit of work, checked against that access,
and commits or rolls back with it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from fhir_server.access import CREATE, READ, SYSTEM, AccessDenied, Grant
from fhir_server.caller import CallerFhir
from fhir_server.service import FhirService
from fhir_server.store import VersionConflict
from fhir_server.store.sqlite import SQLiteStore


class EncountersOnly:
    """A caller who may create and read Encounters, nothing else."""

    def grants(self, action: str) -> tuple[Grant, ...] | None:
        return (Grant(frozenset({"Encounter"})),) if action in (CREATE, READ) else ()

    def describe(self) -> str:
        return "a ward clerk"

    def explain(self, action: str, resource_type: str) -> str:
        return ""


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[FhirService]:
    store = SQLiteStore(tmp_path / "store.db")
    await store.open()
    try:
        yield FhirService(store)
    finally:
        await store.close()


def bed(status: str = "U") -> dict[str, Any]:
    return {"resourceType": "Location", "name": "Bed A1", "status": "active",
            "operationalStatus": {"system": "http://terminology.hl7.org/CodeSystem/v2-0116",
                                  "code": status}}


ENCOUNTER = {"resourceType": "Encounter", "status": "in-progress",
             "class": {"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode",
                       "code": "IMP"}}


async def test_a_unit_acting_as_the_system_commits_with_the_callers_unit(service):
    stored, _ = await CallerFhir(service, SYSTEM).create(bed())
    clerk = CallerFhir(service, EncountersOnly())
    unit = clerk.unit()
    async with unit:
        with pytest.raises(AccessDenied):  # the clerk may not write the bed...
            await unit.update({**bed("O"), "id": stored.id})
        encounter = await unit.create(ENCOUNTER)
        # ... the platform does, on their behalf, in the same unit of work.
        await unit.acting_as(SYSTEM).update({**bed("O"), "id": stored.id},
                                            if_match=stored.version)
        await unit.commit()
    assert (await service.read_json("Location", stored.id))["operationalStatus"]["code"] == "O"
    assert (await service.read("Encounter", encounter.id)).version == 1


async def test_a_failed_commit_rolls_back_what_the_acting_unit_staged(service):
    stored, _ = await CallerFhir(service, SYSTEM).create(bed())
    await CallerFhir(service, SYSTEM).update("Location", stored.id,
                                             {**bed("H"), "id": stored.id})
    unit = CallerFhir(service, EncountersOnly()).unit()
    with pytest.raises(VersionConflict):
        async with unit:
            encounter = await unit.create(ENCOUNTER)
            await unit.acting_as(SYSTEM).update({**bed("O"), "id": stored.id},
                                                if_match=stored.version)  # stale
            await unit.commit()
    assert await service.find_json("Encounter", encounter.id) is None
    assert (await service.read_json("Location", stored.id))["operationalStatus"]["code"] == "H"


async def test_an_acting_unit_is_checked_against_its_own_access(service):
    unit = CallerFhir(service, SYSTEM).unit()
    async with unit:
        with pytest.raises(AccessDenied):
            await unit.acting_as(EncountersOnly()).create(bed())


class OneClinic:
    """A caller who creates and reads Encounters of one organization only."""

    def grants(self, action: str) -> tuple[Grant, ...] | None:
        return (Grant(frozenset({"Encounter"}), owners=frozenset({"kibera"})),) \
            if action in (CREATE, READ) else ()

    def describe(self) -> str:
        return "a Kibera clerk"

    def explain(self, action: str, resource_type: str) -> str:
        return ""


def owned_by(organization: str) -> dict[str, Any]:
    return {**ENCOUNTER, "meta": {"security": [
        {"system": "urn:healthplatform:organization", "code": organization}]}}


async def test_a_write_hook_changes_what_is_stored_and_stages_with_the_write(service):
    seen: list[tuple[Any, str]] = []

    async def hook(access: Any, action: str, resource: dict[str, Any], unit: Any
                   ) -> dict[str, Any]:
        seen.append((access, action))
        unit.put_document("encounter_notes", resource["id"], {"id": resource["id"]})
        return {**resource, "status": "arrived"}

    service.add_write_hook("Encounter", hook)
    clerk = OneClinic()
    stored, _ = await CallerFhir(service, clerk).create(owned_by("kibera"))
    assert b'"arrived"' in stored.body and seen == [(clerk, CREATE)]
    assert await service.store.get_document("encounter_notes", stored.id) is not None


async def test_what_a_write_hook_answers_is_checked_against_the_callers_access(service):
    async def hook(access: Any, action: str, resource: dict[str, Any], unit: Any
                   ) -> dict[str, Any]:
        unit.put_document("encounter_notes", resource["id"], {"id": resource["id"]})
        return owned_by("mathare") | {"id": resource["id"]}  # another clinic's

    service.add_write_hook("Encounter", hook)
    with pytest.raises(AccessDenied):
        await CallerFhir(service, OneClinic()).create(owned_by("kibera"))
    assert await service.store.count_documents("encounter_notes") == 0
