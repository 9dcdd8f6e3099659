"""The interaction table: matched by ingredient and class (branded, combination and
topical products), both ways round, against other drafts and current medications; its
entries round-trip through FHIR PlanDefinition; the prescription-sign check reads the
patient's active medications from the store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cds_hooks.interactions import (
    InteractionEntry,
    InteractionKnowledge,
    InteractionTable,
    check_medication_request,
    entry_from_plan_definition,
    entry_to_plan_definition,
    medications_of,
    seed_entries,
)
from cds_hooks.medications import RXNORM, vocabulary
from fhir_server.access import SYSTEM
from fhir_server.caller import CallerFhir
from fhir_server.service import FhirService
from fhir_server.store import store_from_url
from fhir_server.validation import validate_resource

PDDI = Path(__file__).resolve().parent / "pddi" / "warfarin-nsaids-order-sign-no-coordination.json"
TABLE = InteractionTable(seed_entries())


def med(rxcui: str | None = None, name: str = "", *, draft: bool = False) -> Any:
    return vocabulary().medication(None, name=name or None, rxcui=rxcui, draft=draft)


def keys(findings: list[Any]) -> list[str]:
    return [f.entry.key for f in findings]


def test_the_pddi_vector_ketorolac_order_with_warfarin_on_board() -> None:
    request = json.loads(PDDI.read_text())
    drafts = medications_of([e["resource"] for e in request["context"]["draftOrders"]["entry"]],
                            draft=True)
    current = medications_of([e["resource"] for e in request["prefetch"]["item2"]["entry"]])
    findings = TABLE.find(drafts, current)
    assert keys(findings) == ["warfarin-nsaids"]
    assert findings[0].entry.severity == "high"
    assert findings[0].as_dict()["drugs"] == ["Ketorolac Tromethamine 10 MG Oral Tablet",
                                              "Warfarin Sodium 0.5 MG Oral Tablet"]


@pytest.mark.parametrize("first,second,key", [
    (("855332", ""), ("5640", ""), "warfarin-nsaids"),  # warfarin 5 mg tablet + ibuprofen
    (("202421", ""), ("215101", ""), "warfarin-nsaids"),  # brand names: Coumadin + Aleve
    ((None, "Jantoven 5 mg"), (None, "Motrin 400"), "warfarin-nsaids"),  # free text brands
    (("855332", ""), ("1191", ""), "warfarin-antiplatelets"),  # aspirin is not an NSAID here
    (("3407", ""), ("835911", ""), "digoxin-cyclosporine"),  # Neoral 100 mg capsule
    (("6851", ""), (None, "Co-trimoxazole 960 mg"), "methotrexate-trimethoprim"),
    (("136411", ""), ("4917", ""), "pde5-nitrates"),
    (("36567", ""), ("21212", ""), "statins-strong-cyp3a4-inhibitors"),
    (("8123", ""), ("36437", ""), "maoi-serotonergic"),
    (("2556", ""), ("26225", ""), "qt-prolonging-pair"),  # citalopram + ondansetron
    (("9384", ""), ("11289", ""), "rifampin-warfarin"),
    ((None, "Rifampicin 600 mg"), ((None, "Coumadin")), "rifampin-warfarin"),
    (("519", ""), ("1256", ""), "allopurinol-thiopurines"),
])
def test_pairs_of_the_seed_table_are_found_both_ways_round(first: tuple[str | None, str],
                                                           second: tuple[str | None, str],
                                                           key: str) -> None:
    one, two = med(*first, draft=True), med(*second)
    assert key in keys(TABLE.find([one], [two]))
    assert key in keys(TABLE.find([med(*second, draft=True)], [med(*first)]))


def test_a_combination_product_is_caught_by_its_ingredient() -> None:
    # Esomeprazole 20 MG / Naproxen 375 MG Delayed Release Oral Tablet [Vimovo]
    vimovo = vocabulary().medication({"coding": [{"system": RXNORM, "code": "994007"}]})
    assert {"7258", "283742"} <= vimovo.ingredients
    assert keys(TABLE.find([med("855332", draft=True)], [vimovo])) == ["warfarin-nsaids"]


def test_topical_nsaids_do_not_trigger_the_systemic_warfarin_entry() -> None:
    gel = vocabulary().medication({"coding": [{"system": RXNORM, "code": "855635"}]})
    assert gel.topical
    assert TABLE.find([med("855332", draft=True)], [gel]) == []


def test_drafts_are_checked_against_each_other_and_the_same_drug_twice_is_not_an_interaction(
        ) -> None:
    assert keys(TABLE.find([med("5640", draft=True), med("855332", draft=True)])) == [
        "warfarin-nsaids"]
    assert TABLE.find([med("5640", draft=True)], [med("5640")]) == []
    assert TABLE.find([med("723", draft=True)], [med("161")]) == []


def test_findings_are_ordered_most_severe_first() -> None:
    findings = TABLE.find([med("4917", draft=True), med("3407", draft=True)],
                          [med("136411"), med("3008")])
    assert [f.entry.severity for f in findings] == ["critical", "moderate"]


def test_a_retired_entry_no_longer_fires() -> None:
    retired = [e.model_copy(update={"status": "retired"}) if e.key == "warfarin-nsaids" else e
               for e in seed_entries()]
    assert InteractionTable(retired).find([med("855332", draft=True)], [med("5640")]) == []


def test_an_entry_round_trips_through_a_valid_fhir_plan_definition() -> None:
    entry = next(e for e in seed_entries() if e.key == "warfarin-nsaids")
    plan = entry_to_plan_definition(entry, "2026-03-02T10:00:00Z")
    validate_resource(plan, "PlanDefinition", strict=True)
    assert plan["identifier"][0]["value"] == "warfarin-nsaids"
    assert plan["type"]["coding"][0]["code"] == "eca-rule"
    assert entry_from_plan_definition({**plan, "id": "x"}) == entry


def test_entries_are_validated() -> None:
    base = next(e for e in seed_entries() if e.key == "pde5-nitrates").model_dump()
    for change, message in [({"key": "Bad Key"}, "key"),
                            ({"severity": "severe"}, "severity"),
                            ({"a": {"classes": ["beta-blocker"]}}, "unknown drug class"),
                            ({"b": {"ingredients": ["warfarin"]}}, "RxNorm"),
                            ({"b": {}}, "at least one")]:
        with pytest.raises(ValueError, match=message):
            InteractionEntry.model_validate({**base, **change})


async def test_check_medication_request_reads_the_patients_active_medications(
        tmp_path: Path) -> None:
    store = store_from_url(f"sqlite:///{tmp_path / 'cds.db'}")
    await store.open()
    try:
        fhir = FhirService(store)
        caller = CallerFhir(fhir, SYSTEM)
        patient, _ = await caller.create({"resourceType": "Patient", "name": [
            {"family": "Wanjiru", "given": ["Njeri"]}]})
        subject = {"reference": f"Patient/{patient.id}"}
        for status, code, text in [("active", "855332", "Warfarin Sodium 5 MG Oral Tablet"),
                                   ("stopped", "36567", "Simvastatin 40 MG")]:
            await caller.create({"resourceType": "MedicationRequest", "status": status,
                                 "intent": "order", "subject": subject,
                                 "medicationCodeableConcept": {"coding": [
                                     {"system": RXNORM, "code": code}], "text": text}})
        await caller.create({"resourceType": "MedicationStatement", "status": "active",
                             "subject": subject, "medicationCodeableConcept": {
                                 "text": "Clarithromycin 500 mg twice daily"}})
        draft = {"resourceType": "MedicationRequest", "id": "rx-ibuprofen", "status": "draft",
                 "intent": "order", "subject": subject, "medicationCodeableConcept": {
                     "coding": [{"system": RXNORM, "code": "5640", "display": "Ibuprofen"}]}}
        # The platform hands in who reads (here the store's own rights, as its elevated
        # reader has) and the table.
        knowledge = InteractionKnowledge(caller)
        findings = await check_medication_request(caller, knowledge, draft, patient.id)
        assert [(f["severity"], f["drugs"]) for f in findings] == [
            ("high", ["Ibuprofen", "Warfarin Sodium 5 MG Oral Tablet"])]
        assert set(findings[0]) >= {"severity", "description", "drugs", "recommendation"}
        # a stopped simvastatin does not interact; the active clarithromycin statement does
        statin = {**draft, "medicationCodeableConcept": {"text": "Simvastatin 20 mg"}}
        assert [f["key"] for f in await check_medication_request(caller, knowledge, statin,
                                                                 patient.id)] \
            == ["statins-strong-cyp3a4-inhibitors"]
    finally:
        await store.close()
