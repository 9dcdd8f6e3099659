"""Syndromic surveillance routes: GET /api/surveillance/syndromes, GET
/api/surveillance/alerts, POST /api/surveillance/export/hmis."""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

from platform_api.public_health.reporting import last_complete_week
from tests.platform_api.public_health.helpers import (
    Clinic,
    data,
    days_ago,
    refusal,
    register,
    set_district,
)

ICD10 = "http://hl7.org/fhir/sid/icd-10"


async def visit(clinic: Clinic, patient_id: str, day: str, reason: str | None = None, *,
                temperature: float | None = None, icd10: str | None = None,
                klass: str = "AMB", who: str = "doctor") -> str:
    """An encounter of ``day`` with its reason, a temperature and a diagnosis, written on
    /fhir as a clinician would."""
    encounter: dict[str, Any] = {
        "resourceType": "Encounter", "status": "finished",
        "class": {"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode",
                  "code": klass},
        "subject": {"reference": f"Patient/{patient_id}"},
        "period": {"start": f"{day}T09:30:00+03:00"}}
    if reason:
        encounter["reasonCode"] = [{"text": reason}]
    made = await clinic.client.post("/fhir/Encounter", headers=clinic.h(who), json=encounter)
    assert made.status_code == 201, made.text
    encounter_id = made.json()["id"]
    about = {"subject": {"reference": f"Patient/{patient_id}"},
             "encounter": {"reference": f"Encounter/{encounter_id}"}}
    if temperature is not None:
        response = await clinic.client.post("/fhir/Observation", headers=clinic.h(who), json={
            "resourceType": "Observation", "status": "final", **about,
            "code": {"coding": [{"system": "http://loinc.org", "code": "8310-5"}]},
            "valueQuantity": {"value": temperature, "unit": "Cel",
                              "system": "http://unitsofmeasure.org", "code": "Cel"}})
        assert response.status_code == 201, response.text
    if icd10 is not None:
        response = await clinic.client.post("/fhir/Condition", headers=clinic.h(who), json={
            "resourceType": "Condition", **about,
            "code": {"coding": [{"system": ICD10, "code": icd10}]}})
        assert response.status_code == 201, response.text
    return str(encounter_id)


async def _diarrhoea_outbreak(clinic: Clinic) -> None:
    """A quiet fortnight at Kibera, then four cases of acute watery diarrhoea today
    (reasons and an ICD-10 A09 diagnosis), an ILI yesterday (temperature and cough), a
    visit with no fever; one diarrhoea case at Mathare."""
    p = clinic.patient_id
    await visit(clinic, p, days_ago(14), "Routine antenatal visit")
    await visit(clinic, p, days_ago(1), "Cough", temperature=38.4)
    await visit(clinic, p, days_ago(0), "Acute watery diarrhoea since last night")
    await visit(clinic, p, days_ago(0), "Loose stools", icd10="A09.0")
    await visit(clinic, p, days_ago(0), "watery stool x6, vomiting")
    await visit(clinic, p, days_ago(0), "rice water stool", klass="IMP")
    await visit(clinic, p, days_ago(0), "Headache, no fever", temperature=37.0)
    mathare = await register(clinic, "Halima", "Said", "1990-05-05", "MNH-0001",
                             org=clinic.other_org_id, who="other_admin")
    await visit(clinic, mathare, days_ago(0), "Acute watery diarrhoea", who="other_admin")


async def test_syndromes_are_counted_per_day(clinic: Clinic):
    await _diarrhoea_outbreak(clinic)
    response = await clinic.get("doctor", "/api/surveillance/syndromes", limit=100)
    rows = {r["syndrome"]: r for r in data(response)}
    assert response.json()["meta"]["total"] == len(rows) == 9
    awd = rows["acute-watery-diarrhoea"]
    assert awd["org_id"] == clinic.org_id and awd["total"] == 4
    assert awd["daily"][-1] == {"date": days_ago(0), "count": 4} and len(awd["daily"]) == 28
    assert rows["ili"]["total"] == 1 and rows["fever"]["total"] == 1
    assert rows["sari"]["total"] == 0 and "hospitalization" in rows["sari"]["definition"]
    one = data(await clinic.get("nurse", "/api/surveillance/syndromes", syndrome="ili",
                                date_from=days_ago(1), date_to=days_ago(1)))
    assert one[0]["daily"] == [{"date": days_ago(1), "count": 1}]


