"""Action items: Tasks with an owner, a due date and a status; DELETE cancels."""

from __future__ import annotations

from typing import Any

from tests.platform_api.sessions.conftest import data, refusal

JSON = dict[str, Any]


async def create(client, clinic, who: str = "doctor", **fields: Any):  # type: ignore[no-untyped-def]
    return await client.post("/api/sessions/action-items", headers=clinic[who]["headers"], json={
        "description": "Repeat haemoglobin in two weeks", "patient_id": clinic["patient_id"],
        "encounter_id": clinic["encounter_id"], "due_date": "2026-12-09",
        "priority": "routine", **fields})


async def test_an_action_item_is_a_task_with_owner_and_due_date(client, clinic, app) -> None:
    nurse_id = clinic["nurse"]["user"]["id"]
    item = data(await create(client, clinic, owner_id=nurse_id), 201)
    assert (item["status"], item["owner_id"], item["due_date"]) == ("requested", nurse_id,
                                                                    "2026-12-09")
    assert (item["organization_id"], item["created_by"]) == (clinic["org_id"],
                                                             clinic["doctor"]["user"]["id"])
    task = (await client.get(f"/fhir/Task/{item['id']}",
                             headers=clinic["doctor"]["headers"])).json()
    assert task["restriction"]["period"]["end"] == "2026-12-09"
    assert task["code"]["coding"][0]["code"] == "action-item"
    assert task["owner"]["identifier"] == {"system": "urn:healthplatform:user",
                                           "value": nurse_id}
    mine = await client.get(f"/api/sessions/action-items?owner_id={nurse_id}",
                            headers=clinic["nurse"]["headers"])
    assert [i["id"] for i in mine.json()["data"]] == [item["id"]]
    started = data(await client.patch(f"/api/sessions/action-items/{item['id']}",
                                      headers=clinic["nurse"]["headers"],
                                      json={"status": "in-progress"}))
    assert started["status"] == "in-progress"
    done = data(await client.patch(f"/api/sessions/action-items/{item['id']}",
                                   headers=clinic["nurse"]["headers"],
                                   json={"status": "completed", "notes": "Hb 11.2 g/dL"}))
    assert (done["status"], done["notes"]) == ("completed", "Hb 11.2 g/dL")
    assert done["completed_at"]
    back = await client.patch(f"/api/sessions/action-items/{item['id']}",
                              headers=clinic["nurse"]["headers"], json={"status": "requested"})
    assert refusal(back) == (409, "INVALID_TRANSITION")


async def test_delete_cancels_and_keeps_the_item(client, clinic, app) -> None:
    events: list[JSON] = []

    async def seen(event: JSON) -> None:
        if event["topic"].startswith("platform.sessions.action_item_"):
            events.append(event)
    app.state.services.bus.subscribe("platform.sessions.*", seen)
    item = data(await create(client, clinic), 201)
    cancelled = data(await client.delete(f"/api/sessions/action-items/{item['id']}",
                                         headers=clinic["doctor"]["headers"]))
    assert cancelled["status"] == "cancelled"
    assert cancelled["status_reason"].startswith("Cancelled by")
    still = data(await client.get(f"/api/sessions/action-items/{item['id']}",
                                  headers=clinic["doctor"]["headers"]))
    assert still["status"] == "cancelled"
    listed = await client.get("/api/sessions/action-items?status=cancelled",
                              headers=clinic["doctor"]["headers"])
    assert listed.json()["meta"]["total"] == 1
    again = await client.delete(f"/api/sessions/action-items/{item['id']}",
                                headers=clinic["doctor"]["headers"])
    assert refusal(again) == (409, "INVALID_TRANSITION")
    await app.state.services.bus.drain()
    assert [e["topic"] for e in events] == ["platform.sessions.action_item_created",
                                            "platform.sessions.action_item_cancelled"]


async def test_items_about_no_patient_belong_to_an_organization(client, clinic, other_clinic
                                                                ) -> None:
    item = data(await client.post("/api/sessions/action-items",
                                  headers=clinic["doctor"]["headers"],
                                  json={"description": "Restock the ORS sachets"}), 201)
    assert (item["organization_id"], item["patient_id"]) == (clinic["org_id"], None)
    foreign = await client.post("/api/sessions/action-items",
                                headers=clinic["doctor"]["headers"],
                                json={"description": "x", "organization_id":
                                      other_clinic["org_id"]})
    assert foreign.status_code == 403
    outsider_owner = await create(client, clinic,
                                  owner_id=other_clinic["admin"]["user"]["id"])
    assert refusal(outsider_owner) == (422, "OWNER_NOT_MEMBER")


async def test_action_item_refusals(client, clinic, other_clinic) -> None:
    item = data(await create(client, clinic), 201)
    path = f"/api/sessions/action-items/{item['id']}"
    assert (await client.get(path)).status_code == 401
    assert (await client.get(path, headers=other_clinic["admin"]["headers"])).status_code == 403
    assert (await client.delete(path, headers=other_clinic["admin"]["headers"])).status_code \
        == 403
    assert (await create(client, clinic, who="receptionist")).status_code == 403
    assert refusal(await create(client, clinic, patient_id="nobody")) == (404, "NOT_FOUND")
    assert refusal(await create(client, clinic, due_date="next week")) == \
        (422, "VALIDATION_ERROR")
    assert refusal(await client.get("/api/sessions/action-items/none",
                                    headers=clinic["doctor"]["headers"])) == (404, "NOT_FOUND")
    theirs = await client.get("/api/sessions/action-items",
                              headers=other_clinic["admin"]["headers"])
    assert theirs.json()["meta"]["total"] == 0
