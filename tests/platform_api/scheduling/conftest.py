"""Fixtures of the Scheduling tests: a clinic in Nairobi with its staff, a doctor, a
consultation room and a schedule of daily morning hours (30-minute slots, a few days
ahead), and helpers for times in the clinic's zone."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest
from asgi_lifespan import LifespanManager

from platform_api.app import create_app
from platform_api.policy.roles import ORG_DOCTOR, ORG_NURSE, ORG_RECEPTIONIST
from platform_api.settings import Settings
from tests.conftest import add_member, make_clinic_admin, register_and_login

# the SMTP server the auth tests read their e-mails from, for the confirmations
from tests.platform_api.test_auth_email import inbox  # noqa: F401

NAIROBI = ZoneInfo("Africa/Nairobi")
DAILY_MORNINGS = [{"rrule": "FREQ=DAILY", "start": "08:00", "end": "12:00"}]
JSON = dict[str, Any]


def tomorrow() -> date:
    return (datetime.now(NAIROBI) + timedelta(days=1)).date()


def at(day: date, hour: int, minute: int = 0) -> str:
    """A local Nairobi time as the UTC timestamp the API takes."""
    moment = datetime.combine(day, time(hour, minute), NAIROBI)
    return moment.astimezone(ZoneInfo("UTC")).strftime("%Y-%m-%dT%H:%M:%SZ")


def data(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()["data"]


def refusal(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


async def make_resource(client: httpx.AsyncClient, headers: dict[str, str], org_id: str,
                        **fields: Any) -> JSON:
    body = {"type": "doctor", "name": "Dr. Wanjiru Kamau", "organization_id": org_id,
            "time_zone": "Africa/Nairobi", "description": "General practice", **fields}
    return data(await client.post("/api/resources", headers=headers, json=body), 201)  # type: ignore[no-any-return]


async def make_schedule(client: httpx.AsyncClient, headers: dict[str, str], resource_id: str,
                        **fields: Any) -> JSON:
    body = {"resource_id": resource_id, "name": "Morning clinic", "slot_minutes": 30,
            "horizon_days": 3, "working_hours": DAILY_MORNINGS, **fields}
    return data(await client.post("/api/schedules", headers=headers, json=body), 201)  # type: ignore[no-any-return]


def booking(resource_id: str, day: date, hour: int = 9, minute: int = 0, *,
            length: int = 30, **fields: Any) -> JSON:
    start = datetime.combine(day, time(hour, minute), NAIROBI)
    return {"resource_id": resource_id, "patient_name": "Amina Odhiambo",
            "patient_email": "amina.odhiambo@example.org", "patient_phone": "+254712345678",
            "start_time": at(day, hour, minute),
            "end_time": (start + timedelta(minutes=length)).astimezone(ZoneInfo("UTC"))
            .strftime("%Y-%m-%dT%H:%M:%SZ"),
            "reason": "Antenatal check-up", **fields}


@pytest.fixture
async def clinic(app: Any, client: httpx.AsyncClient) -> JSON:
    """Kibera Community Clinic: its ORG:ADMIN, a doctor, a nurse and a receptionist
    (members), the doctor as a schedulable resource with a daily morning schedule."""
    admin = await make_clinic_admin(client)
    org_id = admin["org_id"]
    staff = {}
    for role, (first, last) in ((ORG_DOCTOR, ("Wanjiru", "Kamau")),
                                (ORG_NURSE, ("Achieng", "Otieno")),
                                (ORG_RECEPTIONIST, ("Baraka", "Mwangi"))):
        member = await register_and_login(client, first_name=first, last_name=last)
        await add_member(app, org_id, member, role)
        staff[role] = member
    doctor = await make_resource(client, admin["headers"], org_id,
                                 user_id=staff[ORG_DOCTOR]["user"]["id"])
    schedule = await make_schedule(client, admin["headers"], doctor["id"])
    return {"admin": admin, "org_id": org_id, "doctor_user": staff[ORG_DOCTOR],
            "nurse": staff[ORG_NURSE], "receptionist": staff[ORG_RECEPTIONIST],
            "doctor": doctor, "schedule": schedule}


@pytest.fixture
async def other_clinic(client: httpx.AsyncClient) -> JSON:
    admin = await make_clinic_admin(client, name="Mombasa Coast Clinic", first_name="Hassan",
                                    last_name="Ali")
    return {"admin": admin, "org_id": admin["org_id"]}


@asynccontextmanager
async def served(settings: Settings) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    """An app of its own (settings of a test's choosing) and a client of it."""
    application = create_app(settings)
    async with LifespanManager(application, startup_timeout=30):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            yield application, client


async def booked_clinic(client: httpx.AsyncClient) -> tuple[JSON, JSON, JSON]:
    """A clinic's administrator, its doctor with a schedule, and a booking tomorrow made
    without signing in, whose contact the administrator registered as a patient."""
    admin = await make_clinic_admin(client)
    doctor = await make_resource(client, admin["headers"], admin["org_id"])
    await make_schedule(client, admin["headers"], doctor["id"])
    made = data(await client.post("/api/appointments", json=booking(doctor["id"],
                                                                    tomorrow())), 201)
    confirmed = data(await client.post(f"/api/appointments/{made['id']}/confirm-patient",
                                       headers=admin["headers"], json={}))
    return admin, doctor, confirmed
