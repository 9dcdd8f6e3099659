"""Webhook acknowledgements under load, and events delivered through the bus.

1. **Acknowledgements.** Starts the server (uvicorn with uvloop and httptools, as
   ``make run`` does; fresh SQLite store) with a deliberately slow consumer of
   ``platform.workforce.leave_approved`` (each event takes ``--slow-ms``, 50 ms: it
   handles 20 a second) and sends signed ``POST /api/workforce/webhooks/leave-approved``
   requests (Standard Webhooks signatures, a new ``webhook-id`` each) at a fixed rate
   (``--rate``, 200/s) for ``--seconds``, open loop: each request leaves at its scheduled
   time whether the earlier ones were answered or not, and its latency counts from that
   time. The server sits behind a "proxy" on loopback (``HEALTHPLATFORM_TRUSTED_PROXIES``
   = 127.0.0.1, ``X-Forwarded-Proto: https``) as a TLS-terminating load balancer would put
   it. Reports acknowledgements/s, p50/p99/max acknowledgement latency, and how far behind
   the slow consumer was when the load stopped (the work the answers did not wait for).
2. **Events delivered/s** end to end, outbox commit → relay → transport → consumer (its
   handled-event record included), for ``--events`` events emitted in commits of 500:
   through the in-process transport, and through NATS JetStream on 127.0.0.1:4222 (a
   namespace of its own, deleted afterwards; ``null`` when no NATS server answers).

Prints one JSON line. Usage: ``python bench/webhooks.py [--rate 200] [--seconds 15]
[--slow-ms 50] [--events 20000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
from standardwebhooks import Webhook

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SECRET = "whsec_" + base64.b64encode(b"bench-leave-approved-signing-key").decode()
NATS_URL = "nats://127.0.0.1:4222"
PATH = "/api/workforce/webhooks/leave-approved"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


# -- the server, with its slow consumer (run as a child process) ----------------------------
def serve(port: int, slow_ms: float) -> None:
    import uvicorn

    from platform_api.app import create_app
    from platform_api.settings import Settings

    app = create_app(Settings())
    handled = 0

    async def slow_roster_update(event: dict[str, Any]) -> None:
        nonlocal handled
        await asyncio.sleep(slow_ms / 1000)  # a roster service that takes its time
        handled += 1
    app.state.services.bus.subscribe("platform.workforce.leave_approved", slow_roster_update,
                                     consumer="slow_rosters")

    from starlette.responses import JSONResponse

    async def backlog(request: Any) -> JSONResponse:
        return JSONResponse({"handled": handled})
    app.add_route("/bench/handled", backlog)
    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools",
                access_log=False, log_level="warning", log_config=None)


def start_server(data_dir: str, slow_ms: float) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "HEALTHPLATFORM_DATA_DIR": data_dir,
           "HEALTHPLATFORM_LEAVE_WEBHOOK_SECRET": SECRET,
           "HEALTHPLATFORM_TRUSTED_PROXIES": '["127.0.0.1"]',
           "HEALTHPLATFORM_RATE_LIMITS": json.dumps({"webhook": "100000000/60"}),
           "HEALTHPLATFORM_ACCESS_LOG": "false", "HEALTHPLATFORM_LOG_LEVEL": "ERROR",
           "HEALTHPLATFORM_HOUSEKEEPING_INTERVAL_SECONDS": "0"}
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--slow-ms",
                               str(slow_ms)], env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                return server, base
        except httpx.HTTPError:
            time.sleep(0.1)
    server.kill()
    raise SystemExit("the server did not start")


def signed_requests(count: int) -> list[tuple[bytes, dict[str, str]]]:
    signer = Webhook(SECRET)
    prepared = []
    for n in range(count):
        body = orjson.dumps({
            "leave_request_id": f"LR-BENCH-{n}", "organization_id": "org-kibera",
            "user_id": f"user-{n % 40}", "start": "2026-12-01", "end": "2026-12-05",
            "type": "annual", "approved_by": "user-admin"})
        webhook_id = f"msg_{uuid.uuid4().hex}"
        at = datetime.now(UTC)
        prepared.append((body, {
            "webhook-id": webhook_id, "webhook-timestamp": str(int(at.timestamp())),
            "webhook-signature": signer.sign(webhook_id, at, body.decode()),
            "Content-Type": "application/json", "X-Forwarded-Proto": "https"}))
    return prepared


async def acknowledgements(base: str, rate: float, seconds: float) -> dict[str, Any]:
    requests = signed_requests(int(rate * seconds))
    latencies: list[float] = []
    failures: dict[str, int] = {}
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as client:
        await client.get("/healthz")  # warm a connection
        start = time.perf_counter() + 0.2

        async def one(n: int, body: bytes, headers: dict[str, str]) -> None:
            scheduled = start + n / rate
            await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
            try:
                response = await client.post(PATH, content=body, headers=headers)
            except httpx.HTTPError as exc:
                failures[type(exc).__name__] = failures.get(type(exc).__name__, 0) + 1
                return
            if response.status_code == 200:
                latencies.append(time.perf_counter() - scheduled)
            else:
                failures[str(response.status_code)] = failures.get(
                    str(response.status_code), 0) + 1

        await asyncio.gather(*(one(n, b, h) for n, (b, h) in enumerate(requests)))
        elapsed = time.perf_counter() - start
        handled = (await client.get("/bench/handled")).json()["handled"]
    return {"rate_offered": rate, "requests": len(requests), "acknowledged": len(latencies),
            "failed": failures, "acks_per_second": round(len(latencies) / elapsed, 1),
            "ack_p50_ms": round(percentile(latencies, 50) * 1000, 2),
            "ack_p99_ms": round(percentile(latencies, 99) * 1000, 2),
            "ack_max_ms": round(max(latencies) * 1000, 2),
            "slow_consumer_handled_when_load_stopped": handled}


# -- events delivered through the bus ------------------------------------------------------------
async def delivered_per_second(count: int, nats_url: str | None) -> float:
    from fhir_server.store import store_from_url
    from platform_api.events import EventBus

    with tempfile.TemporaryDirectory() as tmp:
        store = store_from_url(f"sqlite:///{tmp}/bus.db")
        await store.open()
        bus = EventBus(store)
        namespace = "bench" + uuid.uuid4().hex[:8]
        if nats_url:
            from platform_api.events_nats import NatsTransport

            bus.transport = NatsTransport(nats_url, bus.deliveries, namespace=namespace,
                                          fetch_batch=256)
        store.add_outbox_listener(bus.wake)
        done, handled = asyncio.Event(), 0

        async def count_reminders(event: dict[str, Any]) -> None:
            nonlocal handled
            handled += 1
            if handled == count:
                done.set()
        bus.subscribe("platform.appointment.booked", count_reminders, consumer="reminders")
        await bus.start()
        try:
            start = time.perf_counter()
            for first in range(0, count, 500):
                async with store.unit_of_work() as uow:
                    for n in range(first, min(first + 500, count)):
                        uow.emit("platform.appointment.booked", {"appointment_id": f"a-{n}"},
                                 source_service="scheduling")
                    await uow.commit()
            await asyncio.wait_for(done.wait(), 600)
            return round(count / (time.perf_counter() - start), 1)
        finally:
            await bus.stop()
            await store.close()
            if nats_url:
                await _delete_streams(nats_url, namespace)


async def _delete_streams(url: str, namespace: str) -> None:
    import nats

    client = await nats.connect(url)
    js = client.jetstream()
    for info in await js.streams_info():
        if info.config.name and info.config.name.startswith(namespace.upper() + "_"):
            await js.delete_stream(info.config.name)
    await client.close()


async def nats_reachable() -> bool:
    import nats

    try:
        client = await nats.connect(NATS_URL, connect_timeout=2, allow_reconnect=False)
    except Exception:
        return False
    await client.close()
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--slow-ms", type=float, default=50.0)
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.slow_ms)
        return
    with tempfile.TemporaryDirectory() as data_dir:
        server, base = start_server(data_dir, args.slow_ms)
        try:
            acks = asyncio.run(acknowledgements(base, args.rate, args.seconds))
        finally:
            server.terminate()
            server.wait(30)
    in_process = asyncio.run(delivered_per_second(args.events, None))
    through_nats = asyncio.run(delivered_per_second(args.events, NATS_URL)) \
        if asyncio.run(nats_reachable()) else None
    print(json.dumps({"benchmark": "webhooks", "slow_consumer_ms": args.slow_ms, **acks,
                      "events": args.events, "in_process_events_per_second": in_process,
                      "nats_events_per_second": through_nats}))


if __name__ == "__main__":
    main()
