"""Security audit trail: auth events as FHIR AuditEvent resources.

Every login (and failed login), logout, MFA step, API-key change or use, password reset
and administrator change becomes an ``AuditEvent`` written through the FHIR service into
the audit log (:mod:`fhir_server.audit_log`), readable at ``/fhir/AuditEvent`` like the
clinical trail. One staged in a unit of work (``AuditTrail.stage``) is appended once that
unit has committed: the change it records is stored first, and a change that fails
leaves no record of itself.

Coding (FHIR R4 AuditEvent, DICOM PS3.16 CID 400-403 and 415):

- ``type``: DCM 110114 *User Authentication* for logins and logouts, DCM 110113
  *Security Alert* for changes to someone's security attributes;
- ``subtype``: DCM 110122 *Login* / 110123 *Logout* (CID 415), DCM 110137 *User Security
  Attributes Changed* / 110136 *Security Roles Changed* (CID 403);
- ``outcome``: 0 success, 4 minor failure (a refused credential), 8 serious failure
  (a replayed credential, a suspended account trying to get in);
- ``agent``: who acted (a person: extra-security-role-type ``humanuser``; an API key:
  DCM 110150 *Application*) with the network address they came from;
- ``source``: this service as the observer (security-source-type 4 *Application Server*);
- ``entity``: the account acted upon (audit-entity-type 1 *Person*, object-role 11
  *Security User Entity*) with details such as the new status.

The event kinds are data (``EVENTS``); :func:`audit_event` turns one
:class:`AuditRecord` into the resource.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fhir_server.service import FhirService
from fhir_server.store import UnitOfWork

log = logging.getLogger("healthplatform.audit")

DCM = "http://dicom.nema.org/resources/ontology/DCM"
ROLE_TYPE = "http://terminology.hl7.org/CodeSystem/extra-security-role-type"
SOURCE_TYPE = "http://terminology.hl7.org/CodeSystem/security-source-type"
ENTITY_TYPE = "http://terminology.hl7.org/CodeSystem/audit-entity-type"
OBJECT_ROLE = "http://terminology.hl7.org/CodeSystem/object-role"
USER_SYSTEM = "urn:healthplatform:user"
API_KEY_SYSTEM = "urn:healthplatform:api-key"
SERVICE_SYSTEM = "urn:healthplatform:service"

SUCCESS, MINOR_FAILURE, SERIOUS_FAILURE = "0", "4", "8"

USER_AUTHENTICATION = (DCM, "110114", "User Authentication")
SECURITY_ALERT = (DCM, "110113", "Security Alert")
LOGIN = (DCM, "110122", "Login")
LOGOUT = (DCM, "110123", "Logout")
ATTRIBUTES_CHANGED = (DCM, "110137", "User Security Attributes Changed")
ROLES_CHANGED = (DCM, "110136", "Security Roles Changed")

Coding = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class EventKind:
    type: Coding
    subtype: Coding
    action: str  # AuditEvent.action: C create, R read, U update, D delete, E execute
    summary: str


EVENTS: dict[str, EventKind] = {
    "login": EventKind(USER_AUTHENTICATION, LOGIN, "E", "login"),
    "logout": EventKind(USER_AUTHENTICATION, LOGOUT, "E", "logout"),
    "token-refresh": EventKind(USER_AUTHENTICATION, LOGIN, "E", "session refresh"),
    "mfa-challenge": EventKind(USER_AUTHENTICATION, LOGIN, "E", "MFA challenge"),
    "api-key-use": EventKind(USER_AUTHENTICATION, LOGIN, "E", "API key authentication"),
    "mfa-enrolled": EventKind(SECURITY_ALERT, ATTRIBUTES_CHANGED, "U", "MFA enabled"),
    "mfa-disabled": EventKind(SECURITY_ALERT, ATTRIBUTES_CHANGED, "U", "MFA disabled"),
    "mfa-verify": EventKind(SECURITY_ALERT, ATTRIBUTES_CHANGED, "U", "MFA enrollment check"),
    "password-reset": EventKind(SECURITY_ALERT, ATTRIBUTES_CHANGED, "U", "password reset"),
    "email-verified": EventKind(SECURITY_ALERT, ATTRIBUTES_CHANGED, "U", "e-mail verified"),
    "api-key-created": EventKind(SECURITY_ALERT, ATTRIBUTES_CHANGED, "C", "API key created"),
    "api-key-rotated": EventKind(SECURITY_ALERT, ATTRIBUTES_CHANGED, "U", "API key rotated"),
    "api-key-revoked": EventKind(SECURITY_ALERT, ATTRIBUTES_CHANGED, "D", "API key revoked"),
    "user-status-changed": EventKind(SECURITY_ALERT, ATTRIBUTES_CHANGED, "U",
                                     "account status changed"),
    "user-roles-changed": EventKind(SECURITY_ALERT, ROLES_CHANGED, "U", "roles changed"),
}


@dataclass(frozen=True, slots=True)
class ClientInfo:
    """Where a request came from, as far as the service can tell."""

    ip: str | None = None
    user_agent: str | None = None


NO_CLIENT = ClientInfo()


@dataclass(frozen=True, slots=True)
class AuditRecord:
    event: str  # a key of EVENTS
    outcome: str = SUCCESS
    description: str | None = None
    user_id: str | None = None  # the person acting (or owning the API key)
    user_email: str | None = None
    api_key_id: str | None = None  # set when an API key acted
    api_key_name: str | None = None
    client: ClientInfo = NO_CLIENT
    subject_id: str | None = None  # the account acted upon, when not the actor's own
    details: Mapping[str, str] = field(default_factory=dict)


def _coding(coding: Coding) -> dict[str, str]:
    system, code, display = coding
    return {"system": system, "code": code, "display": display}


def _network(client: ClientInfo) -> dict[str, str] | None:
    # AuditEvent.agent.network.type 2: IP address.
    return {"address": client.ip, "type": "2"} if client.ip else None


def _person(record: AuditRecord, requestor: bool) -> dict[str, Any]:
    who: dict[str, Any] = {}
    if record.user_id:
        who["identifier"] = {"system": USER_SYSTEM, "value": record.user_id}
    if record.user_email:
        who["display"] = record.user_email
    agent: dict[str, Any] = {
        "type": {"coding": [{"system": ROLE_TYPE, "code": "humanuser", "display": "human user"}]},
        "who": who or {"display": "unknown user"},
        "requestor": requestor,
    }
    return agent


def _agents(record: AuditRecord) -> list[dict[str, Any]]:
    network = _network(record.client)
    if record.api_key_id:
        application: dict[str, Any] = {
            "type": {"coding": [_coding((DCM, "110150", "Application"))]},
            "who": {"identifier": {"system": API_KEY_SYSTEM, "value": record.api_key_id},
                    "display": record.api_key_name or "API key"},
            "requestor": True,
        }
        if network:
            application["network"] = network
        agents = [application]
        if record.user_id:
            agents.append(_person(record, requestor=False))
        return agents
    person = _person(record, requestor=True)
    if network:
        person["network"] = network
    if record.client.user_agent:
        person["name"] = record.client.user_agent[:200]
    return [person]


def _entity(record: AuditRecord) -> dict[str, Any] | None:
    target = record.subject_id or record.user_id
    if target is None and not record.details:
        return None
    entity: dict[str, Any] = {
        "type": {"system": ENTITY_TYPE, "code": "1", "display": "Person"},
        "role": {"system": OBJECT_ROLE, "code": "11", "display": "Security User Entity"},
    }
    if target is not None:
        entity["what"] = {"identifier": {"system": USER_SYSTEM, "value": target}}
    if record.details:
        entity["detail"] = [{"type": k, "valueString": v} for k, v in record.details.items()]
    return entity


def audit_event(record: AuditRecord, source_name: str, now: float | None = None
                ) -> dict[str, Any]:
    """The FHIR AuditEvent for one record."""
    kind = EVENTS[record.event]
    recorded = datetime.fromtimestamp(time.time() if now is None else now, UTC)
    resource: dict[str, Any] = {
        "resourceType": "AuditEvent",
        "type": _coding(kind.type),
        "subtype": [_coding(kind.subtype)],
        "action": kind.action,
        "recorded": recorded.isoformat(timespec="milliseconds"),
        "outcome": record.outcome,
        "outcomeDesc": record.description or kind.summary,
        "agent": _agents(record),
        "source": {
            "site": source_name,
            "observer": {"identifier": {"system": SERVICE_SYSTEM, "value": "auth"},
                         "display": f"{source_name} auth"},
            "type": [{"system": SOURCE_TYPE, "code": "4", "display": "Application Server"}],
        },
    }
    entity = _entity(record)
    if entity is not None:
        resource["entity"] = [entity]
    return resource


class AuditTrail:
    """Writes audit records as AuditEvents through the FHIR service (to its audit log)."""

    def __init__(self, fhir: FhirService, source_name: str):
        self.fhir, self.source_name = fhir, source_name

    def stage(self, uow: UnitOfWork, record: AuditRecord) -> None:
        """Stage the event in the unit of work of the change it records (atomic)."""
        self.fhir.stage_create(uow, audit_event(record, self.source_name))

    async def record(self, record: AuditRecord) -> None:
        """Write the event on its own; a failure is logged, never raised: the refusal
        or success being recorded must still reach the client."""
        try:
            async with self.fhir.store.unit_of_work() as uow:
                self.stage(uow, record)
                await uow.commit()
        except Exception:
            log.exception("could not write the audit event %s (outcome %s, user %s)",
                          record.event, record.outcome, record.user_id)
