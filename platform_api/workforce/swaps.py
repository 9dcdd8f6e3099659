"""Shift swaps on a published roster: a member offers one of their shifts (to anyone in
the workforce, or to one colleague), another accepts it; the acceptor must then break no
hard rule (:mod:`.rules`) — a refusal is 409 ``SWAP_BREAKS_RULE`` naming the rule in
``details``.

Documents ``workforce_swaps`` (``id``, ``organization_id``, ``roster_id``,
``assignment_id``, ``date``, ``shift_type_id``, ``shift_type_code``, ``skill``,
``from_user_id``, ``to_user_id`` (none: open to all), ``note``, ``status`` offered |
accepted, ``offered_at``, ``accepted_by``, ``accepted_at``). One open offer per shift
(``workforce_swap_offers/<roster>:<assignment>``: 409 ``SWAP_EXISTS``); an acceptance is
inserted once (``workforce_swap_decisions/<id>``), in the unit of work that moves the
shift in the roster (the roster's next revision).

Who: the shift's member (or an ``ORG:ADMIN``) offers; another workforce member of the
organization accepts; the organization's members list its swaps. Events
``platform.workforce.swap_offered``, ``platform.workforce.swap_accepted`` (the swap's
view).
"""

from __future__ import annotations

from datetime import date
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from fhir_server.caller import FhirUnit
from fhir_server.clock import now_instant
from fhir_server.ids import new_id
from fhir_server.store import DuplicateDocument
from platform_api.envelope import (
    ApiError,
    Envelope,
    PageEnvelope,
    Pagination,
    conflict,
    created,
    not_found,
    ok,
    pagination,
)
from platform_api.facade import ApiContext, api_context, conflict_responses
from platform_api.organizations.members import documents_page
from platform_api.workforce.common import (
    ROSTERS,
    SOURCE,
    SWAP_DECISIONS,
    SWAPS,
    change_in_turn,
    organization,
    shift_type_map,
)
from platform_api.workforce.members import workforce_members
from platform_api.workforce.rosters import (
    assignments_of,
    neighbouring_shifts,
    roster_rules,
    rostered_members,
    visible_roster,
)
from platform_api.workforce.rules import Shift, broken_rule
from platform_api.workforce.shift_types import shift_type

JSON = dict[str, Any]
SWAP_OFFERS = "workforce_swap_offers"
TOPIC = "platform.workforce."
SwapStatus = Literal["offered", "accepted"]
RULES_SAID = {
    "SKILL_MISSING": "you do not hold the skills this shift needs",
    "UNAVAILABLE": "you are on leave or unavailable then",
    "OVERLAP": "it overlaps one of your shifts",
    "MIN_REST": "it leaves less than the minimum rest next to one of your shifts",
    "MAX_HOURS_PER_WEEK": "it takes you over your maximum hours that week",
    "MAX_CONSECUTIVE_NIGHTS": "it makes too many nights in a row",
}


class SwapCreate(BaseModel):
    roster_id: str = Field(min_length=1, max_length=64)
    assignment_id: str = Field(min_length=1, max_length=200,
                               examples=["2027-02-03:0197…:0196…"])
    to_user_id: str | None = Field(default=None, max_length=64,
                                   description="Offer to one colleague (default: anyone)")
    note: str | None = Field(default=None, max_length=500)


class SwapView(BaseModel):
    id: str
    organization_id: str
    roster_id: str
    assignment_id: str
    date: str
    shift_type_id: str
    shift_type_code: str | None = None
    skill: str | None = None
    from_user_id: str
    to_user_id: str | None = None
    note: str | None = None
    status: str
    offered_at: str
    accepted_by: str | None = None
    accepted_at: str | None = None


def swap_view(swap: JSON) -> JSON:
    return SwapView.model_validate(swap).model_dump()


router = APIRouter(tags=["workforce"])


@router.post("/api/workforce/swaps", status_code=201, response_model=Envelope[SwapView],
             responses=conflict_responses({
                 "SWAP_EXISTS": "the shift is already on offer",
                 "ROSTER_NOT_PUBLISHED": "only published rosters change by swaps"}),
             summary="Offer one of your shifts of a published roster")
async def offer_swap(body: SwapCreate, ctx: ApiContext = Depends(api_context)) -> Any:
    roster = await visible_roster(ctx, body.roster_id)
    org_id = roster["organization_id"]
    if roster["status"] != "published":
        raise conflict("ROSTER_NOT_PUBLISHED", "Only a published roster changes by swaps")
    shift = next((a for a in roster.get("assignments") or []
                  if a["id"] == body.assignment_id), None)
    if shift is None:
        raise not_found("Shift")
    ctx.authorize("shift.offer", org_id, user_id=shift["user_id"])
    if body.to_user_id is not None and body.to_user_id not in {
            m["user_id"] for m in await workforce_members(ctx, org_id)}:
        raise ApiError(422, "NOT_IN_WORKFORCE", "to_user_id: not a workforce member of the "
                       "organization", field="to_user_id")
    if body.to_user_id == shift["user_id"]:
        raise ApiError(422, "VALIDATION_ERROR", "to_user_id: the shift is already theirs",
                       field="to_user_id")
    swap: JSON = {
        "id": new_id(), "organization_id": org_id, "roster_id": roster["id"],
        "assignment_id": shift["id"], "date": shift["date"],
        "shift_type_id": shift["shift_type_id"], "shift_type_code": shift.get("shift_type_code"),
        "skill": shift.get("skill"), "from_user_id": shift["user_id"],
        "to_user_id": body.to_user_id, "note": body.note, "status": "offered",
        "offered_at": now_instant(), "accepted_by": None, "accepted_at": None}
    await ctx.insert_once(
        SWAPS, swap, unique=(SWAP_OFFERS, f"{roster['id']}:{shift['id']}"),
        event=(TOPIC + "swap_offered", swap_view(swap), SOURCE),
        refusal=("SWAP_EXISTS", "This shift is already on offer"))
    return created(swap_view(swap))


