"""Allergy-order conflicts: by ingredient, by a cross-reacting class, from RxNorm,
SNOMED CT or text; only allergies in force count."""

from __future__ import annotations

from typing import Any

from cds_hooks.allergies import find_conflicts, substance_of
from cds_hooks.interactions import medications_of
from cds_hooks.medications import RXNORM, vocabulary
from cds_hooks.models import parse_request
from tests.cds_hooks.examples_data import hook_context, hook_request

SNOMED = "http://snomed.info/sct"


def allergy(code: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"resourceType": "AllergyIntolerance", "id": "allergy-1", "code": code,
            "clinicalStatus": {"coding": [{"code": "active"}]},
            "patient": {"reference": "Patient/1288992"}, **extra}


PENICILLIN = allergy({"coding": [{"system": SNOMED, "code": "91936005",
                                  "display": "Allergy to penicillin"}]}, criticality="high")


def drafts_of_the_spec_order_select() -> list[Any]:
    _, context = parse_request(hook_request("order-select", hook_context("order-select")))
    return medications_of(context.selected(), draft=True)  # type: ignore[attr-defined]


def test_the_spec_examples_amoxicillin_clavulanate_conflicts_with_a_penicillin_allergy() -> None:
    conflicts = find_conflicts(drafts_of_the_spec_order_select(), [PENICILLIN])
    assert len(conflicts) == 1
    assert conflicts[0].medication.reference == "MedicationRequest/smart-MedicationRequest-103"
    assert conflicts[0].matched == "Penicillins"
    assert conflicts[0].severity == "critical"


def test_an_allergy_to_one_penicillin_rules_out_the_others_but_not_cephalosporins() -> None:
    amoxicillin = allergy({"coding": [{"system": RXNORM, "code": "723"}], "text": "Amoxicillin"})
    assert substance_of(amoxicillin).classes == {"penicillin"}
    vocab = vocabulary()
    ampicillin = vocab.medication(None, name="Ampicillin 500 mg", draft=True)
    cephalexin = vocab.medication(None, name="Cephalexin 500 mg", draft=True)
    conflicts = find_conflicts([ampicillin, cephalexin], [amoxicillin])
    assert [c.medication.name for c in conflicts] == ["Ampicillin 500 mg"]
    assert conflicts[0].severity == "high"


def test_text_allergies_are_understood() -> None:
    vocab = vocabulary()
    septrin = vocab.medication({"text": "Septrin 960 mg tablets"}, draft=True)
    naproxen = vocab.medication({"coding": [{"system": RXNORM, "code": "215101"}]}, draft=True)
    sulfa = allergy({"text": "Sulfa drugs"})
    nsaids = allergy({"text": "NSAIDs (bronchospasm)"})
    assert [c.medication.name for c in find_conflicts([septrin, naproxen], [sulfa])] == [
        "Septrin 960 mg tablets"]
    assert [c.matched for c in find_conflicts([septrin, naproxen], [nsaids])] == [
        "Non-selective COX inhibitors (NSAIDs and aspirin)"]


def test_refuted_and_resolved_allergies_do_not_count() -> None:
    drafts = drafts_of_the_spec_order_select()
    refuted = {**PENICILLIN, "verificationStatus": {"coding": [{"code": "refuted"}]}}
    resolved = {**PENICILLIN, "clinicalStatus": {"coding": [{"code": "resolved"}]}}
    assert find_conflicts(drafts, [refuted, resolved]) == []