async def test_a_platform_administrator_sees_every_facility(clinic: Clinic):
    await _diarrhoea_outbreak(clinic)
    rows = data(await clinic.get("platform_admin", "/api/surveillance/syndromes",
                                 syndrome="acute-watery-diarrhoea"))
    assert {r["org_id"]: r["total"] for r in rows} == {clinic.org_id: 4,
                                                       clinic.other_org_id: 1}


async def test_alerts_signal_the_outbreak(clinic: Clinic):
    await _diarrhoea_outbreak(clinic)
    response = await clinic.get("admin", "/api/surveillance/alerts",
                                syndrome="acute-watery-diarrhoea")
    alerts = data(response)
    assert {a["method"] for a in alerts} == {"C1", "C2", "C3"}
    assert all(a["date"] == days_ago(0) and a["count"] == 4 and a["signal"] for a in alerts)
    c1 = next(a for a in alerts if a["method"] == "C1")
    assert c1["baseline_mean"] == 0 and c1["statistic"] > c1["threshold"]
    everything = data(await clinic.get("admin", "/api/surveillance/alerts",
                                       signals_only="false", method="C1", limit=100))
    assert {a["date"] for a in everything} == {days_ago(i) for i in range(7)}
    assert not any(a["signal"] for a in everything if a["syndrome"] == "sari")
    page = await clinic.get("admin", "/api/surveillance/alerts", signals_only="false",
                            limit=5, page=2)
    assert len(data(page)) == 5 and page.json()["meta"]["total"] == 7 * 9 * 3


async def test_who_may_see_surveillance_figures(clinic: Clinic):
    for who in ("receptionist", "billing", "lab", "stranger"):
        for path in ("/api/surveillance/syndromes", "/api/surveillance/alerts"):
            assert refusal(await clinic.get(who, path))[0] == 403, (who, path)
    assert refusal(await clinic.get("other_admin", "/api/surveillance/alerts",
                                    org_id=clinic.org_id))[0] == 403
    assert refusal(await clinic.get("doctor", "/api/surveillance/alerts",
                                    org_id="no-such-org")) == (404, "NOT_FOUND")
    for path in ("/api/surveillance/syndromes", "/api/surveillance/alerts"):
        assert (await clinic.client.get(path)).status_code == 401


async def test_bad_filters_name_the_field(clinic: Clinic):
    for params, field in (({"syndrome": "cold"}, "syndrome"),
                          ({"method": "C4"}, "method"),
                          ({"date_from": days_ago(1), "date_to": days_ago(5)}, "date_from"),
                          ({"date_from": "2024-01-01"}, "date_from")):
        response = await clinic.get("doctor", "/api/surveillance/alerts", **params)
        assert refusal(response) == (422, "VALIDATION_ERROR"), params
        assert response.json()["error"]["field"] == field


async def test_the_weeks_syndromes_go_to_the_hmis(clinic: Clinic, dhis2):
    stand_in, _ = dhis2
    period = last_complete_week()
    monday = date.fromisocalendar(int(period[:4]), int(period[5:]), 1)
    await set_district(clinic, clinic.org_id, "Kibra", "KEkibera001")
    for offset in (0, 2, 4):
        await visit(clinic, clinic.patient_id, (monday + timedelta(days=offset)).isoformat(),
                    "fever and cough", temperature=38.9)
    events = clinic.recorded("platform.surveillance.hmis_exported")
    dry = data(await clinic.post("admin", "/api/surveillance/export/hmis",
                                 {"period": period, "dry_run": True}))
    assert dry["push"] is None and stand_in.requests == []
    values = {v["dataElement"]: v["value"] for v in dry["data_value_set"]["dataValues"]}
    assert values["SYNDili0001"] == "3" and values["SYNDawd0001"] == "0"
    assert dry["data_value_set"]["dataSet"] == "SYNDweekly1"
    first = data(await clinic.post("admin", "/api/surveillance/export/hmis",
                                   {"period": period}))
    assert first["push"]["import_count"]["imported"] == 9
    again = data(await clinic.post("admin", "/api/surveillance/export/hmis",
                                   {"period": period}))
    assert again["push"]["import_count"] == {"imported": 0, "updated": 9, "ignored": 0,
                                             "deleted": 0}
    assert stand_in.values[("SYNDili0001", period, "KEkibera001", "HllvX50cXC0")] == "3"
    await clinic.drain()
    assert len(events) == 2
    assert refusal(await clinic.post("doctor", "/api/surveillance/export/hmis",
                                     {"period": period}))[0] == 403
    response = await clinic.post("admin", "/api/surveillance/export/hmis", {"period": "W12"})
    assert response.json()["error"]["field"] == "period"
