"""The internal event bus: outbox → transport → handlers → dead letters.

A write and its events are committed together (the outbox rows of a unit of work). The
:class:`EventBus` relays them: after each commit that wrote events it reads what is
pending, hands it to a :class:`Transport`, and marks it dispatched once the transport has
it. The transport delivers each event to the handlers subscribed to its topic, by name
or by pattern (``platform.fhir.*``: ``*`` one dotted token, ``>`` all the rest, as NATS
subjects read). Handlers are idempotent on the event id. A handler failure, or an event
that cannot be decoded, becomes a dead letter document (collection ``dead_letters``)
instead of being lost.

Transports: :class:`InProcessTransport` (the default: handlers in this process, called
as the relay publishes); a NATS JetStream transport (several processes, durable
consumers) plugs into the same port.

Envelope: ``{id, topic, timestamp, source_service, payload}``; ``source_service`` may be
absent (the spec's shorter form).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import orjson

from fhir_server.clock import now_instant
from fhir_server.store import ResourceStore

log = logging.getLogger("healthplatform.events")

Event = dict[str, Any]
Handler = Callable[[Event], Awaitable[None]]
DeadLetter = Callable[[Event, str], Awaitable[str]]
DEAD_LETTERS = "dead_letters"
REQUIRED_FIELDS = ("id", "topic", "timestamp", "payload")
# The relay gathers for a moment after a commit wakes it, then moves up to RELAY_BATCH
# events a round: marking events dispatched is a write, which takes the write connection
# between two group commits; once per commit it cost writes a third of their throughput
# (bench/fhir_crud.py, every create and update emitting its resource event).
RELAY_BATCH = 1000
RELAY_GATHER_SECONDS = 0.1


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


class Transport(Protocol):
    """How events travel from the outbox to their handlers."""

    def subscribe(self, pattern: str, handler: Handler) -> None: ...

    async def publish(self, events: Sequence[Event]) -> list[bool]:
        """Take ``events``; returns once the transport holds them (so the relay may mark
        them dispatched), with whether each was delivered without a failure where the
        transport knows it at once (in-process), else True."""
        ...

    async def start(self) -> None: ...
    async def stop(self) -> None: ...


class InProcessTransport:
    """Handlers in this process, called as events are published; a failing handler's
    event becomes a dead letter (``dead_letter(event, error)``)."""

    def __init__(self, dead_letter: DeadLetter):
        self.dead_letter = dead_letter
        self._exact: dict[str, list[Handler]] = defaultdict(list)
        self._patterns: list[tuple[str, Handler]] = []

    def subscribe(self, pattern: str, handler: Handler) -> None:
        if "*" in pattern.split(".") or ">" in pattern.split("."):
            self._patterns.append((pattern, handler))
        else:
            self._exact[pattern].append(handler)

    def handlers(self, topic: str) -> list[Handler]:
        return [*self._exact.get(topic, ()),
                *(h for p, h in self._patterns if topic_matches(p, topic))]

    async def publish(self, events: Sequence[Event]) -> list[bool]:
        return [await self.deliver(event) for event in events]

    async def deliver(self, event: Event) -> bool:
        """Run every handler of the event's topic; failures become dead letters."""
        missing = [f for f in REQUIRED_FIELDS if f not in event]
        if missing:
            await self.dead_letter(event, "invalid event envelope: missing "
                                   + ", ".join(missing))
            return False
        ok = True
        for handler in self.handlers(event["topic"]):
            try:
                await handler(event)
            except Exception as exc:
                log.warning("handler %s failed on %s: %s", getattr(handler, "__name__", handler),
                            event["id"], exc)
                await self.dead_letter(event, f"{type(exc).__name__}: {exc}")
                ok = False
        return ok

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


class EventBus:
    """The outbox relay and the platform's handle on the transport."""

    def __init__(self, store: ResourceStore, transport: Transport | None = None):
        self.store = store
        self.transport: Transport = transport or InProcessTransport(self.dead_letter)
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    def subscribe(self, topic: str, handler: Handler) -> None:
        """``handler(event)`` for every event of ``topic`` (a name or a pattern)."""
        self.transport.subscribe(topic, handler)

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
            except Exception:  # the relay must survive a broken store call; log it loudly
                log.exception("event relay failed")
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
        """Hand one event to the transport now (a retried dead letter); whether it was
        delivered without a failure."""
        return (await self.transport.publish([event]))[0]

    async def deliver_raw(self, raw: bytes | str) -> bool:
        """Deliver an event received as text (webhooks, a broker, a dead letter):
        undecodable → dead letter."""
        try:
            event = orjson.loads(raw)
            if not isinstance(event, dict):
                raise ValueError("the event is not a JSON object")
        except (orjson.JSONDecodeError, ValueError) as exc:
            await self.dead_letter({"raw": raw if isinstance(raw, str) else raw.decode(
                "utf-8", "replace")}, f"undecodable event: {exc}")
            return False
        return await self.deliver(event)

    async def dead_letter(self, event: Event, error: str) -> str:
        entry_id = str(uuid.uuid4())
        original = event.get("raw") if set(event) == {"raw"} else orjson.dumps(event).decode()
        async with self.store.unit_of_work() as uow:
            uow.put_document(DEAD_LETTERS, entry_id, {
                "id": entry_id,
                "event_id": event.get("id"),
                "topic": event.get("topic"),
                "original_payload": original,
                "error": error,
                "created_at": now_instant(),
            })
            await uow.commit()
        return entry_id
