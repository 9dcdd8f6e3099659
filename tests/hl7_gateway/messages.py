"""Realistic v2 messages built in code, and helpers to map and inspect them (tests only)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from hl7_gateway.parser import parse
from hl7_gateway.v2_to_fhir import MappedMessage, map_message
from tests.hl7_gateway.hl7_samples import sample_bytes

JSON = dict[str, Any]
# What each shared sample gets back, in order. 08/09 reuse 04's MSH-3/4/10 and 19 reuses
# 05's: to the gateway they are resends, answered with the first one's ACK.
EXPECTED_ACKS = {
    "01": ["CA"], "02": ["CA"], "03": ["AA"], "04": ["AA"], "05": ["AA"], "06": ["AA"],
    "07": ["AA"], "08": ["AA"], "09": ["AA"], "10": ["AA"], "11": ["CA", "AA"], "12": ["AA"],
    "13": ["CA"], "14": ["AA"], "15": ["AA"], "16": ["CA"], "17": ["AA"], "18": ["AA"],
    "19": ["AA"], "20": ["AA"], "21": ["AE"], "22": ["AA"], "23": ["AR"], "24": ["AR"],
    "25": ["AR"], "26": ["AA"], "27": [], "28": ["AA"], "29": ["AA"], "30": ["AA"],
}
RECEIVED = datetime(2024, 3, 1, 8, 0, tzinfo=UTC)

# (OBX-3 code, name, value, units, reference range, flag)
CHEMISTRY = [
    ("2345-7", "Glucose [Mass/volume] in Serum or Plasma", "182", "mg/dL", "70-99", "H"),
    ("2160-0", "Creatinine [Mass/volume] in Serum or Plasma", "0.9", "mg/dL", "0.7-1.3", "N"),
    ("2951-2", "Sodium [Moles/volume] in Serum or Plasma", "139", "mmol/L", "136-145", "N"),
    ("2823-3", "Potassium [Moles/volume] in Serum or Plasma", "6.9", "mmol/L", "3.5-5.1", "HH"),
    ("17861-6", "Calcium [Mass/volume] in Serum or Plasma", "9.4", "mg/dL", "8.6-10.3", "N"),
]


def segment(name: str, fields: dict[int, str]) -> str:
    """A segment with the given fields set (1-based, as in the standard) and the rest empty."""
    values = [""] * max(fields)
    for n, value in fields.items():
        values[n - 1] = value
    return "|".join([name, *values])


def oru(control_id: str = "LAB-0001", *, patient: str = "MRN-884422", filler: str = "F-1001",
        placer: str = "P-5001", results: Sequence[tuple[str, str, str, str, str, str]] =
        CHEMISTRY, status: str = "F", msh15: str = "", msh16: str = "",
        placer_namespace: str = "CLINIC-EHR",
        authority: str = "CITY LAB&2.16.840.1.113883.19.5&ISO") -> bytes:
    """An ORU^R01 from a hospital lab: one chemistry panel, one serum specimen."""
    segments = [
        f"MSH|^~\\&|CITYLAB-LIS|CITY LAB|CLINIC-EHR|KISUMU CLINIC|20240301101500+0300||"
        f"ORU^R01^ORU_R01|{control_id}|P|2.5.1|||{msh15}|{msh16}",
        f"PID|1||{patient}^^^{authority}^MR||Achieng^Grace^Wanjiru||"
        "19800412|F|||12 Oginga Odinga St^^Kisumu^^40100^KE^H||^PRN^PH^^254^712^345678",
        segment("PV1", {1: "1", 2: "O", 3: "LAB^^^CITY LAB", 7: "1234^Mwangi^John^^^Dr",
                        19: "V-7788^^^CITY LAB^VN"}),
        f"ORC|RE|{placer}^{placer_namespace}|{filler}^CITY LAB",
        segment("OBR", {1: "1", 2: f"{placer}^{placer_namespace}", 3: f"{filler}^CITY LAB",
                        4: "24323-8^Comprehensive metabolic panel^LN", 7: "20240301090000+0300",
                        16: "1234^Mwangi^John^^^Dr", 22: "20240301101000+0300", 25: status}),
    ]
    for n, (code, name, value, units, ref, flag) in enumerate(results, 1):
        segments.append(segment("OBX", {
            1: str(n), 2: "NM", 3: f"{code}^{name}^LN", 5: value, 6: f"{units}^{units}^UCUM",
            7: ref, 8: flag, 11: status, 14: "20240301095000+0300"}))
    segments.append(segment("SPM", {1: "1", 2: f"S-{filler}&CITY LAB",
                                    4: "119364003^Serum specimen^SCT",
                                    17: "20240301090000+0300", 18: "20240301093000+0300"}))
    return ("\r".join(segments) + "\r").encode()


def adt(event: str, control_id: str, *, patient: str = "MRN-884422", family: str = "Achieng",
        visit: str = "V-7788", discharge: str = "", extra: Sequence[str] = ()) -> bytes:
    """An ADT from a hospital registration system."""
    segments = [
        f"MSH|^~\\&|REG|KISUMU HOSP|EHR|KISUMU HOSP|20240301101500+0300||ADT^{event}^ADT_A01|"
        f"{control_id}|P|2.5.1",
        f"EVN|{event}|20240301101400+0300",
        f"PID|1||{patient}^^^KISUMU HOSP^MR||{family}^Grace||19800412|F|||"
        "12 Oginga Odinga St^^Kisumu^^40100^KE^H",
        segment("PV1", {1: "1", 2: "I", 3: "WARD-3^12^B^KISUMU HOSP",
                        7: "1234^Mwangi^John^^^Dr", 10: "MED", 19: f"{visit}^^^KISUMU HOSP^VN",
                        44: "20240301100000+0300", 45: discharge}),
        *extra,
    ]
    return ("\r".join(segments) + "\r").encode()


def mapped(raw: bytes) -> MappedMessage:
    return map_message(parse(raw), raw, received_at=RECEIVED, default_tz=UTC)


def sample(prefix: str) -> MappedMessage:
    return mapped(sample_bytes(prefix))


def resources(result: MappedMessage, resource_type: str) -> list[JSON]:
    return [e.resource for e in result.entries if e.resource["resourceType"] == resource_type]


def one(result: MappedMessage, resource_type: str) -> JSON:
    found = resources(result, resource_type)
    assert len(found) == 1, f"{len(found)} {resource_type} resources"
    return found[0]


def request_of(result: MappedMessage, resource: JSON) -> JSON:
    entry = next(e for e in result.entries if e.resource is resource)
    return entry.to_json()["request"]  # type: ignore[no-any-return]


def by_code(result: MappedMessage, code: str) -> JSON:
    """The Observation whose first coding has ``code``."""
    return next(o for o in resources(result, "Observation")
                if o["code"].get("coding", [{}])[0].get("code") == code)
