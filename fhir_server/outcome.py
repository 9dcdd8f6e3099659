"""OperationOutcome: how the FHIR side says what went wrong, and where."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# The code system of the validator's own rule names (``cardinality``, ``binding``, ...) in
# ``OperationOutcome.issue.details``; an invariant is named by its key and the
# StructureDefinition that defines it instead.
RULE_SYSTEM = "urn:healthplatform:validation-rule"


@dataclass(frozen=True, slots=True)
class Issue:
    severity: str  # fatal | error | warning | information
    code: str  # IssueType: invalid, structure, required, value, not-found, deleted, conflict...
    diagnostics: str
    expression: tuple[str, ...] = ()
    # The rule that failed (validation): an invariant's key with the StructureDefinition
    # that defines it as ``source``, or one of the validator's own rules (RULE_SYSTEM).
    rule: str = ""
    source: str = ""

    def to_json(self) -> dict[str, Any]:
        issue: dict[str, Any] = {
            "severity": self.severity, "code": self.code, "diagnostics": self.diagnostics,
        }
        if self.rule:
            issue["details"] = {"coding": [{"system": self.source or RULE_SYSTEM,
                                            "code": self.rule}]}
        if self.expression:
            issue["expression"] = list(self.expression)
        return issue


def operation_outcome(issues: Iterable[Issue]) -> dict[str, Any]:
    return {"resourceType": "OperationOutcome", "issue": [i.to_json() for i in issues]}


class FhirError(Exception):
    """A refusal on the FHIR side: an HTTP status plus the OperationOutcome issues."""

    def __init__(self, status: int, issues: Iterable[Issue] | Issue,
                 headers: dict[str, str] | None = None):
        self.status = status
        self.issues = [issues] if isinstance(issues, Issue) else list(issues)
        self.headers = headers or {}
        super().__init__("; ".join(i.diagnostics for i in self.issues))

    @classmethod
    def of(cls, status: int, code: str, diagnostics: str, *expression: str,
           headers: dict[str, str] | None = None) -> FhirError:
        return cls(status, Issue("error", code, diagnostics, expression), headers)

    def outcome(self) -> dict[str, Any]:
        return operation_outcome(self.issues)


def information(diagnostics: str) -> dict[str, Any]:
    return operation_outcome([Issue("information", "informational", diagnostics)])
