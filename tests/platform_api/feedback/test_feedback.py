"""Feedback (``platform_api.feedback``): users see their own, an organization's
administrator the feedback about it, platform administrators all; staff triage it;
anonymous feedback keeps no identity, is rate limited per address and refused as spam."""

from __future__ import annotations

import time

from platform_api.housekeeping import Housekeeping
from tests.platform_api.area_operations import (
    assert_credentials_needed,
    assert_served_and_documented,
)
from tests.platform_api.clinic import refusal

WAIT = "The wait at the pharmacy window was over an hour this morning."


def data(response, status=200):
    assert response.status_code == status, response.text
    return response.json()["data"]


async def give(world, who, **fields):
    body = {"category": "care", "rating": 2, "text": WAIT, **fields}
    return data(await world.post(who, "/api/feedback", body), 201)


async def test_feedback_is_stored_with_its_author_and_announced(clinic):
    events = clinic.recorded("platform.feedback.*")
    entry = await give(clinic, "nurse", organization_id=clinic.org_id)
    assert entry["status"] == "new" and entry["user_id"] == clinic.user_id("nurse")
    assert entry["anonymous"] is False and entry["rating"] == 2
    await clinic.drain()
    assert [e["topic"] for e in events] == ["platform.feedback.received"]
    assert "text" not in events[0]["payload"]


async def test_users_see_their_own_and_administrators_all(clinic):
    mine = await give(clinic, "nurse", organization_id=clinic.org_id)
    theirs = await give(clinic, "stranger", category="bug", text="The calendar shows "
                        "the wrong week after midnight.")
    own = (await clinic.get("nurse", "/api/feedback")).json()
    assert [e["id"] for e in own["data"]] == [mine["id"]] and own["meta"]["total"] == 1
    assert (await clinic.get("nurse", f"/api/feedback/{theirs['id']}")).status_code == 403
    everyone = (await clinic.get("platform_admin", "/api/feedback")).json()
    assert {e["id"] for e in everyone["data"]} == {mine["id"], theirs["id"]}
    bugs = data(await clinic.get("platform_admin", "/api/feedback", category="bug"))
    assert [e["id"] for e in bugs] == [theirs["id"]]
    about_clinic = data(await clinic.get("admin", "/api/feedback",
                                         organization_id=clinic.org_id))
    assert [e["id"] for e in about_clinic] == [mine["id"]]
    assert data(await clinic.get("admin", f"/api/feedback/{mine['id']}"))["id"] == mine["id"]
    # another clinic's administrator sees only their own, whatever they ask
    assert data(await clinic.get("other_admin", "/api/feedback",
                                 organization_id=clinic.org_id)) == []
    assert (await clinic.get("other_admin", f"/api/feedback/{mine['id']}")).status_code \
        == 403
    assert refusal(await clinic.get("admin", "/api/feedback/no-such-feedback")) == (
        404, "NOT_FOUND")


async def test_staff_triage_through_the_status_table(clinic):
    entry = await give(clinic, "nurse", organization_id=clinic.org_id)
    url = f"/api/feedback/{entry['id']}"
    events = clinic.recorded("platform.feedback.status_changed")
    refused = await clinic.client.patch(url, json={"status": "resolved"},
                                        headers=clinic.h("nurse"))
    assert refusal(refused) == (403, "FORBIDDEN")
    reviewing = data(await clinic.client.patch(url, json={"status": "in-review"},
                                               headers=clinic.h("admin")))
    assert reviewing["status"] == "in-review"
    assert reviewing["triaged_by"] == clinic.user_id("admin")
    late_edit = await clinic.client.patch(url, json={"rating": 1},
                                          headers=clinic.h("nurse"))
    assert refusal(late_edit) == (409, "FEEDBACK_TRIAGED")
    resolved = data(await clinic.client.patch(url, json={
        "status": "resolved", "resolution": "A second window opens at 8:00"},
        headers=clinic.h("platform_admin")))
    assert resolved["resolution"] == "A second window opens at 8:00"
    back = await clinic.client.patch(url, json={"status": "new"},
                                     headers=clinic.h("admin"))
    assert refusal(back) == (409, "INVALID_TRANSITION")
    await clinic.drain()
    assert [(e["payload"]["previous_status"], e["payload"]["status"]) for e in events] == [
        ("new", "in-review"), ("in-review", "resolved")]


