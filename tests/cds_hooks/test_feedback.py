"""Feedback is stored entry by entry and each card's latest outcome is counted: the
acceptance rate and the overrides by reason of a service."""

from __future__ import annotations

from pathlib import Path

from cds_hooks.feedback import entries, record, summary
from cds_hooks.models import parse_feedback
from fhir_server.store import store_from_url


def feedback(card: str, outcome: str, reason: str | None = None) -> dict[str, object]:
    item: dict[str, object] = {"card": card, "outcome": outcome,
                               "outcomeTimestamp": "2026-03-02T10:15:00Z"}
    if outcome == "accepted":
        item["acceptedSuggestions"] = [{"id": "remove-draft"}]
    if reason:
        item["overrideReason"] = {"reason": {
            "code": reason, "system": "urn:healthplatform:cds:override-reason"},
            "userComment": "INR checked this morning"}
    return {"feedback": [item]}


async def test_the_latest_outcome_of_each_card_is_counted(tmp_path: Path) -> None:
    store = store_from_url(f"sqlite:///{tmp_path / 'feedback.db'}")
    await store.open()
    try:
        given = [("drug-interactions", feedback("c1", "accepted")),
                 ("drug-interactions", feedback("c2", "overridden", "monitoring-in-place")),
                 ("drug-interactions", feedback("c3", "accepted")),
                 ("drug-interactions", feedback("c3", "overridden", "not-applicable")),
                 ("news2", feedback("c9", "accepted"))]
        for service_id, body in given:
            await record(store, service_id, parse_feedback(body), "https://ehr.example/")
        [interactions, news2] = await summary(store, ["drug-interactions", "news2"])
        assert (interactions["cards_with_feedback"], interactions["accepted"],
                interactions["overridden"], interactions["feedback_entries"]) == (3, 1, 2, 4)
        assert interactions["acceptance_rate"] == round(1 / 3, 4)
        assert {k: v["count"] for k, v in interactions["override_reasons"].items()} == {
            "monitoring-in-place": 1, "not-applicable": 1}
        assert news2["acceptance_rate"] == 1.0
        listed, total = await entries(store, "drug-interactions", limit=2, offset=0)
        assert total == 4 and len(listed) == 2
        assert listed[0]["user_comment"] in (None, "INR checked this morning")
    finally:
        await store.close()
