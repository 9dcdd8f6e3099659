"""The outbound guard (platform_api/outbound.py). Nothing here sends traffic off this
machine: refusals are tested as decisions (the guard refuses before connecting), and the
allowed path goes to a stand-in server on 127.0.0.1, reached through a stub resolver."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from platform_api.outbound import AddressPolicy, Outbound, OutboundError, OutboundRefused
from tests.browser_support import run_server

REFUSED = ["127.0.0.1", "127.8.9.10", "10.0.0.1", "172.16.3.4", "192.168.1.1",
           "169.254.169.254", "169.254.1.1", "100.64.0.1", "100.127.255.254",
           "100.100.100.200", "0.0.0.0", "240.0.0.1", "224.0.0.1", "255.255.255.255",
           "::1", "::", "fe80::1", "fc00::1", "fd00:ec2::254", "::ffff:127.0.0.1",
           "::ffff:10.0.0.1", "64:ff9b::a00:1", "64:ff9b::a9fe:a9fe", "2002:7f00:1::1",
           "ff02::1", "192.0.0.192"]
PUBLIC = ["93.184.216.34", "8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8"]


@pytest.mark.parametrize("address", REFUSED)
def test_loopback_private_shared_reserved_and_metadata_addresses_are_refused(
        address: str) -> None:
    assert AddressPolicy().refusal(address) is not None


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_are_allowed(address: str) -> None:
    assert AddressPolicy().refusal(address) is None


def test_the_allow_list_opens_a_clinic_network_but_the_private_alias_not_metadata() -> None:
    clinic = AddressPolicy(["10.20.0.0/16", "lab.clinic.local"])
    assert clinic.refusal("10.20.5.5") is None and clinic.refusal("10.21.0.1") is not None
    assert clinic.allows_name("LAB.clinic.local.")
    private = AddressPolicy(private=True)
    assert private.refusal("192.168.1.1") is None and private.refusal("127.0.0.1") is None
    for metadata in ("169.254.169.254", "100.100.100.200", "fd00:ec2::254"):
        assert private.refusal(metadata) is not None
    assert private.refusal("100.64.0.1") is not None


class Resolver:
    """A stub DNS: names to addresses; counts lookups."""

    def __init__(self, names: dict[str, list[str]]):
        self.names, self.lookups = names, 0

    async def __call__(self, host: str, port: int) -> list[str]:
        self.lookups += 1
        if host not in self.names:
            raise OSError(f"{host} does not resolve")
        return self.names[host]


async def hello(request: Request) -> Response:
    return JSONResponse({"host": request.headers["host"]})


async def big(request: Request) -> Response:
    return PlainTextResponse("x" * 200_000)


async def streamed(request: Request) -> Response:
    async def chunks():  # type: ignore[no-untyped-def]
        for _ in range(100):
            yield b"y" * 10_000
    from starlette.responses import StreamingResponse
    return StreamingResponse(chunks())


async def hop(request: Request) -> Response:
    return RedirectResponse(request.query_params["to"], status_code=302)


async def text(request: Request) -> Response:
    return PlainTextResponse("not json")


@pytest.fixture(scope="module")
def local() -> Iterator[str]:
    app = Starlette(routes=[Route("/hello", hello), Route("/big", big),
                            Route("/streamed", streamed), Route("/hop", hop),
                            Route("/text", text)])
    with run_server(app) as url:
        yield url


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


async def test_a_name_resolving_to_a_refused_address_is_refused_before_connecting(
        local: str) -> None:
    port = port_of(local)
    resolver = Resolver({"jwks.example": ["127.0.0.1"], "mixed.example":
                         ["93.184.216.34", "10.0.0.1"]})
    outbound = Outbound(resolver=resolver)
    async with outbound.client() as http:
        for url in (f"http://jwks.example:{port}/hello", f"http://127.0.0.1:{port}/hello",
                    f"http://[::ffff:127.0.0.1]:{port}/hello",
                    "http://mixed.example/hello"):  # one bad address refuses the name
            with pytest.raises(OutboundRefused):
                await http.get(url)
    assert resolver.lookups == 2


async def test_an_allowed_address_is_reached_with_the_host_name_kept(local: str) -> None:
    port = port_of(local)
    resolver = Resolver({"jwks.example": ["127.0.0.1"]})
    outbound = Outbound(["127.0.0.1/32"], resolver=resolver)
    body, _ = await outbound.get_json(f"http://jwks.example:{port}/hello")
    assert body == {"host": f"jwks.example:{port}"}
    by_name = Outbound(["jwks.example"], resolver=resolver)
    assert (await by_name.get_json(f"http://jwks.example:{port}/hello"))[0] == body


async def test_answers_are_capped_in_size_declared_or_streamed(local: str) -> None:
    outbound = Outbound(["127.0.0.1/32"])
    for path in ("/big", "/streamed"):
        with pytest.raises(OutboundError) as refused:
            await outbound.get_json(f"{local}{path}", max_bytes=50_000)
        assert "larger than 50000" in refused.value.reason
    assert len((await outbound.get_json(f"{local}/hello", max_bytes=50_000))[0]) == 1


async def test_redirects_are_not_followed_unless_asked_and_then_each_hop_is_checked(
        local: str) -> None:
    port = port_of(local)
    resolver = Resolver({"app.example": ["127.0.0.1"], "inside.example": ["127.0.0.1"]})
    outbound = Outbound(["app.example"], resolver=resolver)
    target = f"http://inside.example:{port}/hello"
    async with outbound.client() as http:
        response = await http.get(f"http://app.example:{port}/hop", params={"to": target})
        assert response.status_code == 302
    async with outbound.client(follow_redirects=True) as http:
        with pytest.raises(OutboundRefused):
            await http.get(f"http://app.example:{port}/hop", params={"to": target})
        allowed = await http.get(f"http://app.example:{port}/hop",
                                 params={"to": f"http://app.example:{port}/hello"})
        assert allowed.json() == {"host": f"app.example:{port}"}


async def test_the_error_text_does_not_tell_a_closed_port_from_an_open_one(
        local: str) -> None:
    outbound = Outbound(["127.0.0.1/32"])
    closed = "http://127.0.0.1:9/jwks.json"
    texts = []
    for url in (closed, f"{local}/text", f"{local}/missing"):
        with pytest.raises(OutboundError) as failed:
            await outbound.get_json(url)
        texts.append(str(failed.value).replace(url, "URL"))
    assert len(set(texts)) == 1, texts
    with pytest.raises(OutboundError) as refused:
        await Outbound().get_json(closed)
    refused_text = str(refused.value).replace(closed, "URL")
    assert refused_text == texts[0]


async def test_the_aiohttp_session_checks_literals_and_names_at_connect_time(
        local: str) -> None:
    port = port_of(local)
    resolver = Resolver({"hook.example": ["10.1.2.3"], "ok.example": ["127.0.0.1"]})
    session = Outbound(["ok.example"], resolver=resolver).session()
    try:
        for url in (f"http://127.0.0.1:{port}/hello", "http://100.100.100.200/",
                    "http://hook.example/", "http://100.64.0.1/"):
            with pytest.raises(OutboundError):
                await session.request("POST", url)
        status, body = await session.request("GET", f"http://ok.example:{port}/hello")
        assert status == 200 and b"ok.example" in body
    finally:
        await session.close()
