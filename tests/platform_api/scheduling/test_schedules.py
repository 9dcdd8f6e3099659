"""Schedules through the API: their Slots follow them, booked Slots are never dropped
(conflicts are reported), and who may read and write them."""

from __future__ import annotations

from datetime import datetime

from platform_api.scheduling.slots import SlotKeeper, slot_id
from tests.conftest import register_and_login
from tests.platform_api.scheduling.conftest import (
    at,
    booking,
    data,
    make_schedule,
    refusal,
    tomorrow,
)


async def free_slots(client, headers, schedule_id: str) -> list[dict]:
    bundle = (await client.get(f"/fhir/Slot?schedule=Schedule/{schedule_id}&status=free"
                               "&_count=1000&_sort=start", headers=headers)).json()
    return [e["resource"] for e in bundle.get("entry", [])]


async def test_a_schedule_writes_its_slots_for_the_horizon(client, clinic) -> None:
    schedule, headers = clinic["schedule"], clinic["admin"]["headers"]
    assert (schedule["time_zone"], schedule["slot_minutes"]) == ("Africa/Nairobi", 30)
    assert schedule["working_hours"] == [{"rrule": "FREQ=DAILY", "start": "08:00",
                                          "end": "12:00"}]
    assert schedule["slots_created"] >= 16  # 8 a morning: at least two whole mornings
    slots = await free_slots(client, headers, schedule["id"])
    assert len(slots) == schedule["slots_created"]
    day = tomorrow()
    first = datetime.fromisoformat(at(day, 8).replace("Z", "+00:00"))
    assert slot_id(schedule["id"], first) in {s["id"] for s in slots}
    stored = (await client.get(f"/fhir/Schedule/{schedule['id']}", headers=headers)).json()
    assert stored["actor"][0]["reference"] == f"Practitioner/{clinic['doctor']['id']}"
    assert stored["comment"] == "Morning clinic"
    # the resource's schedules
    listed = await client.get(f"/api/resources/{clinic['doctor']['id']}/schedules",
                              headers=headers)
    assert [s["id"] for s in data(listed)] == [schedule["id"]]
    assert listed.json()["meta"]["total"] == 1


async def test_exceptions_and_validation(client, clinic) -> None:
    headers, day = clinic["admin"]["headers"], tomorrow()
    room = data(await client.post("/api/resources", headers=headers, json={
        "type": "room", "name": "Minor theatre", "organization_id": clinic["org_id"],
        "time_zone": "Africa/Nairobi"}), 201)
    closed = await make_schedule(client, headers, room["id"], exceptions=[
        {"start": day.isoformat(), "end": day.isoformat(), "reason": "Jamhuri Day"}])
    slots = await free_slots(client, headers, closed["id"])
    assert slots and not [s for s in slots if s["start"].startswith(at(day, 8)[:10])
                          and s["start"] >= at(day, 8) and s["start"] < at(day, 12)]
    assert closed["exceptions"][0]["reason"] == "Jamhuri Day"
    bad_rule = await client.post("/api/schedules", headers=headers, json={
        "resource_id": room["id"], "working_hours": [
            {"rrule": "FREQ=MINUTELY", "start": "08:00", "end": "09:00"}]})
    assert refusal(bad_rule) == (422, "VALIDATION_ERROR")
    assert bad_rule.json()["error"]["field"].startswith("working_hours.0.rrule")
    no_hours = await client.post("/api/schedules", headers=headers,
                                 json={"resource_id": room["id"], "working_hours": []})
    assert refusal(no_hours) == (422, "VALIDATION_ERROR")
    unknown = await client.post("/api/schedules", headers=headers, json={
        "resource_id": "no-such-room", "working_hours": [
            {"rrule": "FREQ=DAILY", "start": "08:00", "end": "09:00"}]})
    assert refusal(unknown) == (404, "NOT_FOUND")


async def test_a_change_moves_free_slots_and_reports_booked_ones(client, clinic, app
                                                                 ) -> None:
    headers, schedule = clinic["admin"]["headers"], clinic["schedule"]
    doctor_id, day = clinic["doctor"]["id"], tomorrow()
    booked = data(await client.post("/api/appointments",
                                    json=booking(doctor_id, day, 11, 30)), 201)
    events: list[dict] = []

    async def seen(event: dict) -> None:
        events.append(event)
    app.state.services.bus.subscribe("platform.scheduling.schedule_conflict", seen)
    changed = data(await client.put(f"/api/schedules/{schedule['id']}", headers=headers,
                                    json={"working_hours": [{"rrule": "FREQ=DAILY",
                                                             "start": "08:00",
                                                             "end": "11:00"}]}))
    assert changed["slots_removed"] >= 2
    assert [(c["appointment_id"], c["start"]) for c in changed["conflicts"]] == [
        (booked["id"], at(day, 11, 30))]
    # the booking stands: its slot is still busy, and still listed as a conflict
    appointment = data(await client.get(f"/api/appointments/{booked['id']}",
                                        headers=headers))
    assert appointment["status"] == "booked"
    again = data(await client.get(f"/api/schedules/{schedule['id']}", headers=headers))
    assert [c["appointment_id"] for c in again["conflicts"]] == [booked["id"]]
    assert not [s for s in await free_slots(client, headers, schedule["id"])
                if s["start"] >= at(day, 11) and s["start"] < at(day, 12)]
    await app.state.services.bus.drain()
    assert events and events[0]["payload"]["conflicts"][0]["appointment_id"] == booked["id"]
    # moving the appointment into the hours clears the conflict; the stray slot goes
    data(await client.post(f"/api/appointments/{booked['id']}/reschedule", headers=headers,
                           json={"start_time": at(day, 10), "end_time": at(day, 10, 30)}))
    assert data(await client.get(f"/api/schedules/{schedule['id']}", headers=headers)
                )["conflicts"] == []
    stray = await client.get(f"/fhir/Slot/{booked['slot_ids'][0]}", headers=headers)
    assert stray.status_code == 410


