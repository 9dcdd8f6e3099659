"""/admin/dlq: failed events are listed, counted, retried and discarded, never lost."""

from __future__ import annotations

import asyncio

import orjson


async def _fail_once(app) -> list[str]:
    """A handler that fails the first time it sees an event and succeeds afterwards."""
    seen: list[str] = []

    async def flaky(event: dict) -> None:
        seen.append(event["id"])
        if len(seen) == 1:
            raise RuntimeError("pharmacy system unreachable")

    app.state.services.bus.subscribe("platform.prescription.created", flaky)
    return seen


async def _emit(app, payload: dict) -> str:
    store = app.state.services.store
    async with store.unit_of_work() as uow:
        event_id = uow.emit("platform.prescription.created", payload,
                            source_service="prescriptions")
        await uow.commit()
    await app.state.services.bus.drain()
    return event_id


async def test_failed_event_is_listed_retried_and_gone(app, client, admin):
    seen = await _fail_once(app)
    event_id = await _emit(app, {"prescription_id": "rx-1"})
    listing = (await client.get("/admin/dlq", headers=admin["headers"])).json()
    assert listing["meta"]["total"] == 1
    entry = listing["data"][0]
    assert entry["event_id"] == event_id and entry["topic"] == "platform.prescription.created"
    assert "pharmacy system unreachable" in entry["error"]
    assert orjson.loads(entry["original_payload"])["payload"] == {"prescription_id": "rx-1"}
    depth = (await client.get("/admin/dlq/depth", headers=admin["headers"])).json()["data"]
    assert depth["depth"] == 1 and depth["alert"] is False
    assert depth["oldest_event"] == entry["created_at"]
    retried = await client.post(f"/admin/dlq/{entry['id']}/retry", headers=admin["headers"])
    assert retried.status_code == 200 and retried.json()["data"]["retried"] is True
    assert seen == [event_id, event_id]
    assert (await client.get("/admin/dlq/depth", headers=admin["headers"])).json()["data"][
        "depth"] == 0


async def test_retry_that_fails_again_keeps_one_entry(app, client, admin):
    async def broken(event: dict) -> None:
        raise ValueError("formulary code unknown")

    app.state.services.bus.subscribe("platform.prescription.created", broken)
    await _emit(app, {"prescription_id": "rx-2"})
    entry = (await client.get("/admin/dlq", headers=admin["headers"])).json()["data"][0]
    again = await client.post(f"/admin/dlq/{entry['id']}/retry", headers=admin["headers"])
    assert again.status_code == 409 and again.json()["error"]["code"] == "RETRY_FAILED"
    assert "formulary code unknown" in again.json()["error"]["message"]
    listing = (await client.get("/admin/dlq", headers=admin["headers"])).json()
    assert listing["meta"]["total"] == 1
    kept = listing["data"][0]
    assert (kept["id"], kept["retry_count"]) == (entry["id"], 1)
    assert kept["error"] == "ValueError: formulary code unknown"
    assert kept["last_retried_at"] >= entry["created_at"]
    assert kept["original_payload"] == entry["original_payload"]
    await client.post(f"/admin/dlq/{entry['id']}/retry", headers=admin["headers"])
    again = (await client.get("/admin/dlq", headers=admin["headers"])).json()["data"][0]
    assert again["retry_count"] == 2


async def test_undecodable_event_becomes_a_dead_letter_and_can_be_discarded(app, client,
                                                                             admin):
    await app.state.services.bus.deliver_raw(b'{"topic": "platform.auth.user_created"')
    entry = (await client.get("/admin/dlq", headers=admin["headers"])).json()["data"][0]
    assert entry["error"].startswith("undecodable event")
    gone = await client.delete(f"/admin/dlq/{entry['id']}", headers=admin["headers"])
    assert gone.json()["data"] == {"id": entry["id"], "deleted": True}
    assert (await client.delete(f"/admin/dlq/{entry['id']}",
                                headers=admin["headers"])).status_code == 404