async def test_the_author_edits_new_feedback_and_bad_input_names_the_field(clinic):
    entry = await give(clinic, "doctor")
    changed = data(await clinic.client.patch(f"/api/feedback/{entry['id']}", json={
        "rating": 1, "text": WAIT + " Again."}, headers=clinic.h("doctor")))
    assert changed["rating"] == 1 and changed["text"].endswith("Again.")
    bad = await clinic.post("doctor", "/api/feedback", {"category": "care", "rating": 9,
                                                        "text": WAIT})
    assert refusal(bad) == (422, "VALIDATION_ERROR")
    assert bad.json()["error"]["field"] == "rating"
    unknown = await clinic.post("doctor", "/api/feedback", {
        "category": "care", "text": WAIT, "organization_id": "no-such-organization"})
    assert refusal(unknown) == (404, "NOT_FOUND")


async def test_anonymous_feedback_keeps_no_identity(clinic):
    answer = await clinic.client.post("/api/feedback/anonymous", json={
        "category": "care", "rating": 5, "text": "The night nurse was kind and patient.",
        "organization_id": clinic.org_id})
    received = data(answer, 201)
    stored = data(await clinic.get("admin", f"/api/feedback/{received['id']}"))
    assert stored["anonymous"] is True and stored["user_id"] is None
    document = await clinic.app.state.services.store.get_document("feedback",
                                                                  received["id"])
    assert not any("127.0.0.1" in str(v) for v in document.values())


async def test_anonymous_spam_is_refused_naming_the_check(clinic):
    async def send(text):
        return await clinic.client.post("/api/feedback/anonymous",
                                        json={"category": "other", "text": text})
    checks = {
        "Cheap pills at https://pills.example.com today": "links",
        "Visit www.cheap-pills.example now for deals": "links",
        "Great!!!!!!!!!!!!!!!!!!!!!!": "character",
        "buy buy buy buy buy buy buy buy now": "word",
        "ok": "shorter",
    }
    for text, said in checks.items():
        response = await send(text)
        assert refusal(response) == (422, "SPAM_REJECTED"), text
        assert said in response.json()["error"]["message"]
        assert response.json()["error"]["field"] == "text"
    data(await send("The clinic's waiting room had no chairs left."), 201)
    again = await send("the clinic's waiting room  had no chairs left!")
    assert refusal(again) == (422, "SPAM_REJECTED")
    assert "sent already" in again.json()["error"]["message"]


async def test_anonymous_feedback_is_rate_limited_per_address(clinic):
    answers = [await clinic.client.post("/api/feedback/anonymous", json={
        "category": "usability", "text": f"Suggestion number {n}: larger buttons please."})
        for n in range(11)]
    assert [a.status_code for a in answers[:10]] == [201] * 10
    assert refusal(answers[10]) == (429, "RATE_LIMITED")
    assert int(answers[10].headers["Retry-After"]) > 0


async def test_every_operation_of_the_area_is_served_and_documented(client):
    await assert_served_and_documented(client, "Feedback", 5)


async def test_every_route_but_the_anonymous_one_needs_credentials(client):
    public = await assert_credentials_needed(client, "Feedback")
    assert public == ["/api/feedback/anonymous"]


async def test_housekeeping_forgets_fingerprints_after_a_day(clinic):
    text = "The lab results came back on the same day, thank you."
    data(await clinic.client.post("/api/feedback/anonymous",
                                  json={"category": "care", "text": text}), 201)
    services = clinic.app.state.services
    housekeeping = Housekeeping(services.store, services.settings)
    assert (await housekeeping.run_once())["feedback_fingerprints"] == 0
    purged = await housekeeping.run_once(time.time() + 24 * 3600 + 60)
    assert purged["feedback_fingerprints"] == 1
    data(await clinic.client.post("/api/feedback/anonymous",
                                  json={"category": "care", "text": text}), 201)
