"""The notifications' bodies, in the shapes of the Subscriptions R5 Backport IG for R4: a
``history`` Bundle whose first entry is the SubscriptionStatus (a ``Parameters``), then
the resources the notification is about when its content is ``full-resource``.

Every URL a notification carries is absolute (R4 Bundle.entry.fullUrl; the IG's focus
references are to be resolvable): they start from :func:`fhir_base`, the server's public
base, known from the first notification on and whoever the subscriber is. What the
content level lets through follows the IG's payloads page and the R4 status profile:
``empty`` names no resource (no ``focus``) and carries no ``topic`` ("SHOULD NOT be
present when using empty payloads"); ``full-resource`` adds the resource.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson

from fhir_server.clock import now_instant
from fhir_server.store import StoredResource
from platform_api.settings import Settings

JSON = dict[str, Any]
STATUS_PROFILE = ("http://hl7.org/fhir/uv/subscriptions-backport/StructureDefinition/"
                  "backport-subscription-status-r4")
NOTIFICATION_PROFILE = ("http://hl7.org/fhir/uv/subscriptions-backport/StructureDefinition/"
                        "backport-subscription-notification-r4")


def fhir_base(settings: Settings) -> str:
    """The FHIR base notifications name resources by: the server's public base URL
    (``HEALTHPLATFORM_BASE_URL``, else what the server is bound to) + ``/fhir``. The one
    place the subscriptions decide it, so a change to how the server knows its own
    address lands here."""
    return f"{settings.public_base_url}/fhir"


def status_parameters(subscription: JSON, base: str, kind: str, events: int, errors: int,
                      last_error: str | None, event: tuple[int, StoredResource] | None = None,
                      content: str = "id-only", status: str | None = None) -> JSON:
    """SubscriptionStatus as a Parameters (backport): ``kind`` handshake | heartbeat |
    event-notification | query-status; ``status`` the subscription's when it is not the
    stored one (a handshake is sent while it is still ``requested``)."""
    parameters: list[JSON] = [
        {"name": "subscription",
         "valueReference": {"reference": f"{base}/Subscription/{subscription['id']}"}},
    ]
    if content != "empty":
        parameters.append({"name": "topic",
                           "valueCanonical": str(subscription.get("criteria", ""))})
    parameters += [
        {"name": "status", "valueCode": status or subscription.get("status", "active")},
        {"name": "type", "valueCode": kind},
        {"name": "events-since-subscription-start", "valueString": str(events)},
        {"name": "error-count", "valueString": str(errors)},
    ]
    if last_error:
        parameters.append({"name": "error", "valueCodeableConcept": {"text": last_error}})
    if event is not None:
        number, stored = event
        parts: list[JSON] = [{"name": "event-number", "valueString": str(number)},
                             {"name": "timestamp", "valueInstant": stored.last_updated}]
        if content != "empty":
            parts.append({"name": "focus", "valueReference": {
                "reference": f"{base}/{stored.resource_type}/{stored.id}"}})
        parameters.append({"name": "notification-event", "part": parts})
    return {"resourceType": "Parameters", "meta": {"profile": [STATUS_PROFILE]},
            "parameter": parameters}


def notification_bundle(status: JSON, base: str, stored: StoredResource | None = None,
                        content: str = "id-only") -> JSON:
    subscription = status["parameter"][0]["valueReference"]["reference"]
    entries: list[JSON] = [{"fullUrl": f"urn:uuid:{uuid.uuid4()}", "resource": status,
                            "request": {"method": "GET", "url": f"{subscription}/$status"},
                            "response": {"status": "200"}}]
    if stored is not None and content == "full-resource":
        entries.append({
            "fullUrl": f"{base}/{stored.resource_type}/{stored.id}",
            "resource": orjson.loads(stored.body),
            "request": {"method": "POST" if stored.version == 1 else "PUT",
                        "url": stored.resource_type if stored.version == 1
                        else f"{stored.resource_type}/{stored.id}"},
            "response": {"status": "201" if stored.version == 1 else "200"}})
    return {"resourceType": "Bundle", "type": "history", "timestamp": now_instant(),
            "meta": {"profile": [NOTIFICATION_PROFILE]}, "entry": entries}
