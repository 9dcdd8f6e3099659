"""The checks a prescription goes through before it is signed: an extension point between
the Patients area (``POST /api/prescriptions/:id/sign``) and clinical decision support.

A check is ``async def check(services, medication_request, patient_id) -> list[finding]``
(``medication_request`` the FHIR MedicationRequest about to be signed); a finding is
``{kind, severity, description, drugs, recommendation}`` (the drug interaction shape of
the spec, with ``kind`` interaction | allergy | duplicate-therapy). Every function in
:data:`checks` runs on each sign, in order. A finding of
severity ``high`` or ``critical`` refuses the sign (409 ``DRUG_INTERACTION`` listing the
findings) unless the prescriber gives an ``override_reason``; every finding is kept with
the signed prescription (a FHIR DetectedIssue) and shown in its view.

Decision support registers its interaction, allergy and duplicate-therapy checks at
start-up (:mod:`platform_api.cds_prescribing`); :func:`register` adds a check once (a
process that starts several apps registers each check once). A check that
fails is itself a high finding, so the prescriber sees that the check did not run and
must override knowingly: a broken checker neither blocks prescribing nor is skipped
silently.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from platform_api.services import Services

log = logging.getLogger("healthplatform.prescription_checks")

JSON = dict[str, Any]
PrescriptionCheck = Callable[[Services, JSON, str], Awaitable[list[JSON]]]
REFUSING = frozenset({"high", "critical"})

checks: list[PrescriptionCheck] = []


def register(check: PrescriptionCheck) -> PrescriptionCheck:
    if check not in checks:
        checks.append(check)
    return check


def _finding(raw: Any) -> JSON:
    """A finding in the agreed shape (what a check left out is filled in)."""
    found = raw if isinstance(raw, dict) else {"description": str(raw)}
    drugs = found.get("drugs") or []
    return {"kind": str(found.get("kind") or "interaction"),
            "severity": str(found.get("severity") or "moderate").lower(),
            "description": str(found.get("description") or "Interaction"),
            "drugs": [str(d) for d in drugs] if isinstance(drugs, list) else [str(drugs)],
            "recommendation": str(found.get("recommendation") or "")}


async def run_checks(services: Services, medication_request: JSON, patient_id: str
                     ) -> list[JSON]:
    """Every registered check's findings, in order."""
    findings: list[JSON] = []
    for check in list(checks):
        name = getattr(check, "__qualname__", repr(check))
        try:
            found = await check(services, medication_request, patient_id)
        except Exception:  # a failed check must not pass unnoticed: see the docstring
            log.exception("prescription check %s failed", name)
            findings.append({"kind": "check-failed", "severity": "high", "drugs": [],
                             "description": f"The prescription check {name} could not run",
                             "recommendation": "Check interactions by hand, then sign "
                                               "with an override reason"})
            continue
        findings += [_finding(f) for f in found or []]
    return findings


def refusing(findings: list[JSON]) -> list[JSON]:
    return [f for f in findings if f["severity"] in REFUSING]
