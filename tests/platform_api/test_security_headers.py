"""Security headers on every answer, no-store on health data, a CSP and frame options on
HTML pages, and a usable connection after a 500 (a real uvicorn server, keep-alive)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import APIRouter

from platform_api.app import create_app
from platform_api.cli import server_options
from tests.conftest import make_settings

FHIR = {"Content-Type": "application/fhir+json"}


async def test_every_answer_says_nosniff_and_health_data_is_not_stored(client, clinic_admin):
    h = {**clinic_admin["headers"], **FHIR}
    created = await client.post("/fhir/Patient", headers=h, json={
        "resourceType": "Patient", "name": [{"family": "Njeri", "given": ["Wambui"]}]})
    read = await client.get(f"/fhir/Patient/{created.json()['id']}", headers=h)
    me = await client.get("/api/auth/me", headers=h)
    refused = await client.get("/fhir/Patient")
    for answer in (created, read, me, refused):
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["cache-control"] == "no-store", answer.request.url
    for public in ("/fhir/metadata", "/healthz", "/openapi.json"):
        answer = await client.get(public)
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert "cache-control" not in answer.headers, public


async def test_html_pages_get_a_csp_running_only_their_own_scripts_and_no_framing(client):
    docs = await client.get("/docs")
    policy = docs.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert "'unsafe-inline'" not in policy and "'unsafe-eval'" not in policy
    assert docs.headers["x-frame-options"] == "DENY"
    [inline] = re.findall(r"<script>(.*?)</script>", docs.text, re.S)
    digest = base64.b64encode(hashlib.sha256(inline.encode()).digest()).decode()
    assert f"'sha256-{digest}'" in policy
    redirect = await client.get("/docs/oauth2-redirect")
    assert "script-src 'self' 'sha256-" in redirect.headers["content-security-policy"]


def test_serve_runs_uvicorn_without_banner_or_forwarded_headers(tmp_path: Path) -> None:
    options = server_options(make_settings(tmp_path))
    assert options["server_header"] is False and options["proxy_headers"] is False


# -- a real server ------------------------------------------------------------------------
@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[str]:
    """The app with a route that fails, on uvicorn as ``serve`` runs it (asyncio loop)."""
    app = create_app(make_settings(tmp_path))
    router = APIRouter()

    @router.get("/api/test/fails")
    async def fails() -> None:
        raise RuntimeError("the ward printer driver crashed")

    app.include_router(router)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound here: no one takes the port before uvicorn listens
    options = {**server_options(make_settings(tmp_path)), "loop": "asyncio", "http": "h11",
               "log_level": "critical"}
    server = uvicorn.Server(uvicorn.Config(app, **options))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    for _ in range(500):
        if server.started or serving.done():
            break
        await asyncio.sleep(0.02)
    assert server.started, "uvicorn did not start"
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await serving
        sock.close()


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str
                   ) -> tuple[int, dict[str, str]]:
    """One GET on an open connection: the status and headers of its answer (the body is
    read to its end)."""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: ward.example\r\n\r\n".encode())
    await writer.drain()
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:])
               if k}
    await reader.readexactly(int(headers.get("content-length", "0")))
    return int(head[0].split()[1]), headers


async def test_after_a_500_the_keep_alive_connection_is_closed_said_or_still_serves(served):
    reader, writer = await asyncio.open_connection(*served.split(":"))
    try:
        status, headers = await exchange(reader, writer, "/api/test/fails")
        assert status == 500
        assert "server" not in headers
        await asyncio.sleep(0.2)  # the server has done whatever it does after a failure
        if headers.get("connection", "").lower() != "close":
            status, _ = await exchange(reader, writer, "/healthz")  # must still serve
            assert status == 200
        else:
            assert await reader.read() == b""  # closed, as announced
    finally:
        writer.close()


async def test_a_keep_alive_client_goes_on_after_a_500(served):
    async with httpx.AsyncClient(base_url=f"http://{served}") as client:
        failed = await client.get("/api/test/fails")
        assert failed.status_code == 500
        assert failed.headers["connection"] == "close"
        await asyncio.sleep(0.2)
        for _ in range(3):
            assert (await client.get("/healthz")).status_code == 200


async def test_the_real_server_answers_without_a_server_banner(served: Any) -> None:
    async with httpx.AsyncClient(base_url=f"http://{served}") as client:
        answer = await client.get("/healthz")
    assert "server" not in answer.headers
    assert answer.headers["x-content-type-options"] == "nosniff"
