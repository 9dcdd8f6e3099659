"""Drug-drug interactions: the knowledge table, how entries are stored, and the check.

**The table** is data: the seed shipped in ``data/interactions.json`` (each entry with its
source and licence: the HL7 PDDI CDS IG, the ONC high-priority list, FDA labels; only
openly licensed sources) and the entries administrators add or change through
``POST /api/cds/drug-interactions``. An entry names two groups of drugs, each by RxNorm
ingredient codes and/or drug classes (``data/drug_ingredients.json``), so an entry
"warfarin + NSAID" catches every NSAID, branded and combination products included
(:mod:`cds_hooks.medications` resolves products to ingredients).

**Stored entries are FHIR PlanDefinitions** (R4 has no ClinicalUseDefinition; the HL7
PDDI CDS IG itself represents each interaction rule as a PlanDefinition of type
``eca-rule``), so they are versioned (``meta.versionId`` and the business ``version``),
audited and readable through /fhir like any definition::

    key            → identifier[system=urn:healthplatform:drug-interaction].value, and
                     url urn:healthplatform:cds:drug-interaction:<key>
    title          → title, action[0].title
    description    → description, action[0].description
    recommendation → usage, action[0].textEquivalent
    severity       → action[0].code[0] (system urn:healthplatform:cds:interaction-severity:
                     critical | high | moderate | low)
    a, b           → action[0].input[0], input[1]: DataRequirement type MedicationRequest,
                     codeFilter path "medication" with RxNorm ingredient codings, and one
                     codeFilter per class (valueSet urn:healthplatform:cds:drug-class:<c>)
    systemic_only  → action[0].extension urn:healthplatform:cds:systemic-only (boolean)
    source         → relatedArtifact[type=citation] (display, url); licence → copyright
    status         → status (active | retired: a retired entry no longer fires)
    version        → version ("1" for the seed, +1 on every change)
    hooks          → action[0].trigger: named-event order-select, order-sign

An entry stored with the key of a seed entry replaces it. The table a check uses is the
seed overlaid with the stored entries, cached per process and dropped when this process
writes a PlanDefinition, or after ``TABLE_TTL_SECONDS`` (another process's change).

**The check** compares draft medications with each other and with the patient's current
ones (active MedicationRequests and active/intended MedicationStatements): each pair of
different ingredients is tried against every entry, both ways round.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

import orjson
from pydantic import BaseModel, Field, field_validator, model_validator

from cds_hooks.cards import (
    INDICATOR_OF_SEVERITY,
    CdsService,
    Invocation,
    card,
    remove_draft,
    source,
    source_link,
)
from cds_hooks.medications import RXNORM, Medication, medication_of, vocabulary
from cds_hooks.models import Card, CdsResponse, OrderSelectContext, OrderSignContext
from cds_hooks.prefetch import bundle_resources
from fhir_server.caller import CallerFhir

JSON = dict[str, Any]
Severity = Literal["critical", "high", "moderate", "low"]
SEVERITY_RANK = {"critical": 0, "high": 1, "moderate": 2, "low": 3}
ENTRY_SYSTEM = "urn:healthplatform:drug-interaction"
ENTRY_URL = "urn:healthplatform:cds:drug-interaction:"
SEVERITY_SYSTEM = "urn:healthplatform:cds:interaction-severity"
CLASS_VALUE_SET = "urn:healthplatform:cds:drug-class:"
SYSTEMIC_ONLY = "urn:healthplatform:cds:systemic-only"
PLAN_TYPE = {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/plan-definition-type",
                         "code": "eca-rule", "display": "ECA Rule"}]}
TABLE_TTL_SECONDS = 30.0
ACTIVE_REQUEST_STATUSES = "active,on-hold"
ACTIVE_STATEMENT_STATUSES = "active,intended"


class DrugGroup(BaseModel):
    ingredients: list[str] = Field(default=[], description="RxNorm ingredient codes (IN)",
                                   examples=[["11289"]])
    classes: list[str] = Field(default=[], description="Drug classes of the vocabulary",
                               examples=[["nsaid"]])

    @field_validator("ingredients")
    @classmethod
    def _rxnorm_codes(cls, codes: list[str]) -> list[str]:
        for code in codes:
            if not code.isdigit():
                raise ValueError(f"{code!r} is not an RxNorm code (digits)")
        return codes

    @field_validator("classes")
    @classmethod
    def _known_classes(cls, classes: list[str]) -> list[str]:
        known = vocabulary().classes
        for name in classes:
            if name not in known:
                raise ValueError(f"unknown drug class {name!r} (known: "
                                 f"{', '.join(sorted(known))})")
        return classes

    @model_validator(mode="after")
    def _not_empty(self) -> DrugGroup:
        if not self.ingredients and not self.classes:
            raise ValueError("name at least one ingredient or class")
        return self

    def tags(self) -> frozenset[str]:
        return frozenset(self.ingredients) | {f"class:{c}" for c in self.classes}


class Source(BaseModel):
    label: str = Field(min_length=1, max_length=300)
    url: str | None = Field(default=None, max_length=500)
    licence: str | None = Field(default=None, max_length=300)


class InteractionEntry(BaseModel):
    """One entry of the table (the payload of ``POST /api/cds/drug-interactions``)."""

    key: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{1,63}$", examples=["warfarin-nsaids"])
    title: str = Field(min_length=1, max_length=120, examples=["Warfarin + NSAID"])
    severity: Severity
    description: str = Field(min_length=1, max_length=2000)
    recommendation: str = Field(min_length=1, max_length=2000)
    a: DrugGroup
    b: DrugGroup
    source: Source
    systemic_only: bool = Field(default=False, description="Topical and ophthalmic forms "
                                "do not trigger it")
    status: Literal["active", "retired"] = "active"
    version: str = "1"

    def matches(self, first: Medication, second: Medication) -> bool:
        return _pair_matches(self, self.a.tags(), self.b.tags(), first, second)


def _pair_matches(entry: InteractionEntry, a: frozenset[str], b: frozenset[str],
                  first: Medication, second: Medication) -> bool:
    if entry.systemic_only and (first.topical or second.topical):
        return False
    one, two = first.tags(), second.tags()
    return bool((a & one and b & two) or (a & two and b & one))


@dataclass(frozen=True)
class Finding:
    entry: InteractionEntry
    drugs: tuple[Medication, Medication]

    def as_dict(self) -> JSON:
        """The shape of the spec's drug interaction check and of prescription checks."""
        return {"severity": self.entry.severity, "description": self.entry.description,
                "drugs": [d.name for d in self.drugs],
                "recommendation": self.entry.recommendation, "key": self.entry.key,
                "title": self.entry.title, "source": self.entry.source.label,
                "version": self.entry.version}


