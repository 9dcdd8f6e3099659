"""Swaps on a published roster: offered by the shift's member, accepted by a colleague
when no hard rule breaks."""

from __future__ import annotations

from typing import Any

from tests.platform_api.workforce.conftest import (
    WARD,
    data,
    new_roster,
    published_roster,
    refusal,
)

WEEKDAYS = {"start": "2027-03-01", "end": "2027-03-05"}


def shifts_of(roster: dict[str, Any], user_id: str) -> list[dict[str, Any]]:
    return [a for a in roster["assignments"] if a["user_id"] == user_id]


def free_colleague(ward: Any, roster: dict[str, Any], shift: dict[str, Any],
                   candidates: tuple[str, ...]) -> str | None:
    """Someone who works nothing the day before, on, or after the shift's day."""
    day = int(shift["date"][-1])
    for who in candidates:
        days = {int(a["date"][-1]) for a in shifts_of(roster, ward.user_id(who))}
        if who != "admin" and not days & {day - 1, day, day + 1} \
                and ward.user_id(who) != shift["user_id"]:
            return who
    return None


async def test_a_colleague_accepts_an_offered_shift(ward):
    roster = await published_roster(ward, start="2027-03-01", end="2027-03-01")
    seen = ward.recorded("platform.workforce.swap_accepted")
    offered = next(a for a in roster["assignments"] if a["skill"] is None)
    owner = next(w for w in WARD if ward.user_id(w) == offered["user_id"])
    taker = free_colleague(ward, roster, offered, ("receptionist", "lab", "doctor", "nurse"))
    assert taker is not None  # three shifts a day, five members
    swap = data(await ward.post(owner, "/api/workforce/swaps", {
        "roster_id": roster["id"], "assignment_id": offered["id"], "note": "Family wedding"}),
        201)
    assert swap["status"] == "offered" and swap["from_user_id"] == offered["user_id"]
    accepted = data(await ward.post(taker, f"/api/workforce/swaps/{swap['id']}/accept"))
    assert accepted["status"] == "accepted" and accepted["accepted_by"] == ward.user_id(taker)
    after = data(await ward.get("admin", "/api/workforce/rosters"))[0]
    moved = [a for a in after["assignments"]
             if (a["date"], a["shift_type_id"]) == (offered["date"], offered["shift_type_id"])]
    assert ward.user_id(taker) in {a["user_id"] for a in moved}
    assert offered["user_id"] not in {a["user_id"] for a in moved}
    assert refusal(await ward.post(owner, f"/api/workforce/swaps/{swap['id']}/accept")) == (
        409, "INVALID_TRANSITION")  # no longer on offer
    await ward.drain()
    assert seen[0]["payload"]["id"] == swap["id"]
    listed = data(await ward.get("lab", "/api/workforce/swaps", status="accepted"))
    assert [s["id"] for s in listed] == [swap["id"]]


async def test_a_swap_that_breaks_a_hard_rule_is_refused_with_the_rule(ward):
    roster = await published_roster(ward, **WEEKDAYS)
    # someone working the same day as the shift offered: overlap or no rest
    offered = next(a for a in roster["assignments"] if a["shift_type_code"] == "N")
    same_day = next(a for a in roster["assignments"] if a["date"] == offered["date"]
                    and a["user_id"] != offered["user_id"])
    who = next(w for w in ("admin", "doctor", "nurse", "receptionist", "lab")
               if ward.user_id(w) == same_day["user_id"])
    owner = next(w for w in ("admin", "doctor", "nurse", "receptionist", "lab")
                 if ward.user_id(w) == offered["user_id"])
    swap = data(await ward.post(owner, "/api/workforce/swaps", {
        "roster_id": roster["id"], "assignment_id": offered["id"]}), 201)
    response = await ward.post(who, f"/api/workforce/swaps/{swap['id']}/accept")
    assert refusal(response) == (409, "SWAP_BREAKS_RULE")
    assert response.json()["error"]["details"][0]["rule"] in ("OVERLAP", "MIN_REST")


