"""FHIR Subscriptions (R4, with the R5 backport's notifications and operations).

Maps to FHIR ``Subscription`` (R4): ``criteria`` a search, ``channel`` rest-hook or
websocket, ``status`` requested → active ↔ error, ``error`` the last failure. The parts:
:mod:`.criteria` (checks and matching), :mod:`.service` (the index of active subscriptions,
the write hook, the event consumer), :mod:`.delivery` (queues, rest-hook requests with
retries, websocket pushes), :mod:`.websocket` (binding tokens and the socket),
:mod:`.notifications` (the backport's SubscriptionStatus and notification Bundle).

:class:`Channels` is what the FHIR operations ``$status`` and ``$get-ws-binding-token``
reach (``fhir_server.interactions.subscription``).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from fhir_server.interactions.subscription import SUBSCRIPTIONS
from fhir_server.outcome import FhirError
from platform_api.services import Services
from platform_api.subscriptions import notifications
from platform_api.subscriptions.criteria import payload_content
from platform_api.subscriptions.delivery import Deliveries
from platform_api.subscriptions.notifications import notification_bundle, status_parameters
from platform_api.subscriptions.service import RELOAD_SECONDS, Subscriptions
from platform_api.subscriptions.websocket import PATH, BindingTokens, expiration, router

JSON = dict[str, Any]
TOPICS = ("platform.fhir.resource_created", "platform.fhir.resource_updated",
          "platform.fhir.resource_deleted")
CONSUMER = "fhir_subscriptions"


class Channels:
    """The platform's subscriptions as the FHIR operations and the socket see them."""

    def __init__(self, services: Services):
        settings = services.settings
        self.settings = settings
        self.subscriptions = Subscriptions(services)
        self.deliveries = Deliveries(self.subscriptions, settings,
                                     notifications.fhir_base(settings))
        self.subscriptions.delivery = self.deliveries
        self.tokens = BindingTokens(settings.subscription_ws_token_seconds)
        self.reloading: asyncio.Task[None] | None = None

    def websocket_url(self, fhir_base: str) -> str:
        origin = fhir_base.removesuffix("/fhir")
        return "ws" + origin.removeprefix("http") + PATH

    @property
    def documentation(self) -> str:
        """What the CapabilityStatement says of the Subscriptions offered here."""
        skipped = self.settings.subscription_skip_handshake
        skip = ("" if not skipped else " Endpoints activated without a handshake: "
                + ("all" if "*" in skipped else ", ".join(skipped)) + ".")
        return (
            "R4 Subscription with the notifications and operations of the Subscriptions R5 "
            "Backport IG (1.1): criteria a search; channels rest-hook and websocket; "
            "payload none (an empty POST), a mime type (the resource PUT to "
            "[endpoint]/[type]/[id]) or the backport-payload-content extension (empty | "
            "id-only | full-resource: a history notification Bundle). A rest-hook is "
            "created requested and activated once its endpoint accepts the handshake "
            "notification (refused: status error with the reason); a websocket gets its "
            "handshake when bound (bind-with-token)." + skip
            + " $status at type level (id and status parameters; without id, every "
            "Subscription the caller may read) and instance level.")

    async def status(self, subscription: JSON, fhir_base: str) -> JSON:
        active = self.subscriptions.by_id.get(subscription["id"])
        events, errors, error = (active.events, active.errors, active.last_error) \
            if active else (0, 0, subscription.get("error"))
        return status_parameters(subscription, fhir_base, "query-status", events, errors,
                                 error)

    async def binding_token(self, subscriptions: list[JSON], fhir_base: str) -> JSON:
        ids = [s["id"] for s in subscriptions]
        token, expires = self.tokens.issue(ids)
        return {"resourceType": "Parameters", "parameter": [
            {"name": "token", "valueString": token},
            {"name": "expiration", "valueDateTime": expiration(expires)},
            *({"name": "subscription", "valueString": f"Subscription/{i}"} for i in ids),
            {"name": "websocket-url", "valueUrl": self.websocket_url(fhir_base)}]}

    async def bind(self, token: str, socket: Any) -> list[Any]:
        """Bind ``socket`` to the token's subscriptions; a handshake for each."""
        bound = []
        for subscription_id in self.tokens.redeem(token):
            if subscription_id not in self.subscriptions.by_id:
                # just written: its event may not have reached the index yet
                await self.subscriptions.refresh(subscription_id)
            active = self.subscriptions.by_id.get(subscription_id)
            if active is None:
                continue  # deleted or turned off since: nothing to bind
            active.sockets.add(socket)
            bound.append(active)
            base = self.deliveries.base_url
            content = payload_content(active.resource) or "id-only"
            status = status_parameters(active.resource, base, "handshake", active.events,
                                       active.errors, active.last_error, content=content)
            await socket.send_json(notification_bundle(status, base))
        if not bound:
            raise FhirError.of(404, "not-found", "None of the token's subscriptions is "
                               "active any more")
        return bound


def channels_of(services: Services) -> Channels:
    found = services.extras.get(SUBSCRIPTIONS)
    if found is None:
        found = services.extras[SUBSCRIPTIONS] = Channels(services)
        services.fhir.add_write_hook("Subscription", found.subscriptions.on_write)
    return found  # type: ignore[no-any-return]


async def start(services: Services) -> Channels:
    """Index the active subscriptions, then match every resource event."""
    channels = channels_of(services)
    await channels.deliveries.start()
    await channels.subscriptions.load(handshakes=True)
    channels.reloading = asyncio.get_running_loop().create_task(
        channels.subscriptions.reload_every(RELOAD_SECONDS))
    for topic in TOPICS:
        services.bus.subscribe(topic, channels.subscriptions.on_event,
                               consumer=f"{CONSUMER}_{topic.rsplit('.', 1)[1]}")
    return channels


async def stop(services: Services) -> None:
    channels = channels_of(services)
    if channels.reloading is not None:
        channels.reloading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await channels.reloading
    await channels.deliveries.stop()
    active = [a for a in channels.subscriptions.by_id.values() if a.events or a.errors]
    if active:
        await channels.subscriptions.record_status(*active)


__all__ = ["Channels", "channels_of", "router", "start", "stop"]
