"""The NATS JetStream transport of the event bus (``HEALTHPLATFORM_EVENT_BUS=nats://…``).

**Streams**: one per topic prefix (``platform.<area>``): topic ``platform.fhir.
resource_created`` is the subject ``platform.fhir.resource_created`` of the stream
``PLATFORM_FHIR`` (subjects ``platform.fhir.>``), file storage, kept
``stream_max_age`` (events are replayable by a consumer created later within that time),
with a duplicate window: each event is published with ``Nats-Msg-Id`` = its event id, so
the relay publishing it again (a crash between the publish and the outbox mark) stores it
once. A ``namespace`` prefixes subjects and stream names (``<ns>.platform…``,
``<NS>_PLATFORM_…``), so several deployments, or parallel tests, share one server. The
streams of :data:`AREAS` are made at start (a wide subscription such as ``platform.>``
attaches to each); a topic of another area gets its stream when first published.

**Consumers**: every subscription is a durable pull consumer (its name is the
subscription's consumer name) on each stream its pattern reaches, with explicit acks.
Processes subscribing the same consumer share its work. A message is acknowledged only
once its event is handled and recorded (``handled_events``), or dead-lettered. A failure
is redelivered after a back-off (``nak`` with the delay of ``backoff[attempt]``) until
``max_attempts`` deliveries; then the event becomes a dead letter. The server itself
never gives up on a message (``max_deliver`` unbounded): a consumer process that crashes
mid-handler gets it again after ``ack_wait``, rather than the server dropping it
silently. While a handler runs, the message is kept in progress (``+WPI``) so a slow
handler is not redelivered to another process meanwhile. A message that is not an event
(undecodable, a missing envelope field) is dead-lettered with its raw text.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import nats
import orjson
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType, StreamConfig

from platform_api.events import (
    HANDLED_NOW,
    Deliveries,
    Event,
    Failure,
    Subscription,
    UndecodableEvent,
    check_envelope,
    decode_event,
)

log = logging.getLogger("healthplatform.events.nats")

# The areas whose topics the platform publishes (README: Events). Their streams exist
# from the start, so a subscription to a wide pattern reaches them all.
AREAS = (
    "platform.fhir", "platform.auth", "platform.organization", "platform.lab", "platform.hl7",
    "platform.appointment", "platform.prescription", "platform.clinical_record",
    "platform.workforce", "platform.video", "platform.webhook", "platform.billing",
    "platform.gtm", "platform.payments",
)
FETCH_BATCH = 16
FETCH_WAIT_SECONDS = 5.0
PUBLISH_TIMEOUT_SECONDS = 10.0


def area_of(topic: str) -> str:
    """The topic's prefix that names its stream: its first two tokens."""
    return ".".join(topic.split(".")[:2])


