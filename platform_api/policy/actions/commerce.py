"""Workflow actions of the commerce and operations areas (scheduling, marketplace, revenue
cycle, public health, feedback, payments, cross-border lookup, the SMART server's
registration and introspection): who may do each (see :mod:`platform_api.policy.actions`).

Where an action is about a resource, its target's organizations are the resource's
(an appointment's, a claim's, an order's buyer and/or seller): ``Role`` holds for a role
there. CRUD on the same resources stays with the role table; these rules decide the
steps that are more than one write (moving an appointment frees Slots the caller could
not write, approving spending, sending a claim to its payer, ...).
"""

from __future__ import annotations

from platform_api.policy.actions import ADMIN, SELF_PATIENT, SELF_USER, Rule, any_role, role
from platform_api.policy.roles import (
    ORG_ADMIN,
    ORG_BILLING,
    ORG_DOCTOR,
    ORG_NURSE,
    ORG_PHARMACIST,
    ORG_RECEPTIONIST,
)

# The staff who write an organization's scheduling resources (the role table's
# ``scheduling`` category: create and update).
SCHEDULING_STAFF = (ORG_ADMIN, ORG_DOCTOR, ORG_NURSE, ORG_RECEPTIONIST)
# Who orders supplies for an organization.
ORDERING = (ORG_ADMIN, ORG_DOCTOR, ORG_NURSE, ORG_PHARMACIST)
# Who vouches for the goods: the pharmacy and the administrators.
STOCK_KEEPERS = (ORG_ADMIN, ORG_PHARMACIST)
BUYER, SELLER = "of the buying organization", "of the selling organization"

SCHEDULING: dict[str, Rule] = {
    "appointment.book": Rule(
        (SELF_PATIENT,), "A signed-in booking is for your own patient record",
        summary="book a free time for oneself, signed in (without signing in, or for "
                "someone else, a booking holds the contact given until staff confirm it)"),
    "appointment.change": Rule(
        (ADMIN, role(*SCHEDULING_STAFF)), "You may not change this appointment",
        summary="move an appointment through its statuses; end its video visit"),
    "appointment.reschedule": Rule(
        (ADMIN, role(*SCHEDULING_STAFF), SELF_PATIENT), "You may not change this appointment",
        summary="move a booked appointment to another free time"),
    "appointment.cancel": Rule(
        (ADMIN, role(*SCHEDULING_STAFF), SELF_PATIENT), "You may not change this appointment",
        summary="cancel an appointment (its Slots are freed)"),
    "appointment.confirm-patient": Rule(
        (ADMIN, role(*SCHEDULING_STAFF)),
        "Only the organization's staff confirm who booked its appointments",
        summary="confirm who a booking made without signing in is for: link the "
                "organization's Patient, or register the contact as one"),
    "appointment.join-video": Rule(
        (ADMIN, role(*SCHEDULING_STAFF), SELF_PATIENT),
        "Only the appointment's patient and its organization's staff may join this video "
        "visit", summary="start or watch an appointment's video visit"),
    "appointment.request": Rule(
        (ADMIN, SELF_PATIENT, role(*SCHEDULING_STAFF)),
        "You may not ask for appointments for this patient with this organization",
        summary="ask an organization for an appointment (a patient for themselves, staff "
                "for a patient)"),
    "appointment-request.approve": Rule(
        (ADMIN, role(*SCHEDULING_STAFF)),
        "Only the organization's staff may approve appointment requests",
        summary="approve an appointment request: its time is booked"),
    "appointment-request.reject": Rule(
        (ADMIN, role(*SCHEDULING_STAFF)),
        "Only the organization's staff may reject appointment requests",
        summary="reject an appointment request with a reason"),
    "schedule.write": Rule(
        (ADMIN, role(*SCHEDULING_STAFF)),
        "You may not write schedules for this resource's organization",
        summary="create or change a schedule; its Slots are generated with it"),
    "schedule.change": Rule(
        (ADMIN, role(*SCHEDULING_STAFF)), "You may not change this schedule",
        summary="change an existing schedule (checked on the schedule as stored)"),
    "schedule.delete": Rule(
        (ADMIN, role(ORG_ADMIN, ORG_RECEPTIONIST)), "You may not delete this schedule",
        summary="delete a schedule and its future free Slots"),
    "scheduling-resource.retire": Rule(
        (ADMIN, role(ORG_ADMIN)),
        "Only the organization's administrators may retire its resources",
        summary="retire a schedulable resource: its schedules and future free Slots go"),
}

