"""Subscriptions: which are active, what each written resource matches, who may see it.

- **Written through FHIR.** A Subscription is created, changed and deleted with the
  ordinary FHIR API (and in transactions). A write hook checks it as it is staged
  (criteria, channel: :mod:`.criteria`), activates it (R4's workflow: the server
  activates) and records, in the same unit of work, **who** wrote it
  (``subscription_owners``: the caller kept by
  :class:`~platform_api.stored_principal.PrincipalIdentity`). Notifications are filtered
  by that subscriber's access as it is now.
- **Activated by a handshake** (backport IG, channels): a websocket Subscription is
  ``active`` at once (its handshake is sent when a socket binds); a rest-hook one is
  created ``requested`` (also when the client wrote ``active``) and stays so until its
  endpoint accepted the handshake notification sent once the write is committed
  (:meth:`.delivery.Deliveries.start_handshake`): then ``active``, or ``error`` with the
  reason when the endpoint refused it, and then no notification goes to that endpoint
  (unlike an ``error`` after failed deliveries, which the next successful one ends).
  Writing ``requested`` again sends another.
  Endpoints under a prefix of ``subscription_skip_handshake`` (``*``: all) are activated
  without one, for endpoints that cannot answer it.
- **Matched through the resource events**, not by polling: a consumer of
  ``platform.fhir.resource_created`` / ``_updated`` (and ``_deleted`` for Subscriptions
  themselves) keeps an index of the active subscriptions by resource type, reads the
  written version only when some subscription covers its type, decides the match
  (:func:`.criteria.matches`) and whether the subscriber may read it
  (``CallerFhir.admitted``); nothing is sent otherwise, not even a ping. R4 applies
  criteria to the new content: a delete notifies no one.
- **Delivered in the background** (:mod:`.delivery`): the consumer only queues, so a
  slow or failing endpoint never slows a write or another subscription.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from fhir_server.access import CREATE, READ, Access
from fhir_server.caller import CallerFhir
from fhir_server.clock import now_instant
from fhir_server.outcome import FhirError
from fhir_server.store import ResourceGone, ResourceNotFound, StoredResource
from fhir_server.store.port import IndexRows
from platform_api.outbound import Outbound, outbound_of
from platform_api.policy.grants import PolicyAccess
from platform_api.services import Services
from platform_api.stored_principal import PrincipalIdentity
from platform_api.subscriptions.criteria import (
    Criteria,
    check_channel,
    check_endpoint_address,
    keys_of,
    matches,
    parse_criteria,
)

log = logging.getLogger("healthplatform.subscriptions")

JSON = dict[str, Any]
OWNERS, STATUS = "subscription_owners", "subscription_status"
ACCESS_SECONDS = 5.0  # how long a subscriber's access is reused before it is rebuilt
RELOAD_SECONDS = 30.0


@dataclass(slots=True)
class Active:
    """An active subscription as the matcher and the deliveries see it."""

    resource: JSON
    criteria: Criteria
    identity: JSON | None
    events: int = 0  # events since the subscription started
    errors: int = 0  # deliveries that failed after every retry
    last_error: str | None = None
    access: Access | None = None
    access_until: float = 0.0
    sockets: set[Any] = field(default_factory=set)  # bound websocket connections

    @property
    def id(self) -> str:
        return str(self.resource["id"])

    @property
    def channel(self) -> JSON:
        return self.resource.get("channel") or {}


class Subscriptions:
    """The platform's subscriptions (see the module docstring)."""

    def __init__(self, services: Services):
        self.services = services
        self.fhir = services.fhir
        # The platform's own rights, for the index of active subscriptions and their
        # status: what a delivery sends is filtered by each subscriber's access.
        self.system = services.policy.elevate(
            "subscriptions: index the active Subscriptions and write their status")
        self.identity = PrincipalIdentity(services)
        self.by_type: dict[str, dict[str, Active]] = {}
        self.by_id: dict[str, Active] = {}
        # per type: the subscriptions by the index keys a match must have (most: one
        # lookup instead of a check of every subscription), and those without keys
        self.keyed: dict[str, dict[tuple[str, str], dict[str, Active]]] = {}
        self.unkeyed: dict[str, dict[str, Active]] = {}
        self.delivery: Any = None  # the Deliveries (set by install)

    def outbound(self) -> Outbound:
        """The guard deliveries go through (the private-endpoints setting: its alias)."""
        outbound = outbound_of(self.services)
        if self.services.settings.subscription_allow_private_endpoints:
            return outbound.with_private()
        return outbound

    # -- the write hook ----------------------------------------------------------------------
    async def on_write(self, access: Access, action: str, resource: JSON, unit: Any) -> JSON:
        """Check a Subscription as it is staged, activate it, and record its subscriber."""
        if not isinstance(access, PolicyAccess):  # the platform itself (status updates)
            return resource
        await parse_criteria(self.fhir, resource.get("criteria"))
        check_channel(resource)
        await check_endpoint_address(resource, self.outbound().guard)
        status = resource.get("status")
        if status == "requested" or (action == CREATE and status == "active"):
            resource = {k: v for k, v in resource.items() if k != "error"}
            resource["status"] = "requested" if self.needs_handshake(resource) else "active"
        unit.put_document(OWNERS, resource["id"], {
            "id": resource["id"], "owner": self.identity.owner(access),
            "identity": self.identity.dump(access)})
        return resource

    def needs_handshake(self, subscription: JSON) -> bool:
        """Whether activating ``subscription`` waits for its endpoint's handshake."""
        channel = subscription.get("channel") or {}
        if channel.get("type") != "rest-hook":
            return False
        endpoint = str(channel.get("endpoint") or "")
        return not any(prefix == "*" or endpoint.startswith(prefix)
                       for prefix in self.services.settings.subscription_skip_handshake)

    async def conclude_handshake(self, subscription_id: str, error: str | None) -> None:
        """The handshake's outcome: ``active``, or ``error`` with why (unless the
        Subscription changed meanwhile: turned off, deleted, given another endpoint)."""
        if error is not None:
            error = f"The handshake was not accepted: {error}"
            log.warning("Subscription/%s: %s", subscription_id, error)
        # Kept before the status is written, so the index never takes an unverified
        # endpoint for one in error after deliveries (which may recover by themselves).
        async with self.services.store.unit_of_work() as uow:
            kept = await self.services.store.get_document(STATUS, subscription_id) or {}
            uow.put_document(STATUS, subscription_id, {**kept, "id": subscription_id,
                                                       "handshake_failed": error is not None})
            await uow.commit()
        await self._write_state(subscription_id, "active" if error is None else "error",
                                error, only_from="requested")

    # -- the index of active subscriptions -------------------------------------------------
    async def load(self, *, handshakes: bool = False) -> int:
        """Index every active (or failing) subscription; how many. At start, and every
        ``RELOAD_SECONDS``: with several processes on NATS, each consumes only a share of
        the Subscription events, so each re-reads the others' changes this way. With
        ``handshakes`` (at start) the handshakes of ``requested`` rest-hooks are sent
        again: one under way when the process stopped never concluded."""
        system = self.system
        found = await system.search("Subscription", [("status", "active,error")])
        for subscription in found:
            await self.refresh(subscription["id"], subscription)
        for gone in set(self.by_id) - {s["id"] for s in found}:
            self._forget(gone)
        if handshakes:
            for pending in await system.search("Subscription", [("status", "requested")]):
                await self.refresh(pending["id"], pending)
        return len(self.by_id)

    async def reload_every(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await self.load()
            except Exception:  # the next pass tries again; matching goes on meanwhile
                log.exception("reloading the subscriptions failed")

    async def refresh(self, subscription_id: str, subscription: JSON | None = None) -> None:
        """Index (or forget) one subscription as it now stands in the store."""
        if subscription is None:
            subscription = await self.system.find_json(
                "Subscription", subscription_id)
        known = self.by_id.get(subscription_id)
        if subscription is not None and subscription.get("status") == "requested" and \
                self.needs_handshake(subscription) and self.delivery is not None:
            self.delivery.start_handshake(subscription)
        if subscription is None or subscription.get("status") not in ("active", "error"):
            self._forget(subscription_id)
            if subscription is None:  # deleted: what was kept of it goes too
                async with self.services.store.unit_of_work() as uow:
                    uow.delete_document(OWNERS, subscription_id)
                    uow.delete_document(STATUS, subscription_id)
                    await uow.commit()
            return
        try:
            criteria = await parse_criteria(self.fhir, subscription.get("criteria"))
        except FhirError as exc:  # stored before a definition changed: never matches
            log.warning("Subscription/%s has criteria no longer valid: %s", subscription_id,
                        exc)
            self._forget(subscription_id)
            return
        owner = await self.services.store.get_document(OWNERS, subscription_id)
        status = await self.services.store.get_document(STATUS, subscription_id) or {}
        if subscription.get("status") == "error" and status.get("handshake_failed"):
            self._forget(subscription_id)  # never verified: nothing goes to that endpoint
            return
        active = Active(subscription, criteria, owner and owner.get("identity"),
                        status.get("events", 0), status.get("errors", 0),
                        status.get("last_error"))
        if known is not None:
            active.events, active.errors = max(known.events, active.events), known.errors
            active.last_error, active.sockets = known.last_error, known.sockets
        self._forget(subscription_id)
        self.by_id[subscription_id] = active
        resource_type = criteria.resource_type
        self.by_type.setdefault(resource_type, {})[subscription_id] = active
        if criteria.keys:
            keyed = self.keyed.setdefault(resource_type, {})
            for key in criteria.keys:
                keyed.setdefault(key, {})[subscription_id] = active
        else:
            self.unkeyed.setdefault(resource_type, {})[subscription_id] = active

    def _forget(self, subscription_id: str) -> None:
        active = self.by_id.pop(subscription_id, None)
        if active is None:
            return
        resource_type = active.criteria.resource_type
        self.by_type.get(resource_type, {}).pop(subscription_id, None)
        self.unkeyed.get(resource_type, {}).pop(subscription_id, None)
        keyed = self.keyed.get(resource_type, {})
        for key in active.criteria.keys:
            keyed.get(key, {}).pop(subscription_id, None)

    def candidates(self, resource_type: str, rows: IndexRows | None) -> list[Active]:
        """The subscriptions the resource may match: those without keys, and those one of
        whose keys it has (all of the type when its index rows are unknown)."""
        if rows is None:
            return list(self.by_type.get(resource_type, {}).values())
        found = dict(self.unkeyed.get(resource_type, {}))
        keyed = self.keyed.get(resource_type)
        if keyed:
            for key in keys_of(rows):
                found.update(keyed.get(key, ()))
        return list(found.values())

    # -- the consumer -----------------------------------------------------------------------
    async def on_event(self, event: JSON) -> None:
        payload = event.get("payload") or {}
        resource_type, resource_id = payload.get("resourceType"), str(payload.get("id"))
        if resource_type == "Subscription":
            await self.refresh(resource_id)
            return
        if not self.by_type.get(str(resource_type)) or \
                event.get("topic", "").endswith("resource_deleted"):
            return
        try:
            stored = await self.fhir.read(str(resource_type), resource_id,
                                          int(payload.get("versionId") or 0) or None)
        except (ResourceNotFound, ResourceGone):
            return
        await self.match(stored)

    async def match(self, stored: StoredResource) -> int:
        """Queue a notification for each subscription the resource matches and its
        subscriber may read; how many."""
        resource = orjson.loads(stored.body)
        rows = await self.fhir.index(resource)
        candidates = self.candidates(stored.resource_type, rows)
        now = now_instant()
        queued = 0
        for active in candidates:
            end = active.resource.get("end")
            if isinstance(end, str) and end < now:
                continue
            if not await matches(self.fhir, active.criteria, resource, rows):
                continue
            access = await self.access_of(active)
            if access is None or not CallerFhir(self.fhir, access).admitted(READ, resource):
                continue
            active.events += 1
            self.delivery.queue(active, active.events, stored)
            queued += 1
        return queued

    async def access_of(self, active: Active) -> Access | None:
        """The subscriber's access now (reused for a few seconds); None when the
        subscriber is gone (no notification then)."""
        if active.identity is None:
            return None
        if active.access is None or active.access_until < time.monotonic():
            try:
                active.access = await self.identity.load(active.identity)
            except FhirError as exc:
                log.info("Subscription/%s: %s", active.id, exc)
                return None
            active.access_until = time.monotonic() + ACCESS_SECONDS
        return active.access

    # -- status ------------------------------------------------------------------------------
    async def record_status(self, *actives: Active) -> None:
        """Keep the counters (at each change of state, and of all at shutdown)."""
        async with self.services.store.unit_of_work() as uow:
            for active in actives:
                uow.put_document(STATUS, active.id, {
                    "id": active.id, "events": active.events, "errors": active.errors,
                    "last_error": active.last_error})
            await uow.commit()

    async def set_state(self, active: Active, status: str, error: str | None) -> None:
        """The Subscription's own status (``active`` / ``error``) and ``error`` text,
        written by the platform so it is versioned and read like any change."""
        current = await self._write_state(active.id, status, error)
        if current is not None:
            active.resource = current

    async def _write_state(self, subscription_id: str, status: str, error: str | None, *,
                           only_from: str | None = None) -> JSON | None:
        """Write the status (and error) as the platform; the new resource, or None when
        there was nothing to change (or it is no longer in ``only_from``)."""
        system = self.system
        current = await system.find_json("Subscription", subscription_id)
        if current is None or current.get("status") == status or (
                only_from is not None and current.get("status") != only_from):
            return None
        current["status"] = status
        current.pop("error", None)
        if error:
            current["error"] = error
        async with system.unit() as unit:
            await unit.update(current)
            await unit.commit()
        return current

