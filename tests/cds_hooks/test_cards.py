"""Card builders keep the spec's rules: summaries under 140 characters cut at a word,
suggestions with a selection behaviour, override reasons with code, system and display."""

from __future__ import annotations

from cds_hooks.cards import card, override_reasons, remove_draft, source, summary_of


def test_a_long_summary_is_cut_at_a_word_under_140_characters() -> None:
    long = ("Interaction: " + "Amoxicillin 120 MG/ML / clavulanate potassium 8.58 MG/ML Oral "
            "Suspension with Warfarin Sodium 5 MG Oral Tablet [Coumadin] and more words")
    cut = summary_of(long)
    assert len(cut) < 140 and cut.endswith("…") and long.startswith(cut[:-1])
    assert summary_of("  NEWS2 7:\n high  ") == "NEWS2 7: high"


def test_a_card_with_a_suggestion_is_valid_by_the_spec() -> None:
    built = card("Warfarin + NSAID", "critical", source("Drug-drug interaction check"),
                 suggestions=[remove_draft("MedicationRequest/rx-1", "Remove ibuprofen")],
                 overridable=True)
    body = built.model_dump(exclude_none=True)
    assert body["selectionBehavior"] == "at-most-one"
    assert body["suggestions"][0]["actions"] == [{
        "type": "delete", "description": "Remove ibuprofen",
        "resourceId": "MedicationRequest/rx-1"}]
    assert all(r.code and r.system and r.display for r in override_reasons())
    plain = card("NEWS2 2: low clinical risk", "info", source("NEWS2")).model_dump(
        exclude_none=True)
    assert "selectionBehavior" not in plain and "overrideReasons" not in plain
