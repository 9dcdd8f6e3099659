"""Panic (critical) values of lab results: the table, the check, and the flag a critical
result raises in the patient's record.

**The table** is data (``data/panic_values.json``, or the file named by
``HEALTHPLATFORM_CDS_PANIC_VALUES_FILE``): per LOINC code, the unit and the low and/or
high critical limit, with factors for other units a lab may report in (glucose in
mmol/L). A value at or beyond a limit is critical; a value in a unit the entry cannot
convert is reported as not comparable, never guessed.

**The flag**: a critical Observation about a patient raises a FHIR **Flag** in the
patient's record (Flag is R4's "prospective warning" shown to whoever cares for the
patient; DetectedIssue is for issues between clinical actions such as drug
interactions)::

    status       active (inactive when a corrected result is no longer critical)
    identifier   urn:healthplatform:panic-value | <Observation id>:<LOINC code> (one flag
                 per result and analyte: a redelivered event or a resent HL7 message
                 finds it and writes nothing)
    category     flag-category#lab
    code         the analyte's LOINC coding; text "Critical potassium: 6.9 mmol/L
                 (critical above 6.2)"
    subject      the Observation's subject; encounter its encounter
    period.start the Observation's effective time (else now)
    extension    flag-detail → the Observation
    author       display "healthplatform CDS (panic values)"
    meta.security the Observation's owners (the flag is owned like the result)

and, in the same unit of work, the event ``platform.cds.panic_value``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from cds_hooks.cards import CdsService, Invocation, card, source
from cds_hooks.models import Card, CdsResponse
from cds_hooks.prefetch import bundle_resources
from fhir_server.caller import CallerFhir
from fhir_server.clock import now_instant
from fhir_server.ownership import owner_labels, with_owners

JSON = dict[str, Any]
LOINC = "http://loinc.org"
FLAG_SYSTEM = "urn:healthplatform:panic-value"
FLAG_DETAIL = "http://hl7.org/fhir/StructureDefinition/flag-detail"
FLAG_CATEGORY = {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/flag-category",
                             "code": "lab", "display": "Lab"}]}
TOPIC = "platform.cds.panic_value"
AUTHOR = "healthplatform CDS (panic values)"
CHECKED_STATUSES = frozenset({"final", "amended", "corrected", "preliminary"})


@dataclass(frozen=True)
class PanicLimit:
    loinc: str
    display: str
    unit: str
    low: float | None = None
    high: float | None = None
    conversions: Mapping[str, float] | None = None

    def in_unit(self, value: float, unit: str | None) -> float | None:
        """``value`` in the table's unit, None when the unit cannot be converted."""
        unit = (unit or "").strip()
        if unit == self.unit:
            return value
        factor = (self.conversions or {}).get(unit)
        return value * factor if factor is not None else None


@dataclass(frozen=True)
class PanicFinding:
    limit: PanicLimit
    value: float
    unit: str
    direction: Literal["low", "high"] | None  # None: not critical
    comparable: bool = True

    @property
    def critical(self) -> bool:
        return self.direction is not None

    @property
    def threshold(self) -> float | None:
        return self.limit.low if self.direction == "low" else self.limit.high \
            if self.direction == "high" else None

    def text(self) -> str:
        analyte = self.limit.display.split(" [")[0].lower()
        side = "below" if self.direction == "low" else "above"
        return (f"Critical {analyte}: {_number(self.value)} {self.unit} "
                f"(critical {side} {_number(self.threshold or 0)} {self.limit.unit})")

    def as_dict(self) -> JSON:
        return {"code": self.limit.loinc, "display": self.limit.display,
                "value": self.value, "unit": self.unit, "critical": self.critical,
                "direction": self.direction, "limit": self.threshold,
                "limit_unit": self.limit.unit, "comparable": self.comparable,
                "low": self.limit.low, "high": self.limit.high}


def _number(value: float) -> str:
    return f"{value:g}"


