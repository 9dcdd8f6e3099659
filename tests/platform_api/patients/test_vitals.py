"""Vitals: FHIR vital-signs Observations in a panel, range checks naming the field, partial
updates, deletes, lists, and who may do what."""

from __future__ import annotations

VITALS = {"heart_rate": 88, "blood_pressure_systolic": 128, "blood_pressure_diastolic": 82,
          "temperature": 38.4, "respiratory_rate": 18, "oxygen_saturation": 97}


async def record(clinic, who=None, **values):
    response = await clinic.client.post(
        "/api/vitals", json={"patient_id": clinic.patient_id, **(values or VITALS)},
        headers=(who or clinic.nurse)["headers"])
    assert response.status_code == 201, response.text
    return response.json()["data"]


async def test_vitals_are_observations_of_the_vital_signs_profiles(clinic):
    vitals = await record(clinic)
    assert {k: vitals[k] for k in VITALS} == VITALS
    assert vitals["interpretation"]["temperature"] == "H"
    assert vitals["interpretation"]["heart_rate"] == "N"
    panel = (await clinic.fhir(f"Observation/{vitals['id']}")).json()
    assert panel["code"]["coding"][0]["code"] == "85353-1"
    assert len(panel["hasMember"]) == 5
    ids = vitals["observation_ids"]
    heart = (await clinic.fhir(f"Observation/{ids['heart_rate']}")).json()
    assert heart["category"][0]["coding"][0]["code"] == "vital-signs"
    assert heart["code"]["coding"][0] == {"system": "http://loinc.org", "code": "8867-4",
                                          "display": "Heart rate"}
    assert heart["valueQuantity"] == {"value": 88, "unit": "beats/minute",
                                      "system": "http://unitsofmeasure.org", "code": "/min"}
    assert heart["meta"]["profile"] == ["http://hl7.org/fhir/StructureDefinition/heartrate"]
    pressure = (await clinic.fhir(f"Observation/{ids['blood_pressure']}")).json()
    assert pressure["code"]["coding"][0]["code"] == "85354-9"
    assert [(c["code"]["coding"][0]["code"], c["valueQuantity"]["code"])
            for c in pressure["component"]] == [("8480-6", "mm[Hg]"), ("8462-4", "mm[Hg]")]
    oxygen = (await clinic.fhir(f"Observation/{ids['oxygen_saturation']}")).json()
    assert [c["code"] for c in oxygen["code"]["coding"]] == ["2708-6", "59408-5"]
    temperature = (await clinic.fhir(f"Observation/{ids['temperature']}")).json()
    assert temperature["valueQuantity"]["code"] == "Cel"
    # FHIR clients find them like any vital sign.
    found = (await clinic.fhir(f"Observation?subject=Patient/{clinic.patient_id}"
                               "&code=http://loinc.org|8867-4")).json()
    assert found["total"] == 1


async def test_physiologically_impossible_values_are_422_naming_the_field(clinic):
    for field, value in (("heart_rate", 900), ("temperature", 52), ("oxygen_saturation", 140),
                         ("respiratory_rate", 0), ("blood_pressure_systolic", 400)):
        response = await clinic.client.post("/api/vitals", json={
            "patient_id": clinic.patient_id, **VITALS, field: value},
            headers=clinic.nurse["headers"])
        assert response.status_code == 422, field
        assert response.json()["error"]["field"] == field
    half = await clinic.client.post("/api/vitals", json={
        "patient_id": clinic.patient_id, "blood_pressure_systolic": 120},
        headers=clinic.nurse["headers"])
    assert half.status_code == 422 and half.json()["error"]["field"] == \
        "blood_pressure_diastolic"
    inverted = await clinic.client.post("/api/vitals", json={
        "patient_id": clinic.patient_id, "blood_pressure_systolic": 70,
        "blood_pressure_diastolic": 90}, headers=clinic.nurse["headers"])
    assert inverted.status_code == 422
    nothing = await clinic.client.post("/api/vitals", json={"patient_id": clinic.patient_id},
                                       headers=clinic.nurse["headers"])
    assert nothing.status_code == 422
    assert (await clinic.fhir(f"Observation?subject=Patient/{clinic.patient_id}")
            ).json()["total"] == 0  # nothing half-written


