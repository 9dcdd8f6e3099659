"""Terminology checks of coded elements: the codes themselves and their bindings.

- Every Coding whose system the server holds completely must name a code of it, with
  that code's display if it gives one (as the reference validator: an unknown code is
  an error, another display a warning). A system that is a ValueSet's URL, or a
  relative one, is an error.
- A binding (``ElementDefinition.binding``) is checked against its value set:
  ``required`` → error when the code is not in it, ``extensible`` and ``preferred`` →
  warning; ``example`` bindings are not checked. A code whose membership cannot be
  told (a system the server does not hold, SNOMED CT, LOINC...) gives ``information``.

Each function answers (severity, IssueType code, rule, message, sub-path) tuples for the
validator to place.
"""

from __future__ import annotations

from typing import Any

from fhir_server.conformance.model import Binding
from fhir_server.terminology.content import TerminologyContent

Finding = tuple[str, str, str, str, str]  # severity, code, rule, message, sub-path
CODED_TYPES = frozenset({"code", "Coding", "CodeableConcept", "Quantity", "string", "uri",
                         "CodeableReference"})
STRENGTH_SEVERITY = {"required": "error", "extensible": "warning", "preferred": "warning"}


def check_coding(terminology: TerminologyContent, coding: dict[str, Any]) -> list[Finding]:
    """The code and display of one Coding against its code system."""
    system, code = coding.get("system"), coding.get("code")
    if not isinstance(system, str) or not isinstance(code, str):
        return []
    found: list[Finding] = []
    if system.startswith(("#", ".")) or ("/" in system and ":" not in system):
        return [("error", "invalid", "coding-system", "Coding.system must be an absolute "
                 f"reference, not a local reference ('{system}')", ".system")]
    code_system = terminology.code_system(system, coding.get("version"))
    if code_system is None:
        if terminology.is_value_set_url(system):
            return [("error", "invalid", "coding-system", "the Coding references a value "
                     f"set, not a code system ('{system}')", ".system")]
        return found
    if not code_system.complete:
        return found
    concept = code_system.lookup(code)
    if concept is None:
        return [("error", "code-invalid", "code-unknown", f"Unknown code '{code}' in the "
                 f"CodeSystem '{system}'", ".code")]
    display = coding.get("display")
    if isinstance(display, str) and concept.display is not None and \
            display.strip().lower() != concept.display.strip().lower() and \
            not any(str(d.get("value", "")).strip().lower() == display.strip().lower()
                    for d in concept.designations):
        found.append(("warning", "code-invalid", "display", f"Wrong display '{display}' for "
                      f"{system}#{code}: it should be '{concept.display}'", ".display"))
    return found


def check_binding(terminology: TerminologyContent, binding: Binding, type_code: str,
                  value: Any) -> list[Finding]:
    """``value`` (of ``type_code``) against its binding."""
    severity = STRENGTH_SEVERITY.get(binding.strength)
    if severity is None or not binding.value_set:
        return []
    canonical = binding.value_set
    if terminology.value_set(canonical) is None:
        return [("information" if binding.strength != "required" else "warning",
                 "not-found", "binding", f"the value set {canonical} is not known, so the "
                 "code cannot be checked", "")]
    if type_code in ("code", "string", "uri"):
        if not isinstance(value, str):
            return []
        return _verdict(terminology, binding, severity, [(None, value)], "")
    if type_code == "Coding":
        return _verdict(terminology, binding, severity, _pairs([value]), "")
    if type_code == "Quantity":
        if not isinstance(value, dict) or "code" not in value:
            return []
        return _verdict(terminology, binding, severity,
                        [(value.get("system"), str(value.get("code")))], "")
    if type_code == "CodeableConcept":
        if not isinstance(value, dict):
            return []
        codings = [c for c in value.get("coding") or () if isinstance(c, dict)]
        if not codings:
            if binding.strength == "required":
                return [("error", "code-invalid", "binding", "no code provided, and a code "
                         f"is required from the value set {canonical}", "")]
            return []
        return _verdict(terminology, binding, severity, _pairs(codings), "")
    return []


def _pairs(codings: list[Any]) -> list[tuple[str | None, str]]:
    return [(c.get("system"), c["code"]) for c in codings
            if isinstance(c, dict) and isinstance(c.get("code"), str)]


def _verdict(terminology: TerminologyContent, binding: Binding, severity: str,
             pairs: list[tuple[str | None, str]], where: str) -> list[Finding]:
    if not pairs:
        return []
    unknown: list[str] = []
    for system, code in pairs:
        membership = terminology.engine.membership(binding.value_set or "", system, code)
        if membership.result is True:
            return []
        if membership.result is None:
            unknown.append(membership.message)
    if unknown:
        return [("information", "informational", "binding", f"{unknown[0]} (value set "
                 f"{binding.value_set}, {binding.strength} binding)", where)]
    shown = ", ".join(f"{s}#{c}" if s else f"'{c}'" for s, c in pairs)
    rule = f"binding-{binding.strength}"
    if binding.strength == "required":
        return [(severity, "code-invalid", rule, f"the value {shown} is not in the value set "
                 f"{binding.value_set}, and a code is required from this value set", where)]
    return [(severity, "code-invalid", rule, f"the value {shown} is not in the value set "
             f"{binding.value_set} ({binding.strength} binding)", where)]
