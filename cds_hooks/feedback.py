"""CDS Hooks feedback: what clinicians did with the cards (accepted, overridden with a
reason), stored so each service's acceptance rate can be reported.

Feedback is platform bookkeeping about the service, not health data, so it is kept as
documents: every entry received in ``cds_feedback`` (append-only), and the latest
outcome of each card in ``cds_card_outcomes`` (id ``<service>:<card uuid>``: the spec
lets a client send feedback for a card more than once; the later one is the outcome).
The summary counts those outcomes per service (exact counts, one indexed count each):
cards with feedback, accepted, overridden, the acceptance rate, and overrides by reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cds_hooks.cards import OVERRIDE_REASONS, OVERRIDE_SYSTEM
from cds_hooks.models import FeedbackRequest
from fhir_server.clock import now_instant
from fhir_server.ids import new_id
from fhir_server.store import ResourceStore

JSON = dict[str, Any]
FEEDBACK = "cds_feedback"
OUTCOMES = "cds_card_outcomes"


def _entry(service_id: str, item: Any, client: str, received: str) -> JSON:
    reason = item.overrideReason.reason if item.overrideReason else None
    return {
        "id": new_id(), "service_id": service_id, "card": item.card,
        "outcome": item.outcome,
        "accepted_suggestions": [s.id for s in item.acceptedSuggestions or []],
        "override_system": reason.system if reason else None,
        "override_code": reason.code if reason else None,
        "override_display": reason.display if reason else None,
        "user_comment": item.overrideReason.userComment if item.overrideReason else None,
        "outcome_timestamp": item.outcomeTimestamp, "client": client,
        "received_at": received,
    }


async def record(store: ResourceStore, service_id: str, feedback: FeedbackRequest,
                 client: str) -> list[str]:
    """Store every entry and each card's latest outcome (one unit of work)."""
    received = now_instant()
    entries = [_entry(service_id, item, client, received) for item in feedback.feedback]
    async with store.unit_of_work() as uow:
        for entry in entries:
            uow.put_document(FEEDBACK, entry["id"], entry)
            outcome_id = f"{service_id}:{entry['card']}"
            uow.put_document(OUTCOMES, outcome_id, {**entry, "id": outcome_id,
                                                    "entry_id": entry["id"]})
        await uow.commit()
    return [e["id"] for e in entries]


async def summary(store: ResourceStore, service_ids: Sequence[str]) -> list[JSON]:
    rows = []
    for service_id in service_ids:
        where: JSON = {"service_id": service_id}
        cards = await store.count_documents(OUTCOMES, where)
        accepted = await store.count_documents(OUTCOMES, {**where, "outcome": "accepted"})
        overridden = await store.count_documents(OUTCOMES, {**where, "outcome": "overridden"})
        reasons = {}
        for code, display in OVERRIDE_REASONS:
            count = await store.count_documents(OUTCOMES, {
                **where, "outcome": "overridden", "override_system": OVERRIDE_SYSTEM,
                "override_code": code})
            if count:
                reasons[code] = {"display": display, "count": count}
        rows.append({"service_id": service_id, "cards_with_feedback": cards,
                     "accepted": accepted, "overridden": overridden,
                     "acceptance_rate": round(accepted / cards, 4) if cards else None,
                     "override_reasons": reasons,
                     "feedback_entries": await store.count_documents(FEEDBACK, where)})
    return rows


async def entries(store: ResourceStore, service_id: str | None, *, limit: int, offset: int
                  ) -> tuple[list[JSON], int]:
    where = {"service_id": service_id} if service_id else None
    found = await store.find_documents(FEEDBACK, where, limit=limit, offset=offset,
                                       order_by="received_at", descending=True)
    return found, await store.count_documents(FEEDBACK, where)
