"""The Kibera clinic (tests/platform_api/clinic.py) and its courses: a sepsis course with
two modules, 4 CME credits and a two-question assessment (pass mark 50), and a hand
hygiene course of one module, 1 credit, no assessment."""

from __future__ import annotations

from typing import Any

from tests.platform_api.clinic import Clinic, refusal  # noqa: F401  (used by the tests)
from tests.platform_api.clinic import clinic as clinic  # the fixture

JSON = dict[str, Any]
SEPSIS = {
    "title": "Sepsis: the first hour", "description": "Recognition and the sepsis six",
    "modules": [{"title": "Recognising sepsis", "minutes": 45},
                {"title": "The sepsis six", "minutes": 60}],
    "cme_credits": 4, "credit_type": "CME",
    "assessment": {"pass_mark": 50, "questions": [
        {"text": "Lactate above which value suggests septic shock (mmol/L)?",
         "options": ["1", "2", "4"], "answer": 2},
        {"text": "Within how long should antibiotics be given?",
         "options": ["1 hour", "6 hours", "24 hours"], "answer": 0}]},
}
HAND_HYGIENE = {"title": "Hand hygiene", "modules": [{"title": "The five moments"}],
                "cme_credits": 1, "credit_type": "CPD"}


def data(response: Any, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()["data"]


async def new_course(clinic: Clinic, body: JSON = SEPSIS) -> JSON:
    return data(await clinic.post("admin", "/api/training/courses", body), 201)  # type: ignore[no-any-return]


async def enrolled(clinic: Clinic, who: str, course: JSON) -> JSON:
    return data(await clinic.post(who, f"/api/training/courses/{course['id']}/enroll"), 201)  # type: ignore[no-any-return]
