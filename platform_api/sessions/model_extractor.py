"""A model-based extractor: a language model behind an OpenAI-compatible
``POST {HEALTHPLATFORM_EXTRACTION_MODEL_URL}/chat/completions`` (JSON mode) finds the
mentions; this module keeps what it can ground in the text.

The model is asked for findings as JSON (kind, name, the exact words that are the
evidence, negated, uncertain, and the values of a vital sign, a medication's dosage, a
follow-up's delay). What it answers is never trusted as is:

- a finding whose evidence is not, word for word, in the text is dropped (every proposal
  keeps a real evidence span, as the rule extractor's do);
- names are coded with the same code lists as the rules (``data/extraction.json``):
  RxNorm, SNOMED CT + ICD-10, LOINC with UCUM units and plausible ranges; a vital sign
  outside its range or unknown is dropped, a medication, allergen or problem the lists do
  not know is proposed with its text only (a clinician codes it);
- a malformed answer fails the extraction with 502 ``EXTRACTOR_FAILED``, storing nothing.

Patient identifiers are not sent: only the text of the transcript.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import orjson

from platform_api.envelope import ApiError
from platform_api.sessions.extractor import (
    ICD10,
    RXNORM,
    SNOMED,
    Evidence,
    Finding,
    knowledge,
)
from platform_api.settings import Settings

KINDS = ("vital-sign", "medication", "allergy", "problem", "follow-up")
INSTRUCTIONS = (
    "You extract clinical facts from a consultation transcript. Answer with one JSON "
    'object {"findings": [...]}; each finding has "kind" (one of vital-sign, medication, '
    'allergy, problem, follow-up), "name" (the vital sign, drug, allergen or problem, in '
    'English), "evidence" (the exact words of the transcript that state it, copied '
    'verbatim), "negated" (true when the transcript says it is absent), "uncertain" '
    '(true when only suspected), and where they apply "value" and "value2" (numbers: a '
    'vital sign; value2 the diastolic pressure), "dosage" (a medication\'s dose and '
    'frequency as said) and "due_in_days" (when a follow-up is due). Include nothing '
    "that the transcript does not say.")
DAYS = re.compile(r"^\d{1,4}$")


class ModelExtractor:
    name = "model"

    def __init__(self, settings: Settings):
        self.base_url = settings.extraction_model_url.rstrip("/")
        self.api_key = settings.extraction_model_api_key
        self.model = settings.extraction_model_name
        self.timeout = settings.extraction_model_timeout_seconds
        self.version = self.model
        data = knowledge()
        self.vitals = {v["name"]: v for v in data["vitals"]}
        self.codes = _lookup(data)

    async def propose(self, text: str) -> list[Finding]:
        answer = await self._ask(text)
        findings = []
        for item in answer:
            finding = self._grounded(text, item) if isinstance(item, dict) else None
            if finding is not None:
                findings.append(finding)
        return sorted(findings, key=lambda f: (f.evidence.start, f.kind))

    async def _ask(self, text: str) -> list[Any]:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        body = {"model": self.model, "temperature": 0,
                "response_format": {"type": "json_object"},
                "messages": [{"role": "system", "content": INSTRUCTIONS},
                             {"role": "user", "content": text}]}
        try:
            async with httpx.AsyncClient(timeout=self.timeout) as client:
                response = await client.post(f"{self.base_url}/chat/completions", json=body,
                                             headers=headers)
            response.raise_for_status()
            content = response.json()["choices"][0]["message"]["content"]
            findings = orjson.loads(content)["findings"]
        except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as exc:
            raise ApiError(502, "EXTRACTOR_FAILED", f"The extraction model did not give "
                           f"an answer that could be used: {exc}") from None
        if not isinstance(findings, list):
            raise ApiError(502, "EXTRACTOR_FAILED", "The extraction model's findings are "
                           "not a list")
        return findings

    def _grounded(self, text: str, item: dict[str, Any]) -> Finding | None:
        kind, name = item.get("kind"), str(item.get("name") or "").strip()
        quote = str(item.get("evidence") or "").strip()
        start = text.lower().find(quote.lower()) if quote else -1
        if kind not in KINDS or start < 0:
            return None
        evidence = Evidence(start, start + len(quote), text[start:start + len(quote)])
        negated, uncertain = bool(item.get("negated")), bool(item.get("uncertain"))
        if kind == "vital-sign":
            return self._vital(name, item, evidence)
        if kind == "follow-up":
            days = str(item.get("due_in_days") or "")
            return Finding(kind, evidence.text, evidence, details={
                "due_in_days": int(days) if DAYS.match(days) else 7})
        codes = self.codes.get((kind, name.lower()), [])
        details: dict[str, Any] = {}
        if kind == "medication":
            details["dosage"] = str(item.get("dosage") or "").strip() or None
        if kind == "allergy":
            details["category"] = self.codes.get(("allergy-category", name.lower()),
                                                 "medication")
        return Finding(kind, codes[0][2] if codes else name, evidence, codes, negated,
                       uncertain, details)

    def _vital(self, name: str, item: dict[str, Any], evidence: Evidence) -> Finding | None:
        vital = self.vitals.get(name.lower())
        if vital is None:
            return None
        parts = vital.get("components") or [vital]
        try:
            values = [float(item[key]) for key in ("value", "value2")[:len(parts)]]
        except (KeyError, TypeError, ValueError):
            return None
        if not all(p["low"] <= v <= p["high"] for p, v in zip(parts, values, strict=True)):
            return None
        measured = [{"loinc": p["loinc"], "display": p["display"], "value": v,
                     "unit": p["unit"], "unit_display": p.get("unit_display", p["unit"])}
                    for p, v in zip(parts, values, strict=True)]
        codes = [("http://loinc.org", vital["loinc"], vital["display"])]
        details = {"components": measured} if len(parts) > 1 else {"value": measured[0]}
        return Finding("vital-sign", vital["name"], evidence, codes, details=details)


def _lookup(data: dict[str, Any]) -> dict[tuple[str, str], Any]:
    """(kind, lower-case name or synonym) → codes, from the rule extractor's lists."""
    found: dict[tuple[str, str], Any] = {}
    for drug in data["medications"]:
        codes = [(RXNORM, drug["rxcui"], drug["name"])]
        for word in [drug["name"], *drug["synonyms"]]:
            found[("medication", word.lower())] = codes
            found[("allergy", word.lower())] = codes
    for problem in data["problems"]:
        codes = [(SNOMED, problem["snomed"], problem["name"]),
                 (ICD10, problem["icd10"], problem["name"])]
        for word in [problem["name"], *problem["synonyms"]]:
            found[("problem", word.lower())] = codes
    for allergen in data["allergens"]:
        codes = [(allergen["system"], allergen["code"], allergen["name"])]
        for word in [allergen["name"], *allergen["synonyms"]]:
            found[("allergy", word.lower())] = codes
            found[("allergy-category", word.lower())] = allergen["category"]
    return found


__all__ = ["ModelExtractor"]
