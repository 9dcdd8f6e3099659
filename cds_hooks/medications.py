"""What a medication is made of: RxNorm codes and free text → ingredients and classes.

The drug checks (interactions, allergy conflicts) compare ingredients and drug classes,
never product codes, so a branded or combination product is caught by what it contains.
Knowledge, as data shipped in ``cds_hooks/data``:

- ``drug_ingredients.json``: the RxNorm ingredients the tables name, each with its
  classes; synonyms (rifampicin, paracetamol, co-trimoxazole) and a few combination
  products; SNOMED CT allergy codes that name a class;
- ``rxnorm_products.json`` (generated from the HL7 PDDI CDS IG's RxNorm value sets by
  ``scripts/generate_rxnorm_products.py``): RxNorm clinical and branded drugs, brand
  names and packs → their ingredients, topical forms marked.

A coding is resolved by its RxNorm code (an ingredient, or a product of the map); what
has no known code is matched by name (ingredient names, synonyms and brand names as whole
words of the text), so a free-text statement "Coumadin 5 mg daily" is warfarin.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache, cached_property
from importlib import resources
from typing import Any

JSON = dict[str, Any]
RXNORM = "http://www.nlm.nih.gov/research/umls/rxnorm"
RXNORM_SYSTEMS = frozenset({RXNORM, "urn:oid:2.16.840.1.113883.6.88"})
# MedicationOrder: the DSTU2 name of MedicationRequest, still in the Hook Library examples.
MEDICATION_TYPES = frozenset({"MedicationRequest", "MedicationStatement", "MedicationOrder"})


@dataclass(frozen=True)
class Medication:
    """One medication as the checks see it."""

    name: str
    ingredients: frozenset[str]
    classes: frozenset[str]
    rxcui: str | None = None
    topical: bool = False
    reference: str | None = None  # "MedicationRequest/<id>" when it is a resource
    draft: bool = False  # a draft order (checked), not a current medication

    @cached_property
    def _tags(self) -> frozenset[str]:
        own = {self.rxcui} if self.rxcui else set()
        return self.ingredients | own | {f"class:{c}" for c in self.classes}

    def tags(self) -> frozenset[str]:
        """What interaction entries match: ingredients, classes, and the RxNorm code
        itself (an entry an administrator added may name an ingredient the shipped
        vocabulary does not know)."""
        return self._tags

    def same_drug(self, other: Medication) -> bool:
        if self.ingredients or other.ingredients:
            return self.ingredients == other.ingredients
        return self.rxcui is not None and self.rxcui == other.rxcui


@dataclass
class DrugVocabulary:
    ingredients: dict[str, JSON]
    classes: dict[str, JSON]
    products: dict[str, JSON]
    names: dict[str, tuple[str, ...]]  # lower-case name → ingredient codes
    allergy_codes: dict[str, JSON]
    _pattern: re.Pattern[str] | None = field(default=None, repr=False)

    def ingredient_name(self, code: str) -> str:
        return str(self.ingredients.get(code, {}).get("name", code))

    def classes_of(self, ingredients: Iterable[str]) -> frozenset[str]:
        return frozenset(c for i in ingredients for c in self.ingredients.get(i, {}).get(
            "classes", ()))

    def by_code(self, code: str) -> tuple[frozenset[str], bool]:
        """(ingredients, topical) of an RxNorm code; empty when unknown."""
        if code in self.ingredients:
            return frozenset({code}), False
        product = self.products.get(code)
        if product is None:
            return frozenset(), False
        return frozenset(product["ingredients"]), bool(product.get("topical"))

    def by_text(self, text: str) -> frozenset[str]:
        """Ingredients named in free text (whole words, case-insensitive)."""
        if not text:
            return frozenset()
        if self._pattern is None:
            names = sorted(self.names, key=len, reverse=True)
            self._pattern = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, names))
                                       + r")(?![\w-])", re.IGNORECASE)
        return frozenset(code for match in self._pattern.finditer(text)
                         for code in self.names[match.group(1).lower()])

    def medication(self, concept: JSON | None, *, reference: str | None = None,
                   draft: bool = False, name: str | None = None, rxcui: str | None = None
                   ) -> Medication:
        """A Medication from a CodeableConcept (RxNorm codings first, then its text), or
        from a name and an RxNorm code (the /api payload)."""
        concept = concept or {}
        codings = [c for c in concept.get("coding") or [] if isinstance(c, dict)]
        if rxcui:
            codings.insert(0, {"system": RXNORM, "code": rxcui, "display": name})
        ingredients: frozenset[str] = frozenset()
        topical = False
        code = None
        for coding in codings:
            if coding.get("system") in RXNORM_SYSTEMS and coding.get("code"):
                code = code or str(coding["code"])
                found, topical = self.by_code(str(coding["code"]))
                if found:
                    ingredients = found
                    break
        display = name or concept.get("text") or next(
            (c.get("display") for c in codings if c.get("display")), None)
        if not ingredients:
            texts = [name, concept.get("text"), *(c.get("display") for c in codings)]
            ingredients = frozenset().union(*(self.by_text(t) for t in texts if t))
        label = display or " / ".join(sorted(self.ingredient_name(i) for i in ingredients)) \
            or (f"RxNorm {code}" if code else "unnamed medication")
        return Medication(label, ingredients, self.classes_of(ingredients), code, topical,
                          reference, draft)


def _load(name: str) -> JSON:
    return json.loads(resources.files("cds_hooks.data").joinpath(name).read_text())  # type: ignore[no-any-return]


@cache
def vocabulary() -> DrugVocabulary:
    """The shipped vocabulary (read once)."""
    base, generated = _load("drug_ingredients.json"), _load("rxnorm_products.json")
    names: dict[str, tuple[str, ...]] = {}
    for code, ingredient in base["ingredients"].items():
        names[ingredient["name"].lower()] = (code,)
    for brand, code in generated["brand_names"].items():
        names.setdefault(brand, (code,))
    for synonym, code in base["synonyms"].items():
        names[synonym] = (code,)
    for combination, codes in base["combinations"].items():
        names[combination] = tuple(codes)
    return DrugVocabulary(ingredients=base["ingredients"], classes=base["classes"],
                          products={**generated["products"], **base["products"]},
                          names=names, allergy_codes=base["allergy_codes"])


def medication_concept(resource: JSON) -> JSON | None:
    """The medication[x] of a MedicationRequest or MedicationStatement as a
    CodeableConcept (a contained Medication's code, or a reference's display)."""
    if isinstance(resource.get("medicationCodeableConcept"), dict):
        return resource["medicationCodeableConcept"]  # type: ignore[no-any-return]
    reference = resource.get("medicationReference")
    if not isinstance(reference, dict):
        return None
    target = str(reference.get("reference") or "")
    if target.startswith("#"):
        for contained in resource.get("contained") or []:
            if isinstance(contained, dict) and contained.get("id") == target[1:] \
                    and contained.get("resourceType") == "Medication":
                return contained.get("code")  # type: ignore[no-any-return]
    return {"text": reference["display"]} if reference.get("display") else None


def medication_of(resource: JSON, *, draft: bool = False) -> Medication | None:
    """The Medication of a MedicationRequest / MedicationStatement (None for other
    resources, or one naming no medication)."""
    if resource.get("resourceType") not in MEDICATION_TYPES:
        return None
    concept = medication_concept(resource)
    if concept is None:
        return None
    reference = f"{resource['resourceType']}/{resource['id']}" if resource.get("id") else None
    return vocabulary().medication(concept, reference=reference, draft=draft)
