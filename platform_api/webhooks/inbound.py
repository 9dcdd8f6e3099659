"""What every inbound webhook endpoint does, in this order (spec: Events, Inbound
webhooks, and its handling rules):

1. **HTTPS only** (:func:`require_https`): the connection itself is TLS, or it came from
   a trusted proxy (``HEALTHPLATFORM_TRUSTED_PROXIES``) that says ``X-Forwarded-Proto:
   https``; otherwise 403 ``HTTPS_REQUIRED``.
2. **Signature first**: each family verifies its platform's scheme with its official
   library before reading anything else; an unsigned, wrongly signed or stale request is
   401 ``INVALID_SIGNATURE`` (:func:`refuse`): nothing is processed and nothing stored,
   only a refusal log line (never with the body or the signature). A secret that is not
   configured is 503 ``WEBHOOK_NOT_CONFIGURED``: the platform retries later and loses
   nothing once it is set.
3. **Malformed body** (signed, but not what the platform sends): acknowledged (a retry
   would not mend it) and kept as a dead letter with the body as it came
   (:func:`dead_letter_body`).
4. **Once per event id** (:func:`accept`): a receipt ``webhook_receipts/<family>:<event
   id>`` and the event that carries the work are committed together (outbox); a
   redelivery finds the receipt and is answered 200 without being processed again.
5. **200 at once**: the work happens in the event's consumers, asynchronously, through
   the bus; a slow consumer never delays the answer, and a consumer failure becomes a
   dead letter there.

Events carrying the work of a webhook are ``platform.webhook.<family>``; those a
platform's notification *is* (video room events, leave approved) are published under
their own topic directly.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import BaseModel
from starlette.requests import Request

from fhir_server.clock import now_instant
from fhir_server.store import DuplicateDocument
from platform_api.client_origin import client_origin
from platform_api.envelope import ApiError, ErrorEnvelope, JSONResponse, ok
from platform_api.services import Services

log = logging.getLogger("healthplatform.webhooks")

RECEIPTS = "webhook_receipts"
TOPIC_PREFIX = "platform.webhook."
SOURCE_SERVICE = "webhooks"
JSON = dict[str, Any]


# What the OpenAPI document says of every webhook route: its refusals, and a body that is
# the platform's own JSON (read raw: the signature is over its bytes).
REFUSALS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorEnvelope, "description": "INVALID_SIGNATURE: unsigned, wrongly "
          "signed or stale; nothing processed"},
    403: {"model": ErrorEnvelope, "description": "HTTPS_REQUIRED (or ADDRESS_NOT_ALLOWED)"},
    503: {"model": ErrorEnvelope, "description": "WEBHOOK_NOT_CONFIGURED: the secret is "
          "not set; the platform retries later"},
}
PLATFORM_BODY: dict[str, Any] = {"requestBody": {"required": True, "description": "The "
                                 "platform's notification, as it signed it", "content": {
                                     "application/json": {"schema": {"type": "object"}}}}}


class WebhookAck(BaseModel):
    received: bool = True
    duplicate: bool = False
    event_ids: list[str] = []


# -- where a request came from ------------------------------------------------------------
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def networks(entries: Sequence[str]) -> tuple[Network, ...]:
    """Addresses or networks (``10.0.0.0/8``) of a setting; a bad entry is a clear error."""
    parsed = []
    for entry in entries:
        try:
            parsed.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError as exc:
            raise ValueError(f"not an address or network: {entry!r} ({exc})") from None
    return tuple(parsed)


def within(address: str, allowed: Sequence[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in allowed)


def require_https(request: Request, family: str) -> str:
    """403 unless the request came over HTTPS (module doc); the client's address."""
    origin = client_origin(request.scope)
    address, scheme = origin.address or "unknown", origin.scheme
    if scheme != "https":
        log.warning("webhook %s refused from %s: not over HTTPS", family, address)
        raise ApiError(403, "HTTPS_REQUIRED", "Webhooks are accepted over HTTPS only")
    return address


def refuse(family: str, request: Request, reason: str) -> ApiError:
    """The 401 of a request whose signature does not hold, after its log line."""
    peer = request.client.host if request.client else "unknown"
    log.warning("webhook %s refused from %s: %s", family, peer, reason)
    return ApiError(401, "INVALID_SIGNATURE", f"The {family} webhook signature is not valid: "
                    f"{reason}")


def configured(secret: str, family: str, setting: str) -> str:
    """The secret, or 503 when the operator has not set it."""
    if not secret:
        log.error("webhook %s cannot be verified: set HEALTHPLATFORM_%s", family, setting)
        raise ApiError(503, "WEBHOOK_NOT_CONFIGURED", f"The {family} webhook is not "
                       "configured on this server", headers={"Retry-After": "300"})
    return secret


# -- taking an event in -----------------------------------------------------------------------
@dataclass(frozen=True)
class Inbound:
    """One event of a platform's notification: its id at the platform, the topic and
    payload of the bus event that carries its work (``topic=None``: acknowledged and
    recorded, nothing to do)."""

    event_id: str
    topic: str | None
    payload: JSON


async def accept(services: Services, family: str, events: Sequence[Inbound]) -> JSONResponse:
    """Record the events not received before and emit their bus events, in one commit;
    the 200 answer (``duplicate`` when every one had been received before)."""
    fresh = await _unseen(services, family, events)
    if fresh:
        try:
            await _commit(services, family, fresh)
        except DuplicateDocument:  # the same delivery raced this one: take what is left
            fresh = await _unseen(services, family, fresh)
            if fresh:
                await _commit(services, family, fresh)
    return ok(WebhookAck(duplicate=bool(events) and not fresh,
                         event_ids=[e.event_id for e in events]).model_dump())


async def _unseen(services: Services, family: str, events: Sequence[Inbound]
                  ) -> list[Inbound]:
    store = services.store
    return [e for e in events
            if await store.get_document(RECEIPTS, f"{family}:{e.event_id}") is None]


async def _commit(services: Services, family: str, events: Sequence[Inbound]) -> None:
    async with services.store.unit_of_work() as uow:
        for event in events:
            receipt_id = f"{family}:{event.event_id}"
            uow.insert_document(RECEIPTS, receipt_id, {
                "id": receipt_id, "family": family, "event_id": event.event_id,
                "topic": event.topic, "received_at": now_instant()})
            if event.topic is not None:
                uow.emit(event.topic, event.payload, source_service=SOURCE_SERVICE)
        await uow.commit()


async def dead_letter_body(services: Services, family: str, body: bytes, error: str
                           ) -> JSONResponse:
    """A signed body that is not what the platform sends: kept as a dead letter (the body
    as it came), acknowledged so the platform does not send it again and again."""
    log.warning("webhook %s: malformed body kept as a dead letter: %s", family, error)
    await services.bus.deliveries.dead_letter(
        body, f"malformed {family} webhook body: {error}", topic=TOPIC_PREFIX + family)
    return ok(WebhookAck(event_ids=[]).model_dump())


def parse_json(body: bytes) -> Any:
    """The body's JSON; ``ValueError`` naming why not."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None


__all__ = ["PLATFORM_BODY", "RECEIPTS", "REFUSALS", "TOPIC_PREFIX", "Inbound", "WebhookAck",
           "accept", "configured", "dead_letter_body", "networks", "parse_json", "refuse",
           "require_https", "within"]
