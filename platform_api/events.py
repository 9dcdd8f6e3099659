"""The internal event bus: outbox → transport → consumers → dead letters.

A write and its events are committed together (the outbox rows of a unit of work). The
:class:`EventBus` relays them: after each commit that wrote events it reads what is
pending, hands it to a :class:`Transport`, and marks it dispatched once the transport
holds it. The transport delivers each event to the **consumers** subscribed to its topic,
by name or by pattern (``platform.fhir.*``: ``*`` one dotted token, ``>`` all the rest, as
NATS subjects read).

A consumer (:class:`Subscription`) is a handler with a durable name. Delivery is at least
once, so every consumer is made idempotent on the event id here, once for all
(:class:`Deliveries`): the ``handled_events`` documents (id ``<consumer>:<event id>``)
record what each consumer has handled, durably, so a redelivery after a restart, a
lost acknowledgement or a dead-letter retry is skipped, never handled twice. A handler
whose effect is a store write records its event in the *same* unit of work
(:func:`mark_handled`): then even a crash between the effect and the record cannot make
it handle the event twice.

A handler failure becomes a dead letter document (collection ``dead_letters``: ``id``,
``event_id``, ``topic``, ``original_payload`` as the raw JSON text, ``error``,
``created_at``, and the ``consumer`` that failed) once the transport has no retry left
(in-process at once; NATS after its bounded redeliveries), and so does an event that
cannot be decoded; nothing is dropped. A handler raising :class:`RejectedEvent` (a
malformed body no retry will mend) is dead-lettered at once.

Transports: :class:`InProcessTransport` (the default: consumers in this process, called
as the relay publishes) and the NATS JetStream transport
(:mod:`platform_api.events_nats`, ``HEALTHPLATFORM_EVENT_BUS=nats://host:4222``: several
processes, durable consumers).

Envelope: ``{id, topic, timestamp, source_service, payload}``; ``source_service`` may be
absent (the spec's shorter form).
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from fhir_server.clock import now_instant
from fhir_server.store import ResourceStore
from fhir_server.store.port import UnitOfWork

log = logging.getLogger("healthplatform.events")

Event = dict[str, Any]
Handler = Callable[[Event], Awaitable[None]]
DEAD_LETTERS = "dead_letters"
HANDLED = "handled_events"
REQUIRED_FIELDS = ("id", "topic", "timestamp", "payload")
# A consumer's name is its durable name on NATS too: letters, digits, _ and -.
CONSUMER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,120}$")
# The relay gathers for a moment after a commit wakes it, then moves up to RELAY_BATCH
# events a round: marking events dispatched is a write, which takes the write connection
# between two group commits; once per commit it cost writes a third of their throughput
# (bench/fhir_crud.py, every create and update emitting its resource event).
RELAY_BATCH = 1000
RELAY_GATHER_SECONDS = 0.1


class UndecodableEvent(ValueError):
    """Text that is not an event in the envelope (bad JSON, a missing or mistyped field)."""


class RejectedEvent(Exception):
    """Raised by a handler for an event it can never handle (a malformed body, a
    reference to nothing): dead-lettered at once instead of being retried."""


def topic_matches(pattern: str, topic: str) -> bool:
    """NATS subject matching: ``*`` stands for one dotted token, ``>`` for the rest."""
    if pattern == topic:
        return True
    wanted, given = pattern.split("."), topic.split(".")
    for i, token in enumerate(wanted):
        if token == ">":
            return len(given) > i
        if i >= len(given) or (token != "*" and token != given[i]):
            return False
    return len(wanted) == len(given)


def is_pattern(topic: str) -> bool:
    tokens = topic.split(".")
    return "*" in tokens or ">" in tokens


def check_envelope(event: Any) -> Event:
    """``event`` when it has the envelope's fields with their types; else
    :class:`UndecodableEvent` naming what is wrong. ``source_service`` is optional."""
    if not isinstance(event, dict):
        raise UndecodableEvent("the event is not a JSON object")
    missing = [f for f in REQUIRED_FIELDS if f not in event]
    if missing:
        raise UndecodableEvent("invalid event envelope: missing " + ", ".join(missing))
    wrong = [f for f in ("id", "topic", "timestamp") if not isinstance(event[f], str)]
    if not isinstance(event["payload"], dict):
        wrong.append("payload")
    if "source_service" in event and not isinstance(event["source_service"], str):
        wrong.append("source_service")
    if wrong:
        raise UndecodableEvent("invalid event envelope: wrong type of " + ", ".join(wrong))
    return event


def decode_event(raw: bytes | str) -> Event:
    """The event in ``raw`` JSON text, checked (:class:`UndecodableEvent` otherwise)."""
    try:
        event = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise UndecodableEvent(f"undecodable event: {exc}") from None
    return check_envelope(event)


def raw_text(raw: bytes | str) -> str:
    return raw if isinstance(raw, str) else raw.decode("utf-8", "replace")


@dataclass(frozen=True)
class Subscription:
    """A consumer: ``handler`` for the events of ``pattern``, known as ``consumer``
    (its durable name: what it has handled is recorded under that name)."""

    pattern: str
    handler: Handler
    consumer: str

    def matches(self, topic: str) -> bool:
        return topic_matches(self.pattern, topic)


@dataclass(frozen=True)
class Failure:
    """A handler's failure; ``permanent`` when no retry can mend it."""

    error: str
    permanent: bool = False


