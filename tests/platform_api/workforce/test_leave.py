"""Approved leave (the Organizations area's approval, or the HR webhook's event) takes the
member off their shifts, records the leave on their PractitionerRole and reports the
gaps it opens."""

from __future__ import annotations

from tests.platform_api.workforce.conftest import data, published_roster

WEEKDAYS = {"start": "2027-03-01", "end": "2027-03-05"}


async def test_approved_leave_removes_the_member_from_their_shifts(ward):
    roster = await published_roster(ward, **WEEKDAYS)
    applied = ward.recorded("platform.workforce.leave_applied")
    gaps_found = ward.recorded("platform.workforce.coverage_gaps_found")
    nurse = ward.user_id("nurse")
    theirs = [a for a in roster["assignments"] if a["user_id"] == nurse]
    assert theirs, "the nurse works that week"
    first = min(a["date"] for a in theirs)
    leave = data(await ward.post("nurse", "/api/leave-requests", {
        "organization_id": ward.org_id, "type": "sick", "start": first, "end": "2027-03-05"}),
        201)
    data(await ward.post("admin", f"/api/organizations/{ward.org_id}/leave-requests/"
                                  f"{leave['id']}/approve"))
    await ward.drain()
    after = data(await ward.get("admin", "/api/workforce/rosters"))[0]
    assert not [a for a in after["assignments"] if a["user_id"] == nurse and a["date"] >= first]
    assert after["unmet"] >= len(theirs) and after["status"] == "published"
    assert applied[0]["payload"]["leave_request_id"] == leave["id"]
    assert {a["id"] for a in applied[0]["payload"]["removed"]} == {a["id"] for a in theirs}
    assert gaps_found[0]["payload"]["cause"] == "leave"
    member = data(await ward.get("admin", "/api/workforce/members", user_id=nurse))[0]
    assert any(u["reason"] == f"sick leave ({leave['id']})" for u in member["unavailability"])
    gaps = data(await ward.get("nurse", f"/api/workforce/rosters/{roster['id']}/coverage-gaps",
                               limit=100))
    assert {(g["date"], g["shift_type_id"]) for g in gaps} >= {
        (a["date"], a["shift_type_id"]) for a in theirs}


async def test_a_redelivered_leave_changes_nothing_more(ward):
    roster = await published_roster(ward, **WEEKDAYS)
    nurse = ward.user_id("nurse")
    event = {"id": "evt-leave-1", "topic": "platform.workforce.leave_approved", "payload": {
        "leave_request_id": "hr-7781", "organization_id": ward.org_id, "user_id": nurse,
        "start": "2027-03-01", "end": "2027-03-05", "type": "annual",
        "approved_by": "hr-system"}}
    from platform_api.workforce.leave import LeaveConsumer

    consumer = LeaveConsumer(ward.app.state.services)
    await consumer.leave_approved(event)
    once = data(await ward.get("admin", "/api/workforce/rosters"))[0]
    await consumer.leave_approved({**event, "id": "evt-leave-2"})  # same leave, another id
    twice = data(await ward.get("admin", "/api/workforce/rosters"))[0]
    assert once["revision"] == twice["revision"] and once["revision"] > roster["revision"]
    assert not [a for a in twice["assignments"] if a["user_id"] == nurse]
    member = data(await ward.get("admin", "/api/workforce/members", user_id=nurse))[0]
    assert len(member["unavailability"]) == 1


async def test_leave_of_someone_outside_the_workforce_changes_no_roster(ward):
    await published_roster(ward, **WEEKDAYS)
    before = data(await ward.get("admin", "/api/workforce/rosters"))[0]
    from platform_api.workforce.leave import LeaveConsumer

    await LeaveConsumer(ward.app.state.services).leave_approved({
        "id": "evt-leave-3", "topic": "platform.workforce.leave_approved", "payload": {
            "leave_request_id": "hr-1", "organization_id": ward.org_id,
            "user_id": ward.user_id("billing"), "start": "2027-03-01", "end": "2027-03-05",
            "type": "annual", "approved_by": "hr-system"}})
    after = data(await ward.get("admin", "/api/workforce/rosters"))[0]
    assert after["revision"] == before["revision"]


async def test_the_hr_webhooks_approval_reaches_the_rosters(ward):
    from tests.platform_api.webhooks.conftest import LEAVE_SECRET
    from tests.platform_api.webhooks.signing import body_of, standard_headers

    ward.app.state.services.settings.leave_webhook_secret = LEAVE_SECRET
    roster = await published_roster(ward, **WEEKDAYS)
    doctor = ward.user_id("doctor")
    assert [a for a in roster["assignments"] if a["user_id"] == doctor]
    body = body_of({"leave_request_id": "HR-2027-031", "organization_id": ward.org_id,
                    "user_id": doctor, "start": "2027-03-01T00:00:00+03:00",
                    "end": "2027-03-05", "type": "study", "approved_by": "hr-system"})
    response = await ward.client.post(
        "https://testserver/api/workforce/webhooks/leave-approved", content=body,
        headers=standard_headers(body, "msg_hr_2027_031", secret=LEAVE_SECRET))
    assert response.status_code == 200, response.text
    await ward.drain()
    after = data(await ward.get("admin", "/api/workforce/rosters"))[0]
    assert not [a for a in after["assignments"] if a["user_id"] == doctor]
    member = data(await ward.get("admin", "/api/workforce/members", user_id=doctor))[0]
    assert [u["reason"] for u in member["unavailability"]] == ["study leave (HR-2027-031)"]
