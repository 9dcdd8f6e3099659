"""``GET /fhir/metadata``: the whole CapabilityStatement, and the small documents a client
asks for with ``_summary`` and ``_elements``."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

from fhir_server.interactions.capabilities import SUMMARY_PATHS

DEFINITIONS = Path(__file__).resolve().parents[1] / "data" / "fhir-r4"


def test_the_summary_elements_are_those_r4_marks_as_summary():
    bundle = json.loads(lzma.decompress((DEFINITIONS / "profiles-resources.json.xz")
                                        .read_bytes()))
    definition = next(e["resource"] for e in bundle["entry"]
                      if e["resource"]["id"] == "CapabilityStatement")
    marked = {element["path"].removeprefix("CapabilityStatement.")
              for element in definition["snapshot"]["element"]
              if element.get("isSummary") and "." in element["path"]
              and not element["path"].endswith("modifierExtension")}
    assert marked == SUMMARY_PATHS


async def test_summary_true_is_a_small_statement_of_the_summary_elements(client):
    whole = await client.get("/fhir/metadata")
    summary = await client.get("/fhir/metadata", params={"_summary": "true"})
    assert summary.status_code == 200
    assert len(summary.content) * 20 < len(whole.content)  # 30 KB of 940 KB
    statement = summary.json()
    assert statement["fhirVersion"] == "4.0.1" and statement["kind"] == "instance"
    assert "SUBSETTED" in {t["code"] for t in statement["meta"]["tag"]}
    rest = statement["rest"][0]
    assert rest["mode"] == "server" and "documentation" not in rest
    patient = next(r for r in rest["resource"] if r["type"] == "Patient")
    assert set(patient) == {"type", "profile", "operation"}  # no searchParam, interaction
    assert {o["name"] for o in patient["operation"]} == {"validate", "everything", "match",
                                                         "export"}
    assert len(rest["resource"]) == len(whole.json()["rest"][0]["resource"])


async def test_elements_keeps_those_named_and_the_mandatory_ones(client):
    response = await client.get("/fhir/metadata", params={"_elements": "software,fhirVersion"})
    assert response.status_code == 200
    statement = response.json()
    assert set(statement) == {"resourceType", "software", "fhirVersion", "status", "date",
                              "kind", "format", "meta"}
    assert "SUBSETTED" in {t["code"] for t in statement["meta"]["tag"]}


async def test_summary_false_and_data_are_the_whole_statement_and_count_is_refused(client):
    whole = (await client.get("/fhir/metadata")).json()
    assert (await client.get("/fhir/metadata?_summary=false")).json() == whole
    data = (await client.get("/fhir/metadata?_summary=data")).json()
    assert data["rest"] == whole["rest"]
    count = await client.get("/fhir/metadata?_summary=count")
    assert count.status_code == 400
    assert count.json()["issue"][0]["expression"] == ["_summary"]
