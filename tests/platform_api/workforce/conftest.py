"""The Kibera clinic (tests/platform_api/clinic.py) with a small ward workforce: its
administrator, doctor, nurse, receptionist and lab technician as workforce members, and
a day (07:00-19:00) and a night (19:00-07:00) shift type. Generation runs with a short
solver time limit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from platform_api.settings import Settings
from tests.conftest import make_settings
from tests.platform_api.clinic import Clinic, refusal  # noqa: F401  (used by the tests)
from tests.platform_api.clinic import clinic as clinic  # the fixture

JSON = dict[str, Any]
WARD = ("admin", "doctor", "nurse", "receptionist", "lab")
SKILLS = {"admin": ["senior"], "doctor": ["senior", "prescriber"], "nurse": ["icu"],
          "receptionist": [], "lab": []}


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path, workforce_solver_time_limit_seconds=3,
                         workforce_solver_workers=1)


def data(response: Any, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()["data"]


async def add_workforce(clinic: Clinic, who: str, **fields: Any) -> JSON:
    body = {"user_id": clinic.user_id(who), "grade": "Officer", "skills": SKILLS[who],
            "contracted_hours": 40, **fields}
    return data(await clinic.post("admin", "/api/workforce/members", body), 201)  # type: ignore[no-any-return]


async def add_shift_type(clinic: Clinic, code: str, start: str, end: str,
                         coverage: list[JSON], **fields: Any) -> JSON:
    body = {"code": code, "name": code, "start": start, "end": end, "coverage": coverage,
            **fields}
    return data(await clinic.post("admin", "/api/workforce/shift-types", body), 201)  # type: ignore[no-any-return]


@pytest.fixture
async def ward(clinic: Clinic) -> Clinic:
    for who in WARD:
        await add_workforce(clinic, who)
    await add_shift_type(clinic, "D", "07:00", "19:00",
                         [{"count": 1, "skill": "senior"}, {"count": 1}])
    await add_shift_type(clinic, "N", "19:00", "07:00", [{"count": 1}])
    return clinic


async def new_roster(clinic: Clinic, start: str = "2027-03-01", end: str = "2027-03-07",
                     **fields: Any) -> JSON:
    body = {"name": "Ward 3, first week of March", "start": start, "end": end, **fields}
    return data(await clinic.post("admin", "/api/workforce/rosters", body), 201)  # type: ignore[no-any-return]


async def published_roster(clinic: Clinic, **fields: Any) -> JSON:
    roster = await new_roster(clinic, **fields)
    generated = data(await clinic.post("admin", f"/api/workforce/rosters/{roster['id']}/generate"))
    data(await clinic.post("admin", f"/api/workforce/rosters/{roster['id']}/approve",
                           {"accept_gaps": True}))
    data(await clinic.post("admin", f"/api/workforce/rosters/{roster['id']}/publish"))
    return generated  # type: ignore[no-any-return]