async def test_patch_changes_the_signs_sent(clinic):
    vitals = await record(clinic)
    url = f"/api/vitals/{vitals['id']}"
    patched = await clinic.client.patch(url, json={"temperature": 37.1,
                                                   "oxygen_saturation": None},
                                        headers=clinic.nurse["headers"])
    assert patched.status_code == 200, patched.text
    data = patched.json()["data"]
    assert data["temperature"] == 37.1 and data["oxygen_saturation"] is None
    assert data["heart_rate"] == 88 and data["status"] == "amended"
    assert "oxygen_saturation" not in data["observation_ids"]
    temperature = (await clinic.fhir(f"Observation/{vitals['observation_ids']['temperature']}"
                                     )).json()
    assert temperature["meta"]["versionId"] == "2" and temperature["status"] == "amended"
    heart = (await clinic.fhir(f"Observation/{vitals['observation_ids']['heart_rate']}")).json()
    assert heart["meta"]["versionId"] == "1"  # untouched
    withdrawn = (await clinic.fhir(
        f"Observation/{vitals['observation_ids']['oxygen_saturation']}")).json()
    assert withdrawn["status"] == "entered-in-error"
    bad = await clinic.client.patch(url, json={"heart_rate": 900},
                                    headers=clinic.nurse["headers"])
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "heart_rate"
    half = await clinic.client.patch(url, json={"blood_pressure_systolic": None},
                                     headers=clinic.nurse["headers"])
    assert half.status_code == 422


async def test_delete_removes_the_panel_and_its_members(clinic):
    vitals = await record(clinic)
    url = f"/api/vitals/{vitals['id']}"
    assert (await clinic.client.delete(url, headers=clinic.doctor["headers"])).status_code == 200
    assert (await clinic.client.get(url, headers=clinic.doctor["headers"])).status_code == 404
    left = (await clinic.fhir(f"Observation?subject=Patient/{clinic.patient_id}")).json()
    assert left["total"] == 0


async def test_lists_by_patient_and_mine_newest_first(clinic):
    first = await record(clinic, heart_rate=72, effective_at="2026-02-01T08:00:00Z")
    second = await record(clinic, who=clinic.doctor, heart_rate=110,
                          effective_at="2026-02-03T08:00:00Z")
    listing = (await clinic.client.get(f"/api/vitals?patient_id={clinic.patient_id}",
                                       headers=clinic.doctor["headers"])).json()
    assert [v["id"] for v in listing["data"]] == [second["id"], first["id"]]
    assert listing["data"][0]["heart_rate"] == 110 and listing["meta"]["total"] == 2
    mine = (await clinic.client.get("/api/vitals", headers=clinic.nurse["headers"])).json()
    assert [v["id"] for v in mine["data"]] == [first["id"]]
    own = (await clinic.client.get("/api/vitals", headers=clinic.patient["headers"])).json()
    assert own["meta"]["total"] == 2
    since = (await clinic.client.get(f"/api/vitals?patient_id={clinic.patient_id}"
                                     "&since=2026-02-02T00:00:00Z",
                                     headers=clinic.doctor["headers"])).json()
    assert [v["id"] for v in since["data"]] == [second["id"]]


async def test_access_by_role_membership_and_consent(clinic):
    vitals = await record(clinic)
    url = f"/api/vitals/{vitals['id']}"
    assert (await clinic.client.get(url, headers=clinic.patient["headers"])).status_code == 200
    assert (await clinic.client.patch(url, json={"heart_rate": 70}, headers=clinic.patient[
        "headers"])).status_code == 403
    assert (await clinic.client.delete(url, headers=clinic.nurse["headers"])).status_code == 403
    for response in (
            await clinic.client.get(url, headers=clinic.outsider["headers"]),
            await clinic.client.get(f"/api/vitals?patient_id={clinic.patient_id}",
                                    headers=clinic.outsider["headers"]),
            await clinic.client.post("/api/vitals", json={"patient_id": clinic.patient_id,
                                                          **VITALS},
                                     headers=clinic.outsider["headers"])):
        assert response.status_code == 403
    assert (await clinic.client.get("/api/vitals/unknown", headers=clinic.doctor[
        "headers"])).status_code == 404
    # Another Observation is not a set of vitals.
    heart = vitals["observation_ids"]["heart_rate"]
    assert (await clinic.client.get(f"/api/vitals/{heart}", headers=clinic.doctor[
        "headers"])).status_code == 404
    assert (await clinic.client.get("/api/vitals")).status_code == 401
