"""Allergy-order conflicts: a draft medication whose ingredient, or a drug class that
cross-reacts, matches an active AllergyIntolerance of the patient.

An allergy's substance is read from ``AllergyIntolerance.code`` (and
``reaction.substance``): RxNorm codings (an ingredient or a product: its ingredients),
SNOMED CT codes the vocabulary maps to a class (91936005 *Allergy to penicillin*), or the
text ("Penicillin", "Sulfa drugs", "NSAIDs": ingredient, synonym, brand and class names).
A conflict is the same ingredient, or a draft of a class marked ``cross_reactive`` that
one of the allergy's ingredients or classes belongs to: an allergy to amoxicillin rules
out every penicillin (amoxicillin-clavulanate included), not a cephalosporin.

Only allergies in force count: ``clinicalStatus`` active (or absent) and not
``verificationStatus`` refuted or entered-in-error. Severity of the conflict:
``criticality`` high → critical, else high.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cds_hooks.cards import (
    INDICATOR_OF_SEVERITY,
    CdsService,
    Invocation,
    card,
    remove_draft,
    source,
)
from cds_hooks.interactions import draft_medications
from cds_hooks.medications import RXNORM_SYSTEMS, DrugVocabulary, Medication, vocabulary
from cds_hooks.models import Card, CdsResponse
from cds_hooks.prefetch import bundle_resources

JSON = dict[str, Any]
INACTIVE_CLINICAL = frozenset({"inactive", "resolved"})
NOT_VERIFIED = frozenset({"refuted", "entered-in-error"})


@dataclass(frozen=True)
class AllergySubstance:
    allergy: JSON
    name: str
    ingredients: frozenset[str]
    classes: frozenset[str]  # cross-reactive classes the allergy rules out

    @property
    def reference(self) -> str | None:
        return f"AllergyIntolerance/{self.allergy['id']}" if self.allergy.get("id") else None


@dataclass(frozen=True)
class Conflict:
    medication: Medication
    substance: AllergySubstance
    matched: str  # the ingredient or class name that matched

    @property
    def severity(self) -> str:
        return "critical" if self.substance.allergy.get("criticality") == "high" else "high"


def _code(concept: JSON | None) -> str | None:
    return ((concept or {}).get("coding") or [{}])[0].get("code")


def in_force(allergy: JSON) -> bool:
    clinical = _code(allergy.get("clinicalStatus"))
    verification = _code(allergy.get("verificationStatus"))
    return clinical not in INACTIVE_CLINICAL and verification not in NOT_VERIFIED


def _concepts(allergy: JSON) -> list[JSON]:
    concepts = [allergy.get("code") or {}]
    concepts += [r["substance"] for r in allergy.get("reaction") or []
                 if isinstance(r, dict) and isinstance(r.get("substance"), dict)]
    return concepts


def _class_names(vocab: DrugVocabulary, text: str) -> set[str]:
    found = set()
    for name, info in vocab.classes.items():
        words = {name.replace("-", " "), str(info.get("display", "")).lower()}
        if name == "sulfonamide-antibiotic":
            words |= {"sulfa", "sulpha", "sulfonamide"}
        if name == "cox-inhibitor":
            words |= {"nsaid", "nsaids"}
        if any(w and re.search(rf"(?<!\w){re.escape(w)}s?(?!\w)", text) for w in words):
            found.add(name)
    return found


def substance_of(allergy: JSON, vocab: DrugVocabulary | None = None) -> AllergySubstance:
    vocab = vocab or vocabulary()
    ingredients: set[str] = set()
    classes: set[str] = set()
    names = []
    for concept in _concepts(allergy):
        for coding in concept.get("coding") or []:
            system, code = coding.get("system"), str(coding.get("code") or "")
            if system in RXNORM_SYSTEMS:
                ingredients |= vocab.by_code(code)[0]
            mapped = vocab.allergy_codes.get(f"{system}|{code}")
            if mapped:
                classes |= set(mapped["classes"])
            if coding.get("display"):
                names.append(coding["display"])
        if concept.get("text"):
            names.append(concept["text"])
    for text in names:
        ingredients |= vocab.by_text(text)
        classes |= _class_names(vocab, text.lower())
    classes |= vocab.classes_of(ingredients)
    cross = {c for c in classes if vocab.classes.get(c, {}).get("cross_reactive")}
    return AllergySubstance(allergy, names[0] if names else "unnamed allergy",
                            frozenset(ingredients), frozenset(cross))


def find_conflicts(drafts: Sequence[Medication], allergies: Sequence[JSON]) -> list[Conflict]:
    vocab = vocabulary()
    substances = [substance_of(a, vocab) for a in allergies if in_force(a)]
    conflicts = []
    for medication in drafts:
        for substance in substances:
            shared = medication.ingredients & substance.ingredients
            classes = medication.classes & substance.classes
            if shared:
                matched = ", ".join(sorted(vocab.ingredient_name(i) for i in shared))
            elif classes:
                matched = ", ".join(sorted(vocab.classes[c]["display"] for c in classes))
            else:
                continue
            conflicts.append(Conflict(medication, substance, matched))
    return conflicts


# -- the CDS service (order-select, order-sign) ----------------------------------------------
def conflict_card(conflict: Conflict) -> Card:
    medication, substance = conflict.medication, conflict.substance
    reactions = ", ".join(
        m.get("text") or (m.get("coding") or [{}])[0].get("display", "")
        for r in substance.allergy.get("reaction") or [] for m in r.get("manifestation") or [])
    detail = (f"The patient has an active allergy to **{substance.name}**"
              f"{f' (reaction: {reactions})' if reactions else ''}; "
              f"**{medication.name}** contains or is related to: {conflict.matched}.\n\n"
              f"*Criticality: {substance.allergy.get('criticality', 'unknown')}. "
              f"Recorded as {substance.reference or 'an AllergyIntolerance'}.*")
    suggestions = [remove_draft(medication.reference, f"Remove the draft order for "
                                f"{medication.name}")] if medication.reference else []
    return card(f"Allergy to {substance.name}: {medication.name} ({conflict.matched})",
                INDICATOR_OF_SEVERITY[conflict.severity], source(SERVICE_TITLE),
                detail=detail, suggestions=suggestions, overridable=True)


async def allergy_service(inv: Invocation) -> CdsResponse:
    drafts = draft_medications(inv)
    allergies = bundle_resources(inv.prefetch.get("allergies"))
    if not drafts or not allergies:
        return CdsResponse()
    return CdsResponse(cards=[conflict_card(c) for c in find_conflicts(drafts, allergies)])


SERVICE_TITLE = "Allergy conflict check"
SERVICE = CdsService(
    id="allergy-conflicts", hooks=("order-select", "order-sign"), title=SERVICE_TITLE,
    description="Checks draft medication orders against the patient's active "
                "AllergyIntolerances by ingredient and cross-reacting drug class "
                "(an amoxicillin allergy rules out every penicillin).",
    prefetch={"allergies": "AllergyIntolerance?patient={{context.patientId}}"},
    usage_requirements="Draft MedicationRequests coded with RxNorm (or named in text); the "
                       "patient's AllergyIntolerances by prefetch or FHIR access (else 412).",
    run=allergy_service)