HANDLED_NOW, ALREADY_HANDLED = "handled", "already handled"
Outcome = str | Failure


def handled_key(consumer: str, event_id: str) -> str:
    return f"{consumer}:{event_id}"


def handled_record(consumer: str, event: Event) -> dict[str, Any]:
    return {"id": handled_key(consumer, event["id"]), "consumer": consumer,
            "event_id": event["id"], "topic": event.get("topic"), "handled_at": now_instant()}


def mark_handled(uow: UnitOfWork | Any, consumer: str, event: Event) -> None:
    """Record in ``uow`` (a store or FHIR unit of work) that ``consumer`` handled
    ``event``: a handler that writes its effect in that unit makes effect and record one
    commit, so no crash can make it handle the event twice."""
    record = handled_record(consumer, event)
    uow.put_document(HANDLED, record["id"], record)


class Deliveries:
    """The consumer side every transport shares: idempotency on ``(consumer, event id)``
    and dead letters, both in the store."""

    def __init__(self, store: ResourceStore):
        self.store = store

    async def already_handled(self, consumer: str, event_id: str) -> bool:
        return await self.store.get_document(HANDLED, handled_key(consumer, event_id)) \
            is not None

    async def run(self, subscription: Subscription, event: Event) -> Outcome:
        """Hand ``event`` to the consumer unless it has handled it already."""
        if await self.already_handled(subscription.consumer, event["id"]):
            return ALREADY_HANDLED
        try:
            await subscription.handler(event)
        except RejectedEvent as exc:
            return Failure(f"rejected: {exc}", permanent=True)
        except Exception as exc:
            log.warning("consumer %s failed on event %s (%s): %s", subscription.consumer,
                        event["id"], event["topic"], exc)
            return Failure(f"{type(exc).__name__}: {exc}")
        return HANDLED_NOW

    async def record(self, consumer: str, events: Sequence[Event]) -> None:
        """Record that ``consumer`` handled ``events`` (one commit)."""
        if not events:
            return
        async with self.store.unit_of_work() as uow:
            for event in events:
                mark_handled(uow, consumer, event)
            await uow.commit()

    async def dead_letter(self, event: Event | bytes | str, error: str,
                          consumer: str | None = None, *, topic: str | None = None) -> str:
        """Keep a failed event (or undecodable text, kept as it came, under ``topic``
        when known); the entry's id."""
        entry_id = str(uuid.uuid4())
        if isinstance(event, dict):
            original = orjson.dumps(event).decode()
            event_id, topic = event.get("id"), event.get("topic")
        else:
            original, event_id = raw_text(event), None
        async with self.store.unit_of_work() as uow:
            uow.put_document(DEAD_LETTERS, entry_id, {
                "id": entry_id,
                "event_id": event_id if isinstance(event_id, str) else None,
                "topic": topic if isinstance(topic, str) else None,
                "original_payload": original,
                "error": error,
                "consumer": consumer,
                "retry_count": 0,
                "created_at": now_instant(),
            })
            await uow.commit()
        return entry_id


