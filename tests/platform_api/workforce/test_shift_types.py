"""Shift types with their coverage, and the coverage requirements read from them."""

from __future__ import annotations

from tests.platform_api.workforce.conftest import add_shift_type, data, refusal


async def test_a_night_shift_crosses_midnight_and_counts_as_night(clinic):
    night = await add_shift_type(clinic, "N", "21:30", "07:30", [{"count": 2}],
                                 required_skills=["icu"])
    assert night["crosses_midnight"] and night["night"] and night["minutes"] == 600
    early = await add_shift_type(clinic, "E", "07:00", "15:00", [{"count": 3}])
    assert not early["crosses_midnight"] and not early["night"] and early["minutes"] == 480


async def test_codes_are_unique_in_an_organization(clinic):
    await add_shift_type(clinic, "E", "07:00", "15:00", [{"count": 3}])
    response = await clinic.post("admin", "/api/workforce/shift-types", {
        "code": "E", "name": "Early again", "start": "06:00", "end": "14:00",
        "coverage": [{"count": 1}]})
    assert refusal(response) == (409, "SHIFT_TYPE_EXISTS")
    other = await clinic.post("other_admin", "/api/workforce/shift-types", {
        "code": "E", "name": "Early", "start": "06:00", "end": "14:00",
        "coverage": [{"count": 1}]})
    assert other.status_code == 201


async def test_coverage_requirements_per_weekday_and_skill(clinic):
    early = await add_shift_type(clinic, "E", "07:00", "15:00", [
        {"count": 2, "skill": "senior"},
        {"count": 4, "days": ["mon", "tue", "wed", "thu", "fri"]},
        {"count": 2, "days": ["sat", "sun"]}])
    rows = data(await clinic.get("nurse", "/api/workforce/coverage-requirements",
                                 shift_type_id=early["id"], limit=100))
    assert len(rows) == 14
    saturday = {r["skill"]: r["count"] for r in rows if r["day"] == "sat"}
    assert saturday == {"senior": 2, None: 2}
    monday = data(await clinic.get("nurse", "/api/workforce/coverage-requirements", day="mon"))
    assert {r["skill"]: r["count"] for r in monday} == {"senior": 2, None: 4}


async def test_only_the_admin_creates_and_members_read(clinic):
    body = {"code": "E", "name": "Early", "start": "07:00", "end": "15:00",
            "coverage": [{"count": 1}]}
    assert refusal(await clinic.post("nurse", "/api/workforce/shift-types", body)) == (
        403, "FORBIDDEN")
    await add_shift_type(clinic, "E", "07:00", "15:00", [{"count": 1}])
    assert len(data(await clinic.get("lab", "/api/workforce/shift-types"))) == 1
    assert data(await clinic.get("other_admin", "/api/workforce/shift-types")) == []


async def test_a_shift_type_needs_coverage_and_valid_times(clinic):
    response = await clinic.post("admin", "/api/workforce/shift-types", {
        "code": "E", "name": "Early", "start": "07:00", "end": "15:00", "coverage": []})
    assert refusal(response) == (422, "VALIDATION_ERROR")
    assert response.json()["error"]["field"] == "coverage"
    response = await clinic.post("admin", "/api/workforce/shift-types", {
        "code": "E", "name": "Early", "start": "25:00", "end": "15:00",
        "coverage": [{"count": 1}]})
    assert response.json()["error"]["field"] == "start"