class PanicTable:
    def __init__(self, limits: Iterable[PanicLimit], source: str = ""):
        self.by_code = {limit.loinc: limit for limit in limits}
        self.source = source

    @classmethod
    def from_json(cls, data: JSON) -> PanicTable:
        limits = [PanicLimit(e["loinc"], e.get("display", e["loinc"]), e["unit"],
                             e.get("low"), e.get("high"), e.get("conversions"))
                  for e in data["entries"]]
        return cls(limits, data.get("source", ""))

    def check(self, code: str, value: float, unit: str | None) -> PanicFinding | None:
        """None when the table has no limit for ``code``."""
        limit = self.by_code.get(code)
        if limit is None:
            return None
        converted = limit.in_unit(value, unit)
        if converted is None:
            return PanicFinding(limit, value, unit or "", None, comparable=False)
        direction: Literal["low", "high"] | None = None
        if limit.low is not None and converted <= limit.low:
            direction = "low"
        elif limit.high is not None and converted >= limit.high:
            direction = "high"
        return PanicFinding(limit, value, unit or "", direction)

    def check_observation(self, observation: JSON) -> list[PanicFinding]:
        """Findings of an Observation's value and components (LOINC-coded quantities)."""
        found = []
        for holder in [observation, *(observation.get("component") or [])]:
            quantity = holder.get("valueQuantity")
            if not isinstance(quantity, dict) or not isinstance(quantity.get("value"),
                                                                 int | float):
                continue
            if quantity.get("comparator"):
                continue  # "<2" is not a measured value to compare with a limit
            unit = quantity.get("code") or quantity.get("unit")
            for coding in (holder.get("code") or {}).get("coding") or []:
                if coding.get("system") == LOINC and coding.get("code"):
                    finding = self.check(str(coding["code"]), float(quantity["value"]), unit)
                    if finding is not None:
                        found.append(finding)
                        break
        return found


@cache
def _table_from(path: str) -> PanicTable:
    if path:
        return PanicTable.from_json(json.loads(Path(path).read_text()))
    return PanicTable.from_json(json.loads(resources.files("cds_hooks.data").joinpath(
        "panic_values.json").read_text()))


def panic_table(path: str = "") -> PanicTable:
    """The shipped table, or the one in the file ``path`` (read once)."""
    return _table_from(path)


# -- flags ---------------------------------------------------------------------------------
def flag_identifier(observation_id: str, code: str) -> str:
    return f"{observation_id}:{code}"


def flag_for(observation: JSON, finding: PanicFinding) -> JSON:
    when = observation.get("effectiveDateTime") or observation.get("issued") or now_instant()
    flag: JSON = {
        "resourceType": "Flag", "status": "active",
        "identifier": [{"system": FLAG_SYSTEM, "value": flag_identifier(
            observation["id"], finding.limit.loinc)}],
        "category": [FLAG_CATEGORY],
        "code": {"coding": [{"system": LOINC, "code": finding.limit.loinc,
                             "display": finding.limit.display}], "text": finding.text()},
        "subject": observation["subject"], "period": {"start": when},
        "author": {"display": AUTHOR},
        "extension": [{"url": FLAG_DETAIL,
                       "valueReference": {"reference": f"Observation/{observation['id']}"}}],
    }
    if isinstance(observation.get("encounter"), dict):
        flag["encounter"] = observation["encounter"]
    return with_owners(flag, owner_labels(observation))


def patient_of(observation: JSON) -> str | None:
    reference = str((observation.get("subject") or {}).get("reference") or "")
    return reference.removeprefix("Patient/") if reference.startswith("Patient/") else None


def event_payload(observation: JSON, finding: PanicFinding, flag_id: str) -> JSON:
    return {"patient_id": patient_of(observation), "observation_id": observation["id"],
            "flag_id": flag_id, **{k: v for k, v in finding.as_dict().items()
                                   if k not in ("comparable", "critical")},
            "summary": finding.text(), "organization_ids": sorted(owner_labels(observation)),
            "effective": observation.get("effectiveDateTime"), "detected_at": now_instant()}


