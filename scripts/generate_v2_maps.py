"""Generate the v2 → FHIR code maps the HL7v2 gateway ships (``v2_to_fhir/v2_maps.json``).

Inputs (``../shared/fhir-r4`` from the repository root, see its README for provenance):

- ``v2-tables.json.gz``: the HL7 v2 tables as FHIR CodeSystems. Gives the display text of
  every code of the tables the mappers emit as ``http://terminology.hl7.org/CodeSystem/v2-NNNN``
  codings, so a coding never carries a display the official table does not have.
- ``profiles-others.json.gz``: the R4 core profiles; the vital signs profiles
  (``baseDefinition`` .../vitalsigns) give the LOINC codes an OBX is a vital sign by
  (category ``vital-signs``, which the R4 vital signs profiles require).
- ``conceptmaps.json``: the R4 core ConceptMaps. Those between a FHIR value set and a v2
  table (``cm-*-v2``) run FHIR → v2; they are inverted here (v2 → FHIR). Where several FHIR
  codes claim one v2 code, the ``equal``/``equivalent`` one wins over ``wider``.

The maps the R4 core does not carry are the HL7 v2-to-FHIR IG v1.0.0 ConceptMaps
(``table-hl7NNNN-to-*``), transcribed below in ``IG_MAPS`` with the IG's choices; a few
codes the IG leaves unmapped get the value named in ``LOCAL_CHOICES`` (a FHIR status is
required, so "unmapped" is not an option for us), each with the reason.

Run: ``python scripts/generate_v2_maps.py [path/to/fhir-r4]``.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = ROOT.parent / "shared" / "fhir-r4"
OUT = ROOT / "hl7_gateway" / "v2_to_fhir" / "v2_maps.json"

# v2 tables whose codes the mappers emit as codings (display text is taken from the source).
TABLES = [
    "0001", "0002", "0003", "0004", "0007", "0038", "0062", "0063", "0069", "0074", "0078",
    "0085", "0119", "0123", "0127", "0128", "0131", "0136", "0162", "0163", "0189", "0190",
    "0200", "0201", "0202", "0203", "0270", "0271", "0273", "0278", "0322", "0323", "0485",
]

# R4 core ConceptMaps (FHIR → v2) inverted into v2 → FHIR maps: name → ConceptMap id.
CORE_MAPS = {
    "administrative_gender": "cm-administrative-gender-v2",
    "address_use": "cm-address-use-v2",
    "name_use": "cm-name-use-v2",
    "contact_point_use": "cm-contact-point-use-v2",
    "contact_point_system": "cm-contact-point-system-v2",
}

# HL7 v2-to-FHIR IG v1.0.0 ConceptMaps (v2 code → FHIR code).
IG_MAPS: dict[str, dict[str, str]] = {
    # table-hl70001-to-administrative-gender: A (ambiguous) and N (not applicable) → other.
    "administrative_gender": {"F": "female", "M": "male", "O": "other", "U": "unknown",
                              "A": "other", "N": "other"},
    # table-hl70004-to-v3-ActEncounterCode (Encounter.class).
    "encounter_class": {"E": "EMER", "I": "IMP", "O": "AMB", "P": "PRENC", "R": "AMB",
                        "B": "IMP"},
    # table-hl70002-to-v3-MaritalStatus.
    "marital_status": {"A": "L", "D": "D", "M": "M", "S": "S", "W": "W", "C": "C", "G": "T",
                       "P": "T", "R": "T", "E": "L", "N": "A", "I": "I", "B": "U", "U": "UNK",
                       "O": "OTH", "T": "UNK"},
    # table-hl70085-to-observation-status (OBX-11).
    "observation_status": {"F": "final", "P": "preliminary", "C": "corrected", "A": "amended",
                           "D": "entered-in-error", "W": "entered-in-error", "X": "cancelled"},
    # table-hl70123-to-diagnostic-report-status (OBR-25).
    "diagnostic_report_status": {"O": "registered", "I": "registered", "S": "registered",
                                 "P": "preliminary", "C": "corrected", "R": "partial",
                                 "F": "final", "X": "cancelled", "Y": "entered-in-error",
                                 "Z": "entered-in-error"},
    # table-hl70078-to-v3-ObservationInterpretation (OBX-8): identity for the shared codes.
    "interpretation": {c: c for c in (
        "<", ">", "A", "AA", "AC", "B", "D", "DET", "H", "HH", "HM", "HU", "I", "IE", "IND",
        "L", "LL", "LU", "MS", "N", "ND", "NEG", "NR", "NS", "OBX", "POS", "QCF", "R", "RR",
        "S", "SDD", "SYN-R", "SYN-S", "TOX", "U", "VS", "W", "WR")},
    # table-hl70038-to-request-status (ORC-5).
    "order_status": {"A": "active", "CA": "revoked", "CM": "completed", "DC": "revoked",
                     "ER": "entered-in-error", "HD": "on-hold", "IP": "active", "RP": "revoked",
                     "SC": "active"},
    # table-hl70119-to-request-status (ORC-1 when ORC-5 is empty).
    "order_control_status": {"NW": "active", "OK": "active", "SC": "active", "XO": "active",
                             "RL": "active", "OR": "active", "CA": "revoked", "OC": "revoked",
                             "CR": "revoked", "DC": "revoked", "OD": "revoked", "DR": "revoked",
                             "HD": "on-hold", "OH": "on-hold", "RE": "active", "CM": "completed"},
    # table-hl70485-to-request-priority (TQ1-9 / OBR-5 priority).
    "request_priority": {"S": "stat", "A": "asap", "R": "routine", "P": "urgent", "C": "urgent",
                         "T": "urgent", "PRN": "routine"},
    # table-hl70322-to-immunization-status (RXA-20).
    "immunization_status": {"CP": "completed", "PA": "completed", "RE": "not-done",
                            "NA": "not-done"},
    # table-hl70127-to-allergy-intolerance-category (AL1-2).
    "allergy_category": {"DA": "medication", "FA": "food", "EA": "environment",
                         "AA": "environment", "PA": "environment", "LA": "environment"},
    # table-hl70128-to-allergy-intolerance-criticality (AL1-4).
    "allergy_criticality": {"SV": "high", "MO": "low", "MI": "low", "U": "unable-to-assess"},
    # table-hl70278-to-appointment-status (SCH-25), matched case-insensitively.
    "appointment_status": {"pending": "pending", "waitlist": "waitlist", "booked": "booked",
                           "started": "arrived", "complete": "fulfilled",
                           "cancelled": "cancelled", "dc": "cancelled",
                           "discontinued": "cancelled", "deleted": "entered-in-error",
                           "blocked": "booked", "overbook": "booked", "noshow": "noshow"},
    # table-hl70278-to-participationstatus (AIS/AIG/AIL/AIP-12).
    "participation_status": {"pending": "tentative", "waitlist": "tentative",
                             "booked": "accepted", "started": "accepted",
                             "complete": "accepted", "cancelled": "declined",
                             "dc": "declined", "discontinued": "declined",
                             "deleted": "declined", "blocked": "accepted",
                             "overbook": "accepted", "noshow": "declined"},
    # table-hl70271-to-composition-status (TXA-17 → DocumentReference.docStatus).
    "document_completion": {"AU": "final", "LA": "final", "DI": "preliminary",
                            "DO": "preliminary", "IN": "preliminary", "IP": "preliminary",
                            "PA": "preliminary"},
    # table-hl70273-to-document-reference-status (TXA-19).
    "document_availability": {"AV": "current", "UN": "current", "OB": "superseded",
                              "CA": "entered-in-error"},
    # table-hl70063-to-subscriber-relationship (IN1-17).
    "subscriber_relationship": {"SEL": "self", "SPO": "spouse", "DOM": "common",
                                "CHD": "child", "NCH": "child", "SCH": "child",
                                "FCH": "child", "PAR": "parent", "MTH": "parent",
                                "FTH": "parent", "EME": "injured", "OTH": "other"},
    # PV1-7/8/9/17 → v3-ParticipationType (Encounter.participant.type).
    "encounter_participant": {"PV1-7": "ATND", "PV1-8": "REF", "PV1-9": "CON",
                              "PV1-17": "ADM"},
    # XTN-3 → contact-point-system beyond the core map (CP: cell phone, use mobile).
    "contact_point_system": {"CP": "phone", "SAT": "phone", "TDD": "other", "TTY": "other",
                             "MD": "other", "X.400": "email"},
    # XAD-7 → address-use beyond the core map (B business, P permanent, M mailing).
    "address_use": {"B": "work", "P": "home", "M": "home", "BDL": "home", "L": "home"},
    # XAD-7 → address-type (M mailing, SH shipping: postal).
    "address_type": {"M": "postal", "SH": "postal"},
    # DG1-6 → diagnosis-role (Encounter.diagnosis.use).
    "diagnosis_role": {"A": "AD", "W": "CC", "F": "DD", "P": "pre-op", "O": "post-op"},
}

# Codes the IG leaves unmapped while FHIR requires a value (reason in each comment).
LOCAL_CHOICES: dict[str, dict[str, str]] = {
    "observation_status": {
        "I": "registered",  # specimen in lab, result pending
        "O": "registered",  # order detail only, no result yet
        "R": "preliminary",  # entered, not verified
        "S": "preliminary",  # partial (deprecated in v2.6)
        "V": "final",  # verified final, value unchanged
        "U": "final",  # status changed to final without retransmitting the value
        "B": "amended",  # appended report: information added, values unchanged
        "N": "cancelled",  # not asked: the observation was never sought
    },
    "appointment_status": {
        "arrived": "arrived",  # not in table 0278, but what many schedulers send (Corepoint)
        "checked in": "checked-in",
    },
    "diagnostic_report_status": {
        "A": "partial",  # some, not all, results available (FHIR-Converter's choice too)
        "M": "partial",  # corrected, not final
        "N": "registered",  # procedure incomplete
    },
}

# Coding system names (v2 table 0396 and common HL7 v2.3 names) → FHIR system URIs.
CODE_SYSTEMS = {
    "LN": "http://loinc.org", "LOINC": "http://loinc.org",
    "SCT": "http://snomed.info/sct", "SNM": "http://snomed.info/sct",
    "SNOMED": "http://snomed.info/sct", "SNOMEDCT": "http://snomed.info/sct",
    "SNM3": "http://snomed.info/sct", "SCT2": "http://snomed.info/sct",
    "I10": "http://hl7.org/fhir/sid/icd-10", "ICD10": "http://hl7.org/fhir/sid/icd-10",
    "I10C": "http://hl7.org/fhir/sid/icd-10-cm", "ICD10CM": "http://hl7.org/fhir/sid/icd-10-cm",
    "I10P": "http://www.cms.gov/Medicare/Coding/ICD10",
    "I9": "http://hl7.org/fhir/sid/icd-9-cm", "I9C": "http://hl7.org/fhir/sid/icd-9-cm",
    "I9CDX": "http://hl7.org/fhir/sid/icd-9-cm", "I9M": "http://hl7.org/fhir/sid/icd-9-cm",
    "ICD9": "http://hl7.org/fhir/sid/icd-9-cm",
    "CVX": "http://hl7.org/fhir/sid/cvx", "NDC": "http://hl7.org/fhir/sid/ndc",
    "MVX": "http://terminology.hl7.org/CodeSystem/MVX",
    "UCUM": "http://unitsofmeasure.org", "ANS+": "http://unitsofmeasure.org",
    "RXNORM": "http://www.nlm.nih.gov/research/umls/rxnorm",
    "C4": "http://www.ama-assn.org/go/cpt", "CPT": "http://www.ama-assn.org/go/cpt",
    "C5": "http://www.ama-assn.org/go/cpt", "CPT4": "http://www.ama-assn.org/go/cpt",
    "HCPCS": "urn:oid:2.16.840.1.113883.6.285",
    "NCIT": "http://ncimeta.nci.nih.gov", "NCI": "http://ncimeta.nci.nih.gov",
    "CDCREC": "urn:oid:2.16.840.1.113883.6.238",
    "DCM": "http://dicom.nema.org/resources/ontology/DCM",
    "ISO3166": "urn:iso:std:iso:3166", "ISO+": "urn:iso:std:iso:11073:10101",
    "UMLS": "http://www.nlm.nih.gov/research/umls", "NPI": "http://hl7.org/fhir/sid/us-npi",
    "CDCPHINVS": "urn:oid:2.16.840.1.114222.4.5.274",
    "cdcgs1vis": "urn:oid:2.16.840.1.114222.4.5.307",
    "ATC": "http://www.whocc.no/atc", "HPC": "urn:oid:2.16.840.1.113883.6.4",
    "NUCCPROVIDER": "http://nucc.org/provider-taxonomy",
}

# LOINC codes of VXU OBX segments that carry Immunization elements (CDC IIS guide).
IMMUNIZATION_OBSERVATIONS = {
    "64994-7": "programEligibility",
    "30963-3": "fundingSource",
    "69764-9": "education.documentType",
    "29768-9": "education.publicationDate",
    "29769-7": "education.presentationDate",
    "30956-7": "education.vaccineType",
}


def _load_tables(source: Path) -> dict[str, dict[str, str]]:
    with gzip.open(source / "v2-tables.json.gz") as f:
        bundle = json.load(f)
    found: dict[str, dict[str, str]] = {}
    for entry in bundle["entry"]:
        resource = entry["resource"]
        table = resource.get("id", "").removeprefix("v2-")
        if resource["resourceType"] != "CodeSystem" or table not in TABLES or table in found:
            continue
        found[table] = {c["code"]: c.get("display", "") for c in resource.get("concept", [])}
    missing = sorted(set(TABLES) - set(found))
    if missing:
        raise SystemExit(f"v2 tables missing from the source: {', '.join(missing)}")
    return found


_RANK = {"equal": 0, "equivalent": 1, "wider": 2, "narrower": 3}


def _inverted_core_maps(source: Path) -> dict[str, dict[str, str]]:
    bundle = json.loads((source / "conceptmaps.json").read_text())
    by_id = {e["resource"]["id"]: e["resource"] for e in bundle["entry"]}
    maps: dict[str, dict[str, str]] = {}
    for name, cm_id in CORE_MAPS.items():
        best: dict[str, tuple[int, str]] = {}
        for group in by_id[cm_id]["group"]:
            for element in group["element"]:
                for target in element.get("target", []):
                    rank = _RANK.get(target.get("equivalence", ""), 9)
                    if target["code"] not in best or rank < best[target["code"]][0]:
                        best[target["code"]] = (rank, element["code"])
        maps[name] = {v2: fhir for v2, (_, fhir) in sorted(best.items())}
    return maps


def _vital_sign_codes(source: Path) -> dict[str, str]:
    """LOINC code → vital signs profile id, from the profiles' fixed Observation.code."""
    with gzip.open(source / "profiles-others.json.gz") as f:
        bundle = json.load(f)
    found: dict[str, str] = {}
    for entry in bundle["entry"]:
        profile = entry["resource"]
        if not str(profile.get("baseDefinition", "")).endswith("/vitalsigns"):
            continue
        for element in profile.get("differential", {}).get("element", []):
            element_id = str(element.get("id", ""))
            code = element.get("fixedCode") or element.get("patternCode")
            if element_id.startswith("Observation.code.coding:") and code:
                found[code] = profile["id"]
    return dict(sorted(found.items()))


def build(source: Path) -> dict[str, Any]:
    maps = _inverted_core_maps(source)
    for name, table in IG_MAPS.items():
        maps[name] = {**maps.get(name, {}), **table}
    for name, table in LOCAL_CHOICES.items():
        maps[name] = {**maps[name], **table}
    # v2 name types the core map lacks: A alias, B birth name, C adopted, TEMP/T temporary.
    maps["name_use"] = {**maps["name_use"], "A": "usual", "B": "old", "C": "official",
                        "T": "temp", "I": "official", "R": "official", "U": "usual"}
    return {
        "_source": "generated by scripts/generate_v2_maps.py from the FHIR R4 v2 tables and "
                   "ConceptMaps and the HL7 v2-to-FHIR IG v1.0.0 ConceptMaps",
        "tables": _load_tables(source),
        "maps": dict(sorted(maps.items())),
        "code_systems": CODE_SYSTEMS,
        "immunization_observations": IMMUNIZATION_OBSERVATIONS,
        "vital_signs": _vital_sign_codes(source),
    }


def main() -> None:
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_SOURCE
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(build(source), indent=1, ensure_ascii=False, sort_keys=False)
                   + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
