"""Fairness per member and the Gini coefficient of night and weekend load."""

from __future__ import annotations

from collections import Counter

from tests.platform_api.workforce.conftest import data, new_roster, published_roster, refusal

WEEK = {"start": "2027-03-01", "end": "2027-03-07", "holidays": ["2027-03-06"]}


async def test_fairness_counts_each_members_load_against_contract(ward):
    roster = await published_roster(ward, **WEEK)
    rows = data(await ward.get("admin", "/api/workforce/fairness", limit=100))
    assert len(rows) == 5
    shifts = Counter(a["user_id"] for a in roster["assignments"])
    nights = Counter(a["user_id"] for a in roster["assignments"] if a["shift_type_code"] == "N")
    weekends = Counter(a["user_id"] for a in roster["assignments"]
                       if a["date"] in ("2027-03-06", "2027-03-07"))
    holidays = Counter(a["user_id"] for a in roster["assignments"] if a["date"] == "2027-03-06")
    for row in rows:
        user = row["user_id"]
        assert row["shifts"] == shifts[user] and row["hours"] == 12 * shifts[user]
        assert row["nights"] == nights[user] and row["weekends"] == weekends[user]
        assert row["holidays"] == holidays[user]
        assert row["contracted_hours"] == 40
        assert row["hours_vs_contract"] == row["hours"] - 40


async def test_a_member_sees_their_own_row_and_the_coefficients(ward):
    await published_roster(ward, **WEEK)
    mine = data(await ward.get("nurse", "/api/workforce/fairness"))
    assert [r["user_id"] for r in mine] == [ward.user_id("nurse")]
    gini = data(await ward.get("nurse", "/api/workforce/fairness/gini"))
    assert gini["members"] == 5 and gini["start"] == "2027-03-01"
    for name in ("nights_gini", "weekends_gini", "night_weekend_gini", "hours_gini"):
        assert 0 <= gini[name] < 1


async def test_a_draft_is_measured_by_its_id_and_a_period_narrows_the_count(ward):
    draft = await new_roster(ward, **WEEK)
    generated = data(await ward.post("admin", f"/api/workforce/rosters/{draft['id']}/generate"))
    rows = data(await ward.get("admin", "/api/workforce/fairness", roster_id=draft["id"],
                               limit=100))
    assert sum(r["shifts"] for r in rows) == len(generated["assignments"])
    monday = data(await ward.get("admin", "/api/workforce/fairness", roster_id=draft["id"],
                                 limit=100, **{"from": "2027-03-01", "to": "2027-03-01"}))
    assert sum(r["shifts"] for r in monday) == 3
    assert data(await ward.get("admin", "/api/workforce/fairness")) and all(
        r["shifts"] == 0 for r in data(await ward.get("admin", "/api/workforce/fairness")))
    assert refusal(await ward.get("nurse", "/api/workforce/fairness",
                                  roster_id=draft["id"])) == (404, "NOT_FOUND")
    response = await ward.get("admin", "/api/workforce/fairness/gini",
                              **{"from": "2027-03-05", "to": "2027-03-01"})
    assert refusal(response) == (422, "VALIDATION_ERROR")