# -- the table ----------------------------------------------------------------------------------
def seed_entries() -> list[InteractionEntry]:
    data = orjson.loads(resources.files("cds_hooks.data").joinpath(
        "interactions.json").read_bytes())
    sources = data["sources"]
    return [InteractionEntry.model_validate({**raw, "source": sources[raw["source"]]})
            for raw in data["interactions"]]


@dataclass
class InteractionTable:
    entries: list[InteractionEntry]

    def __post_init__(self) -> None:
        # Each active entry with its two groups' tags, computed once per table.
        self._active = [(e, e.a.tags(), e.b.tags()) for e in self.entries
                        if e.status == "active"]

    def active(self) -> list[InteractionEntry]:
        return [e for e, _, _ in self._active]

    def find(self, drafts: Sequence[Medication], current: Sequence[Medication] = ()
             ) -> list[Finding]:
        """Interactions of each draft with the other drafts and with the current
        medications, most severe first."""
        findings: list[Finding] = []
        seen: set[tuple[str, frozenset[str]]] = set()
        pairs = [(d, o) for i, d in enumerate(drafts) for o in [*drafts[i + 1:], *current]]
        for first, second in pairs:
            if not first.tags() or not second.tags() or first.same_drug(second):
                continue  # the same drug twice is a duplicate order, not an interaction
            for entry, a, b in self._active:
                key = (entry.key, frozenset({first.name, second.name}))
                if key not in seen and _pair_matches(entry, a, b, first, second):
                    seen.add(key)
                    findings.append(Finding(entry, (first, second)))
        findings.sort(key=lambda f: SEVERITY_RANK[f.entry.severity])
        return findings


def entry_to_plan_definition(entry: InteractionEntry, when: str) -> JSON:
    action: JSON = {
        "title": entry.title, "description": entry.description,
        "textEquivalent": entry.recommendation,
        "code": [{"coding": [{"system": SEVERITY_SYSTEM, "code": entry.severity}]}],
        "trigger": [{"type": "named-event", "name": "order-select"},
                    {"type": "named-event", "name": "order-sign"}],
        "input": [_group_requirement(entry.a), _group_requirement(entry.b)],
    }
    if entry.systemic_only:
        action["extension"] = [{"url": SYSTEMIC_ONLY, "valueBoolean": True}]
    citation: JSON = {"type": "citation", "display": entry.source.label}
    if entry.source.url:
        citation["url"] = entry.source.url
    plan: JSON = {
        "resourceType": "PlanDefinition", "url": ENTRY_URL + entry.key,
        "identifier": [{"system": ENTRY_SYSTEM, "value": entry.key}],
        "version": entry.version, "name": _computable_name(entry.key),
        "title": entry.title, "type": PLAN_TYPE, "status": entry.status, "date": when,
        "publisher": "healthplatform", "description": entry.description,
        "usage": entry.recommendation, "relatedArtifact": [citation], "action": [action],
    }
    if entry.source.licence:
        plan["copyright"] = entry.source.licence
    return plan


