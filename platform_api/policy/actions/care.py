"""Workflow actions of the care areas (patients, consent, prescribing, labs, clinical
notes, recordings, decision support and AI): who may do each (see
:mod:`platform_api.policy.actions`).

Where an action is "whoever may write this kind of record", the roles are read from the
role table (:func:`roles_that`), so the two cannot drift apart: the roles that may update
a Task transmit an e-prescription, those that may create a MedicationDispense dispense.
"""

from __future__ import annotations

from fhir_server.access import CREATE, READ, UPDATE
from platform_api.policy.actions import ADMIN, SELF_PATIENT, Rule, any_role, role
from platform_api.policy.roles import (
    ORG_ADMIN,
    ORG_DOCTOR,
    ORG_LAB,
    ORG_NURSE,
    ORG_ROLES,
    types_for,
)


def roles_that(action: str, resource_type: str) -> tuple[str, ...]:
    """The organization roles the role table lets ``action`` a ``resource_type``."""
    return tuple(r for r in ORG_ROLES if resource_type in types_for(r, action))


# Who may ask for decision support: the roles that treat patients or read their results.
CLINICAL_ROLES = (ORG_ADMIN, ORG_DOCTOR, ORG_NURSE, ORG_LAB)
CLINICAL_ROLE_REQUIRED = "CLINICAL_ROLE_REQUIRED"
PLATFORM_ADMIN_REQUIRED = "PLATFORM_ADMIN_REQUIRED"
NOT_DEVICE_MEMBER = "NOT_DEVICE_MEMBER"

RULES: dict[str, Rule] = {
    # -- "my records" lists -----------------------------------------------------------------
    "records.list-all": Rule(
        (ADMIN,), "Only platform administrators list every patient's records",
        summary="lists of one's own records (vitals, prescriptions, lab orders, consents, "
                "...) show every record instead"),
    # -- consent ------------------------------------------------------------------------------
    "consent.request": Rule(
        (role(*roles_that(CREATE, "Consent")),),
        "You may not ask for consent for this organization",
        summary="ask a patient for access to their record for one's organization (held as "
                "a request addressed to the patient until they accept it)"),
    "consent.follow-request": Rule(
        (ADMIN, SELF_PATIENT, role(*roles_that(READ, "Consent"),
                                   of="of the organization that asked")),
        "Only the patient and the organization that asked see this consent request",
        summary="see a consent request: the patient it is addressed to, the organization "
                "that asked"),
    "consent.decide": Rule(
        (ADMIN, SELF_PATIENT), "Only the patient may decide on their consent",
        summary="accept or decline a consent request, revoke a consent"),
    # -- data subject rights ---------------------------------------------------------------
    "patient.data-rights": Rule(
        (ADMIN, SELF_PATIENT), "Only the patient or a platform administrator may do this",
        summary="ask for the patient's data to be erased, list those requests"),
    "patient.erasure.decide": Rule(
        (ADMIN,), "Only platform administrators decide erasure requests",
        summary="approve (erase the record) or reject an erasure request"),
    # -- prescribing ------------------------------------------------------------------------
    "prescription.sign": Rule(
        (role(ORG_DOCTOR, of="of the organization the prescription belongs to"),),
        "Only a doctor of the organization the prescription belongs to may sign it",
        summary="sign a prescription (its checks run, it becomes active)"),
    "eprescription.transmit": Rule(
        (ADMIN, role(*roles_that(UPDATE, "Task"), of="of the prescribing organization")),
        "Only the prescribing organization may transmit this e-prescription",
        summary="send an e-prescription to its pharmacy"),
    "eprescription.dispense": Rule(
        (ADMIN, role(*roles_that(CREATE, "MedicationDispense"),
                     of="of the pharmacy it was sent to")),
        "Only the pharmacy this e-prescription was sent to may dispense it",
        summary="record a fill the pharmacy dispensed"),
    "eprescription.refill": Rule(
        (ADMIN, SELF_PATIENT, role(*roles_that(UPDATE, "Task"),
                                   of="of the organizations holding the e-prescription")),
        "Only the patient, their clinicians or the pharmacy may request a refill",
        summary="ask for the next fill (the pharmacy may too: `eprescription.dispense`)"),
    # -- labs and decision support ----------------------------------------------------------
    "lab.ingest-hl7": Rule(
        (ADMIN, any_role(*roles_that(CREATE, "DiagnosticReport"))),
        "Only labs, clinicians' organizations and administrators may send HL7",
        summary="send an HL7 v2 message to the gateway over /api (API keys: their "
                "`lab:write` scope)"),
    "cds.feedback.read": Rule(
        (ADMIN,), "Only platform administrators see CDS feedback",
        summary="read the CDS Hooks feedback and its summary"),
    # -- clinical sessions -------------------------------------------------------------------
    "clinical-note.sign": Rule(
        (role(ORG_DOCTOR, ORG_NURSE, of="of the organization holding the note"),),
        "Only a doctor or nurse of the organization that holds this note may sign or "
        "amend it",
        summary="sign or amend a clinical note"),
    "recording.change": Rule(
        (ADMIN, role(*roles_that(UPDATE, "Media"), of="of the organization holding it")),
        "You may not change this recording",
        summary="upload audio to a recording, mark it ready"),
    # -- AI ------------------------------------------------------------------------------------
    "ai.decision-support": Rule(
        (ADMIN, any_role(*CLINICAL_ROLES)),
        "AI-assisted tools are for clinicians: a doctor, nurse, laboratory or administrator "
        "of an organization", code=CLINICAL_ROLE_REQUIRED,
        summary="AI-assisted decision support (inference, lab interpretation, risk scores)"),
    "ai.model.register": Rule(
        (ADMIN,), "Only platform administrators register models",
        code=PLATFORM_ADMIN_REQUIRED, summary="upload a model version to the registry"),
    "ai.device.list": Rule(
        (ADMIN, any_role()), "Devices belong to organizations; you are a member of none",
        summary="list the AI devices of one's organizations"),
    "ai.device.heartbeat": Rule(
        (ADMIN, role(of="of the device's organization")),
        "Only members of the device's organization send its heartbeat",
        code=NOT_DEVICE_MEMBER, summary="report a device's last-seen, battery and models"),
}