class Transport(Protocol):
    """How events travel from the outbox to their consumers."""

    def subscribe(self, subscription: Subscription) -> None: ...

    async def publish(self, events: Sequence[Event]) -> list[bool]:
        """Take ``events``; returns once the transport holds them (so the relay may mark
        them dispatched), with whether each was delivered without a failure where the
        transport knows it at once (in-process), else True."""
        ...

    async def start(self) -> None: ...
    async def stop(self) -> None: ...


class InProcessTransport:
    """Consumers in this process, called as events are published: each consumer takes
    the batch in order, consumers side by side (a slow one delays only the batch's
    dispatch mark, not the others); a failure becomes a dead letter at once."""

    def __init__(self, deliveries: Deliveries):
        self.deliveries = deliveries
        self._exact: dict[str, list[Subscription]] = defaultdict(list)
        self._patterns: list[Subscription] = []

    def subscribe(self, subscription: Subscription) -> None:
        if is_pattern(subscription.pattern):
            self._patterns.append(subscription)
        else:
            self._exact[subscription.pattern].append(subscription)

    def subscriptions(self, topic: str) -> list[Subscription]:
        return [*self._exact.get(topic, ()), *(s for s in self._patterns if s.matches(topic))]

    async def publish(self, events: Sequence[Event]) -> list[bool]:
        delivered = [True] * len(events)
        batches: dict[Subscription, list[int]] = defaultdict(list)
        for i, event in enumerate(events):
            try:
                check_envelope(event)
            except UndecodableEvent as exc:
                await self.deliveries.dead_letter(event, str(exc))
                delivered[i] = False
                continue
            for subscription in self.subscriptions(event["topic"]):
                batches[subscription].append(i)
        failed = await asyncio.gather(*(self._consume(s, [events[i] for i in indexes])
                                        for s, indexes in batches.items()))
        for indexes, failures in zip(batches.values(), failed, strict=True):
            for i in indexes:
                if events[i]["id"] in failures:
                    delivered[i] = False
        return delivered

    async def _consume(self, subscription: Subscription, events: list[Event]) -> set[str]:
        """Run one consumer over its events in order; the ids that failed."""
        handled, failed = [], set()
        for event in events:
            outcome = await self.deliveries.run(subscription, event)
            if isinstance(outcome, Failure):
                await self.deliveries.dead_letter(event, outcome.error, subscription.consumer)
                failed.add(event["id"])
            elif outcome == HANDLED_NOW:
                handled.append(event)
        await self.deliveries.record(subscription.consumer, handled)
        return failed

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


def consumer_name(handler: Handler) -> str:
    """A durable name from the handler's module and qualified name."""
    where = f"{getattr(handler, '__module__', '')}.{getattr(handler, '__qualname__', '')}"
    return re.sub(r"[^A-Za-z0-9_-]+", "_", where.replace("<locals>.", "")).strip("_")[:120] \
        or "consumer"


