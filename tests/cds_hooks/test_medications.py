"""Medications resolve to ingredients and classes by RxNorm code (ingredient, product,
brand, combination), by name, and from FHIR resources (contained Medication, DSTU2
MedicationOrder)."""

from __future__ import annotations

from cds_hooks.medications import RXNORM, medication_of, vocabulary


def test_codes_names_and_brands_resolve_to_ingredients() -> None:
    vocab = vocabulary()
    assert vocab.medication({"coding": [{"system": RXNORM, "code": "855332"}]}).ingredients \
        == {"11289"}
    assert vocab.medication({"text": "Panadol 500 mg"}).ingredients == {"161"}
    assert vocab.medication({"text": "Augmentin 625 mg"}).ingredients == {"723", "48203"}
    unknown = vocab.medication(None, name="Flagyl 400 mg", rxcui="6922")
    assert unknown.ingredients == frozenset() and "6922" in unknown.tags()
    assert vocab.medication({"text": "sugar pill"}).tags() == frozenset()


def test_fhir_resources_name_their_medication() -> None:
    contained = {"resourceType": "MedicationRequest", "id": "rx1", "status": "draft",
                 "contained": [{"resourceType": "Medication", "id": "m",
                                "code": {"coding": [{"system": RXNORM, "code": "36437"}]}}],
                 "medicationReference": {"reference": "#m"}}
    found = medication_of(contained, draft=True)
    assert found is not None and found.classes >= {"ssri", "serotonergic"}
    assert (found.reference, found.draft) == ("MedicationRequest/rx1", True)
    old = {"resourceType": "MedicationOrder", "id": "o1",
           "medicationCodeableConcept": {"text": "Warfarin 5 mg"}}
    assert medication_of(old) is not None
    assert medication_of({"resourceType": "NutritionOrder", "id": "n1"}) is None
    assert medication_of({"resourceType": "MedicationStatement",
                          "medicationReference": {"display": "Coumadin"}}).ingredients == {  # type: ignore[union-attr]
        "11289"}
