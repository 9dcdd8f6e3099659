"""Helpers of the public-health tests, around the clinic of tests/platform_api/clinic.py
(Kibera Community Clinic in Nairobi's Kibra district, its staff and a patient; a second
clinic; a stranger; a platform administrator), children and adults to report cases of,
and a helper that reports one."""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

import httpx

from tests.platform_api.clinic import Clinic, refusal  # noqa: F401  (re-exported)

JSON = dict[str, Any]


def days_ago(n: int) -> str:
    return (date.today() - timedelta(days=n)).isoformat()


def data(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["success"] is True
    return body["data"]


async def register(clinic: Clinic, first: str, last: str, born: str, mrn: str,
                   org: str | None = None, who: str = "admin") -> str:
    response = await clinic.client.post(
        f"/api/organizations/{org or clinic.org_id}/patients", headers=clinic.h(who),
        json={"first_name": first, "last_name": last, "date_of_birth": born,
              "gender": "male", "mrn": mrn})
    return str(data(response, 201)["id"])


async def report(clinic: Clinic, who: str = "doctor", **fields: Any) -> httpx.Response:
    body = {"patient_id": clinic.patient_id, "disease": "cholera",
            "onset_date": days_ago(2), **fields}
    return await clinic.post(who, "/api/public-health/cases", body)


async def set_district(clinic: Clinic, org_id: str, district: str, org_unit: str | None,
                       who: str = "admin") -> None:
    """The facility's district (address) and DHIS2 organisation unit (identifier)."""
    headers = clinic.h(who)
    current = (await clinic.client.get(f"/fhir/Organization/{org_id}", headers=headers)).json()
    current["address"] = [{"district": district, "city": "Nairobi", "country": "KE"}]
    if org_unit:
        current["identifier"] = [*(current.get("identifier") or []), {
            "system": "urn:healthplatform:hmis-org-unit", "value": org_unit}]
    response = await clinic.client.put(f"/fhir/Organization/{org_id}", headers=headers,
                                       json=current)
    assert response.status_code == 200, response.text
