"""The clinic the Treatments tests work in (tests/platform_api/clinic.py), and a protocol
of its own."""

from __future__ import annotations

from typing import Any

from tests.platform_api.clinic import Clinic, clinic, refusal  # noqa: F401  (the fixture)

JSON = dict[str, Any]
ATC = "http://www.whocc.no/atc"


def malaria_protocol(**fields: Any) -> JSON:
    """Uncomplicated falciparum malaria, adults: artemether-lumefantrine twice daily for
    three days, a review on day 3."""
    return {
        "code": "malaria-al", "title": "Uncomplicated malaria: artemether-lumefantrine",
        "condition": {"system": "http://snomed.info/sct", "code": "62676009",
                      "display": "Falciparum malaria"},
        "steps": [
            {"id": "al", "title": "Artemether-lumefantrine", "kind": "medication",
             "code": {"system": ATC, "code": "P01BF01",
                      "display": "artemether and lumefantrine"},
             "instructions": "4 tablets (20/120 mg) twice daily",
             "duration": {"value": 3, "unit": "d"},
             "repeat": {"frequency": 2, "period": 1, "unit": "d"}},
            {"id": "review", "title": "Review", "kind": "visit", "after": "al"},
        ],
        **fields,
    }


def data(response: Any, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()["data"]


async def shipped(world: Clinic, code: str) -> JSON:
    found = data(await world.get("doctor", "/api/treatments", code=code))
    assert len(found) == 1, found
    return found[0]  # type: ignore[no-any-return]
