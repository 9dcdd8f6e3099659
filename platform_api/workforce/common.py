"""What the Workforce routes share: which organization a request is about, and changes
of one document taken in turns.

Which organization: ``organization_id`` in the body or query, else the caller's only
organization; the caller must be one of its members (platform administrators may name any
organization). Managing the workforce (members, shift types, rosters) is for the
organization's ``ORG:ADMIN``\\ s (the policy's ``workforce.manage``); every member reads
it.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from fhir_server.caller import CallerFhir, FhirUnit
from fhir_server.clock import now_instant
from fhir_server.store import DuplicateDocument
from platform_api.envelope import ApiError, conflict
from platform_api.facade import ApiContext, require_organization
from platform_api.services import Services

JSON = dict[str, Any]
SOURCE = "workforce"
SHIFT_TYPES = "workforce_shift_types"
SHIFT_TYPE_CODES = "workforce_shift_type_codes"
ROSTERS = "workforce_rosters"
SWAPS = "workforce_swaps"
SWAP_DECISIONS = "workforce_swap_decisions"
CHANGE_ATTEMPTS = 4
MAX_SHIFT_TYPES = 200


async def organization(ctx: ApiContext, wanted: str | None) -> str:
    """The organization named, else the caller's only one (422 when they have several or
    none); 404 unknown, 403 not a member."""
    if wanted is None:
        # None: a platform administrator, who works in every organization, names one.
        where = ctx.organizations_for("organization.work-in")
        mine = sorted(where or ())
        if len(mine) != 1:
            raise ApiError(422, "ORGANIZATION_REQUIRED", "organization_id: name the "
                           "organization" + ("" if where is None else
                                             f" (you are a member of {len(mine)})"),
                           field="organization_id")
        wanted = mine[0]
    await require_organization(ctx, wanted)
    return wanted


async def shift_type_map(ctx: ApiContext | None, org_id: str, *,
                         services: Services | None = None) -> dict[str, JSON]:
    store = (services or ctx.services).store  # type: ignore[union-attr]
    found = await store.find_documents(SHIFT_TYPES, {"organization_id": org_id},
                                       limit=MAX_SHIFT_TYPES, order_by="code")
    return {s["id"]: s for s in found}


Change = Callable[[JSON], Awaitable[tuple[JSON, list[tuple[str, JSON]]]]]


async def change_in_turn(services: Services, fhir: CallerFhir, roster_id: str, change: Change,
                         *, attempts: int = CHANGE_ATTEMPTS,
                         also: Callable[[FhirUnit], Awaitable[None] | None] | None = None,
                         collection: str = ROSTERS, name: str = "Roster",
                         source: str = SOURCE) -> JSON:
    """Load the document (a roster unless ``collection`` says otherwise), ``change`` it
    (the changed document and the events to emit) and save it as its next revision: the
    revision's turn document (``<collection>_turns/<id>:<revision>``) is inserted in the
    same unit of work, so of two changes made from the same revision one commits and the
    other runs again on the new one (or, after ``attempts``, is 409 ``CHANGED``:
    ``ROSTER_CHANGED`` for a roster)."""
    store, turns = services.store, f"{collection}_turns"
    for _attempt in range(attempts):
        current = await store.get_document(collection, roster_id)
        if current is None:
            raise ApiError(404, "NOT_FOUND", f"{name} not found")
        changed, events = await change(current)
        turn = int(current.get("revision", 0)) + 1
        changed = {**changed, "revision": turn, "updated_at": now_instant()}
        unit = fhir.unit()
        try:
            async with unit:
                unit.insert_document(turns, f"{roster_id}:{turn}",
                                     {"id": f"{roster_id}:{turn}", "at": changed["updated_at"]})
                unit.put_document(collection, roster_id, changed)
                for topic, payload in events:
                    unit.emit(topic, payload, source_service=source)
                if also is not None and inspect.isawaitable(staged := also(unit)):
                    await staged
                await unit.commit()
        except DuplicateDocument:
            if await store.get_document(turns, f"{roster_id}:{turn}") is None:
                raise
            continue
        return changed
    raise conflict(f"{name.upper()}_CHANGED", f"The {name.lower()} changed while this "
                   "change was made: read it again and retry")
