"""A local stand-in of an OpenAI-compatible chat completions API in JSON mode: it checks
the bearer key and the request, keeps what it received, and answers the findings a test
gives it (or a status)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web


@dataclass
class ChatStandIn:
    api_key: str
    findings: list[dict[str, Any]] = field(default_factory=list)
    content: str | None = None  # a raw answer instead of the findings
    received: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> web.Application:
        application = web.Application()
        application.router.add_post("/v1/chat/completions", self.complete)
        return application

    async def complete(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": {"message": "Incorrect API key"}}, status=401)
        body = await request.json()
        self.received.append(body)
        if body.get("response_format", {}).get("type") != "json_object":
            return web.json_response({"error": {"message": "JSON mode expected"}},
                                     status=400)
        content = self.content if self.content is not None else orjson.dumps(
            {"findings": self.findings}).decode()
        return web.json_response({"id": "chatcmpl-1", "object": "chat.completion",
                                  "model": body["model"], "choices": [{
                                      "index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": content}}]})