@dataclass
class NatsTransport:
    url: str
    deliveries: Deliveries
    namespace: str = ""
    max_attempts: int = 5
    backoff: Sequence[float] = (1.0, 5.0, 30.0, 120.0)
    ack_wait: float = 30.0
    stream_max_age: float = 7 * 24 * 3600.0
    duplicate_window: float = 120.0
    fetch_batch: int = FETCH_BATCH
    _nc: NatsClient | None = None
    _js: JetStreamContext | None = None
    _subscriptions: list[Subscription] = field(default_factory=list)
    _streams: set[str] = field(default_factory=set)  # areas whose stream exists
    _attached: set[tuple[str, str]] = field(default_factory=set)  # (consumer, area)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.namespace and not re.fullmatch(r"[A-Za-z0-9_-]+", self.namespace):
            raise ValueError(f"event bus namespace {self.namespace!r}: letters, digits, _ "
                             "and - only")
        if self.max_attempts < 1:
            raise ValueError("event bus max_attempts must be at least 1")

    # -- names ---------------------------------------------------------------------------
    def subject(self, topic: str) -> str:
        return f"{self.namespace}.{topic}" if self.namespace else topic

    def stream_name(self, area: str) -> str:
        name = f"{self.namespace}_{area}" if self.namespace else area
        return re.sub(r"[^A-Za-z0-9_-]", "_", name).upper()

    def filter_subject(self, pattern: str, area: str) -> str | None:
        """The part of ``area``'s stream that ``pattern`` reaches, as a subject filter;
        ``None`` when it reaches none of it."""
        wanted, prefix = pattern.split("."), area.split(".")
        for i, token in enumerate(prefix):
            if i >= len(wanted):
                return None
            if wanted[i] == ">":
                return self.subject(area + ".>")
            if wanted[i] not in ("*", token):
                return None
        rest = wanted[len(prefix):]
        return self.subject(".".join([*prefix, *rest])) if rest else self.subject(area)

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        self._nc = await nats.connect(self.url, name="healthplatform",
                                      max_reconnect_attempts=-1, connect_timeout=5)
        self._js = self._nc.jetstream(timeout=PUBLISH_TIMEOUT_SECONDS)
        for area in AREAS:
            await self._ensure_stream(area)  # attaches the subscriptions it concerns

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        self._attached.clear()
        self._streams.clear()
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.drain()
            self._nc = self._js = None

    def subscribe(self, subscription: Subscription) -> None:
        self._subscriptions.append(subscription)
        if self._js is not None:
            task = asyncio.get_running_loop().create_task(self._attach(subscription))
            self._tasks.append(task)

    # -- publishing -----------------------------------------------------------------------
    async def publish(self, events: Sequence[Event]) -> list[bool]:
        js = self._jetstream()
        acks = []
        for event in events:
            try:
                check_envelope(event)
            except UndecodableEvent as exc:
                await self.deliveries.dead_letter(event, str(exc))
                continue
            area = area_of(event["topic"])
            if area not in self._streams:
                await self._ensure_stream(area)
            acks.append(await js.publish_async(
                self.subject(event["topic"]), orjson.dumps(event),
                headers={"Nats-Msg-Id": event["id"]}, stream=self.stream_name(area)))
        # The relay marks the events dispatched only once the server has stored each.
        await asyncio.wait_for(asyncio.gather(*acks), PUBLISH_TIMEOUT_SECONDS)
        return [True] * len(events)

    # -- streams and consumers ------------------------------------------------------------
    def _jetstream(self) -> JetStreamContext:
        if self._js is None:
            raise RuntimeError("the NATS transport is not started")
        return self._js

    async def _ensure_stream(self, area: str) -> None:
        js = self._jetstream()
        config = StreamConfig(
            name=self.stream_name(area), subjects=[self.subject(area), self.subject(area + ".>")],
            storage=StorageType.FILE, max_age=self.stream_max_age,
            duplicate_window=self.duplicate_window)
        try:
            await js.add_stream(config)
        except nats.js.errors.BadRequestError:
            await js.update_stream(config)  # exists with other limits: take ours
        self._streams.add(area)
        for subscription in self._subscriptions:
            if (subscription.consumer, area) not in self._attached and \
                    self.filter_subject(subscription.pattern, area) is not None:
                await self._attach_to(subscription, area)

    async def _attach(self, subscription: Subscription) -> None:
        for area in sorted(self._streams):
            if self.filter_subject(subscription.pattern, area) is not None:
                await self._attach_to(subscription, area)

    async def _attach_to(self, subscription: Subscription, area: str) -> None:
        key = (subscription.consumer, area)
        if key in self._attached:
            return
        self._attached.add(key)
        js, stream = self._jetstream(), self.stream_name(area)
        config = ConsumerConfig(
            durable_name=subscription.consumer, ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL, ack_wait=self.ack_wait, max_deliver=-1,
            filter_subject=self.filter_subject(subscription.pattern, area),
            max_ack_pending=1000)
        try:
            await js.add_consumer(stream, config)
        except nats.js.errors.BadRequestError:
            # It exists with another configuration (e.g. an older ack_wait): replace it
            # would lose its position; keep it, it still delivers with explicit acks.
            log.warning("consumer %s on %s exists with another configuration; kept",
                        subscription.consumer, stream)
        pull = await js.pull_subscribe_bind(subscription.consumer, stream)
        self._tasks.append(asyncio.get_running_loop().create_task(
            self._pull(subscription, pull), name=f"nats-{subscription.consumer}-{area}"))

    async def _pull(self, subscription: Subscription,
                    pull: JetStreamContext.PullSubscription) -> None:
        while True:
            try:
                messages = await pull.fetch(self.fetch_batch, timeout=FETCH_WAIT_SECONDS)
            except (TimeoutError, nats.errors.TimeoutError):
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a broken connection: nats-py reconnects; wait for it
                log.warning("fetching for %s failed: %s", subscription.consumer, exc)
                await asyncio.sleep(1.0)
                continue
            for message in messages:
                try:
                    await self._consume(subscription, message)
                except asyncio.CancelledError:
                    raise
                except Exception:  # not acknowledged: redelivered after ack_wait
                    log.exception("consumer %s could not settle a message",
                                  subscription.consumer)

    async def _consume(self, subscription: Subscription, message: Msg) -> None:
        deliveries = self.deliveries
        try:
            event = decode_event(message.data)
        except UndecodableEvent as exc:
            await deliveries.dead_letter(message.data, str(exc), subscription.consumer)
            await message.ack()
            return
        attempt = message.metadata.num_delivered
        outcome = await self._run_kept_in_progress(subscription, event, message)
        if isinstance(outcome, Failure):
            if outcome.permanent or attempt >= self.max_attempts:
                await deliveries.dead_letter(event, f"{outcome.error} (after {attempt} "
                                             f"deliver{'y' if attempt == 1 else 'ies'})",
                                             subscription.consumer)
                await message.ack()
            else:
                delay = self.backoff[min(attempt, len(self.backoff)) - 1] if self.backoff \
                    else 0
                await message.nak(delay=delay)
            return
        if outcome == HANDLED_NOW:
            await deliveries.record(subscription.consumer, [event])
        await message.ack()

    async def _run_kept_in_progress(self, subscription: Subscription, event: Event,
                                    message: Msg) -> str | Failure:
        async def keep_alive() -> None:
            while True:
                await asyncio.sleep(max(self.ack_wait / 3, 0.1))
                await message.in_progress()

        alive = asyncio.get_running_loop().create_task(keep_alive())
        try:
            return await self.deliveries.run(subscription, event)
        finally:
            alive.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await alive


__all__ = ["AREAS", "NatsTransport", "area_of"]
