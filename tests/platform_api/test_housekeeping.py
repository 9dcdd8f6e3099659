"""Housekeeping: HL7v2 idempotency records, dispatched events and expired tokens go after
their retention, on the server's schedule and with ``healthplatform purge``; health data
and everything still in use stays."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from asgi_lifespan import LifespanManager
from typer.testing import CliRunner

from fhir_server.store.sqlite import SQLiteStore
from hl7_gateway.gateway import MESSAGES
from platform_api.app import create_app
from platform_api.auth import mfa, refresh
from platform_api.auth.tokens import rfc3339
from platform_api.cli import app as cli
from platform_api.housekeeping import DAY, Housekeeping
from platform_api.services import services_of
from tests.conftest import make_settings, register_and_login
from tests.hl7_gateway.messages import oru
from tests.platform_api.test_labs import ingest


async def dispatched(store: Any) -> int:
    rows = store.conn.execute("SELECT count(*) FROM outbox WHERE dispatched = 1").fetchone()
    return int(rows[0])


async def test_records_events_and_tokens_go_after_their_retention(app, client, admin):
    services = services_of(app.state)
    store = services.store
    user = await register_and_login(client)
    login = await client.post("/api/auth/login", json={"email": user["user"]["email"],
                                                       "password": "correct horse battery"})
    refresh_token = login.json()["data"]["refresh_token"]
    first = await ingest(client, admin["headers"], oru("KEEP-1"))
    assert first["ack_code"] == "AA"
    [report] = [r for r in first["resources"] if r.startswith("DiagnosticReport/")]
    # The bus delivers every event of the message (the lab result, the resources'):
    # one still pending would stay past the purge, and the resend below, whose events
    # have the same ids, would collide with it.
    await services.bus.drain()
    for _ in range(250):
        if not await store.pending_events():
            break
        await asyncio.sleep(0.02)
    assert not await store.pending_events() and await dispatched(store) > 0
    housekeeping = Housekeeping(store, services.settings)
    records = await store.count_documents(MESSAGES)
    tokens = await store.count_documents(refresh.TOKENS)
    assert records == 1 and tokens >= 2

    # A day later nothing has reached its retention.
    nothing = await housekeeping.run_once(time.time() + DAY / 2)
    assert not any(nothing.values()), nothing
    assert (await ingest(client, admin["headers"], oru("KEEP-1")))["duplicate"] is True

    # Past the event retention (7 days) the dispatched events go, nothing else.
    week = await housekeeping.run_once(time.time() + 8 * DAY)
    assert week["events"] > 0 and week["hl7_records"] == 0 and week["refresh_tokens"] == 0
    assert await dispatched(store) == 0

    # Past the refresh tokens' lifetime (30 days) and a day's grace, they go with their
    # single-use guards; the HL7 records are kept 90 days.
    month = await housekeeping.run_once(time.time() + 32 * DAY)
    assert month["refresh_tokens"] == tokens and month["hl7_records"] == 0
    assert await store.count_documents(refresh.TOKENS) == 0
    assert await store.count_documents(refresh.USES) == 0
    gone = await client.post("/api/auth/refresh", json={"refresh_token": refresh_token})
    assert gone.status_code == 401

    # Past 90 days the idempotency record goes: the health data it described stays,
    # and a resend of the message is processed afresh.
    season = await housekeeping.run_once(time.time() + 91 * DAY)
    assert season["hl7_records"] == 1
    assert await store.count_documents(MESSAGES) == 0
    assert await store.read_current(*report.split("/")) is not None
    again = await ingest(client, admin["headers"], oru("KEEP-1"))
    assert again["ack_code"] == "AA" and again["duplicate"] is False
    assert await store.count_documents(MESSAGES) == 1
    # the users themselves are never purged
    me = await client.get("/api/auth/me", headers=user["headers"])
    assert me.status_code == 200


async def test_the_server_runs_housekeeping_on_its_interval(tmp_path):
    settings = make_settings(tmp_path, housekeeping_interval_seconds=0.05,
                             hl7_record_retention_days=1)
    application = create_app(settings)
    async with LifespanManager(application, startup_timeout=30):
        store = services_of(application.state).store
        async with store.unit_of_work() as uow:  # a record received two days ago
            uow.put_document(MESSAGES, "LAB|FAC|OLD", {
                "id": "LAB|FAC|OLD", "received_at": "2000-01-01T00:00:00.000000Z"})
            uow.put_document(MESSAGES, "LAB|FAC|NEW", {
                "id": "LAB|FAC|NEW", "received_at": "2999-01-01T00:00:00.000000Z"})
            await uow.commit()
        for _ in range(200):
            if await store.get_document(MESSAGES, "LAB|FAC|OLD") is None:
                break
            await asyncio.sleep(0.02)
        assert await store.get_document(MESSAGES, "LAB|FAC|OLD") is None
        assert await store.get_document(MESSAGES, "LAB|FAC|NEW") is not None


def test_healthplatform_purge_runs_one_pass(tmp_path, monkeypatch):
    monkeypatch.setenv("HEALTHPLATFORM_DATA_DIR", str(tmp_path))

    async def seed() -> None:
        store = SQLiteStore(tmp_path / "healthplatform.db")
        await store.open()
        try:
            async with store.unit_of_work() as uow:
                uow.put_document(MESSAGES, "LAB|FAC|1", {
                    "id": "LAB|FAC|1", "received_at": "2000-01-01T00:00:00.000000Z"})
                await uow.commit()
        finally:
            await store.close()

    asyncio.run(seed())
    result = CliRunner().invoke(cli, ["purge"])
    assert result.exit_code == 0, result.output
    assert "1 hl7 records" in result.output


async def test_used_totp_steps_go_a_day_after_use(app):
    services = services_of(app.state)
    store = services.store
    now = time.time()
    async with store.unit_of_work() as uow:
        for step, used in (("u1:100", now - 2 * DAY), ("u1:200", now - 60)):
            uow.insert_document(mfa.USED_STEPS, step, {"id": step, "user_id": "u1",
                                                       "used_at": rfc3339(used)})
        await uow.commit()
    purged = await Housekeeping(store, services.settings).run_once(now)
    assert purged["mfa_used_steps"] == 1
    assert [d["id"] for d in await store.find_documents(mfa.USED_STEPS)] == ["u1:200"]


async def test_expired_smart_records_go_a_day_after_they_expired(app):
    from platform_api.smart import oauth as smart

    services = services_of(app.state)
    store = services.store
    now = time.time()
    async with store.unit_of_work() as uow:
        for collection in (smart.CODES, smart.LAUNCHES, smart.AUTH_REQUESTS,
                           smart.MANAGE_SESSIONS, smart.ASSERTIONS):
            for name, expires in (("old", now - 2 * DAY), ("live", now + 60)):
                uow.insert_document(collection, name, {"id": name,
                                                       "expires_at": rfc3339(expires)})
        uow.insert_document(smart.CODE_USES, "old", {"id": "old"})
        await uow.commit()
    purged = await Housekeeping(store, services.settings).run_once(now)
    for name in ("smart_codes", "smart_launches", "smart_auth_requests",
                 "smart_manage_sessions", "smart_assertions"):
        assert purged[name] == 1, name
    assert [d["id"] for d in await store.find_documents(smart.CODES)] == ["live"]
    assert await store.count_documents(smart.CODE_USES) == 0
async def test_webhook_receipts_and_handled_event_records_go_after_their_retention(app):
    services = services_of(app.state)
    store, bus = services.store, services.bus

    async def remind(event: dict[str, Any]) -> None:
        return None
    bus.subscribe("platform.appointment.booked", remind, consumer="reminders")
    await bus.drain()  # what the app wrote as it started (the shipped treatment protocols)
    before = await store.count_documents("handled_events")
    async with store.unit_of_work() as uow:
        uow.insert_document("webhook_receipts", "billing:evt_1", {
            "id": "billing:evt_1", "received_at": _now()})
        uow.emit("platform.appointment.booked", {"appointment_id": "a-1"})
        await uow.commit()
    await bus.drain()
    assert await store.count_documents("handled_events") == before + 1
    housekeeping = Housekeeping(store, services.settings)
    kept = await housekeeping.run_once(time.time() + 29 * DAY)
    assert (kept["webhook_receipts"], kept["handled_events"]) == (0, 0)
    gone = await housekeeping.run_once(time.time() + 31 * DAY)
    assert (gone["webhook_receipts"], gone["handled_events"]) == (1, before + 1)


def _now() -> str:
    from fhir_server.clock import now_instant

    return now_instant()
