"""The HMIS export and push: GET /api/public-health/hmis-export, POST
/api/public-health/hmis-push, against a stand-in DHIS2 over real HTTP."""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest

from platform_api.public_health.dhis2 import Dhis2Client, HmisError
from platform_api.public_health.reporting import last_complete_week
from tests.conftest import make_settings
from tests.platform_api.public_health.helpers import (
    Clinic,
    data,
    refusal,
    register,
    report,
    set_district,
)
from tests.stand_ins import free_port

PERIOD = last_complete_week()
MONDAY = date.fromisocalendar(int(PERIOD[:4]), int(PERIOD[5:]), 1)


async def _week_of_cases(clinic: Clinic) -> None:
    """Kibera's week: two cholera cases (a child of 2 who died, an adult), one measles
    case in a child, one discarded cholera case; Mathare's own cholera case."""
    await set_district(clinic, clinic.org_id, "Kibra", "KEkibera001")
    child = await register(clinic, "Baraka", "Otieno", (MONDAY - timedelta(days=800))
                           .isoformat(), "KCC-0002")
    other_child = await register(clinic, "Imani", "Wafula", "2024-01-15", "KCC-0003")
    adult = await register(clinic, "Juma", "Mwangi", "1979-03-02", "KCC-0004")
    onset = MONDAY.isoformat()
    data(await report(clinic, patient_id=child, onset_date=onset, outcome="died"), 201)
    data(await report(clinic, patient_id=adult, onset_date=onset), 201)
    data(await report(clinic, patient_id=other_child, disease="measles", onset_date=onset),
         201)
    data(await report(clinic, onset_date=onset, classification="discarded"), 201)
    mathare = await register(clinic, "Halima", "Said", "1990-05-05", "MNH-0001",
                             org=clinic.other_org_id, who="other_admin")
    data(await report(clinic, who="other_admin", patient_id=mathare, onset_date=onset), 201)


def _values(value_set: dict[str, Any]) -> dict[tuple[str, str], str]:
    return {(v["dataElement"], v["categoryOptionCombo"]): v["value"]
            for v in value_set["dataValues"]}


async def test_the_export_counts_the_weeks_cases_by_disease_and_age(clinic: Clinic):
    await _week_of_cases(clinic)
    value_set = data(await clinic.get("admin", "/api/public-health/hmis-export",
                                      period=PERIOD))
    assert value_set["dataSet"] == "IDSRweekly1" and value_set["period"] == PERIOD
    assert value_set["orgUnit"] == "KEkibera001"
    assert {v["period"] for v in value_set["dataValues"]} == {PERIOD}
    values = _values(value_set)
    assert values[("IDSRcholCas", "IDSRageLt5y")] == "1"
    assert values[("IDSRcholCas", "IDSRage5yUp")] == "1"  # the discarded one is not counted
    assert values[("IDSRcholDea", "IDSRageLt5y")] == "1"
    assert values[("IDSRcholDea", "IDSRage5yUp")] == "0"
    assert values[("IDSRmeasCas", "IDSRageLt5y")] == "1"
    assert values[("IDSRebolCas", "IDSRage5yUp")] == "0"  # zero reporting
    assert len(values) == 26 * 2 * 2
    # the week before holds none of them
    earlier = (MONDAY - timedelta(days=7)).isocalendar()
    before = data(await clinic.get("admin", "/api/public-health/hmis-export",
                                   period=f"{earlier[0]}W{earlier[1]}"))
    assert set(_values(before).values()) == {"0"}