async def flag_critical_results(fhir: CallerFhir, observation: JSON, table: PanicTable, *,
                                updated: bool = False) -> list[str]:
    """Raise a Flag (and the event) for each critical value of a patient's Observation
    that has none yet; on an ``updated`` result, mark the flags of values no longer
    critical inactive. The ids of the flags created. Nothing is written (no unit of
    work) for a result with nothing to flag: this runs on every stored Observation."""
    if patient_of(observation) is None or observation.get("status") not in CHECKED_STATUSES:
        return []
    findings = table.check_observation(observation)
    critical = [f for f in findings if f.critical]
    stale: list[JSON] = []
    if updated:
        for finding in (f for f in findings if not f.critical):
            # (R4 has no status search parameter on Flag)
            stale += [flag for flag in await fhir.search("Flag", [("identifier", _flag_token(
                observation, finding))]) if flag.get("status") == "active"]
    if not critical and not stale:
        return []
    created: list[str] = []
    unit = fhir.unit()
    async with unit:
        for finding in critical:
            staged = await unit.create(flag_for(observation, finding), if_none_exist=[
                ("identifier", _flag_token(observation, finding))])
            unit.after_writes(_emit_when_created(staged, observation, finding, created))
        for flag in stale:
            await unit.update({**flag, "status": "inactive",
                               "period": {**flag.get("period", {}), "end": now_instant()}})
        await unit.commit()
    return created


def _flag_token(observation: JSON, finding: PanicFinding) -> str:
    return f"{FLAG_SYSTEM}|{flag_identifier(observation['id'], finding.limit.loinc)}"


def _emit_when_created(staged: Any, observation: JSON, finding: PanicFinding,
                       created: list[str]) -> Any:
    def emit(staging: Any) -> None:
        if staged.existing:
            return
        created.append(staged.id)
        staging.emit(TOPIC, event_payload(observation, finding, staged.id),
                     source_service="cds")
    return emit


# -- the CDS service (patient-view, appointment-book) ------------------------------------------
def critical_flags(flags: Iterable[JSON]) -> list[JSON]:
    """Active flags raised by this module (its identifier system)."""
    return [f for f in flags if f.get("resourceType") == "Flag" and f.get("status") == "active"
            and any(i.get("system") == FLAG_SYSTEM for i in f.get("identifier") or [])]


def flag_card(flag: JSON) -> Card:
    text = (flag.get("code") or {}).get("text") or "Critical lab result"
    observation = next((e["valueReference"]["reference"] for e in flag.get("extension") or []
                        if e.get("url") == FLAG_DETAIL and e.get("valueReference")), None)
    since = (flag.get("period") or {}).get("start")
    detail = (f"{text}, resulted {since}. The result is still flagged as critical: confirm "
              f"a clinician has acted on it.\n\n*{observation or 'Observation'}; "
              f"Flag/{flag.get('id')}.*")
    return card(text, "critical", source(SERVICE_TITLE), detail=detail)


async def critical_results_service(inv: Invocation) -> CdsResponse:
    flags = critical_flags(bundle_resources(inv.prefetch.get("flags")))
    return CdsResponse(cards=[flag_card(f) for f in flags])


SERVICE_TITLE = "Critical lab results"
SERVICE = CdsService(
    id="critical-results", hooks=("patient-view", "appointment-book"), title=SERVICE_TITLE,
    description="Lab results at or beyond their critical (panic) limits that are still "
                "flagged active in the patient's record (Flags raised when the result was "
                "stored, by HL7v2 or FHIR).",
    # R4 Flag has no status search parameter: the active ones are picked here.
    prefetch={"flags": "Flag?patient={{context.patientId}}"},
    usage_requirements="The patient's Flags by prefetch or FHIR access (else 412); flags "
                       "are raised by this server when it stores a critical result.",
    run=critical_results_service)