class EventBus:
    """The outbox relay, the consumers of this process and the platform's handle on the
    transport."""

    def __init__(self, store: ResourceStore, transport: Transport | None = None):
        self.store = store
        self.deliveries = Deliveries(store)
        self.transport: Transport = transport or InProcessTransport(self.deliveries)
        self.consumers: dict[str, Subscription] = {}
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    def subscribe(self, topic: str, handler: Handler, *, consumer: str | None = None
                  ) -> Subscription:
        """``handler(event)`` for every event of ``topic`` (a name or a pattern), as the
        durable consumer ``consumer`` (default: from the handler's module and name; a
        name already taken by another subscription of this bus gets a number)."""
        name = consumer or consumer_name(handler)
        if not CONSUMER_NAME.match(name):
            raise ValueError(f"consumer name {name!r}: letters, digits, _ and - only")
        if consumer is None:
            base, n = name, 1
            while name in self.consumers:
                n += 1
                name = f"{base}_{n}"
        elif name in self.consumers:
            raise ValueError(f"a consumer named {name!r} is already subscribed")
        subscription = Subscription(topic, handler, name)
        self.consumers[name] = subscription
        self.transport.subscribe(subscription)
        return subscription

    def wake(self) -> None:
        """Called after a commit that wrote outbox rows."""
        self._idle.clear()
        self._wakeup.set()

    async def start(self) -> None:
        await self.transport.start()
        self._task = asyncio.create_task(self._run(), name="event-relay")
        self.wake()  # relay whatever a previous process left in the outbox

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        await self.transport.stop()

    async def drain(self) -> None:
        """Wait until every pending event has been relayed (tests, shutdown)."""
        if self._task is None:
            while await self.dispatch_pending():
                pass
            return
        await self._idle.wait()

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            await asyncio.sleep(RELAY_GATHER_SECONDS)
            self._wakeup.clear()
            try:
                while await self.dispatch_pending():
                    pass
            except Exception:  # the relay must survive a broken store or broker; log it loudly
                log.exception("event relay failed")
                self._wakeup.set()  # try again after the next gathering pause
                await asyncio.sleep(1.0)
                continue
            if not self._wakeup.is_set():
                self._idle.set()

    async def dispatch_pending(self) -> int:
        """Relay one batch of pending outbox events; how many there were."""
        events = await self.store.pending_events(limit=RELAY_BATCH)
        if events:
            await self.transport.publish(events)
            await self.store.mark_dispatched([e["id"] for e in events])
        return len(events)

    async def deliver(self, event: Event) -> bool:
        """Hand one event to this process's consumers of its topic now; failures become
        dead letters. Whether every consumer handled it."""
        try:
            check_envelope(event)
        except UndecodableEvent as exc:
            await self.deliveries.dead_letter(event, str(exc))
            return False
        ok = True
        for subscription in self.subscriptions(event["topic"]):
            outcome = await self.deliveries.run(subscription, event)
            if isinstance(outcome, Failure):
                await self.deliveries.dead_letter(event, outcome.error, subscription.consumer)
                ok = False
            elif outcome == HANDLED_NOW:
                await self.deliveries.record(subscription.consumer, [event])
        return ok

    async def deliver_raw(self, raw: bytes | str) -> bool:
        """Deliver an event received as text (a webhook, a dead letter): undecodable →
        dead letter with the text as it came."""
        try:
            event = decode_event(raw)
        except UndecodableEvent as exc:
            await self.deliveries.dead_letter(raw, str(exc))
            return False
        return await self.deliver(event)

    def subscriptions(self, topic: str) -> list[Subscription]:
        return [s for s in self.consumers.values() if s.matches(topic)]

    async def retry(self, raw: str, consumer: str | None = None) -> str | None:
        """Run a dead letter's event again, in this process: by the consumer that failed
        on it, or (an entry no consumer is named on) by every consumer of its topic here.
        ``None`` once handled, else why it failed again; writes no dead letter."""
        try:
            event = decode_event(raw)
        except UndecodableEvent as exc:
            return str(exc)
        if consumer is not None:
            subscription = self.consumers.get(consumer)
            if subscription is None:
                return f"the consumer {consumer} does not run in this process"
            targets = [subscription]
        else:
            targets = self.subscriptions(event["topic"])
            if not targets:
                return f"no consumer of {event['topic']} runs in this process"
        errors = []
        for subscription in targets:
            outcome = await self.deliveries.run(subscription, event)
            if isinstance(outcome, Failure):
                errors.append(outcome.error)
            elif outcome == HANDLED_NOW:
                await self.deliveries.record(subscription.consumer, [event])
        return "; ".join(errors) or None

    async def dead_letter(self, event: Event, error: str) -> str:
        return await self.deliveries.dead_letter(event, error)


def bus_from_settings(store: ResourceStore, url: str, **options: Any) -> EventBus:
    """The bus for ``HEALTHPLATFORM_EVENT_BUS``: in-process when empty, NATS JetStream for
    ``nats://`` URLs."""
    bus = EventBus(store)
    if not url:
        return bus
    if not url.startswith(("nats://", "tls://")):
        raise ValueError(f"HEALTHPLATFORM_EVENT_BUS: {url!r} is not a nats:// URL")
    from platform_api.events_nats import NatsTransport

    bus.transport = NatsTransport(url, bus.deliveries, **options)
    return bus
