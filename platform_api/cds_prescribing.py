"""The prescription checks decision support provides, registered in
:mod:`platform_api.prescription_checks` at start-up (:func:`install`), so that signing a
prescription runs the same knowledge the CDS Hooks services answer with:

- **drug-drug interactions**: :func:`cds_hooks.interactions.check_medication_request`
  (the interaction table, seed plus stored entries, of the ``drug-interactions`` service);
- **allergy conflicts**: :func:`cds_hooks.allergies.find_conflicts` against the patient's
  AllergyIntolerances in force (the ``allergy-conflicts`` service);
- **duplicate therapy**: the same ingredients as one of the patient's current
  medications (high: a double dose; two drugs of one class, e.g. two NSAIDs, are entries
  of the interaction table).

Each reads the patient's current medications and allergies with one elevated reader:
the prescriber may be a locum who cannot see every record of the patient, and a check
that misses a current medication because of who signs would be unsafe. The reader only
reads; what the check found is shown to a caller already admitted to sign.
"""

from __future__ import annotations

from typing import Any

from cds_hooks.allergies import find_conflicts
from cds_hooks.interactions import check_medication_request, current_medications
from cds_hooks.medications import medication_of
from fhir_server.caller import CallerFhir
from platform_api import prescription_checks
from platform_api.services import Services

JSON = dict[str, Any]
READER = "prescription_checks_reader"


def _reader(services: Services) -> CallerFhir:
    reader = services.extras.get(READER)
    if reader is None:
        reader = services.extras[READER] = services.policy.elevate(
            "prescription checks: read the patient's current medications and allergies")
    return reader  # type: ignore[no-any-return]


async def interactions(services: Services, medication_request: JSON, patient_id: str
                       ) -> list[JSON]:
    from platform_api.cds import cds_runtime  # the CDS area imports this module

    findings = await check_medication_request(
        _reader(services), cds_runtime(services).knowledge, medication_request, patient_id)
    return [{**f, "kind": "interaction"} for f in findings]


async def allergies(services: Services, medication_request: JSON, patient_id: str
                    ) -> list[JSON]:
    draft = medication_of(medication_request, draft=True)
    if draft is None:
        return []
    found = await _reader(services).search("AllergyIntolerance",
                                           [("patient", f"Patient/{patient_id}")])
    return [{"kind": "allergy", "severity": c.severity, "drugs": [draft.name],
             "description": f"The patient has an active allergy to {c.substance.name}; "
                            f"{draft.name} contains or is related to: {c.matched}",
             "recommendation": "Choose a medicine the patient is not allergic to"}
            for c in find_conflicts([draft], found)]


async def duplicate_therapy(services: Services, medication_request: JSON, patient_id: str
                            ) -> list[JSON]:
    draft = medication_of(medication_request, draft=True)
    if draft is None or not (draft.ingredients or draft.rxcui):
        return []
    current = await current_medications(_reader(services), patient_id,
                                         exclude=[draft.reference or ""])
    return [{"kind": "duplicate-therapy", "severity": "high",
             "drugs": [draft.name, other.name],
             "description": f"{draft.name} duplicates a current medication of the patient "
                            f"({other.name}): a double dose",
             "recommendation": "Stop or change the current prescription first"}
            for other in current if draft.same_drug(other)]


CHECKS = (interactions, allergies, duplicate_therapy)


def install() -> None:
    """Register the checks (once per process: every app of the process shares them)."""
    for check in CHECKS:
        prescription_checks.register(check)
