"""FHIR Subscriptions: created through /fhir, matched through the resource events,
delivered to a real local HTTP receiver (rest-hook: R4 ping, R4 payload PUT, backport
Bundle), retried then marked error then active again, never slowing a write, never
carrying what the subscriber may not read, and pushed to a websocket bound with a token."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import pytest
import websockets
from aiohttp import web
from asgi_lifespan import LifespanManager

from platform_api.app import create_app
from platform_api.outbound import Outbound
from tests.browser_support import run_server
from tests.conftest import add_member, make_clinic_admin, make_settings, register_and_login
from tests.platform_api.smart.support import Clinic, make_clinic, observation
from tests.stand_ins import serving

JSON = dict[str, Any]
LOINC = "http://loinc.org"
GLUCOSE = f"Observation?code={LOINC}|2339-0"
BACKPORT = ("http://hl7.org/fhir/uv/subscriptions-backport/StructureDefinition/"
            "backport-payload-content")
NOWHERE = "https://lab.example.org"  # never reached: its rest-hooks skip the handshake


class Receiver:
    """An integration's endpoint: records each request; can fail or hold requests.
    ``handshakes``: what came before the subscription it was for went active."""

    def __init__(self) -> None:
        self.received: list[JSON] = []
        self.handshakes: list[JSON] = []
        self.fail_next = 0
        self.hold: asyncio.Event | None = None
        self.holding = 0
        self.arrived = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        if self.hold is not None:
            self.holding += 1
            await self.hold.wait()
        body = await request.read()
        if self.fail_next:
            self.fail_next -= 1
            return web.Response(status=503)
        self.received.append({"method": request.method, "path": request.path,
                              "headers": dict(request.headers), "body": body})
        self.arrived.set()
        return web.Response(status=200)

    async def wait_for(self, count: int) -> list[JSON]:
        deadline = time.monotonic() + 20
        while len(self.received) < count:
            assert time.monotonic() < deadline, f"{len(self.received)} of {count} arrived"
            await asyncio.sleep(0.02)
        return self.received


@pytest.fixture
def settings(tmp_path: Path) -> Any:
    # the receiver stands on loopback: allowed here, refused by default (see below); the
    # documentation-only endpoints of some tests are never posted to, not even a handshake
    return make_settings(tmp_path, subscription_retry_seconds=0.05,
                         subscription_delivery_attempts=2,
                         subscription_allow_private_endpoints=True,
                         subscription_skip_handshake=[NOWHERE])


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    found = Receiver()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", found.handle)
    async with serving(app) as url:
        yield found, url


@pytest.fixture
async def clinic(app: Any, client: httpx.AsyncClient) -> Clinic:
    return await make_clinic(app, client)


async def subscribe(client: httpx.AsyncClient, headers: dict[str, str], endpoint: str,
                    criteria: str = GLUCOSE, found: Receiver | None = None, **channel: Any
                    ) -> httpx.Response:
    """Create a rest-hook Subscription; with ``found`` (its endpoint's receiver), wait
    until its handshake activated it and set the handshake apart from the notifications."""
    response = await client.post("/fhir/Subscription", headers=headers, json={
        "resourceType": "Subscription", "status": "requested", "criteria": criteria,
        "reason": "Glucose results for the diabetes clinic's follow-up system",
        "channel": {"type": "rest-hook", "endpoint": endpoint, **channel}})
    if found is not None and response.status_code == 201:
        await until_status(client, headers, response.json()["id"], "active")
        path = urlsplit(endpoint).path
        found.handshakes += [r for r in found.received if r["path"] == path]
        found.received = [r for r in found.received if r["path"] != path]
    return response


async def until_status(client: httpx.AsyncClient, headers: dict[str, str],
                       subscription_id: str, status: str) -> JSON:
    deadline = time.monotonic() + 20
    while True:
        current = (await client.get(f"/fhir/Subscription/{subscription_id}",
                                    headers=headers)).json()
        if current["status"] == status:
            return current  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, current
        await asyncio.sleep(0.02)


async def glucose(client: httpx.AsyncClient, headers: dict[str, str], patient: str) -> str:
    return await observation(client, headers, patient, "2339-0",
                             "Glucose [Mass/volume] in Blood", "laboratory", 6.1, "mmol/L")


async def heart_rate(client: httpx.AsyncClient, headers: dict[str, str], patient: str
                     ) -> str:
    return await observation(client, headers, patient, "8867-4", "Heart rate",
                             "vital-signs", 80, "/min")


async def test_a_rest_hook_is_activated_and_gets_each_matching_resource_put_to_it(
        client: httpx.AsyncClient, clinic: Clinic, receiver: tuple[Receiver, str]) -> None:
    found, url = receiver
    headers = clinic.admin["headers"]
    created = await subscribe(client, headers, f"{url}/fhir", payload="application/fhir+json",
                              header=["Authorization: Bearer lab-sync-secret"], found=found)
    assert created.status_code == 201, created.text
    assert created.json()["status"] == "requested"  # active once the handshake is accepted
    assert [h["headers"]["Authorization"] for h in found.handshakes] == [
        "Bearer lab-sync-secret"]

    await heart_rate(client, headers, clinic.amina)  # does not match
    observation_id = await glucose(client, headers, clinic.amina)
    [delivered] = await found.wait_for(1)
    assert delivered["method"] == "PUT"
    assert delivered["path"] == f"/fhir/Observation/{observation_id}"
    assert delivered["headers"]["Authorization"] == "Bearer lab-sync-secret"
    assert orjson.loads(delivered["body"])["id"] == observation_id


async def test_without_a_payload_the_notification_is_an_empty_post(
        client: httpx.AsyncClient, clinic: Clinic, receiver: tuple[Receiver, str]) -> None:
    found, url = receiver
    assert (await subscribe(client, clinic.admin["headers"], f"{url}/hook", found=found)
            ).status_code == 201
    await glucose(client, clinic.admin["headers"], clinic.baraka)
    [delivered] = await found.wait_for(1)
    assert (delivered["method"], delivered["path"], delivered["body"]) == ("POST", "/hook", b"")


async def test_a_backport_subscription_gets_notification_bundles_numbered_in_order(
        client: httpx.AsyncClient, clinic: Clinic, receiver: tuple[Receiver, str]) -> None:
    found, url = receiver
    headers = clinic.admin["headers"]
    created = await subscribe(client, headers, f"{url}/notify", payload="application/fhir+json",
                              _payload={"extension": [{"url": BACKPORT,
                                                       "valueCode": "full-resource"}]},
                              found=found)
    assert created.status_code == 201, created.text
    first = await glucose(client, headers, clinic.amina)
    second = await glucose(client, headers, clinic.baraka)
    delivered = await found.wait_for(2)
    bundles = [orjson.loads(d["body"]) for d in delivered]
    for number, (bundle, expected) in enumerate(zip(bundles, (first, second), strict=True), 1):
        assert bundle["type"] == "history"
        status = {p["name"]: p for p in bundle["entry"][0]["resource"]["parameter"]}
        assert status["type"]["valueCode"] == "event-notification"
        event = {p["name"]: p for p in status["notification-event"]["part"]}
        assert event["event-number"]["valueString"] == str(number)
        assert event["focus"]["valueReference"]["reference"].endswith(f"Observation/{expected}")
        assert bundle["entry"][1]["resource"]["id"] == expected


@pytest.mark.parametrize(("change", "field"), [
    ({"criteria": "Observation?flavour=sweet"}, "Subscription.criteria"),
    ({"criteria": "Unicorn?name=x"}, "Subscription.criteria"),
    ({"channel": {"type": "email", "endpoint": "mailto:lab@example.org"}},
     "Subscription.channel.type"),
    ({"channel": {"type": "rest-hook", "endpoint": "ftp://lab.example.org"}},
     "Subscription.channel.endpoint"),
    ({"channel": {"type": "rest-hook", "endpoint": "https://lab.example.org",
                  "header": ["no colon here"]}}, "Subscription.channel.header[0]"),
])
async def test_a_subscription_the_server_cannot_honour_is_refused_naming_the_field(
        client: httpx.AsyncClient, clinic: Clinic, change: JSON, field: str) -> None:
    body = {"resourceType": "Subscription", "status": "requested", "criteria": GLUCOSE,
            "reason": "test", "channel": {"type": "rest-hook",
                                          "endpoint": "https://lab.example.org"}, **change}
    response = await client.post("/fhir/Subscription", headers=clinic.admin["headers"],
                                 json=body)
    assert response.status_code == 400, response.text
    assert response.json()["issue"][0]["expression"] == [field]


async def test_notifications_carry_only_what_the_subscriber_may_read(
        app: Any, client: httpx.AsyncClient, clinic: Clinic,
        receiver: tuple[Receiver, str]) -> None:
    found, url = receiver
    other = await make_clinic_admin(client, name="Mathare North Clinic",
                                    first_name="Achieng", last_name="Otieno")
    theirs = await client.post("/fhir/Patient", headers=other["headers"], json={
        "resourceType": "Patient", "name": [{"family": "Wafula", "given": ["Juma"]}]})
    assert (await subscribe(client, other["headers"], f"{url}/mathare",
                            criteria="Observation?", payload="application/fhir+json",
                            found=found)).status_code == 201
    await glucose(client, clinic.admin["headers"], clinic.amina)  # not theirs to read
    own = await glucose(client, other["headers"], theirs.json()["id"])
    [delivered] = await found.wait_for(1)
    assert delivered["path"] == f"/mathare/Observation/{own}"
    await asyncio.sleep(0.3)  # the other clinic's write was handled first: nothing came
    assert len(found.received) == 1


async def test_roles_allowed_and_refused_to_subscribe(
        app: Any, client: httpx.AsyncClient, clinic: Clinic) -> None:
    endpoint = f"{NOWHERE}/hook"
    assert (await subscribe(client, clinic.doctor["headers"], endpoint)).status_code == 201
    lab = await register_and_login(client, first_name="Faith", last_name="Njeri")
    await add_member(app, clinic.org_id, lab, "ORG:LAB")
    assert (await subscribe(client, lab["headers"], endpoint)).status_code == 201
    desk = await register_and_login(client, first_name="Mercy", last_name="Wambui")
    await add_member(app, clinic.org_id, desk, "ORG:RECEPTIONIST")
    refused = await subscribe(client, desk["headers"], endpoint)
    assert refused.status_code == 403
    patient = await register_and_login(client, first_name="Zawadi", last_name="Achieng")
    assert (await subscribe(client, patient["headers"], endpoint)).status_code == 403
    assert (await subscribe(client, {}, endpoint)).status_code == 401


async def test_a_failing_endpoint_turns_the_subscription_error_then_active_again(
        client: httpx.AsyncClient, clinic: Clinic, receiver: tuple[Receiver, str]) -> None:
    found, url = receiver
    headers = clinic.admin["headers"]
    created = await subscribe(client, headers, f"{url}/flaky", found=found)
    subscription_id = created.json()["id"]
    found.fail_next = 2  # both attempts of the first notification fail
    await glucose(client, headers, clinic.amina)

    async def status() -> JSON:
        return (await client.get(f"/fhir/Subscription/{subscription_id}",
                                 headers=headers)).json()

    deadline = time.monotonic() + 20
    while (await status())["status"] != "error":
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    assert "503" in (await status())["error"]
    report = await client.get(f"/fhir/Subscription/{subscription_id}/$status",
                              headers=headers)
    parameters = {p["name"]: p for p in report.json()["entry"][0]["resource"]["parameter"]}
    assert parameters["error-count"]["valueString"] == "1"
    assert parameters["events-since-subscription-start"]["valueString"] == "1"

    await glucose(client, headers, clinic.baraka)
    await found.wait_for(1)
    deadline = time.monotonic() + 20
    while (await status())["status"] != "active":
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    assert "error" not in await status()


async def test_a_hanging_endpoint_never_holds_up_a_write(
        client: httpx.AsyncClient, clinic: Clinic, receiver: tuple[Receiver, str]) -> None:
    found, url = receiver
    headers = clinic.admin["headers"]
    await subscribe(client, headers, f"{url}/slow", found=found)
    found.hold = asyncio.Event()
    await glucose(client, headers, clinic.amina)
    deadline = time.monotonic() + 20
    while not found.holding:  # the endpoint now holds the first notification
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    written = await client.post("/fhir/Patient", headers=headers, json={
        "resourceType": "Patient", "name": [{"family": "Chebet", "given": ["Lilian"]}]})
    assert written.status_code == 201 and found.holding == 1 and not found.received
    found.hold.set()
    await found.wait_for(1)


async def test_the_capability_statement_names_the_websocket_and_operations(
        client: httpx.AsyncClient) -> None:
    rest = (await client.get("/fhir/metadata")).json()["rest"][0]
    [extension] = rest["extension"]
    assert extension["valueUri"] == "ws://testserver/fhir/$subscription-ws"
    subscription = next(r for r in rest["resource"] if r["type"] == "Subscription")
    assert {"status", "get-ws-binding-token"} <= {o["name"] for o in subscription["operation"]}


async def test_a_websocket_bound_with_a_token_gets_a_handshake_then_notifications(
        tmp_path: Path) -> None:
    app = create_app(make_settings(tmp_path))
    with run_server(app) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            # Over HTTP only: the app's store belongs to the server thread's event loop.
            admin = await make_clinic_admin(client)
            headers = admin["headers"]
            patient = await client.post("/fhir/Patient", headers=headers, json={
                "resourceType": "Patient", "name": [{"family": "Odhiambo"}]})
            created = await client.post("/fhir/Subscription", headers=headers, json={
                "resourceType": "Subscription", "status": "requested", "criteria": GLUCOSE,
                "reason": "Ward dashboard", "channel": {"type": "websocket"}})
            assert created.status_code == 201, created.text
            subscription_id = created.json()["id"]
            issued = await client.post(
                f"/fhir/Subscription/{subscription_id}/$get-ws-binding-token",
                headers=headers)
            assert issued.status_code == 200, issued.text
            out = {p["name"]: p for p in issued.json()["parameter"]}
            ws_url = out["websocket-url"]["valueUrl"]
            assert ws_url == url.replace("http", "ws") + "/fhir/$subscription-ws"

            async with websockets.connect(ws_url) as socket:
                await socket.send(f"bind-with-token {out['token']['valueString']}")
                handshake = orjson.loads(await asyncio.wait_for(socket.recv(), 20))
                status = {p["name"]: p for p in
                          handshake["entry"][0]["resource"]["parameter"]}
                assert status["type"]["valueCode"] == "handshake"
                observation_id = await glucose(client, headers, patient.json()["id"])
                event = orjson.loads(await asyncio.wait_for(socket.recv(), 20))
                status = {p["name"]: p for p in event["entry"][0]["resource"]["parameter"]}
                assert status["type"]["valueCode"] == "event-notification"
                focus = {p["name"]: p for p in status["notification-event"]["part"]}["focus"]
                assert focus["valueReference"]["reference"].endswith(
                    f"Observation/{observation_id}")

            async with websockets.connect(ws_url) as socket:  # a token binds once
                await socket.send(f"bind-with-token {out['token']['valueString']}")
                refusal = orjson.loads(await asyncio.wait_for(socket.recv(), 20))
                assert refusal["resourceType"] == "OperationOutcome"
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await asyncio.wait_for(socket.recv(), 20)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008

            stranger = await register_and_login(client, first_name="Kevin", last_name="Ouma")
            refused = await client.post(
                f"/fhir/Subscription/{subscription_id}/$get-ws-binding-token",
                headers=stranger["headers"])
            assert refused.status_code == 403


async def test_subscriptions_survive_a_restart(tmp_path: Path,
                                               receiver: tuple[Receiver, str]) -> None:
    found, url = receiver
    settings = make_settings(tmp_path, subscription_allow_private_endpoints=True)
    app = create_app(settings)
    async with LifespanManager(app, startup_timeout=30):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            clinic = await make_clinic(app, c)
            assert (await subscribe(c, clinic.admin["headers"], f"{url}/after", found=found)
                    ).status_code == 201
    again = create_app(settings)
    async with LifespanManager(again, startup_timeout=30):
        transport = httpx.ASGITransport(app=again)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            login = await c.post("/api/auth/login", json={
                "email": clinic.admin["user"]["email"], "password": "correct horse battery"})
            headers = {"Authorization": f"Bearer {login.json()['data']['token']}"}
            await glucose(c, headers, clinic.amina)
            await found.wait_for(1)


async def test_a_deleted_or_switched_off_subscription_is_told_nothing_more(
        app: Any, client: httpx.AsyncClient, clinic: Clinic,
        receiver: tuple[Receiver, str]) -> None:
    found, url = receiver
    headers = clinic.admin["headers"]
    gone = (await subscribe(client, headers, f"{url}/deleted", found=found)).json()
    off = await until_status(client, headers, (await subscribe(
        client, headers, f"{url}/off", found=found)).json()["id"], "active")
    assert (await client.delete(f"/fhir/Subscription/{gone['id']}",
                                headers=headers)).status_code == 200
    off["status"] = "off"
    assert (await client.put(f"/fhir/Subscription/{off['id']}", headers=headers,
                             json=off)).status_code == 200
    await subscribe(client, headers, f"{url}/still-on", found=found)
    await glucose(client, headers, clinic.amina)
    [delivered] = await found.wait_for(1)
    assert delivered["path"] == "/still-on"
    store = app.state.services.store
    assert await store.get_document("subscription_owners", gone["id"]) is None
    assert await store.get_document("subscription_owners", off["id"]) is not None


@pytest.mark.parametrize("endpoint", [
    "http://127.0.0.1:8080/hook", "http://10.0.0.5/fhir", "http://169.254.169.254/latest",
    "http://[::1]/hook", "http://localhost:9000/hook", "http://0.0.0.0/hook",
    "http://100.64.0.1/", "http://100.100.100.200/", "http://[fd00:ec2::254]/",
    "http://[::ffff:10.0.0.1]/hook"])
async def test_by_default_a_rest_hook_may_not_post_inside_the_servers_network(
        tmp_path: Path, endpoint: str) -> None:
    # the public address below is accepted, never posted to (no handshake)
    app = create_app(make_settings(tmp_path, subscription_skip_handshake=["*"]))
    async with LifespanManager(app, startup_timeout=30):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            admin = await make_clinic_admin(c)
            refused = await subscribe(c, admin["headers"], endpoint)
            assert refused.status_code == 400, refused.text
            assert refused.json()["issue"][0]["expression"] == ["Subscription.channel.endpoint"]
            public = await subscribe(c, admin["headers"], "https://203.0.113.9/hook")
            assert public.status_code == 400  # TEST-NET-3: reserved for documentation
            outside = await subscribe(c, admin["headers"], "https://8.8.8.8/hook")
            assert outside.status_code == 201, outside.text


class LaterResolver:
    """A stub DNS: ``later.invalid`` does not resolve when the Subscription is written,
    then resolves to a private address; ``hook.example`` is the local receiver."""

    def __init__(self) -> None:
        self.later_lookups = 0

    async def __call__(self, host: str, port: int) -> list[str]:
        if host == "hook.example":
            return ["127.0.0.1"]
        if host == "later.invalid":
            self.later_lookups += 1
            if self.later_lookups > 1:
                return ["10.0.0.7"]
        raise OSError(f"{host} does not resolve")


async def test_each_delivery_checks_the_address_it_connects_to(
        tmp_path: Path, receiver: tuple[Receiver, str],
        caplog: pytest.LogCaptureFixture) -> None:
    """Result 3: a name that did not resolve when written and later resolves to a
    private address gets no post; the allowed receiver beside it gets its handshake."""
    found, url = receiver
    port = urlsplit(url).port
    resolver = LaterResolver()
    app = create_app(make_settings(tmp_path, subscription_retry_seconds=0.05,
                                   subscription_delivery_attempts=2,
                                   outbound_allow=["127.0.0.1/32"]))
    app.state.services.extras["outbound"] = Outbound(["127.0.0.1/32"], resolver=resolver)
    caplog.set_level("INFO", "healthplatform.subscriptions")
    async with LifespanManager(app, startup_timeout=30):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            admin = await make_clinic_admin(c)
            later = await subscribe(c, admin["headers"], f"http://later.invalid:{port}/x")
            assert later.status_code == 201, later.text
            await until_status(c, admin["headers"], later.json()["id"], "error")
            allowed = await subscribe(c, admin["headers"], f"http://hook.example:{port}/ok",
                                      found=found)
            assert allowed.status_code == 201
    assert [h["path"] for h in found.handshakes] == ["/ok"]
    assert resolver.later_lookups >= 2
    assert "resolves to 10.0.0.7" in caplog.text


# --- the Subscriptions Backport IG (1.1) for R4, request by request --------------------------


def status_of(bundle: JSON) -> dict[str, JSON]:
    """The SubscriptionStatus parameters of a notification Bundle, by name."""
    first = bundle["entry"][0]["resource"]
    assert first["resourceType"] == "Parameters"  # backport-notification-bundle-r4-1
    return {p["name"]: p for p in first["parameter"]}


def backport(content: str) -> JSON:
    return {"payload": "application/fhir+json",
            "_payload": {"extension": [{"url": BACKPORT, "valueCode": content}]}}


async def test_a_rest_hook_is_requested_until_its_endpoint_accepts_the_handshake(
        client: httpx.AsyncClient, clinic: Clinic, receiver: tuple[Receiver, str]) -> None:
    """Channels, REST-Hook: "the server SHALL set initial status to requested ... After a
    successful handshake notification has been sent and accepted, the server SHALL update
    the status to active"."""
    found, url = receiver
    headers = clinic.admin["headers"]
    created = await subscribe(client, headers, f"{url}/admissions", **backport("id-only"),
                              header=["X-Api-Key: their-key"])
    assert created.status_code == 201, created.text
    assert created.json()["status"] == "requested"
    subscription_id = created.json()["id"]
    await until_status(client, headers, subscription_id, "active")
    [handshake] = found.received
    assert (handshake["method"], handshake["path"]) == ("POST", "/admissions")
    assert handshake["headers"]["Content-Type"] == "application/fhir+json"
    assert handshake["headers"]["X-Api-Key"] == "their-key"
    bundle = orjson.loads(handshake["body"])
    assert (bundle["resourceType"], bundle["type"]) == ("Bundle", "history")
    assert len(bundle["entry"]) == 1  # the status alone: no event
    status = status_of(bundle)
    assert status["type"]["valueCode"] == "handshake"
    assert status["status"]["valueCode"] == "requested"
    assert status["events-since-subscription-start"]["valueString"] == "0"
    assert "notification-event" not in status
    reference = status["subscription"]["valueReference"]["reference"]
    assert reference.startswith("http") and reference.endswith(f"/Subscription/{subscription_id}")
    assert bundle["entry"][0]["request"]["url"] == f"{reference}/$status"
    # writing requested again asks for another handshake (a new endpoint, say)
    current = await until_status(client, headers, subscription_id, "active")
    current["status"] = "requested"
    assert (await client.put(f"/fhir/Subscription/{subscription_id}", headers=headers,
                             json=current)).status_code == 200
    await until_status(client, headers, subscription_id, "active")
    assert len(found.received) == 2


async def test_an_endpoint_refusing_the_handshake_turns_the_subscription_error(
        client: httpx.AsyncClient, clinic: Clinic, receiver: tuple[Receiver, str]) -> None:
    """Channels, REST-Hook: "Any errors in the initial handshake SHALL result in the status
    being changed to error"; nothing is sent to it meanwhile."""
    found, url = receiver
    headers = clinic.admin["headers"]
    found.fail_next = 2  # every attempt of the handshake (the settings allow two)
    created = await subscribe(client, headers, f"{url}/refusing")
    subscription_id = created.json()["id"]
    failed = await until_status(client, headers, subscription_id, "error")
    assert failed["error"] == "The handshake was not accepted: The endpoint answered 503"
    await glucose(client, headers, clinic.amina)  # matches, but the endpoint is unverified
    await asyncio.sleep(0.5)
    assert found.received == []
    # the client asks again (the endpoint is fixed): handshake, active, notifications
    failed["status"] = "requested"
    assert (await client.put(f"/fhir/Subscription/{subscription_id}", headers=headers,
                             json=failed)).status_code == 200
    active = await until_status(client, headers, subscription_id, "active")
    assert "error" not in active
    observation_id = await glucose(client, headers, clinic.baraka)
    handshake, notification = await found.wait_for(2)
    assert (handshake["method"], notification["method"]) == ("POST", "POST")
    assert notification["body"] == b"" and observation_id  # an R4 ping


async def test_endpoints_named_in_the_skip_setting_are_activated_without_a_handshake(
        tmp_path: Path, receiver: tuple[Receiver, str]) -> None:
    found, url = receiver
    settings = make_settings(tmp_path, subscription_allow_private_endpoints=True,
                             subscription_skip_handshake=[f"{url}/legacy/"])
    app = create_app(settings)
    async with LifespanManager(app, startup_timeout=30):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            admin = await make_clinic_admin(c)
            legacy = await subscribe(c, admin["headers"], f"{url}/legacy/hook")
            assert legacy.json()["status"] == "active"
            other = await subscribe(c, admin["headers"], f"{url}/modern/hook")
            assert other.json()["status"] == "requested"
            await until_status(c, admin["headers"], other.json()["id"], "active")
            statement = (await c.get("/fhir/metadata")).json()
    assert [r["path"] for r in found.received] == ["/modern/hook"]
    subscription = next(r for r in statement["rest"][0]["resource"]
                        if r["type"] == "Subscription")
    assert f"{url}/legacy/" in subscription["documentation"]


async def test_notifications_are_absolute_from_the_first_without_a_configured_base_url(
        app: Any, client: httpx.AsyncClient, clinic: Clinic,
        receiver: tuple[Receiver, str]) -> None:
    """R4 Bundle.entry.fullUrl is absolute; the IG's focus is a resolvable reference. No
    $status call comes first here, and HEALTHPLATFORM_BASE_URL is not set."""
    found, url = receiver
    settings = app.state.services.settings
    assert settings.base_url == ""
    base = f"{settings.public_base_url}/fhir"
    headers = clinic.admin["headers"]
    created = await subscribe(client, headers, f"{url}/full", **backport("full-resource"),
                              found=found)
    observation_id = await glucose(client, headers, clinic.amina)
    [delivered] = await found.wait_for(1)
    bundle = orjson.loads(delivered["body"])
    status = status_of(bundle)
    assert status["subscription"]["valueReference"]["reference"] == (
        f"{base}/Subscription/{created.json()['id']}")
    event = {p["name"]: p for p in status["notification-event"]["part"]}
    assert event["focus"]["valueReference"]["reference"] == (
        f"{base}/Observation/{observation_id}")
    assert bundle["entry"][1]["fullUrl"] == f"{base}/Observation/{observation_id}"
    assert all(e["fullUrl"].startswith(("http://", "https://", "urn:uuid:"))
               for e in bundle["entry"])
    [handshake] = found.handshakes
    handshake_status = status_of(orjson.loads(handshake["body"]))
    assert handshake_status["subscription"]["valueReference"]["reference"].startswith(base)


async def test_an_empty_notification_names_no_resource_and_no_topic(
        client: httpx.AsyncClient, clinic: Clinic, receiver: tuple[Receiver, str]) -> None:
    """Payloads, Empty: no focus, no entry but the status; the R4 status profile's topic
    "SHOULD NOT be present when using empty payloads"."""
    found, url = receiver
    headers = clinic.admin["headers"]
    await subscribe(client, headers, f"{url}/empty", **backport("empty"), found=found)
    await glucose(client, headers, clinic.amina)
    [delivered] = await found.wait_for(1)
    bundle = orjson.loads(delivered["body"])
    assert len(bundle["entry"]) == 1
    status = status_of(bundle)
    assert "topic" not in status
    assert status["type"]["valueCode"] == "event-notification"
    event = {p["name"]: p for p in status["notification-event"]["part"]}
    assert set(event) == {"event-number", "timestamp"}
    assert "topic" not in status_of(orjson.loads(found.handshakes[0]["body"]))
    # id-only still carries it (MAY), full-resource SHOULD
    await subscribe(client, headers, f"{url}/ids", **backport("id-only"), found=found)
    await glucose(client, headers, clinic.baraka)
    ids = next(d for d in await found.wait_for(3) if d["path"] == "/ids")
    assert status_of(orjson.loads(ids["body"]))["topic"]["valueCanonical"] == GLUCOSE


async def test_status_at_type_level_lists_the_callers_subscriptions(
        client: httpx.AsyncClient, clinic: Clinic, receiver: tuple[Receiver, str]) -> None:
    """OperationDefinition backport-subscription-status: type = true; "In the absence of any
    specified ids, the server returns the status for all Subscriptions available to the
    caller"; ids and statuses are ORed; the answer is a searchset Bundle."""
    found, url = receiver
    headers = clinic.admin["headers"]
    first = (await subscribe(client, headers, f"{url}/one", found=found)).json()["id"]
    second = (await subscribe(client, headers, f"{url}/two", found=found)).json()["id"]
    off = await until_status(client, headers, second, "active")
    off["status"] = "off"
    assert (await client.put(f"/fhir/Subscription/{second}", headers=headers,
                             json=off)).status_code == 200
    other = await make_clinic_admin(client, name="Mathare North Clinic",
                                    first_name="Achieng", last_name="Otieno")
    theirs = (await subscribe(client, other["headers"], f"{url}/theirs", found=found)
              ).json()["id"]

    def statuses(response: httpx.Response) -> dict[str, str]:
        assert response.status_code == 200, response.text
        bundle = response.json()
        assert (bundle["type"], bundle["total"]) == ("searchset", len(bundle["entry"]))
        found_: dict[str, str] = {}
        for entry in bundle["entry"]:
            status = {p["name"]: p for p in entry["resource"]["parameter"]}
            reference = status["subscription"]["valueReference"]["reference"]
            found_[reference.rsplit("/", 1)[1]] = status["status"]["valueCode"]
        return found_

    everything = statuses(await client.get("/fhir/Subscription/$status", headers=headers))
    assert everything == {first: "active", second: "off"}  # never the other clinic's
    assert statuses(await client.get("/fhir/Subscription/$status?status=active",
                                     headers=headers)) == {first: "active"}
    assert statuses(await client.get(f"/fhir/Subscription/$status?id={first}&id={second}"
                                     "&status=off", headers=headers)) == {second: "off"}
    posted = await client.post("/fhir/Subscription/$status", headers=headers, json={
        "resourceType": "Parameters", "parameter": [{"name": "id", "valueId": first}]})
    assert statuses(posted) == {first: "active"}
    assert statuses(await client.get("/fhir/Subscription/$status",
                                      headers=other["headers"])) == {theirs: "active"}
    naming_theirs = await client.get(f"/fhir/Subscription/$status?id={theirs}",
                                     headers=headers)
    assert naming_theirs.status_code in (403, 404)
    assert naming_theirs.json()["resourceType"] == "OperationOutcome"
    # a user of no organization may not read Subscriptions: refused, as their search is
    stranger = await register_and_login(client, first_name="Mercy", last_name="Wambui")
    refused = await client.get("/fhir/Subscription/$status", headers=stranger["headers"])
    assert refused.status_code == 403 and refused.json()["resourceType"] == "OperationOutcome"
    assert (await client.get("/fhir/Subscription/$status")).status_code == 401


async def test_the_capability_statement_lists_type_level_status_and_the_handshake(
        client: httpx.AsyncClient) -> None:
    rest = (await client.get("/fhir/metadata")).json()["rest"][0]
    subscription = next(r for r in rest["resource"] if r["type"] == "Subscription")
    status = next(o for o in subscription["operation"] if o["name"] == "status")
    assert status["definition"].endswith("/backport-subscription-status")
    assert "Type level" in status["documentation"]
    assert "handshake" in subscription["documentation"]
