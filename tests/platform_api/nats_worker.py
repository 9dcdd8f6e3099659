"""A consumer process for the NATS transport's tests (run as ``python -m
tests.platform_api.nats_worker``): it consumes ``platform.appointment.>`` as the durable
consumer ``--consumer``, writing one ``deliveries`` document per handling together with
its handled record (one unit of work), and with ``--crash-after N`` dies abruptly
(``os._exit``) right after the N-th handling has committed, before acknowledging it, as a
process killed mid-stream would."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import uuid
from typing import Any

from fhir_server.store import store_from_url
from platform_api.events import EventBus, mark_handled
from platform_api.events_nats import NatsTransport

CRASHED = 3


async def main(args: argparse.Namespace) -> None:
    store = store_from_url(args.store)
    await store.open()
    bus = EventBus(store)
    bus.transport = NatsTransport(args.nats, bus.deliveries, namespace=args.namespace,
                                  ack_wait=args.ack_wait, backoff=(0.2,))
    handled = 0

    async def remind(event: dict[str, Any]) -> None:
        nonlocal handled
        async with store.unit_of_work() as uow:
            uow.put_document("deliveries", f"{event['id']}:{uuid.uuid4()}",
                             {"event_id": event["id"], "pid": os.getpid()})
            mark_handled(uow, args.consumer, event)
            await uow.commit()
        handled += 1
        if handled == args.crash_after:
            os._exit(CRASHED)
    bus.subscribe("platform.appointment.>", remind, consumer=args.consumer)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await bus.transport.start()
    print("ready", flush=True)
    await stop.wait()
    await bus.transport.stop()
    await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--nats", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--consumer", required=True)
    parser.add_argument("--ack-wait", type=float, default=1.0)
    parser.add_argument("--crash-after", type=int, default=0)
    asyncio.run(main(parser.parse_args()))
