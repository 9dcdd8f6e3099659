"""Treatment protocols (``platform_api.treatments.protocols``): PlanDefinitions, versioned,
retired rather than deleted once a patient's treatment was started from them."""

from __future__ import annotations

from tests.platform_api.treatments.conftest import data, malaria_protocol, shipped


async def test_the_who_regimens_are_shipped_as_active_protocols(clinic):
    tb = await shipped(clinic, "tb-2hrze-4hr")
    assert tb["status"] == "active" and tb["version"] == "1"
    assert tb["organization_id"] is None
    assert [s["id"] for s in tb["steps"]][:2] == ["intensive-hrze", "continuation-hr"]
    intensive, continuation = tb["steps"][:2]
    assert intensive["duration"] == {"value": 2, "unit": "mo"}
    assert continuation["after"] == "intensive-hrze"
    assert continuation["duration"] == {"value": 4, "unit": "mo"}
    assert intensive["code"]["code"] == "J04AM06"
    art = await shipped(clinic, "hiv-art-tld")
    tld = next(s for s in art["steps"] if s["id"] == "tld-daily")
    assert tld["duration"] is None and tld["repeat"]["unit"] == "d"
    assert art["condition"]["code"] == "86406008"


async def test_a_protocol_is_a_plan_definition_everyone_reads(clinic):
    made = data(await clinic.post("doctor", "/api/treatments", malaria_protocol()), 201)
    assert made["status"] == "draft" and made["organization_id"] == clinic.org_id
    assert made["url"] == "urn:healthplatform:treatment-protocol:malaria-al"
    plan = (await clinic.get("doctor", f"/fhir/PlanDefinition/{made['id']}")).json()
    assert plan["type"]["coding"][0]["code"] == "clinical-protocol"
    assert plan["action"][0]["timingTiming"]["repeat"] == {
        "boundsDuration": {"value": 3, "unit": "d", "system": "http://unitsofmeasure.org",
                           "code": "d"}, "frequency": 2, "period": 1, "periodUnit": "d"}
    assert plan["action"][1]["relatedAction"] == [{"actionId": "al",
                                                   "relationship": "after-end"}]
    seen = data(await clinic.get("stranger", f"/api/treatments/{made['id']}"))
    assert seen["steps"][0]["instructions"] == "4 tablets (20/120 mg) twice daily"


async def test_only_doctors_and_administrators_write_protocols(clinic):
    for who in ("nurse", "receptionist", "stranger"):
        response = await clinic.post(who, "/api/treatments", malaria_protocol())
        assert response.status_code == 403, (who, response.text)


async def test_a_protocol_with_a_step_after_an_unknown_step_is_refused(clinic):
    body = malaria_protocol()
    body["steps"][1]["after"] = "quinine"
    response = await clinic.post("doctor", "/api/treatments", body)
    assert response.status_code == 422
    assert "quinine" in response.json()["error"]["message"]


async def test_the_same_code_and_version_twice_is_a_conflict(clinic):
    data(await clinic.post("doctor", "/api/treatments", malaria_protocol()), 201)
    response = await clinic.post("doctor", "/api/treatments", malaria_protocol())
    assert (response.status_code, response.json()["error"]["code"]) == (409,
                                                                         "PROTOCOL_EXISTS")


async def test_status_moves_follow_the_table(clinic):
    made = data(await clinic.post("doctor", "/api/treatments", malaria_protocol()), 201)
    url = f"/api/treatments/{made['id']}"
    active = data(await clinic.client.patch(url, json={"status": "active"},
                                            headers=clinic.h("doctor")))
    assert active["status"] == "active"
    response = await clinic.client.patch(url, json={"status": "draft"},
                                         headers=clinic.h("doctor"))
    assert (response.status_code, response.json()["error"]["code"]) == (
        409, "INVALID_TRANSITION")


async def test_a_protocol_not_in_use_changes_and_is_deleted(clinic):
    made = data(await clinic.post("doctor", "/api/treatments", malaria_protocol()), 201)
    url = f"/api/treatments/{made['id']}"
    changed = data(await clinic.client.patch(url, json={"title": "Malaria (AL)"},
                                             headers=clinic.h("doctor")))
    assert changed["title"] == "Malaria (AL)"
    refused = await clinic.client.delete(url, headers=clinic.h("doctor"))
    assert refused.status_code == 403  # definitions: only the ORG:ADMIN deletes
    gone = data(await clinic.client.delete(url, headers=clinic.h("admin")))
    assert gone == {"id": made["id"], "deleted": True, "retired": False}
    assert (await clinic.get("doctor", url)).status_code == 404


async def test_a_new_version_supersedes_and_retires_the_earlier_one(clinic):
    first = data(await clinic.post("doctor", "/api/treatments",
                                   malaria_protocol(status="active")), 201)
    events = clinic.recorded("platform.treatments.*")
    second = data(await clinic.post("doctor", "/api/treatments", malaria_protocol(
        status="active", supersedes_id=first["id"], title="Malaria: AL, 2027")), 201)
    assert second["version"] == "2" and second["supersedes_id"] == first["id"]
    assert second["url"] == first["url"]
    earlier = data(await clinic.get("doctor", f"/api/treatments/{first['id']}"))
    assert earlier["status"] == "retired"
    await clinic.drain()
    assert {e["topic"] for e in events} == {"platform.treatments.protocol_created",
                                            "platform.treatments.protocol_retired"}
    versions = data(await clinic.get("doctor", "/api/treatments", code="malaria-al"))
    assert {v["version"] for v in versions} == {"1", "2"}


async def test_the_list_filters_by_status_and_pages(clinic):
    data(await clinic.post("doctor", "/api/treatments", malaria_protocol()), 201)
    drafts = await clinic.get("doctor", "/api/treatments", status="draft")
    assert [p["code"] for p in drafts.json()["data"]] == ["malaria-al"]
    page = (await clinic.get("doctor", "/api/treatments", limit=1)).json()
    assert page["meta"]["total"] == 3 and len(page["data"]) == 1


async def test_a_shipped_protocol_is_changed_only_by_platform_administrators(clinic):
    tb = await shipped(clinic, "tb-2hrze-4hr")
    url = f"/api/treatments/{tb['id']}"
    for who in ("doctor", "admin"):
        response = await clinic.client.patch(url, json={"description": "Shorter"},
                                             headers=clinic.h(who))
        assert response.status_code == 403, who
    changed = await clinic.client.patch(url, json={"description": "WHO 2022 regimen"},
                                        headers=clinic.h("platform_admin"))
    assert changed.json()["data"]["description"] == "WHO 2022 regimen"


async def test_the_shipped_protocols_are_stored_once_across_restarts(clinic):
    from platform_api.treatments import start

    await start(clinic.app.state.services)
    found = await clinic.get("stranger", "/api/treatments", code="tb-2hrze-4hr")
    assert found.json()["meta"]["total"] == 1


async def test_a_plan_definition_that_is_no_protocol_is_not_found_here(clinic):
    rule = await clinic.client.post("/fhir/PlanDefinition", headers=clinic.h("doctor"), json={
        "resourceType": "PlanDefinition", "status": "active", "name": "sepsis-alert",
        "type": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/"
                                       "plan-definition-type", "code": "eca-rule"}]}})
    assert rule.status_code == 201, rule.text
    response = await clinic.get("doctor", f"/api/treatments/{rule.json()['id']}")
    assert response.status_code == 404
    listed = data(await clinic.get("doctor", "/api/treatments"))
    assert rule.json()["id"] not in {p["id"] for p in listed}