def _computable_name(key: str) -> str:
    return "DrugInteraction" + "".join(part.capitalize() for part in key.split("-"))


def _group_requirement(group: DrugGroup) -> JSON:
    filters: list[JSON] = []
    if group.ingredients:
        filters.append({"path": "medication", "code": [
            {"system": RXNORM, "code": code, "display": vocabulary().ingredient_name(code)}
            for code in group.ingredients]})
    filters += [{"path": "medication", "valueSet": CLASS_VALUE_SET + c} for c in group.classes]
    return {"type": "MedicationRequest", "codeFilter": filters}


def entry_from_plan_definition(plan: JSON) -> InteractionEntry:
    action = (plan.get("action") or [{}])[0]
    groups = []
    for requirement in (action.get("input") or [])[:2]:
        ingredients, classes = [], []
        for code_filter in requirement.get("codeFilter") or []:
            ingredients += [c["code"] for c in code_filter.get("code") or []]
            if str(code_filter.get("valueSet", "")).startswith(CLASS_VALUE_SET):
                classes.append(code_filter["valueSet"][len(CLASS_VALUE_SET):])
        groups.append({"ingredients": ingredients, "classes": classes})
    citation: JSON = next((r for r in plan.get("relatedArtifact") or []
                           if r.get("type") == "citation"), {})
    key = next(i["value"] for i in plan["identifier"] if i.get("system") == ENTRY_SYSTEM)
    severity = ((action.get("code") or [{}])[0].get("coding") or [{}])[0].get("code")
    return InteractionEntry.model_validate({
        "key": key, "title": plan.get("title") or key, "severity": severity,
        "description": plan.get("description", ""), "recommendation": plan.get("usage", ""),
        "a": groups[0], "b": groups[1],
        "source": {"label": citation.get("display") or "healthplatform",
                   "url": citation.get("url"), "licence": plan.get("copyright")},
        "systemic_only": any(e.get("url") == SYSTEMIC_ONLY and e.get("valueBoolean")
                             for e in action.get("extension") or []),
        "status": "active" if plan.get("status") == "active" else "retired",
        "version": plan.get("version") or "1",
    })


class InteractionKnowledge:
    """The table of one FHIR service (seed + stored entries), cached. ``reader`` reads the
    stored entries for everyone who checks: the platform hands in the caller it elevated
    for that (this package does not decide access)."""

    def __init__(self, reader: CallerFhir):
        self.reader = reader
        self._table: InteractionTable | None = None
        self._loaded_at = 0.0
        reader.service.add_write_listener(self._written)

    def _written(self, resources_: Sequence[JSON]) -> None:
        if any(r.get("resourceType") == "PlanDefinition" for r in resources_):
            self._table = None

    async def stored_plans(self) -> list[JSON]:
        return await self.reader.search("PlanDefinition", [("identifier", f"{ENTRY_SYSTEM}|")])

    async def table(self) -> InteractionTable:
        if self._table is not None and time.monotonic() - self._loaded_at < TABLE_TTL_SECONDS:
            return self._table
        entries = {e.key: e for e in seed_entries()}
        for plan in await self.stored_plans():
            stored = entry_from_plan_definition(plan)
            entries[stored.key] = stored
        self._table = InteractionTable(list(entries.values()))
        self._loaded_at = time.monotonic()
        return self._table


# -- the patient's current medications -------------------------------------------------------
async def current_medications(fhir: CallerFhir, patient_id: str,
                              exclude: Iterable[str] = ()) -> list[Medication]:
    """The patient's active MedicationRequests and MedicationStatements (as the caller
    may see them), ``exclude`` references left out (the order being checked)."""
    patient = f"Patient/{patient_id}"
    requests = await fhir.search("MedicationRequest", [
        ("subject", patient), ("status", ACTIVE_REQUEST_STATUSES)])
    statements = await fhir.search("MedicationStatement", [
        ("subject", patient), ("status", ACTIVE_STATEMENT_STATUSES)])
    return medications_of([*requests, *statements], exclude=exclude)


