"""The internal event bus (embedded mode): outbox → in-process handlers → dead letters.

A write and its event are committed together (the outbox rows of a unit of work); after
the commit the dispatcher delivers pending events to the subscribed handlers. Handlers
are idempotent on the event id. A handler failure, or an event that cannot be decoded,
becomes a dead letter document (collection ``dead_letters``) instead of being lost.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from fhir_server.clock import now_instant
from fhir_server.store import ResourceStore

log = logging.getLogger("healthplatform.events")

Event = dict[str, Any]
Handler = Callable[[Event], Awaitable[None]]
DEAD_LETTERS = "dead_letters"
REQUIRED_FIELDS = ("id", "topic", "timestamp", "payload")


class EventBus:
    def __init__(self, store: ResourceStore):
        self.store = store
        self._handlers: dict[str, list[Handler]] = defaultdict(list)
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    def subscribe(self, topic: str, handler: Handler) -> None:
        self._handlers[topic].append(handler)

    def wake(self) -> None:
        """Called after a commit that wrote outbox rows."""
        self._idle.clear()
        self._wakeup.set()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="event-dispatcher")
        self.wake()  # deliver whatever a previous process left in the outbox

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def drain(self) -> None:
        """Wait until every pending event has been handled (tests, shutdown)."""
        if self._task is None:
            await self.dispatch_pending()
            return
        await self._idle.wait()

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            try:
                while await self.dispatch_pending():
                    pass
            except Exception:  # the loop must survive a broken store call; log it loudly
                log.exception("event dispatch failed")
            if not self._wakeup.is_set():
                self._idle.set()

    async def dispatch_pending(self) -> int:
        events = await self.store.pending_events(limit=100)
        for event in events:
            await self.deliver(event)
        if events:
            await self.store.mark_dispatched([e["id"] for e in events])
        return len(events)

    async def deliver(self, event: Event) -> bool:
        """Run every handler of the event's topic; failures become dead letters."""
        missing = [f for f in REQUIRED_FIELDS if f not in event]
        if missing:
            await self.dead_letter(event, f"invalid event envelope: missing {', '.join(missing)}")
            return False
        ok = True
        for handler in self._handlers.get(event["topic"], ()):
            try:
                await handler(event)
            except Exception as exc:
                log.warning("handler %s failed on %s: %s", getattr(handler, "__name__", handler),
                            event["id"], exc)
                await self.dead_letter(event, f"{type(exc).__name__}: {exc}")
                ok = False
        return ok

    async def deliver_raw(self, raw: bytes | str) -> bool:
        """Deliver an event received as text (webhooks, a broker): undecodable → dead letter."""
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
