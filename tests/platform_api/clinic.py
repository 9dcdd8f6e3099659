"""A clinic with its staff, for the Organizations and Doctors areas' tests: Kibera
Community Clinic (its ORG:ADMIN Wanjiku, a doctor, a nurse, a receptionist, a billing
clerk, a lab technician, a registered patient), a second clinic (Mathare North, its own
administrator), a stranger with no organization, and a platform administrator."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from platform_api.policy.roles import (
    ORG_BILLING,
    ORG_DOCTOR,
    ORG_LAB,
    ORG_NURSE,
    ORG_RECEPTIONIST,
)
from tests.conftest import add_member, make_admin, make_clinic_admin, register_and_login

STAFF = {"doctor": ("Achieng", "Otieno", ORG_DOCTOR), "nurse": ("Nafula", "Wekesa", ORG_NURSE),
         "receptionist": ("Kamau", "Njoroge", ORG_RECEPTIONIST),
         "billing": ("Mutua", "Kilonzo", ORG_BILLING), "lab": ("Halima", "Abdi", ORG_LAB)}


@dataclass
class Clinic:
    client: httpx.AsyncClient
    app: Any
    org_id: str
    other_org_id: str
    people: dict[str, dict[str, Any]] = field(default_factory=dict)
    patient_id: str = ""

    def h(self, who: str) -> dict[str, str]:
        return self.people[who]["headers"]

    def user_id(self, who: str) -> str:
        return str(self.people[who]["user"]["id"])

    async def get(self, who: str, path: str, **params: Any) -> httpx.Response:
        return await self.client.get(path, params=params, headers=self.h(who))

    async def post(self, who: str, path: str, body: Any = None) -> httpx.Response:
        return await self.client.post(path, json=body, headers=self.h(who))

    async def drain(self) -> None:
        await self.app.state.services.bus.drain()

    def recorded(self, topic: str) -> list[dict[str, Any]]:
        """The events of ``topic`` (a name or a pattern) the bus delivers from now on."""
        seen: list[dict[str, Any]] = []

        async def handler(event: dict[str, Any]) -> None:
            seen.append(event)
        self.app.state.services.bus.subscribe(topic, handler)
        return seen


def refusal(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


@pytest.fixture
async def clinic(app: Any, client: httpx.AsyncClient) -> Clinic:
    admin = await make_clinic_admin(client)
    other = await make_clinic_admin(client, name="Mathare North Health Centre",
                                    first_name="Otieno", last_name="Ouma")
    world = Clinic(client, app, admin["org_id"], other["org_id"])
    world.people.update(admin=admin, other_admin=other)
    for who, (first, last, role) in STAFF.items():
        world.people[who] = await register_and_login(client, first_name=first, last_name=last)
        await add_member(app, admin["org_id"], world.people[who], role)
    world.people["stranger"] = await register_and_login(client, first_name="Zawadi",
                                                        last_name="Njeri")
    world.people["platform_admin"] = await make_admin(app, client)
    patient = await client.post(f"/api/organizations/{admin['org_id']}/patients", json={
        "first_name": "Amina", "last_name": "Odhiambo", "date_of_birth": "1988-04-12",
        "gender": "female", "mrn": "KCC-0001"}, headers=admin["headers"])
    assert patient.status_code == 201, patient.text
    world.patient_id = patient.json()["data"]["id"]
    return world
