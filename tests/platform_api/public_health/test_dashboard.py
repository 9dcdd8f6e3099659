"""The public-health dashboard: GET /api/public-health/dashboard (platform
administrators)."""

from __future__ import annotations

from datetime import date, timedelta

from platform_api.public_health.cases import epi_week
from tests.platform_api.public_health.helpers import (
    Clinic,
    data,
    days_ago,
    refusal,
    register,
    report,
    set_district,
)


async def _cases(clinic: Clinic) -> None:
    """Kibera (Kibra district): two cholera cases (one died), a measles case three weeks
    ago; Mathare (Mathare district): a cholera case; a discarded case."""
    await set_district(clinic, clinic.org_id, "Kibra", None)
    await set_district(clinic, clinic.other_org_id, "Mathare", None, who="other_admin")
    adult = await register(clinic, "Juma", "Mwangi", "1979-03-02", "KCC-0004")
    data(await report(clinic, onset_date=days_ago(1), outcome="died"), 201)
    data(await report(clinic, patient_id=adult, onset_date=days_ago(2)), 201)
    data(await report(clinic, patient_id=adult, disease="measles", onset_date=days_ago(21)),
         201)
    data(await report(clinic, patient_id=adult, disease="typhoid", onset_date=days_ago(3),
                      classification="discarded"), 201)
    mathare = await register(clinic, "Halima", "Said", "1990-05-05", "MNH-0001",
                             org=clinic.other_org_id, who="other_admin")
    data(await report(clinic, who="other_admin", patient_id=mathare, onset_date=days_ago(1)),
         201)


def _by(rows: list[dict], field: str = "key") -> dict[str, tuple[int, int]]:
    return {r[field]: (r["cases"], r["deaths"]) for r in rows if r["cases"]}


async def test_counts_by_disease_week_facility_and_district(clinic: Clinic):
    await _cases(clinic)
    view = data(await clinic.get("platform_admin", "/api/public-health/dashboard"))
    assert view["total"] == 4 and view["deaths"] == 1
    assert _by(view["by_disease"]) == {"cholera": (3, 1), "measles": (1, 0)}
    assert view["by_disease"][0]["label"] == "Cholera"
    assert _by(view["by_district"]) == {"Kibra": (3, 1), "Mathare": (1, 0)}
    assert _by(view["by_facility"], "label") == {"Kibera Community Clinic": (3, 1),
                                                 "Mathare North Health Centre": (1, 0)}
    weeks = [r["key"] for r in view["by_week"]]
    assert len(weeks) in (12, 13) and weeks[-1] == epi_week(date.today())
    assert sum(r["cases"] for r in view["by_week"]) == 4
    assert dict(_by(view["by_week"]))[epi_week(date.today() - timedelta(days=21))] == (1, 0)


async def test_filters_narrow_the_counts(clinic: Clinic):
    await _cases(clinic)
    get = clinic.get
    assert data(await get("platform_admin", "/api/public-health/dashboard",
                          disease="measles"))["total"] == 1
    assert data(await get("platform_admin", "/api/public-health/dashboard",
                          district="Mathare"))["total"] == 1
    assert data(await get("platform_admin", "/api/public-health/dashboard",
                          org_id=clinic.org_id))["total"] == 3
    assert data(await get("platform_admin", "/api/public-health/dashboard",
                          date_from=days_ago(7)))["total"] == 3


async def test_charts_as_svg_and_png(clinic: Clinic):
    await _cases(clinic)
    svg = await clinic.get("platform_admin", "/api/public-health/dashboard", format="svg",
                           chart="disease")
    assert svg.status_code == 200 and svg.headers["content-type"] == "image/svg+xml"
    assert svg.text.lstrip().startswith("<?xml") and "<svg" in svg.text
    assert "Cholera" in svg.text and "Notifiable cases by disease" in svg.text
    png = await clinic.get("platform_admin", "/api/public-health/dashboard", format="png")
    assert png.headers["content-type"] == "image/png"
    assert png.content.startswith(b"\x89PNG\r\n\x1a\n") and len(png.content) > 2000


async def test_only_platform_administrators_and_bad_filters(clinic: Clinic):
    for who in ("admin", "doctor", "stranger"):
        assert refusal(await clinic.get(who, "/api/public-health/dashboard"))[0] == 403
    assert (await clinic.client.get("/api/public-health/dashboard")).status_code == 401
    for params, field in (({"disease": "flu"}, "disease"),
                          ({"date_from": "2026-02-30"}, "date_from"),
                          ({"date_from": days_ago(1), "date_to": days_ago(3)}, "date_from"),
                          ({"date_from": "2020-01-01"}, "date_from"),
                          ({"format": "gif"}, "format")):
        response = await clinic.get("platform_admin", "/api/public-health/dashboard",
                                    **params)
        assert refusal(response) == (422, "VALIDATION_ERROR"), params
        assert response.json()["error"]["field"] == field, params


async def test_a_question_past_the_search_limit_is_split_or_refused(clinic: Clinic,
                                                                    monkeypatch):
    from platform_api.public_health import reporting

    await _cases(clinic)
    # Kibera's three counted cases span three days: the whole range fills a search of 4
    # (3 conditions and the patient they include), each half does not
    monkeypatch.setattr(reporting, "MAX_SEARCH_RESULTS", 4)
    view = data(await clinic.get("platform_admin", "/api/public-health/dashboard",
                                 org_id=clinic.org_id))
    assert view["total"] == 3
    monkeypatch.setattr(reporting, "MAX_SEARCH_RESULTS", 2)  # one day fills it
    response = await clinic.get("platform_admin", "/api/public-health/dashboard")
    assert refusal(response) == (422, "TOO_MANY_RECORDS")
    assert response.json()["error"]["field"] == "org_id"


async def test_a_notifiable_case_written_on_fhir_with_icd10_counts(clinic: Clinic):
    response = await clinic.client.post("/fhir/Condition", headers=clinic.h("doctor"), json={
        "resourceType": "Condition",
        "category": [{"coding": [{"system": "urn:healthplatform:condition-category",
                                  "code": "notifiable-case"}]}],
        "code": {"coding": [{"system": "http://hl7.org/fhir/sid/icd-10", "code": "B05.9"}]},
        "subject": {"reference": f"Patient/{clinic.patient_id}"},
        "onsetDateTime": days_ago(2)})
    assert response.status_code == 201, response.text
    view = data(await clinic.get("platform_admin", "/api/public-health/dashboard"))
    assert _by(view["by_disease"]) == {"measles": (1, 0)}