async def test_the_push_is_idempotent_per_period(clinic: Clinic, dhis2):
    stand_in, _ = dhis2
    await _week_of_cases(clinic)
    events = clinic.recorded("platform.public_health.hmis_pushed")
    first = data(await clinic.post("admin", "/api/public-health/hmis-push",
                                   {"period": PERIOD}))
    assert first["status"] == "SUCCESS" and first["org_unit"] == "KEkibera001"
    assert first["import_count"] == {"imported": 104, "updated": 0, "ignored": 0,
                                     "deleted": 0}
    assert stand_in.requests[0]["query"]["importStrategy"] == "CREATE_AND_UPDATE"
    second = data(await clinic.post("admin", "/api/public-health/hmis-push",
                                    {"period": PERIOD, "org_id": clinic.org_id}))
    assert second["import_count"]["updated"] == 104
    assert second["import_count"]["imported"] == 0 and second["pushes"] == 2
    assert len(stand_in.values) == 104
    assert stand_in.values[("IDSRcholCas", PERIOD, "KEkibera001", "IDSRageLt5y")] == "1"
    await clinic.drain()
    assert [e["payload"]["import_count"]["updated"] for e in events] == [0, 104]


async def test_the_platform_administrator_pushes_for_a_named_facility(clinic: Clinic):
    await _week_of_cases(clinic)
    assert refusal(await clinic.post("platform_admin", "/api/public-health/hmis-push",
                                     {"period": PERIOD})) == (422, "ORGANIZATION_REQUIRED")
    pushed = data(await clinic.post("platform_admin", "/api/public-health/hmis-push",
                                    {"period": PERIOD, "org_id": clinic.org_id}))
    assert pushed["org_id"] == clinic.org_id


async def test_a_facility_without_an_org_unit_or_unknown_to_dhis2(clinic: Clinic):
    response = await clinic.get("admin", "/api/public-health/hmis-export", period=PERIOD)
    assert refusal(response) == (409, "ORG_UNIT_NOT_MAPPED")
    await set_district(clinic, clinic.org_id, "Kibra", "KEunknown01")
    response = await clinic.post("admin", "/api/public-health/hmis-push", {"period": PERIOD})
    assert refusal(response) == (502, "HMIS_IMPORT_FAILED")
    assert response.json()["error"]["details"][0]["object"] == "KEunknown01"


async def test_who_may_export_and_push(clinic: Clinic):
    await set_district(clinic, clinic.org_id, "Kibra", "KEkibera001")
    for who in ("doctor", "nurse", "receptionist", "stranger"):
        assert refusal(await clinic.get(who, "/api/public-health/hmis-export",
                                        period=PERIOD))[0] == 403, who
        assert refusal(await clinic.post(who, "/api/public-health/hmis-push",
                                         {"period": PERIOD}))[0] == 403, who
    assert refusal(await clinic.get("other_admin", "/api/public-health/hmis-export",
                                    org_id=clinic.org_id))[0] == 403
    assert refusal(await clinic.get("admin", "/api/public-health/hmis-export",
                                    org_id="no-such-org")) == (404, "NOT_FOUND")
    assert (await clinic.client.get("/api/public-health/hmis-export")).status_code == 401
    data(await clinic.get("platform_admin", "/api/public-health/hmis-export",
                          org_id=clinic.org_id))


async def test_bad_periods_are_refused_naming_the_field(clinic: Clinic):
    await set_district(clinic, clinic.org_id, "Kibra", "KEkibera001")
    for bad in ("2026-11", "2026W99"):
        response = await clinic.get("admin", "/api/public-health/hmis-export", period=bad)
        assert refusal(response) == (422, "VALIDATION_ERROR"), bad
        assert response.json()["error"]["field"] == "period"
    future = (date.today() + timedelta(days=14)).isocalendar()
    response = await clinic.post("admin", "/api/public-health/hmis-push",
                                 {"period": f"{future[0]}W{future[1]}"})
    assert refusal(response) == (422, "VALIDATION_ERROR")
    assert response.json()["error"]["field"] == "period"


