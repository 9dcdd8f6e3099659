"""The notifications' bodies, in the shapes of the Subscriptions R5 Backport IG for R4: a
``history`` Bundle whose first entry is the SubscriptionStatus (a ``Parameters``), then
the resources the notification is about when its content is ``full-resource``."""

from __future__ import annotations

import uuid
from typing import Any

import orjson

from fhir_server.clock import now_instant
from fhir_server.store import StoredResource

JSON = dict[str, Any]


def status_parameters(subscription: JSON, base: str, kind: str, events: int, errors: int,
                      last_error: str | None, event: tuple[int, StoredResource] | None = None,
                      content: str = "id-only") -> JSON:
    """SubscriptionStatus as a Parameters (backport): ``kind`` handshake | heartbeat |
    event-notification | query-status."""
    parameters: list[JSON] = [
        {"name": "subscription",
         "valueReference": {"reference": f"{base}/Subscription/{subscription['id']}"}},
        {"name": "topic", "valueCanonical": str(subscription.get("criteria", ""))},
        {"name": "status", "valueCode": subscription.get("status", "active")},
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
    return {"resourceType": "Parameters", "meta": {"profile": [
        "http://hl7.org/fhir/uv/subscriptions-backport/StructureDefinition/"
        "backport-subscription-status-r4"]}, "parameter": parameters}


def notification_bundle(status: JSON, base: str, stored: StoredResource | None = None,
                        content: str = "id-only") -> JSON:
    entries: list[JSON] = [{"fullUrl": f"urn:uuid:{uuid.uuid4()}", "resource": status,
                            "request": {"method": "GET", "url": "Subscription/$status"},
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
            "meta": {"profile": ["http://hl7.org/fhir/uv/subscriptions-backport/"
                                 "StructureDefinition/backport-subscription-notification-r4"]},
            "entry": entries}