async def test_depth_alerts_past_the_threshold(app, client, admin, settings):
    settings.dlq_alert_depth = 1
    for n in range(2):
        await app.state.services.bus.deliver_raw(f"not json {n}")
    depth = (await client.get("/admin/dlq/depth", headers=admin["headers"])).json()["data"]
    assert depth["depth"] == 2 and depth["alert"] is True


async def test_the_list_pages_and_filters_by_topic(app, client, admin):
    async def broken(event: dict) -> None:
        raise RuntimeError("dispensing system down")

    app.state.services.bus.subscribe("platform.prescription.created", broken,
                                     consumer="dispensing")
    for n in range(3):
        await _emit(app, {"prescription_id": f"rx-{n}"})
    await app.state.services.bus.deliver_raw("not json")
    h = admin["headers"]
    page = (await client.get("/admin/dlq?page=2&limit=2", headers=h)).json()
    assert page["meta"] == {"page": 2, "limit": 2, "total": 4} and len(page["data"]) == 2
    only = (await client.get("/admin/dlq?topic=platform.prescription.created",
                             headers=h)).json()
    assert only["meta"]["total"] == 3
    assert {e["consumer"] for e in only["data"]} == {"dispensing"}
    assert (await client.get("/admin/dlq?limit=101", headers=h)).status_code == 422


async def test_depth_alerts_when_the_oldest_entry_is_too_old(app, client, admin, settings):
    await app.state.services.bus.deliver_raw("not json")
    depth = (await client.get("/admin/dlq/depth", headers=admin["headers"])).json()["data"]
    assert (depth["depth"], depth["alert"]) == (1, False)
    settings.dlq_alert_age_seconds = 0
    await asyncio.sleep(0.01)
    depth = (await client.get("/admin/dlq/depth", headers=admin["headers"])).json()["data"]
    assert depth["alert"] is True


async def test_retry_and_delete_of_an_unknown_entry_are_404(client, admin):
    h = admin["headers"]
    assert (await client.post("/admin/dlq/nope/retry", headers=h)).status_code == 404
    assert (await client.delete("/admin/dlq/nope", headers=h)).status_code == 404


async def test_only_platform_admins(client, user, clinic_admin):
    assert (await client.get("/admin/dlq")).status_code == 401
    for method, path in (("GET", "/admin/dlq"), ("GET", "/admin/dlq/depth"),
                         ("POST", "/admin/dlq/x/retry"), ("DELETE", "/admin/dlq/x")):
        assert (await client.request(method, path)).status_code == 401
        for caller in (user, clinic_admin):  # a user, an organization's ORG:ADMIN
            assert (await client.request(method, path, headers=caller["headers"])
                    ).status_code == 403


async def test_an_hl7_message_rejected_with_ar_is_listed_with_its_text_and_reason(
        client, admin):
    """An unsupported message type (here a master file update) is refused with AR and kept,
    so an interface analyst sees what the lab sent and why it was refused."""
    message = ("MSH|^~\\&|CITYLAB-LIS|CITY LAB|HEALTHPLATFORM|KCC|20260301101500||MFN^M02|"
               "MFN-0001|P|2.5.1\rMFI|PRA^Practitioner master file^HL70175||UPD|||AL\r")
    ingested = await client.post("/api/lab/hl7-ingest", content=message.encode(),
                                 headers={**admin["headers"],
                                          "Content-Type": "x-application/hl7-v2+er7"})
    data = ingested.json()["data"]
    assert data["ack_code"] == "AR" and data["dead_letter_id"]
    listing = (await client.get("/admin/dlq", params={"topic": "platform.hl7.message_failed"},
                                headers=admin["headers"])).json()
    [entry] = listing["data"]
    assert entry["id"] == data["dead_letter_id"]
    assert entry["raw_message"].startswith("MSH|^~\\&|CITYLAB-LIS|CITY LAB")
    assert (entry["message_type"], entry["control_id"]) == ("MFN^M02", "MFN-0001")
    assert entry["error"].startswith("rejected: ") and "MFN" in entry["error"]
    retried = await client.post(f"/admin/dlq/{entry['id']}/retry", headers=admin["headers"])
    assert retried.status_code == 409  # still a type the gateway does not take
    assert "failed again" in retried.json()["error"]["message"]
