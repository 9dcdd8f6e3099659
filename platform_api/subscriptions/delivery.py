"""Delivering notifications: one queue and one worker per subscription, in the background.

The matcher only queues (:meth:`Deliveries.queue`), so a write never waits for an
endpoint. Each subscription's notifications go out in order, by its own worker; at most
``subscription_max_concurrent_deliveries`` requests are in flight in all (the client's
connection limit), so a failing endpoint holds its own worker and one connection, never
another subscription's queue.

- **rest-hook** (R4): with no ``payload``, a POST with an empty body to the endpoint; with
  a ``payload`` mime type, the resource is PUT to ``[endpoint]/[type]/[id]``; with the
  backport's payload content extension (``empty`` | ``id-only`` | ``full-resource``), a
  POST of the backport notification Bundle. ``channel.header`` lines are sent as headers.
  A refused delivery (a network error, a timeout, a status other than 2xx) is retried
  with exponential back-off (``subscription_delivery_attempts``,
  ``subscription_retry_seconds``, doubling, at most a minute apart); after the last
  attempt the Subscription turns ``error`` with the reason in ``error`` and its error
  count goes up; the next delivery that succeeds turns it ``active`` again.
- **websocket**: the notification Bundle goes to each connection bound to the
  subscription (``bind-with-token``); with none bound it is not kept (the websocket
  channel is live only).
- **the rest-hook handshake** (backport IG, channels: "After a successful handshake
  notification has been sent and accepted, the server SHALL update the status to active.
  Any errors in the initial handshake SHALL result in the status being changed to
  error"): once a ``requested`` rest-hook is committed, a POST of a ``handshake``
  notification Bundle (status ``requested``, no event) to the endpoint, with its headers
  and the same retries; an R4 subscription without a payload gets an empty POST, as each
  of its notifications is. A 2xx answer activates it, anything else turns it ``error``
  (:meth:`Subscriptions.conclude_handshake`).

Queues are in memory, at most ``subscription_queue_limit`` notifications a subscription
(past it the oldest is dropped and counted as an error). A notification still queued when
the process stops is not sent: a notification is a hint to re-read (R4), and the
backport's ``events-since-subscription-start`` lets a client see it missed some.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from fhir_server.store import StoredResource
from platform_api.outbound import GuardedSession, OutboundError
from platform_api.settings import Settings
from platform_api.subscriptions.criteria import headers_of, payload_content
from platform_api.subscriptions.notifications import notification_bundle, status_parameters
from platform_api.subscriptions.service import Active, Subscriptions

JSON = dict[str, Any]

log = logging.getLogger("healthplatform.subscriptions")
FHIR_JSON = "application/fhir+json"
MAX_BACKOFF = 60.0
ANSWER_BYTES = 64 * 1024  # what is read of an endpoint's answer (it is not used)


@dataclass(frozen=True, slots=True)
class Notification:
    active: Active
    number: int
    stored: StoredResource


class Deliveries:
    def __init__(self, subscriptions: Subscriptions, settings: Settings, base_url: str):
        self.subscriptions = subscriptions
        self.settings = settings
        self.base_url = base_url  # the FHIR base the notifications name (…/fhir)
        self._queues: dict[str, deque[Notification]] = {}
        self._wakeups: dict[str, asyncio.Event] = {}
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._handshakes: dict[str, asyncio.Task[None]] = {}
        self._client: GuardedSession | None = None
        self.delivered = 0  # notifications sent (counted for the bench and the tests)

    async def start(self) -> None:
        # aiohttp rather than httpx here: measured with bench/subscriptions.py, httpx's
        # pool bookkeeping took 60% of the server's CPU at ~200 notifications/s.
        # Through the outbound guard: every connection's address is checked when it is
        # made, so a name that resolved nowhere (or somewhere public) when the
        # Subscription was written cannot later post inside the network.
        self._client = self.subscriptions.outbound().session(
            timeout=self.settings.subscription_timeout_seconds,
            limit=self.settings.subscription_max_concurrent_deliveries,
            skip_auto_headers=("Content-Type",))

    async def stop(self) -> None:
        workers = [*self._workers.values(), *self._handshakes.values()]
        for worker in workers:
            worker.cancel()
        for worker in workers:
            with contextlib.suppress(asyncio.CancelledError):
                await worker
        self._workers.clear()
        self._handshakes.clear()
        if self._client is not None:
            await self._client.close()

    def queue(self, active: Active, number: int, stored: StoredResource) -> None:
        queue = self._queues.setdefault(active.id, deque())
        if len(queue) >= self.settings.subscription_queue_limit:
            queue.popleft()
            active.errors += 1
            active.last_error = "The queue was full: a notification was dropped"
        queue.append(Notification(active, number, stored))
        self._wakeups.setdefault(active.id, asyncio.Event()).set()
        if active.id not in self._workers:
            task = asyncio.get_running_loop().create_task(self._work(active.id))
            self._workers[active.id] = task
            task.add_done_callback(functools.partial(self._ended, active.id))

    def _ended(self, subscription_id: str, _: object) -> None:
        self._workers.pop(subscription_id, None)

    def pending(self) -> int:
        return sum(len(q) for q in self._queues.values())

    async def _work(self, subscription_id: str) -> None:
        queue, wakeup = self._queues[subscription_id], self._wakeups[subscription_id]
        while True:
            if not queue:
                wakeup.clear()
                try:
                    await asyncio.wait_for(wakeup.wait(), timeout=60)
                except TimeoutError:  # idle a minute: the worker ends (another comes)
                    if not queue:
                        return
            notification = queue.popleft()
            try:
                await self._deliver(notification)
            except Exception:  # a bug must not end the subscription's deliveries
                log.exception("Subscription/%s: delivery failed", subscription_id)

    async def _deliver(self, notification: Notification) -> None:
        active = notification.active
        if active.channel.get("type") == "websocket":
            await self._to_sockets(notification)
            return
        await self._settle(active, await self._with_retries(
            functools.partial(self._post, notification)))

    async def _with_retries(self, attempt: Callable[[], Awaitable[str | None]]
                            ) -> str | None:
        """``attempt`` until it succeeds or the attempts run out (back-off doubling);
        the reason the last one failed, or None."""
        error: str | None = None
        delay = self.settings.subscription_retry_seconds
        for number in range(self.settings.subscription_delivery_attempts):
            if number:
                await asyncio.sleep(min(delay, MAX_BACKOFF))
                delay *= 2
            error = await attempt()
            if error is None:
                break
        return error

    async def _post(self, notification: Notification) -> str | None:
        """One attempt; the reason it failed, or None."""
        active, stored = notification.active, notification.stored
        endpoint = str(active.channel.get("endpoint"))
        headers = headers_of(active.resource)
        content = payload_content(active.resource)
        payload = active.channel.get("payload")
        if content is not None:
            body = orjson.dumps(self.bundle(notification, content))
            method, url = "POST", endpoint
            headers["Content-Type"] = FHIR_JSON
        elif payload:
            body, method = stored.body, "PUT"
            url = f"{endpoint.rstrip('/')}/{stored.resource_type}/{stored.id}"
            headers["Content-Type"] = str(payload)
        else:
            body, method, url = b"", "POST", endpoint
        return await self._request(method, url, body, headers)

    async def _request(self, method: str, url: str, body: bytes, headers: dict[str, str]
                       ) -> str | None:
        assert self._client is not None
        try:
            status, _ = await self._client.request(method, url, data=body, headers=headers,
                                                   max_bytes=ANSWER_BYTES)
        except OutboundError as exc:  # the subscriber sees no more than this (issue 32)
            log.info("rest-hook %s: %s", url, exc.reason)
            return "The endpoint could not be reached or did not answer"
        if not 200 <= status < 300:
            return f"The endpoint answered {status}"
        return None

    # -- the handshake -----------------------------------------------------------------------
    def start_handshake(self, subscription: JSON) -> None:
        """Send a requested rest-hook's handshake in the background (one at a time each)."""
        subscription_id = str(subscription["id"])
        if subscription_id in self._handshakes:
            return
        task = asyncio.get_running_loop().create_task(self._handshake(subscription))
        self._handshakes[subscription_id] = task
        task.add_done_callback(lambda _: self._handshakes.pop(subscription_id, None))

    async def _handshake(self, subscription: JSON) -> None:
        try:
            error = await self._with_retries(
                functools.partial(self._send_handshake, subscription))
            await self.subscriptions.conclude_handshake(str(subscription["id"]), error)
        except Exception:  # the next start or a client's new request tries again
            log.exception("Subscription/%s: the handshake failed", subscription["id"])

    def handshake_body(self, subscription: JSON) -> bytes:
        """The handshake notification Bundle of ``subscription`` (still ``requested``)."""
        content = payload_content(subscription) or "id-only"
        status = status_parameters(subscription, self.base_url, "handshake", 0, 0, None,
                                   content=content, status="requested")
        return orjson.dumps(notification_bundle(status, self.base_url))

    async def _send_handshake(self, subscription: JSON) -> str | None:
        channel = subscription.get("channel") or {}
        headers = headers_of(subscription)
        body = b""
        if payload_content(subscription) is not None or channel.get("payload"):
            body = self.handshake_body(subscription)
            headers["Content-Type"] = FHIR_JSON
        return await self._request("POST", str(channel.get("endpoint")), body, headers)

    def bundle(self, notification: Notification, content: str) -> dict[str, Any]:
        active = notification.active
        status = status_parameters(active.resource, self.base_url, "event-notification",
                                   active.events, active.errors, active.last_error,
                                   (notification.number, notification.stored), content)
        return notification_bundle(status, self.base_url, notification.stored, content)

    async def _to_sockets(self, notification: Notification) -> None:
        active = notification.active
        content = payload_content(active.resource) or (
            "full-resource" if active.channel.get("payload") else "id-only")
        text = orjson.dumps(self.bundle(notification, content)).decode()
        for socket in list(active.sockets):
            try:
                await socket.send_text(text)
                self.delivered += 1
            except Exception:  # the client went: unbind it
                active.sockets.discard(socket)

    async def _settle(self, active: Active, error: str | None) -> None:
        """Count the outcome and move the Subscription between active and error."""
        if error is None:
            self.delivered += 1
            if active.resource.get("status") == "error":
                await self.subscriptions.set_state(active, "active", None)
                await self.subscriptions.record_status(active)
            return
        active.errors += 1
        active.last_error = error
        log.warning("Subscription/%s: delivery failed after %d attempts: %s", active.id,
                    self.settings.subscription_delivery_attempts, error)
        await self.subscriptions.set_state(active, "error", error)
        await self.subscriptions.record_status(active)