async def test_the_client_signs_in_with_a_token_and_reads_both_summary_shapes(dhis2):
    stand_in, url = dhis2
    values = {"dataSet": "IDSRweekly1", "period": PERIOD, "orgUnit": "KEkibera001",
              "dataValues": [{"dataElement": "IDSRcholCas", "period": PERIOD,
                              "orgUnit": "KEkibera001", "categoryOptionCombo": "IDSRageLt5y",
                              "value": "3"}]}
    summary = await Dhis2Client(url, token=stand_in.token).import_data_values(values)
    assert summary.status == "SUCCESS" and summary.import_count["imported"] == 1
    stand_in.legacy = True
    summary = await Dhis2Client(url, token=stand_in.token).import_data_values(values)
    assert summary.import_count["updated"] == 1
    stand_in.legacy = False
    mixed = {**values, "dataValues": [*values["dataValues"], {
        **values["dataValues"][0], "orgUnit": "KEnowhere01"}]}
    summary = await Dhis2Client(url, token=stand_in.token).import_data_values(mixed)
    assert summary.status == "WARNING"  # DHIS2 answers it with HTTP 409
    assert summary.import_count["updated"] == 1 and summary.import_count["ignored"] == 1
    assert summary.conflicts == [{"object": "KEnowhere01",
                                  "value": "Org unit not found or not accessible"}]
    with pytest.raises(HmisError) as refused:
        await Dhis2Client(url, token="d2pat_wrong").import_data_values(values)
    assert refused.value.code == "HMIS_AUTH_FAILED" and "d2pat" not in refused.value.message
    with pytest.raises(HmisError) as refused:
        await Dhis2Client(url, "hmis-reporter", "wrong").import_data_values(values)
    assert refused.value.code == "HMIS_AUTH_FAILED"
    with pytest.raises(HmisError) as refused:
        await Dhis2Client(url + "/dhis", token=stand_in.token).import_data_values(values)
    assert refused.value.code == "HMIS_REJECTED" and "404" in refused.value.message
    with pytest.raises(HmisError) as refused:
        await Dhis2Client(f"http://127.0.0.1:{free_port()}").import_data_values(values)
    assert refused.value.code == "HMIS_UNREACHABLE"


def test_no_hmis_configured_is_said(tmp_path: Path):
    with pytest.raises(HmisError) as refused:
        Dhis2Client.from_settings(make_settings(tmp_path))
    assert refused.value.code == "HMIS_NOT_CONFIGURED"


def test_a_mapping_that_does_not_fit_stops_the_app(tmp_path: Path):
    import json

    from platform_api.app import create_app
    from platform_api.public_health.knowledge import DATA

    mapping = json.loads((DATA / "hmis_mapping.json").read_text())
    mapping["cases"]["data_elements"]["common-cold"] = {"cases": "XXcoldCases",
                                                       "deaths": "XXcoldDeath"}
    path = tmp_path / "mapping.json"
    path.write_text(json.dumps(mapping))
    with pytest.raises(ValueError, match="common-cold"):
        create_app(make_settings(tmp_path, hmis_mapping_file=str(path)))
    own = tmp_path / "own.json"
    del mapping["cases"]["data_elements"]["common-cold"]
    mapping["cases"]["data_elements"]["cholera"]["cases"] = "KEcholera01"
    own.write_text(json.dumps(mapping))
    create_app(make_settings(tmp_path, hmis_mapping_file=str(own)))


async def test_a_push_without_an_hmis_configured_is_503(tmp_path: Path):
    import httpx
    from asgi_lifespan import LifespanManager

    from platform_api.app import create_app
    from tests.conftest import make_clinic_admin

    app = create_app(make_settings(tmp_path))
    async with LifespanManager(app, startup_timeout=30):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            founder = await make_clinic_admin(client)
            organization = (await client.get(f"/fhir/Organization/{founder['org_id']}",
                                             headers=founder["headers"])).json()
            organization["identifier"] = [{"system": "urn:healthplatform:hmis-org-unit",
                                           "value": "KEkibera001"}]
            await client.put(f"/fhir/Organization/{founder['org_id']}",
                             headers=founder["headers"], json=organization)
            response = await client.post("/api/public-health/hmis-push",
                                         headers=founder["headers"], json={"period": PERIOD})
    assert refusal(response) == (503, "HMIS_NOT_CONFIGURED")