async def test_an_inactive_schedule_offers_nothing_and_delete_needs_no_bookings(
        client, clinic) -> None:
    headers, schedule = clinic["admin"]["headers"], clinic["schedule"]
    doctor_id, day = clinic["doctor"]["id"], tomorrow()
    paused = data(await client.put(f"/api/schedules/{schedule['id']}", headers=headers,
                                   json={"active": False}))
    assert paused["active"] is False and paused["slots_removed"] > 0
    assert await free_slots(client, headers, schedule["id"]) == []
    resumed = data(await client.put(f"/api/schedules/{schedule['id']}", headers=headers,
                                    json={"active": True}))
    assert resumed["slots_created"] == paused["slots_removed"]  # the deleted ids come back
    booked = data(await client.post("/api/appointments", json=booking(doctor_id, day)), 201)
    assert refusal(await client.delete(f"/api/schedules/{schedule['id']}", headers=headers)
                   ) == (409, "SCHEDULE_HAS_BOOKINGS")
    data(await client.post(f"/api/appointments/{booked['id']}/cancel", headers=headers,
                           json={}))
    data(await client.delete(f"/api/schedules/{schedule['id']}", headers=headers))
    assert refusal(await client.get(f"/api/schedules/{schedule['id']}", headers=headers)
                   ) == (404, "NOT_FOUND")
    assert await free_slots(client, headers, schedule["id"]) == []


async def test_who_may_read_and_write_schedules(client, clinic, other_clinic) -> None:
    schedule_id, doctor_id = clinic["schedule"]["id"], clinic["doctor"]["id"]
    hours = {"working_hours": [{"rrule": "FREQ=WEEKLY;BYDAY=SA", "start": "09:00",
                                "end": "11:00"}]}
    # the doctor and the receptionist write schedules; only the receptionist deletes
    for who in ("doctor_user", "receptionist", "nurse"):
        got = await client.get(f"/api/schedules/{schedule_id}", headers=clinic[who]["headers"])
        assert got.status_code == 200
    made = data(await client.post("/api/schedules", headers=clinic["doctor_user"]["headers"],
                                  json={"resource_id": doctor_id, "horizon_days": 7, **hours}),
                201)
    assert refusal(await client.delete(f"/api/schedules/{made['id']}",
                                       headers=clinic["doctor_user"]["headers"])
                   ) == (403, "FORBIDDEN")
    data(await client.delete(f"/api/schedules/{made['id']}",
                             headers=clinic["receptionist"]["headers"]))
    # another organization and a patient: nothing
    outsider = other_clinic["admin"]["headers"]
    assert refusal(await client.get(f"/api/schedules/{schedule_id}", headers=outsider)
                   ) == (403, "FORBIDDEN")
    assert refusal(await client.put(f"/api/schedules/{schedule_id}", headers=outsider,
                                    json={"active": False})) == (403, "FORBIDDEN")
    assert refusal(await client.post("/api/schedules", headers=outsider,
                                     json={"resource_id": doctor_id, **hours})
                   ) == (403, "FORBIDDEN")
    patient = await register_and_login(client, first_name="Juma", last_name="Hassan")
    listed = await client.get(f"/api/resources/{doctor_id}/schedules",
                              headers=patient["headers"])
    assert listed.json()["meta"]["total"] == 0  # a patient sees no one's schedules
    assert (await client.get(f"/api/schedules/{schedule_id}")).status_code == 401


async def test_the_keeper_moves_the_horizon_on(app, client, clinic) -> None:
    headers, schedule = clinic["admin"]["headers"], clinic["schedule"]
    before = len(await free_slots(client, headers, schedule["id"]))
    data(await client.put(f"/api/schedules/{schedule['id']}", headers=headers,
                          json={"horizon_days": 5}))
    after = len(await free_slots(client, headers, schedule["id"]))
    assert after >= before + 16
    keeper = SlotKeeper(app.state.services, 0)
    assert await keeper.run_once() == 0  # nothing missing: nothing written
