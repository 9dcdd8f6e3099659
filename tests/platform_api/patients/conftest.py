"""Fixtures of the Patients area: a clinic with its staff and a patient who has an account,
and a doctor of another organization who has neither membership nor consent."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from fhir_server.access import SYSTEM
from fhir_server.caller import CallerFhir
from platform_api.policy.roles import ORG_DOCTOR, ORG_NURSE, ORG_PHARMACIST, ORG_RECEPTIONIST
from tests.conftest import add_member, make_clinic_admin, register_and_login

JSON = dict[str, Any]
USER_SYSTEM = "urn:healthplatform:user"
PATIENT = {"first_name": "Amina", "last_name": "Odhiambo", "date_of_birth": "1988-04-12",
           "gender": "female", "phone": "+254712345678", "mrn": "KCC-0001"}


@dataclass
class Clinic:
    app: Any
    client: httpx.AsyncClient
    org_id: str
    admin: JSON  # ORG:ADMIN (founded the clinic)
    doctor: JSON  # ORG:DOCTOR
    nurse: JSON  # ORG:NURSE
    receptionist: JSON  # ORG:RECEPTIONIST
    patient: JSON  # the patient's own account; their record is patient_id
    patient_id: str
    outsider: JSON  # a doctor of another organization: no membership, no consent
    outsider_org_id: str

    seen: list[JSON]  # every platform event the bus delivered since the clinic opened

    async def events(self, topic: str) -> list[JSON]:
        """The payloads of ``topic`` delivered so far, oldest first."""
        await self.app.state.services.bus.drain()
        return [e["payload"] for e in self.seen if e["topic"] == topic]

    async def fhir(self, path: str, who: JSON | None = None) -> httpx.Response:
        return await self.client.get(f"/fhir/{path}", headers=(who or self.admin)["headers"])


async def link_account(app: Any, patient_id: str, user: JSON) -> None:
    """Give the patient record the user's identifier (what a clinic does when a patient
    it registered opens an account), as the system."""
    fhir = CallerFhir(app.state.services.fhir, SYSTEM)
    patient = await fhir.read_json("Patient", patient_id)
    patient.setdefault("identifier", []).append({"system": USER_SYSTEM,
                                                 "value": user["user"]["id"]})
    await fhir.update("Patient", patient_id, patient)
    app.state.services.policy.membership_changed(user["user"]["id"])


async def member(app: Any, client: httpx.AsyncClient, org_id: str, role: str, first: str,
                 last: str) -> JSON:
    user = await register_and_login(client, first_name=first, last_name=last)
    await add_member(app, org_id, user, role)
    return user


@pytest.fixture
async def clinic(app: Any, client: httpx.AsyncClient) -> Clinic:
    seen: list[JSON] = []

    async def record(event: JSON) -> None:
        seen.append(event)
    app.state.services.bus.subscribe("platform.>", record)
    admin = await make_clinic_admin(client)
    org_id = admin["org_id"]
    doctor = await member(app, client, org_id, ORG_DOCTOR, "Wanjiru", "Kamau")
    nurse = await member(app, client, org_id, ORG_NURSE, "Achieng", "Otieno")
    receptionist = await member(app, client, org_id, ORG_RECEPTIONIST, "Baraka", "Mwangi")
    registered = await client.post(f"/api/organizations/{org_id}/patients", json=PATIENT,
                                   headers=admin["headers"])
    assert registered.status_code == 201, registered.text
    patient_id = registered.json()["data"]["id"]
    patient = await register_and_login(client, first_name="Amina", last_name="Odhiambo")
    await link_account(app, patient_id, patient)
    other = await make_clinic_admin(client, name="Mathare North Health Centre",
                                    first_name="Kofi", last_name="Boateng")
    outsider = await member(app, client, other["org_id"], ORG_DOCTOR, "Chidi", "Okafor")
    return Clinic(app, client, org_id, admin, doctor, nurse, receptionist, patient,
                  patient_id, outsider, other["org_id"], seen)


@pytest.fixture
async def pharmacy(app: Any, client: httpx.AsyncClient) -> JSON:
    """A pharmacy organization with its pharmacist."""
    owner = await register_and_login(client, first_name="Halima", last_name="Yusuf")
    created = await client.post("/api/organizations", headers=owner["headers"], json={
        "name": "Uhuru Pharmacy", "type": "pharmacy", "country": "KE"})
    assert created.status_code == 201, created.text
    org_id = created.json()["data"]["id"]
    pharmacist = await member(app, client, org_id, ORG_PHARMACIST, "Jabari", "Njoroge")
    return {"org_id": org_id, "owner": owner, "pharmacist": pharmacist}
