"""Generate the RxNorm product → ingredient map the drug checks ship
(``cds_hooks/data/rxnorm_products.json``).

Input: a checkout of the HL7 Potential Drug-Drug Interaction (PDDI) CDS implementation
guide (github.com/HL7/PDDI-CDS, licence CC0 1.0), at the commit that still enumerated its
RxNorm value sets (``ae51e30``: later commits replaced the expansions with references to
VSAC). Each ``input/vocabulary/valueset-<ingredient>.xml`` lists the RxNorm concepts that
contain one ingredient: the ingredient itself (IN), its precise ingredients (PIN, e.g.
warfarin sodium), brand names (BN), clinical and branded drugs (SCD, SBD) and packs,
combination products included. A product found in several sets contains each of their
ingredients (``Esomeprazole / Naproxen`` is in both). The ``-exclude`` sets list topical,
ophthalmic and otic forms, which the interaction table may leave out (``systemic_only``);
concepts whose RxNorm dose form is local (Topical, Ophthalmic, Otic, Medicated Patch) are
marked so too, as the exclude sets miss some.

Only the ingredients the knowledge tables use are kept (``INGREDIENTS`` below); the
others' value sets are not read. Brand names (a display with no strength or form) become
name synonyms, so free-text medications ("Coumadin 5 mg") are recognised too.

Run: ``python scripts/generate_rxnorm_products.py path/to/PDDI-CDS [commit]``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "cds_hooks" / "data" / "rxnorm_products.json"
FHIR = "{http://hl7.org/fhir}"
COMMIT = "ae51e30"
# value set name → RxNorm ingredient code (the IN concept of the set)
INGREDIENTS = {
    "warfarin": "11289", "aspirin": "1191", "digoxin": "3407", "cyclosporine": "3008",
    "ibuprofen": "5640", "naproxen": "7258", "ketorolac": "35827", "diclofenac": "3355",
    "celecoxib": "140587", "meloxicam": "41493", "indomethacin": "5781",
    "piroxicam": "8356", "etodolac": "24605", "ketoprofen": "6142", "flurbiprofen": "4502",
    "sulindac": "10237", "nabumetone": "31448", "oxaprozin": "32613", "diflunisal": "3393",
    "fenoprofen": "4331", "tolmetin": "10636", "mefenamate": "6693",
    "spironolactone": "9997", "eplerenone": "298869", "omeprazole": "7646",
    "esomeprazole": "283742",
}
# Local forms by the RxNorm dose form in a concept's name (the -exclude sets miss some).
LOCAL_FORMS = re.compile(r"\b(Topical|Ophthalmic|Otic|Medicated Patch|Irrigation Solution)\b")
FORM_WORDS = re.compile(r"\b(product|pill|tablet|capsule|solution|injection|kit|pack|topical|oral|"
                        r"ophthalmic|rectal|suppository|gel|cream|patch|powder|gum)\b", re.I)


def value_set(repo: Path, commit: str, name: str) -> list[tuple[str, str]]:
    path = f"input/vocabulary/valueset-{name}.xml"
    shown = subprocess.run(["git", "-C", str(repo), "show", f"{commit}:{path}"],
                           capture_output=True, check=False)
    if shown.returncode != 0:
        return []
    concepts = []
    for concept in ET.fromstring(shown.stdout).iter(FHIR + "concept"):
        code = concept.find(FHIR + "code")
        display = concept.find(FHIR + "display")
        if code is not None:
            concepts.append((code.get("value", ""),
                             display.get("value", "") if display is not None else ""))
    return concepts


def is_brand_name(display: str) -> bool:
    return bool(display) and not re.search(r"\d|/|\{|\[", display) \
        and not FORM_WORDS.search(display) and len(display.split()) <= 3


def generate(repo: Path, commit: str = COMMIT) -> dict[str, object]:
    products: dict[str, dict[str, object]] = {}
    names: dict[str, str] = {}
    for name, ingredient in INGREDIENTS.items():
        concepts = value_set(repo, commit, name)
        if not concepts:
            raise SystemExit(f"value set {name} not found at {commit}")
        topical = {code for code, _ in value_set(repo, commit, f"{name}-exclude")}
        for code, display in concepts:
            if code == ingredient:
                continue
            entry = products.setdefault(code, {"display": display, "ingredients": []})
            ingredients = entry["ingredients"]
            assert isinstance(ingredients, list)
            if ingredient not in ingredients:
                ingredients.append(ingredient)
                ingredients.sort(key=int)
            if code in topical or LOCAL_FORMS.search(display):
                entry["topical"] = True
            if is_brand_name(display) and display.lower() != name:
                names.setdefault(display.lower(), ingredient)
    return {
        "source": "HL7 Potential Drug-Drug Interaction (PDDI) CDS IG, RxNorm value sets "
                  f"(github.com/HL7/PDDI-CDS at {commit}); RxNorm codes and names are "
                  "from the US National Library of Medicine",
        "licence": "CC0 1.0 (the IG); RxNorm content is in the public domain",
        "generated_by": "scripts/generate_rxnorm_products.py",
        "products": dict(sorted(products.items(), key=lambda kv: int(kv[0]))),
        "brand_names": dict(sorted(names.items())),
    }


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    data = generate(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else COMMIT)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    print(f"{OUT}: {len(data['products'])} products, "  # type: ignore[arg-type]
          f"{len(data['brand_names'])} brand names")  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
