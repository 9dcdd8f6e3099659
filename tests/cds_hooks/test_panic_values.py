"""The panic-value table: critical at or beyond a limit, other units converted or called
not comparable, components checked; a file can replace the table."""

from __future__ import annotations

import json
from pathlib import Path

from cds_hooks.panic_values import flag_for, panic_table


def test_limits_are_inclusive_and_name_their_side() -> None:
    table = panic_table()
    high = table.check("2823-3", 6.9, "mmol/L")
    assert high is not None and (high.critical, high.direction, high.threshold) == (
        True, "high", 6.2)
    assert high.text() == "Critical potassium: 6.9 mmol/L (critical above 6.2 mmol/L)"
    at_limit = table.check("2823-3", 2.8, "mmol/L")
    assert at_limit is not None and at_limit.direction == "low"
    normal = table.check("2823-3", 4.1, "mmol/L")
    assert normal is not None and not normal.critical
    assert table.check("2160-0", 9.9, "mg/dL") is None  # creatinine: no panic limit


def test_other_units_are_converted_or_not_compared() -> None:
    table = panic_table()
    glucose = table.check("2345-7", 1.8, "mmol/L")  # 1.8 mmol/L = 32 mg/dL
    assert glucose is not None and glucose.direction == "low"
    haemoglobin = table.check("718-7", 55, "g/L")
    assert haemoglobin is not None and haemoglobin.direction == "low"
    odd = table.check("2823-3", 6.9, "mg/dL")
    assert odd is not None and (odd.critical, odd.comparable) == (False, False)


def test_an_observation_is_checked_with_its_components_and_flagged_as_its_owner() -> None:
    observation = {
        "resourceType": "Observation", "id": "obs-k", "status": "final",
        "meta": {"security": [{"system": "urn:healthplatform:organization", "code": "org-1"}]},
        "code": {"coding": [{"system": "http://loinc.org", "code": "2823-3"}]},
        "subject": {"reference": "Patient/p1"}, "effectiveDateTime": "2026-03-01T09:50:00Z",
        "valueQuantity": {"value": 7.1, "unit": "mmol/L", "code": "mmol/L"}}
    findings = panic_table().check_observation(observation)
    assert [f.direction for f in findings] == ["high"]
    flag = flag_for(observation, findings[0])
    assert flag["identifier"][0]["value"] == "obs-k:2823-3"
    assert flag["meta"]["security"] == observation["meta"]["security"]
    assert flag["extension"][0]["valueReference"] == {"reference": "Observation/obs-k"}
    assert panic_table().check_observation({**observation, "valueQuantity": {
        "value": 7.1, "comparator": ">", "unit": "mmol/L"}}) == []


def test_a_laboratory_can_replace_the_table(tmp_path: Path) -> None:
    own = tmp_path / "panic.json"
    own.write_text(json.dumps({"source": "Kisumu County Referral Lab, 2026", "entries": [
        {"loinc": "2823-3", "display": "Potassium", "unit": "mmol/L", "low": 3.0,
         "high": 6.0}]}))
    table = panic_table(str(own))
    assert table.source == "Kisumu County Referral Lab, 2026"
    finding = table.check("2823-3", 6.1, "mmol/L")
    assert finding is not None and finding.critical
    assert table.check("2951-2", 100, "mmol/L") is None