@router.get("/api/workforce/swaps", response_model=PageEnvelope[SwapView],
            summary="List an organization's swaps (filter by roster, status)")
async def list_swaps(organization_id: str | None = Query(None, max_length=64),
                     roster_id: str | None = Query(None, max_length=64),
                     status: SwapStatus | None = Query(None),
                     page: Pagination = Depends(pagination),
                     ctx: ApiContext = Depends(api_context)) -> Any:
    org_id = await organization(ctx, organization_id)
    where = {"organization_id": org_id, **({"roster_id": roster_id} if roster_id else {}),
             **({"status": status} if status else {})}
    found, total = await documents_page(ctx, SWAPS, where, page, "offered_at",
                                        descending=True)
    return page.respond([swap_view(s) for s in found], total)


@router.post("/api/workforce/swaps/{swap_id}/accept", response_model=Envelope[SwapView],
             responses=conflict_responses({
                 "SWAP_BREAKS_RULE": "taking the shift would break a hard rule (details)",
                 "INVALID_TRANSITION": "the swap is no longer on offer"}),
             summary="Accept a swap: the shift becomes yours if no hard rule breaks")
async def accept_swap(swap_id: str, ctx: ApiContext = Depends(api_context)) -> Any:
    swap = await ctx.services.store.get_document(SWAPS, swap_id)
    if swap is None:
        raise not_found("Swap")
    org_id, me = await organization(ctx, swap["organization_id"]), ctx.principal.user_id
    if swap["status"] != "offered":
        raise conflict("INVALID_TRANSITION", f"The swap is {swap['status']}")
    if swap["from_user_id"] == me:
        raise ApiError(422, "OWN_SHIFT", "You cannot accept your own offer")
    # Offered to one colleague, or to anyone (then the caller may take it).
    ctx.authorize("shift.take", org_id, user_id=swap.get("to_user_id") or me)
    workforce = await workforce_members(ctx, org_id)
    if me not in {m["user_id"] for m in workforce}:
        raise ApiError(422, "NOT_IN_WORKFORCE", "You are not in the organization's workforce")
    members = {m.user_id: m for m in await rostered_members(ctx.services, workforce, org_id)}
    types = await shift_type_map(ctx, org_id)
    roster = await ctx.services.store.get_document(ROSTERS, swap["roster_id"])
    around = await neighbouring_shifts(ctx, roster, types) if roster else {}
    now = now_instant()
    accepted = {**swap, "status": "accepted", "accepted_by": me, "accepted_at": now}

    async def change(roster: JSON) -> tuple[JSON, list[tuple[str, JSON]]]:
        held = next((a for a in roster.get("assignments") or []
                     if a["id"] == swap["assignment_id"]), None)
        if roster["status"] != "published" or held is None \
                or held["user_id"] != swap["from_user_id"]:
            raise conflict("INVALID_TRANSITION", "The shift is no longer the offerer's")
        shift = Shift(date.fromisoformat(held["date"]), shift_type(types[held["shift_type_id"]]))
        mine = [a.shift for a in assignments_of(roster, types) if a.user_id == me] + \
            around.get(me, [])
        rule = broken_rule(members[me], mine, shift, roster_rules(ctx.services.settings, roster),
                           held.get("skill"))
        if rule is not None:
            raise ApiError(409, "SWAP_BREAKS_RULE", f"You cannot take this shift: "
                           f"{RULES_SAID[rule]} ({rule})", details=[{"rule": rule}])
        moved = {**held, "user_id": me, "id": f"{held['date']}:{held['shift_type_id']}:{me}"}
        assignments = [moved if a is held else a for a in roster["assignments"]]
        return {**roster, "assignments": assignments}, [
            (TOPIC + "swap_accepted", swap_view(accepted))]

    def record(unit: FhirUnit) -> None:
        unit.insert_document(SWAP_DECISIONS, swap_id, {"id": swap_id, "at": now})
        unit.put_document(SWAPS, swap_id, accepted)
        unit.delete_document(SWAP_OFFERS, f"{swap['roster_id']}:{swap['assignment_id']}")

    try:
        await change_in_turn(ctx.services, ctx.fhir, swap["roster_id"], change, also=record)
    except DuplicateDocument:
        raise conflict("INVALID_TRANSITION", "The swap was accepted meanwhile") from None
    return ok(swap_view(accepted))
