"""Allergy–order conflicts: a draft medication whose ingredient, or a drug class that
cross-reacts, matches an active AllergyIntolerance of the patient.

An allergy's substance is read from ``AllergyIntolerance.code`` (and
``reaction.substance``): RxNorm codings (an ingredient or a product: its ingredients),
SNOMED CT codes the vocabulary maps to a class (91936005 *Allergy to penicillin*), or the
text ("Penicillin", "Sulfa drugs", "NSAIDs": ingredient, synonym, brand and class names).
A conflict is the same ingredient, or a draft of a class marked ``cross_reactive`` that
one of the allergy's ingredients or classes belongs to: an allergy to amoxicillin rules
out every penicillin (amoxicillin–clavulanate included), not a cephalosporin.

Only allergies in force count: ``clinicalStatus`` active (or absent) and not
``verificationStatus`` refuted or entered-in-error. Severity of the conflict:
``criticality`` high → critical, else high.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cds_hooks.medications import RXNORM_SYSTEMS, DrugVocabulary, Medication, vocabulary

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
