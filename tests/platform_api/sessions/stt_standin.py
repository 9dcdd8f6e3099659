"""A local stand-in of an OpenAI-compatible speech-to-text API:
``POST /v1/audio/transcriptions`` (multipart ``file``, ``model``, ``language``,
``response_format``), checked against a bearer key; it answers the transcript it was
given for the next call (or fails with a status), and keeps what it received."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class SpeechToTextStandIn:
    api_key: str
    text: str = "Blood pressure is 150 over 95. No known drug allergies."
    fail_with: int | None = None
    received: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> web.Application:
        application = web.Application(client_max_size=64 * 1024 * 1024)
        application.router.add_post("/v1/audio/transcriptions", self.transcribe)
        return application

    async def transcribe(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": {"message": "Incorrect API key provided",
                                                 "type": "invalid_request_error"}}, status=401)
        form = await request.post()
        upload = form.get("file")
        if not isinstance(upload, web.FileField):
            return web.json_response({"error": {"message": "file is required"}}, status=400)
        audio = upload.file.read()
        self.received.append({"model": form.get("model"), "language": form.get("language"),
                              "response_format": form.get("response_format"),
                              "bytes": len(audio)})
        if self.fail_with is not None:
            return web.json_response({"error": {"message": "The model is overloaded"}},
                                     status=self.fail_with)
        words = self.text.split(". ")
        step = 2.5
        segments = [{"id": i, "start": i * step, "end": (i + 1) * step,
                     "text": " " + w.rstrip(".") + "."} for i, w in enumerate(words)]
        return web.json_response({"task": "transcribe", "language": "english",
                                  "duration": step * len(words), "text": self.text,
                                  "segments": segments})
