"""The access policy decides every action, and the platform's own rights are one named
call (platform_api.policy, STYLE.md §8). Read from the source, so a new route that decides
access by hand, or a new place that acts as the system, fails here until it goes through
the policy (or is added, with its reason, to the lists below)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("platform_api", "cds_hooks", "hl7_gateway")
POLICY = "platform_api/policy/"

# Modules that refuse with 403 for reasons that are not who-may-do-what decisions of the
# policy's (the route table's middleware is the policy's route layer; authentication
# refuses credentials; inbound webhooks refuse transports and senders).
NOT_WORKFLOW_REFUSALS = {
    "platform_api/access.py": "the route table (the policy's route layer) and its middleware",
    "platform_api/envelope.py": "defines the envelope's refusal helpers",
    "platform_api/auth/errors.py": "authentication: a suspended account",
    "platform_api/auth/dependencies.py": "authentication: which credential reaches a route",
    "platform_api/webhooks/inbound.py": "a webhook over plain HTTP",
    "platform_api/webhooks/messaging.py": "a messaging provider's verification handshake",
    "platform_api/webhooks/mobile_money.py": "a callback from outside the provider's addresses",
}
HAND_WRITTEN = re.compile(
    r"\bforbidden\(|ApiError\(\s*403|\brequire\(|\.role_in\(|\.memberships\b"
    r"|\.unrestricted\b|\bis_org_admin\b|\brequire_member\b|\brequire_org_admin\b"
    r"|\brequire_manager\b|\brequire_role\b|\brequire_admin_of\b|\brequire_self_or_admin\b"
    r"|\brequire_clinician\b")

# The FHIR service's methods that read or write data without a caller's access.
UNCHECKED = re.compile(
    r"services\.fhir\.(read|read_json|find_json|search|search_page|match_ids|match_plan|"
    r"stage_create|stage_update|stage_delete|parse)\(|\bfhir\.store\.")
# Platform bookkeeping that writes with no caller by design (the audit trails themselves,
# the event outbox): each with its reason.
UNCHECKED_ALLOWED = {
    "platform_api/audit.py": "the security audit trail writes its own AuditEvents",
    "platform_api/sessions/audit.py": "the clinical audit trail writes its own AuditEvents",
}

# Every place the platform acts with more rights than its caller: module → the reasons
# it names (policy.elevate / ctx.elevate / ctx.elevate_unit / elevated_access).
ELEVATIONS: dict[str, set[str]] = {
    "platform_api/cross_border.py": {
        "cross-border.lookup: keep the exchange's Patients and their Provenance"},
    "platform_api/feedback/routes.py": {
        "feedback.anonymous: check the organization it is about exists"},
    "platform_api/marketplace/inventory.py": {
        "emergency-routing: read every facility's stock of the product"},
    "platform_api/marketplace/orders.py": {
        "supply-order.move: update the order and the seller's stock",
        "supply-order.place: reserve the sellers' stock and store the orders both sides own",
        "supply-order.place: store the draft order both sides own"},
    "platform_api/payments/__init__.py": {
        "payment.initiate: record the payment's PaymentNotice"},
    "platform_api/payments/ledger.py": {
        "payment settlement: record the payment's new state in its PaymentNotice"},
    "platform_api/scheduling/appointments.py": {
        "appointment notices: read the appointment, its resource and the patient's e-mail "
        "address",
        "appointment.availability: read a resource's free Slots",
        "appointment.cancel: free the appointment's Slots",
        "appointment.change: take or free the appointment's Slots",
        "appointment.reschedule: take the new time's Slots, free the old"},
    "platform_api/scheduling/contacts.py": {
        "appointment.book: take the Slots and store the booking for the contact given",
        "appointment.book: take the Slots and store the patient's own appointment"},
    "platform_api/scheduling/requests.py": {
        "appointment-request.approve: take the Slots, book the request",
        "appointment-request.reject: free the Slots, decline the request",
        "appointment.request: read the free Slots and store the request"},
    "platform_api/scheduling/schedules.py": {
        "schedule.write: generate and delete the schedule's Slots"},
    "platform_api/scheduling/slots.py": {
        "slot upkeep: generate the Slots of every active schedule's horizon"},
    "platform_api/scheduling/telemedicine.py": {
        "appointment.change: finish the visit's Encounter, fulfil the appointment",
        "appointment.join-video: find or create the visit's Encounter",
        "video events: record joins, departures and the end of a visit in its Encounter"},
    "platform_api/webhooks/billing.py": {
        "billing webhook: check the organization an event names exists"},
    "platform_api/webhooks/messaging.py": {
        "messaging webhook: record inbound messages and delivery receipts as Communications"},
    "platform_api/patients/eprescriptions.py": {
        "eprescription transmit: add the pharmacy to the owners of the e-prescription and "
        "its prescription",
        "eprescription dispense: record the fill and complete the e-prescription and its "
        "prescription",
        "eprescription refill: move the e-prescription back to the pharmacy's queue"},
    "platform_api/patients/data_rights.py": {
        "erasure request: record the patient's request as a Task",
        "erasure: erase and pseudonymize the patient's record and its history",
        "export: record the export of the patient's record as an AuditEvent"},
    "platform_api/patients/clinical_records.py": {
        "clinical record audit: read the record's Provenances, notes and AuditEvents"},
    "platform_api/treatments/protocols.py": {
        "treatment protocols: store the shipped protocols",
        "treatment protocol change: look for any treatment started from this version"},
    "platform_api/cds_prescribing.py": {
        "prescription checks: read the patient's current medications and allergies"},
    "platform_api/cds.py": {
        "cds: read the stored drug-interaction entries (PlanDefinitions)",
        "cds panic values: read each stored Observation and write its critical-result Flag"},
    "platform_api/sessions/transcription.py": {
        "transcription worker: claim transcription jobs and write their transcripts, Tasks "
        "and recording durations"},
    "platform_api/ai/common.py": {"decision support: record the call as an AuditEvent"},
    "platform_api/ai/devices.py": {
        "device heartbeat: update the device's last-seen time, battery and model versions"},
    "platform_api/ai/registry.py": {
        "model info: read the public registry of AI models for devices"},
    "platform_api/rcm/insurance.py": {
        "insurance enrolment: store the patient's own Coverage, owned by the insurer"},
    "platform_api/doctors/consumers.py": {
        "doctors consumers: create a registered doctor's profile, and give or take their "
        "PractitionerRole at an organization as their membership comes or goes"},
    "platform_api/doctors/profiles.py": {
        "doctor.create-profile: the caller's Practitioner, its PractitionerRoles and a "
        "pending VerificationResult",
        "doctor.view-profile: read the doctors' VerificationResults for their whole profiles",
        "doctor.edit-profile: the doctor's Practitioner, its roles' specialties and the "
        "VerificationResult a resubmission reopens",
        "doctor.leave-organization: delete the doctor's PractitionerRole at the organization"},
    "platform_api/labs.py": {"hl7 gateway: store what the lab and clinical interfaces send"},
    "platform_api/subscriptions/service.py": {
        "subscriptions: index the active Subscriptions and write their status"},
    "platform_api/mpi/service.py": {
        "patient index: read every Patient to match, and write the links it decides"},
    "platform_api/organizations/admissions.py": {
        "admission: the occupancy status of the beds (Location) the stay takes and leaves"},
    "platform_api/organizations/messaging.py": {
        "messaging streams: read each sent message to push it to its conversation's "
        "participants"},
    "platform_api/training/assessments.py": {
        "training.answer: the member's attempt (QuestionnaireResponse)",
        "training.credits: read the members' assessment attempts (QuestionnaireResponse)"},
    "platform_api/workforce/leave.py": {
        "workforce leave: mark approved leave on the member's PractitionerRole and take "
        "their shifts off the organization's rosters"},
}


def sources() -> dict[str, str]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            found[path.relative_to(ROOT).as_posix()] = path.read_text()
    return found


def code_lines(text: str) -> list[tuple[int, str]]:
    """The lines of a module that are code (docstrings and comments left out)."""
    tree = ast.parse(text)
    docstrings: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                             ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return [(n, line.split("#", 1)[0]) for n, line in enumerate(text.splitlines(), 1)
            if n not in docstrings]


def test_no_hand_written_access_decisions_outside_the_policy():
    found = []
    for name, text in sources().items():
        if name.startswith(POLICY) or name in NOT_WORKFLOW_REFUSALS:
            continue
        found += [f"{name}:{n}: {line.strip()}" for n, line in code_lines(text)
                  if HAND_WRITTEN.search(line)]
    assert found == [], "decide these through the policy (ctx.authorize / ctx.may):\n" + \
        "\n".join(found)


def test_only_the_policy_imports_the_system_access():
    found = []
    for name, text in sources().items():
        if name == POLICY + "elevation.py":
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.module == "fhir_server.access" \
                    and any(a.name == "SYSTEM" for a in node.names):
                found.append(name)
    assert found == [], f"elevate through the policy instead: {found}"


def test_areas_do_not_call_the_unchecked_fhir_service():
    found = []
    for name, text in sources().items():
        if name.startswith(POLICY) or name in UNCHECKED_ALLOWED:
            continue
        found += [f"{name}:{n}: {line.strip()}" for n, line in code_lines(text)
                  if UNCHECKED.search(line)]
    assert found == [], "read and write through the caller's CallerFhir (or an " \
        "elevation):\n" + "\n".join(found)


ELEVATE = re.compile(r"\b(?:elevate|elevate_unit|elevated_access)\(")


def elevation_sites() -> dict[str, set[str]]:
    """Module → the reasons its elevations name (string literals only: a reason is
    written where the elevation is, not computed)."""
    sites: dict[str, set[str]] = {}
    for name, text in sources().items():
        if name.startswith(POLICY) or name == "platform_api/facade.py":
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("elevate", "elevate_unit", "elevated_access"):
                reason = node.args[-1] if node.func.attr == "elevate_unit" and \
                    len(node.args) == 2 else (node.args[0] if node.args else None)
                assert isinstance(reason, ast.Constant) and isinstance(reason.value, str), \
                    f"{name}:{node.lineno}: an elevation names its reason as a literal"
                sites.setdefault(name, set()).add(reason.value)
    return sites


def test_every_elevation_site_is_listed_with_its_reason():
    assert elevation_sites() == ELEVATIONS, (
        "a new (or changed) elevation: add it to ELEVATIONS with its reason after "
        "checking the action it serves is decided by the policy first")