MARKETPLACE: dict[str, Rule] = {
    "supplier.register": Rule(
        (ADMIN, role(ORG_ADMIN)), "Only ORG:ADMIN of the organization may register suppliers",
        summary="register a supplier an organization buys from"),
    "purchase-order.approve": Rule(
        (ADMIN, role(ORG_ADMIN, of=BUYER)),
        "Only ORG:ADMIN of the organization may approve purchase orders",
        summary="approve a draft purchase order (the spending)"),
    "purchase-order.reorder": Rule(
        (ADMIN, role(*STOCK_KEEPERS)),
        "Only ORG:ADMIN or ORG:PHARMACIST of the organization may trigger reorders",
        summary="raise draft purchase orders for a facility's items below their level"),
    "supply-order.place": Rule(
        (ADMIN, role(*ORDERING, of=BUYER)),
        "Your role in this organization may not order supplies",
        summary="place an order or check a cart out (the seller's stock is reserved)"),
    "supply-order.submit": Rule(
        (ADMIN, role(*ORDERING, of=BUYER)), "Your role may not move this order to submitted",
        summary="submit a draft order (its stock is reserved)"),
    "supply-order.cancel": Rule(
        (ADMIN, role(*ORDERING, of=BUYER)), "Your role may not move this order to cancelled",
        summary="cancel an order (its reserved stock is released)"),
    "supply-order.confirm-delivery": Rule(
        (ADMIN, role(*ORDERING, of=BUYER)), "Your role may not move this order to delivered",
        summary="confirm an order was delivered"),
    "supply-order.verify": Rule(
        (ADMIN, role(*STOCK_KEEPERS, of=BUYER)),
        "Your role may not move this order to verified",
        summary="verify a submitted order"),
    "supply-order.approve": Rule(
        (ADMIN, role(ORG_ADMIN, of=BUYER)), "Your role may not move this order to approved",
        summary="approve the spending of a verified order"),
    "supply-order.dispatch": Rule(
        (ADMIN, role(*STOCK_KEEPERS, of=SELLER)),
        "Your role may not move this order to dispatched",
        summary="dispatch an approved order"),
    "supply-order.reject": Rule(
        (ADMIN, role(*STOCK_KEEPERS, of="of the buying or the selling organization")),
        "Your role may not move this order to rejected",
        summary="reject an order (its reserved stock is released)"),
}

REVENUE: dict[str, Rule] = {
    "claim.send": Rule(
        (ADMIN, role(ORG_ADMIN, ORG_BILLING)), "You may not send this organization's claims",
        summary="send a claim to its payer, check eligibility, ask for a pre-authorization"),
    "insurance.enroll-self": Rule(
        (SELF_PATIENT,), "Only the patient themselves enrols without an organization",
        summary="enrol oneself in an insurance plan (the coverage is the insurer's)"),
    "payment.read": Rule(
        (ADMIN, SELF_USER), "Only its payer and platform administrators see a payment",
        summary="read a mobile money payment's state"),
}

REPORTING: dict[str, Rule] = {
    "public-health.aggregates": Rule(
        (ADMIN, role(ORG_ADMIN, ORG_DOCTOR, ORG_NURSE)),
        "Your role in this organization does not see its public-health figures",
        summary="see a facility's public-health aggregates and surveillance"),
    "public-health.hmis": Rule(
        (ADMIN, role(ORG_ADMIN)),
        "Only the organization's administrators export or push its figures to the HMIS",
        summary="export a facility's figures for the HMIS (DHIS2) or push them"),
    "feedback.read": Rule(
        (ADMIN, role(ORG_ADMIN), SELF_USER),
        "This feedback is neither yours nor about an organization you administer",
        summary="read a feedback entry"),
    "feedback.triage": Rule(
        (ADMIN, role(ORG_ADMIN)),
        "Only platform administrators, or the administrator of the organization it is "
        "about, triage feedback",
        summary="list an organization's feedback; set a status or resolution"),
    "feedback.edit": Rule(
        (SELF_USER,), "Only its author edits feedback",
        summary="change one's own feedback while it is new"),
    "cross-border.lookup": Rule(
        (ADMIN, any_role(ORG_ADMIN, ORG_DOCTOR, ORG_NURSE, ORG_RECEPTIONIST)),
        "Only an organization's clinical or front-desk staff look patients up through a "
        "national exchange",
        summary="look a patient up by national id through a national exchange (the Patient "
                "found is kept)"),
}

SMART: dict[str, Rule] = {
    "smart-client.register": Rule(
        (ADMIN,), "registering a SMART client needs a platform administrator or an API key "
                  "with smart:register",
        summary="register a SMART client with a user's token (API keys: the scope "
                "smart:register)"),
    "smart-client.register-platform-wide": Rule(
        (ADMIN,), "only a platform administrator registers a platform-wide backend client",
        summary="register a backend services client for the whole platform"),
    "smart-client.act-for-organization": Rule(
        (ADMIN, role(ORG_ADMIN)),
        "only an ORG:ADMIN of the organization (or a platform administrator) registers a "
        "client acting for it",
        summary="register a backend services client acting for an organization"),
    "smart-token.introspect": Rule(
        (ADMIN,), "only the token's own client or a platform administrator introspects it",
        summary="introspect any SMART token (RFC 7662; a client its own tokens)"),
}

RULES: dict[str, Rule] = {**SCHEDULING, **MARKETPLACE, **REVENUE, **REPORTING, **SMART}
