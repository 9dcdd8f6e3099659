"""CME credits recorded with evidence, and the summary against the required total."""

from __future__ import annotations

from datetime import UTC, datetime

from tests.platform_api.training.conftest import data, refusal

YEAR = datetime.now(UTC).year
CONFERENCE = {"activity": "KMA annual scientific conference", "credits": 12,
              "credit_type": "CME", "earned_on": f"{YEAR}-01-02",
              "evidence": {"description": "Certificate of attendance",
                           "url": "https://kma.example.org/certificates/2291",
                           "issuer": "Kenya Medical Association"}}


async def test_credits_are_recorded_with_evidence(clinic):
    credit = data(await clinic.post("doctor", "/api/training/cme-credits", CONFERENCE), 201)
    assert credit["source"] == "manual" and credit["user_id"] == clinic.user_id("doctor")
    assert credit["evidence"]["issuer"] == "Kenya Medical Association"
    response = await clinic.post("doctor", "/api/training/cme-credits",
                                 {k: v for k, v in CONFERENCE.items() if k != "evidence"})
    assert refusal(response) == (422, "VALIDATION_ERROR")
    assert response.json()["error"]["field"] == "evidence"
    response = await clinic.post("doctor", "/api/training/cme-credits",
                                 {**CONFERENCE, "earned_on": f"{YEAR + 1}-12-31"})
    assert response.json()["error"]["field"] == "earned_on"


async def test_the_admin_records_for_members_and_others_for_themselves(clinic):
    data(await clinic.post("admin", "/api/training/cme-credits",
                           {**CONFERENCE, "user_id": clinic.user_id("nurse")}), 201)
    response = await clinic.post("nurse", "/api/training/cme-credits",
                                 {**CONFERENCE, "user_id": clinic.user_id("doctor")})
    assert refusal(response) == (403, "FORBIDDEN")
    assert len(data(await clinic.get("nurse", "/api/training/cme-credits"))) == 1
    assert data(await clinic.get("doctor", "/api/training/cme-credits")) == []
    assert refusal(await clinic.get("doctor", "/api/training/cme-credits",
                                    user_id=clinic.user_id("nurse"))) == (403, "FORBIDDEN")


async def test_the_summary_compares_each_member_with_the_required_total(clinic):
    data(await clinic.post("doctor", "/api/training/cme-credits", CONFERENCE), 201)
    data(await clinic.post("doctor", "/api/training/cme-credits",
                           {**CONFERENCE, "credits": 40, "activity": "Online ECG course"}), 201)
    data(await clinic.post("doctor", "/api/training/cme-credits",
                           {**CONFERENCE, "earned_on": f"{YEAR - 1}-06-01"}), 201)
    rows = data(await clinic.get("admin", "/api/training/cme-credits/summary", limit=100))
    doctor = next(r for r in rows if r["user_id"] == clinic.user_id("doctor"))
    assert doctor["credits"] == 52 and doctor["required"] == 50 and doctor["met"]
    assert doctor["by_type"] == {"CME": 52}
    nurse = next(r for r in rows if r["user_id"] == clinic.user_id("nurse"))
    assert nurse["credits"] == 0 and nurse["remaining"] == 50 and not nurse["met"]
    assert len(rows) == 6  # every member of the clinic
    half = data(await clinic.get("doctor", "/api/training/cme-credits/summary",
                                 **{"from": f"{YEAR}-01-01", "to": f"{YEAR}-01-31"}))
    assert [r["user_id"] for r in half] == [clinic.user_id("doctor")]
    assert half[0]["required"] == round(50 * 31 / 365, 1) and half[0]["met"]
    response = await clinic.get("doctor", "/api/training/cme-credits/summary",
                                **{"from": f"{YEAR}-02-01", "to": f"{YEAR}-01-01"})
    assert refusal(response) == (422, "VALIDATION_ERROR")
