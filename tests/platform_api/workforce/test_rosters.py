"""Rosters: created as drafts, generated with CP-SAT, approved (gaps only when accepted),
published; members see published rosters only."""

from __future__ import annotations

from collections import Counter

from tests.platform_api.workforce.conftest import data, new_roster, refusal

WEEKDAYS = {"start": "2027-03-01", "end": "2027-03-05"}  # Monday to Friday


async def test_generation_covers_a_feasible_week_and_keeps_the_rules(ward):
    roster = await new_roster(ward, **WEEKDAYS)
    generated = data(await ward.post("admin", f"/api/workforce/rosters/{roster['id']}/generate"))
    assert generated["gaps"] == [] and generated["unmet"] == 0
    assert generated["solver"]["status"] in ("OPTIMAL", "FEASIBLE")
    per_shift = Counter((a["date"], a["shift_type_code"]) for a in generated["assignments"])
    assert all(per_shift[(day, "D")] == 2 and per_shift[(day, "N")] == 1
               for day in ("2027-03-01", "2027-03-02", "2027-03-03", "2027-03-04",
                           "2027-03-05"))
    seniors = {ward.user_id("admin"), ward.user_id("doctor")}
    assert all(a["user_id"] in seniors for a in generated["assignments"]
               if a["skill"] == "senior")
    # a night (19:00-07:00) is never followed by the next day's day shift (no rest)
    worked = {(a["user_id"], a["date"], a["shift_type_code"]) for a in generated["assignments"]}
    for user, day, code in worked:
        if code == "N":
            following = f"2027-03-0{int(day[-1]) + 1}"
            assert (user, following, "D") not in worked
            assert (user, day, "D") not in worked


async def test_a_short_roster_is_returned_with_its_gaps_and_approved_only_knowingly(ward):
    seen = ward.recorded("platform.workforce.coverage_gaps_found")
    roster = await new_roster(ward, start="2027-03-01", end="2027-03-07")  # 21 x 12 h > 5 x 48 h
    generated = data(await ward.post("admin", f"/api/workforce/rosters/{roster['id']}/generate"))
    assert generated["unmet"] >= 1 and generated["gaps"]
    gaps = await ward.get("admin", f"/api/workforce/rosters/{roster['id']}/coverage-gaps")
    assert gaps.json()["meta"]["total"] == len(generated["gaps"])
    assert all(g["missing"] == g["required"] - g["assigned"] > 0 for g in data(gaps))
    refused = await ward.post("admin", f"/api/workforce/rosters/{roster['id']}/approve")
    assert refusal(refused) == (409, "COVERAGE_GAPS")
    approved = data(await ward.post("admin", f"/api/workforce/rosters/{roster['id']}/approve",
                                    {"accept_gaps": True}))
    assert approved["status"] == "approved" and approved["approved_by"] == ward.user_id("admin")
    await ward.drain()
    assert seen and seen[0]["payload"]["cause"] == "generation"


async def test_status_moves_follow_the_table(ward):
    roster = await new_roster(ward, **WEEKDAYS)
    path = f"/api/workforce/rosters/{roster['id']}"
    assert refusal(await ward.post("admin", path + "/publish")) == (409, "INVALID_TRANSITION")
    assert refusal(await ward.post("admin", path + "/approve")) == (409, "ROSTER_NOT_GENERATED")
    data(await ward.post("admin", path + "/generate"))
    data(await ward.post("admin", path + "/approve"))
    assert refusal(await ward.post("admin", path + "/generate")) == (409, "INVALID_TRANSITION")
    published = data(await ward.post("admin", path + "/publish"))
    assert published["status"] == "published" and published["revision"] == 3
    assert refusal(await ward.post("admin", path + "/approve")) == (409, "INVALID_TRANSITION")


async def test_members_see_published_rosters_only_and_cannot_manage_them(ward):
    roster = await new_roster(ward, **WEEKDAYS)
    path = f"/api/workforce/rosters/{roster['id']}"
    assert data(await ward.get("nurse", "/api/workforce/rosters")) == []
    assert refusal(await ward.get("nurse", "/api/workforce/rosters", status="draft")) == (
        403, "FORBIDDEN")
    assert refusal(await ward.get("nurse", path + "/coverage-gaps")) == (404, "NOT_FOUND")
    for action in ("/generate", "/approve", "/publish"):
        assert refusal(await ward.post("nurse", path + action)) == (403, "FORBIDDEN")
    assert refusal(await ward.post("nurse", "/api/workforce/rosters", {
        "name": "Mine", "start": "2027-03-01", "end": "2027-03-02"})) == (403, "FORBIDDEN")
    for action in ("/generate", "/approve", "/publish"):
        data(await ward.post("admin", path + action))
    listed = data(await ward.get("nurse", "/api/workforce/rosters",
                                 user_id=ward.user_id("nurse")))
    assert [r["id"] for r in listed] == [roster["id"]]
    assert {a["user_id"] for a in listed[0]["assignments"]} <= {ward.user_id("nurse")}
    assert refusal(await ward.get("other_admin", path + "/coverage-gaps")) == (403, "FORBIDDEN")


async def test_generation_needs_shift_types(clinic):
    roster = await new_roster(clinic)
    response = await clinic.post("admin", f"/api/workforce/rosters/{roster['id']}/generate")
    assert refusal(response) == (422, "NO_SHIFT_TYPES")
    assert refusal(await clinic.post("admin", "/api/workforce/rosters/unknown/generate")) == (
        404, "NOT_FOUND")


async def test_declared_unavailability_is_respected(clinic):
    from tests.platform_api.workforce.conftest import WARD, add_shift_type, add_workforce

    for who in WARD:
        away = [{"start": "2027-03-02", "end": "2027-03-03"}] if who == "nurse" else []
        await add_workforce(clinic, who, unavailability=away)
    await add_shift_type(clinic, "D", "07:00", "19:00", [{"count": 2}])
    roster = await new_roster(clinic, **WEEKDAYS)
    generated = data(await clinic.post("admin",
                                       f"/api/workforce/rosters/{roster['id']}/generate"))
    assert not [a for a in generated["assignments"] if a["user_id"] == clinic.user_id("nurse")
                and a["date"] in ("2027-03-02", "2027-03-03")]


async def test_a_roster_period_is_checked(clinic):
    response = await clinic.post("admin", "/api/workforce/rosters", {
        "name": "Backwards", "start": "2027-03-07", "end": "2027-03-01"})
    assert refusal(response) == (422, "VALIDATION_ERROR")
    assert response.json()["error"]["field"] == "end"
    response = await clinic.post("admin", "/api/workforce/rosters", {
        "name": "A quarter", "start": "2027-01-01", "end": "2027-03-31"})
    assert refusal(response) == (422, "VALIDATION_ERROR")


async def test_the_rest_rule_holds_across_the_border_of_two_rosters(ward):
    from tests.platform_api.workforce.conftest import published_roster

    first = await published_roster(ward, start="2027-03-01", end="2027-03-05")
    nights = {a["user_id"] for a in first["assignments"]
              if a["date"] == "2027-03-05" and a["shift_type_code"] == "N"}
    assert nights  # someone works Friday night, until 07:00 on Saturday
    weekend = await new_roster(ward, start="2027-03-06", end="2027-03-07")
    generated = data(await ward.post("admin",
                                     f"/api/workforce/rosters/{weekend['id']}/generate"))
    saturday_days = {a["user_id"] for a in generated["assignments"]
                     if a["date"] == "2027-03-06" and a["shift_type_code"] == "D"}
    assert saturday_days and not saturday_days & nights