def medications_of(resources_: Iterable[JSON], *, draft: bool = False,
                   exclude: Iterable[str] = ()) -> list[Medication]:
    skip = set(exclude)
    found = []
    for resource in resources_:
        medication = medication_of(resource, draft=draft)
        if medication is not None and medication.reference not in skip:
            found.append(medication)
    return found


async def check_medication_request(fhir: CallerFhir, knowledge: InteractionKnowledge,
                                   medication_request: JSON, patient_id: str
                                   ) -> list[dict[str, Any]]:
    """Interaction findings ``{severity, description, drugs, recommendation}`` (plus
    ``key``, ``title``, ``source``, ``version``) of a MedicationRequest about to be
    signed, against the patient's current medications as ``fhir``'s caller sees them (the
    platform hands in whom it reads as: the prescriber, or its own elevated reader): the
    prescription-sign check (``platform_api.prescription_checks``)."""
    draft = medication_of(medication_request, draft=True)
    if draft is None:
        return []
    current = await current_medications(fhir, patient_id, exclude=[draft.reference or ""])
    table = await knowledge.table()
    return [f.as_dict() for f in table.find([draft], current)]


# -- the CDS service (order-select, order-sign) ----------------------------------------------
def draft_medications(inv: Invocation) -> list[Medication]:
    """The drafts to check: on order-select the selected orders, on order-sign all."""
    context = inv.context
    orders = context.selected() if isinstance(context, OrderSelectContext) else \
        context.orders() if isinstance(context, OrderSignContext) else []
    return medications_of(orders, draft=True)


def current_from_prefetch(inv: Invocation, drafts: Sequence[Medication]) -> list[Medication]:
    references = {d.reference for d in drafts if d.reference}
    resources_ = [*bundle_resources(inv.prefetch.get("medications")),
                  *bundle_resources(inv.prefetch.get("statements"))]
    return medications_of(resources_, exclude=references)


def finding_card(finding: Finding) -> Card:
    first, second = finding.drugs
    entry = finding.entry
    current = "" if second.draft else " (a current medication)"
    detail = (f"**{entry.title}** ({entry.severity} severity): {first.name} with "
              f"{second.name}{current}.\n\n{entry.description}\n\n"
              f"**Recommendation:** {entry.recommendation}\n\n"
              f"*Source: {entry.source.label}; table entry `{entry.key}` version "
              f"{entry.version}.*")
    suggestions = [remove_draft(d.reference, f"Remove the draft order for {d.name}")
                   for d in finding.drugs if d.draft and d.reference]
    return card(f"{entry.title}: {first.name} with {second.name}",
                INDICATOR_OF_SEVERITY[entry.severity],
                source(SERVICE_TITLE, entry.source.url), detail=detail,
                suggestions=suggestions, overridable=True,
                links=source_link(entry.source.label, entry.source.url))


def unselected_drafts(inv: Invocation) -> list[Medication]:
    """On order-select, the session's other draft orders: a selection is checked against
    them as against current medications (they are not checked again themselves)."""
    context = inv.context
    if not isinstance(context, OrderSelectContext):
        return []
    chosen = {id(r) for r in context.selected()}
    return medications_of([r for r in context.orders() if id(r) not in chosen], draft=True)


async def interaction_service(inv: Invocation) -> CdsResponse:
    drafts = draft_medications(inv)
    if not drafts:
        return CdsResponse()
    table: InteractionTable = await inv.interaction_table()
    others = [*unselected_drafts(inv), *current_from_prefetch(inv, drafts)]
    findings = table.find(drafts, others)
    return CdsResponse(cards=[finding_card(f) for f in findings])


SERVICE_TITLE = "Drug-drug interaction check"
SERVICE = CdsService(
    id="drug-interactions", hooks=("order-select", "order-sign"), title=SERVICE_TITLE,
    description="Checks RxNorm-coded draft medication orders against each other and the "
                "patient's active MedicationRequests and MedicationStatements, by "
                "ingredient and drug class (branded and combination products included), "
                "with an interaction table whose every entry names its source.",
    prefetch={
        "medications": "MedicationRequest?patient={{context.patientId}}"
                       f"&status={ACTIVE_REQUEST_STATUSES}",
        "statements": "MedicationStatement?patient={{context.patientId}}"
                      f"&status={ACTIVE_STATEMENT_STATUSES}",
    },
    usage_requirements="Draft MedicationRequests coded with RxNorm (or named in text). The "
                       "patient's active medications come from prefetch, or are read with "
                       "fhirServer + fhirAuthorization; without either the call is a 412.",
    run=interaction_service)