async def test_a_senior_place_needs_a_senior(ward):
    roster = await published_roster(ward, **WEEKDAYS)
    senior = next(a for a in roster["assignments"] if a["skill"] == "senior")
    owner = "admin" if senior["user_id"] == ward.user_id("admin") else "doctor"
    swap = data(await ward.post(owner, "/api/workforce/swaps", {
        "roster_id": roster["id"], "assignment_id": senior["id"]}), 201)
    response = await ward.post("lab", f"/api/workforce/swaps/{swap['id']}/accept")
    assert refusal(response) == (409, "SWAP_BREAKS_RULE")
    assert response.json()["error"]["details"] == [{"rule": "SKILL_MISSING"}]


async def test_offers_are_the_members_own_once_and_on_published_rosters(ward):
    roster = await published_roster(ward, **WEEKDAYS)
    theirs = shifts_of(roster, ward.user_id("doctor"))[0]
    body = {"roster_id": roster["id"], "assignment_id": theirs["id"]}
    assert refusal(await ward.post("lab", "/api/workforce/swaps", body)) == (403, "FORBIDDEN")
    swap = data(await ward.post("doctor", "/api/workforce/swaps", body), 201)
    assert refusal(await ward.post("doctor", "/api/workforce/swaps", body)) == (
        409, "SWAP_EXISTS")
    assert refusal(await ward.post("doctor", f"/api/workforce/swaps/{swap['id']}/accept")) == (
        422, "OWN_SHIFT")
    assert refusal(await ward.post("stranger", f"/api/workforce/swaps/{swap['id']}/accept")) \
        == (403, "FORBIDDEN")
    draft = await new_roster(ward, **WEEKDAYS)
    assert refusal(await ward.post("admin", "/api/workforce/swaps", {
        "roster_id": draft["id"], "assignment_id": "x"})) == (409, "ROSTER_NOT_PUBLISHED")
    assert refusal(await ward.post("doctor", "/api/workforce/swaps", {
        "roster_id": roster["id"], "assignment_id": "2027-03-01:none:none"})) == (404, "NOT_FOUND")
    assert data(await ward.get("other_admin", "/api/workforce/swaps")) == []


async def test_an_offer_to_one_colleague_is_theirs_to_accept(ward):
    roster = await published_roster(ward, **WEEKDAYS)
    theirs = shifts_of(roster, ward.user_id("doctor"))[0]
    swap = data(await ward.post("doctor", "/api/workforce/swaps", {
        "roster_id": roster["id"], "assignment_id": theirs["id"],
        "to_user_id": ward.user_id("nurse")}), 201)
    assert refusal(await ward.post("lab", f"/api/workforce/swaps/{swap['id']}/accept")) == (
        403, "FORBIDDEN")
    response = await ward.post("doctor", "/api/workforce/swaps", {
        "roster_id": roster["id"], "assignment_id": theirs["id"],
        "to_user_id": ward.user_id("stranger")})
    assert refusal(response) == (422, "NOT_IN_WORKFORCE")


async def test_two_colleagues_accepting_at_once_one_takes_the_shift(ward):
    import asyncio

    roster = await published_roster(ward, start="2027-03-01", end="2027-03-01")
    offered = next(a for a in roster["assignments"] if a["skill"] is None)
    owner = next(w for w in WARD if ward.user_id(w) == offered["user_id"])
    working = {a["user_id"] for a in roster["assignments"]}
    free = [w for w in WARD if ward.user_id(w) not in working]
    assert len(free) == 2  # three shifts, five members
    swap = data(await ward.post(owner, "/api/workforce/swaps", {
        "roster_id": roster["id"], "assignment_id": offered["id"]}), 201)
    answers = await asyncio.gather(*(ward.post(who, f"/api/workforce/swaps/{swap['id']}/accept")
                                     for who in free))
    assert sorted(a.status_code for a in answers) == [200, 409]
    after = data(await ward.get("admin", "/api/workforce/rosters"))[0]
    taken = [a for a in after["assignments"] if a["shift_type_id"] == offered["shift_type_id"]
             and a["user_id"] in {ward.user_id(w) for w in free}]
    assert len(taken) == 1
