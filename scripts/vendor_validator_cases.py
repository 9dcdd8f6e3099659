"""Vendor the HL7 reference validator's published R4 test cases that need only the base
R4 specification, for ``tests/fhir_server/test_validation_agreement.py``.

Source: the ``validator/`` folder of https://github.com/FHIR/fhir-test-cases (Apache
License 2.0) and its ``manifest.json``; each case's expected outcome is the Java
reference validator's (``outcomes/java/...``). Run:
``python scripts/vendor_validator_cases.py path/to/fhir-test-cases COMMIT``.

A case is taken when it is R4 (``version`` 4.0 / 4.0.1), JSON (the server speaks FHIR
JSON only: XML is answered 406), not switched off (``use-test: false``), the reference
published its outcome, and it needs nothing beyond the base specification and no
validator option that changes the rules: no supporting files, profiles, packages,
logical models, extension domains, reference fetchers, best-practice or security
settings (the keys in ``EXCLUDING``). Its profile step, when it has one, is not used (it
needs the profile's file): only the validation against the base specification is.

Writes ``tests/data/fhir-test-cases/``: the case files under ``validator/``,
``cases.json`` (name, file, module, the reference's error count and first messages),
the licence and a README with the commit.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "fhir-test-cases"
EXCLUDING = ("supporting", "profiles", "packages", "logical", "package-map", "supporting5",
             "fetcher", "validateReference", "assumeValidRestReferences",
             "allowed-extension-domain", "examples", "security-checks", "for-publication",
             "best-practice", "language", "ips", "bundle-param", "certificate", "advisor",
             "sct", "no-tx", "new-xver-mode", "tx-dependent", "matchetype",
             "default-version", "validateContains", "enforceAggregationOutsideBundles",
             "r5-bundle-relative-reference-policy", "allow-comments", "noHtmlInMarkdown",
             "no-experimental-content", "ids-in-errors", "scoring",
             "fhir-validator-cli-options", "suppress")


def _outcome(validator: Path, case: dict[str, Any]) -> dict[str, Any] | None:
    java = case.get("java")
    if isinstance(java, dict):
        return java
    if not java or not (validator / "outcomes" / java).exists():
        return None
    return json.loads((validator / "outcomes" / java).read_text(encoding="utf-8"))


def select(validator: Path) -> list[dict[str, Any]]:
    manifest = json.loads((validator / "manifest.json").read_text(encoding="utf-8"))
    chosen = []
    for case in manifest["test-cases"]:
        if case.get("version") not in ("4.0", "4.0.1") or not case["file"].endswith(".json"):
            continue
        if case.get("use-test") is False or any(key in case for key in EXCLUDING):
            continue
        outcome = _outcome(validator, case)
        if outcome is None:
            continue
        if "errorCount" in outcome:
            errors, messages = int(outcome["errorCount"]), []
        else:
            failing = [i for i in outcome.get("issue", [])
                       if i.get("severity") in ("error", "fatal")]
            errors = len(failing)
            messages = [f"{(i.get('expression') or ['?'])[0]}: "
                        f"{(i.get('details') or {}).get('text', i.get('diagnostics', ''))}"[:300]
                        for i in failing[:5]]
        chosen.append({"name": case["name"], "file": case["file"],
                       "module": case.get("module", ""), "errors": errors,
                       "messages": messages})
    return chosen


def main() -> None:
    source, commit = Path(sys.argv[1]), sys.argv[2]
    validator = source / "validator"
    cases = select(validator)
    if OUT.exists():
        shutil.rmtree(OUT)
    (OUT / "validator").mkdir(parents=True)
    for case in cases:
        target = OUT / "validator" / case["file"]
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(validator / case["file"], target)
    (OUT / "cases.json").write_text(json.dumps({"source": "https://github.com/FHIR/fhir-test-cases",
                                                "commit": commit, "cases": cases}, indent=1)
                                    + "\n", encoding="utf-8")
    shutil.copyfile(source / "LICENSE.txt", OUT / "LICENSE.txt")
    invalid = sum(1 for c in cases if c["errors"])
    print(f"wrote {len(cases)} cases ({invalid} invalid, {len(cases) - invalid} valid) "
          f"to {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
