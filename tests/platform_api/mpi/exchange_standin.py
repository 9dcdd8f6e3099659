"""Local stand-ins of national health information exchanges speaking FHIR R4:
``GET /Patient?identifier=<system>|<id>`` answering a searchset Bundle of the Patients it
holds, behind an API key or an OAuth2 client-credentials token (``POST /token``), and
modes for what can go wrong: ``slow`` (answers after ``delay`` seconds), ``broken``
(503 the first ``failures`` times, then normal), ``down`` (always 500), ``not_fhir``
(a JSON that is no Bundle), ``invalid`` (a Patient that is not valid FHIR R4)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.stand_ins import free_port

JSON = dict[str, Any]


@dataclass
class ExchangeStandIn:
    system: str
    patients: dict[str, JSON] = field(default_factory=dict)  # national id → Patient
    api_key: str | None = None
    client: tuple[str, str] | None = None  # OAuth2 client id and secret
    mode: str = "normal"
    delay: float = 0.0
    failures: int = 0
    searches: list[str] = field(default_factory=list)
    tokens_issued: list[str] = field(default_factory=list)
    runner: web.AppRunner | None = None
    url: str = ""

    def app(self) -> web.Application:
        application = web.Application()
        application.router.add_get("/Patient", self.search)
        application.router.add_post("/token", self.token)
        return application

    async def start(self) -> str:
        self.runner = web.AppRunner(self.app())
        await self.runner.setup()
        port = free_port()
        await web.TCPSite(self.runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def token(self, request: web.Request) -> web.Response:
        form = await request.post()
        auth = request.headers.get("Authorization", "")
        import base64
        expected = "Basic " + base64.b64encode(
            f"{self.client[0]}:{self.client[1]}".encode()).decode() if self.client else None
        if form.get("grant_type") != "client_credentials" or auth != expected:
            return web.json_response({"error": "invalid_client"}, status=401)
        token = f"token-{len(self.tokens_issued) + 1}"
        self.tokens_issued.append(token)
        return web.json_response({"access_token": token, "token_type": "Bearer",
                                  "expires_in": 3600})

    def _authorized(self, request: web.Request) -> bool:
        if self.api_key is not None:
            return request.headers.get("X-API-Key") == self.api_key
        if self.client is not None:
            return request.headers.get("Authorization") == \
                f"Bearer {self.tokens_issued[-1] if self.tokens_issued else '-'}"
        return True

    async def search(self, request: web.Request) -> web.Response:
        identifier = request.query.get("identifier", "")
        self.searches.append(identifier)
        if not self._authorized(request):
            return web.json_response({"resourceType": "OperationOutcome", "issue": [
                {"severity": "error", "code": "login"}]}, status=401)
        if self.mode == "slow":
            await asyncio.sleep(self.delay)
        if self.mode == "down" or (self.mode == "broken" and self.failures > 0):
            self.failures -= 1
            return web.json_response({"resourceType": "OperationOutcome", "issue": [
                {"severity": "fatal", "code": "transient"}]},
                status=503 if self.mode == "broken" else 500)
        if self.mode == "not_fhir":
            return web.json_response({"status": "ok", "people": []})
        system, _, value = identifier.partition("|")
        found = [self.patients[value]] if system == self.system and value in self.patients \
            else []
        if self.mode == "invalid":
            found = [{"resourceType": "Patient", "birthDate": "31/12/1980"}]
        return web.json_response({
            "resourceType": "Bundle", "type": "searchset", "total": len(found),
            "entry": [{"fullUrl": f"{self.url}/Patient/{p.get('id', 'x')}", "resource": p,
                       "search": {"mode": "match"}} for p in found]},
            content_type="application/fhir+json")
