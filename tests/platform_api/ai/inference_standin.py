"""A local stand-in of a remote inference endpoint speaking both protocols the platform
forwards to: KServe v2 (``/v2/models/{name}/infer``: it really computes, the sum and the
maximum of each numeric input, the length of each BYTES string) and an OpenAI-compatible
chat completions API (it answers with the number of words it received). It checks the
bearer key, keeps every request body it received, and can be told to be slow or to
answer too much."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class InferenceStandIn:
    api_key: str
    delay: float = 0.0
    padding: int = 0  # bytes of filler added to each answer
    received: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> web.Application:
        application = web.Application()
        application.router.add_post("/v2/models/{name}/infer", self.infer)
        application.router.add_post("/v1/chat/completions", self.complete)
        return application

    def _refused(self, request: web.Request) -> web.Response | None:
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": "unauthorized"}, status=401)
        return None

    async def infer(self, request: web.Request) -> web.StreamResponse:
        refused = self._refused(request)
        if refused:
            return refused
        body = await request.json()
        self.received.append(body)
        await asyncio.sleep(self.delay)
        name = request.match_info["name"]
        if name != "sepsis-risk":
            return web.json_response({"error": f"Model {name} not found"}, status=404)
        outputs = []
        for tensor in body["inputs"]:
            if tensor["datatype"] == "BYTES":  # text: the length of each string
                outputs.append({"name": f"{tensor['name']}_lengths",
                                "shape": [len(tensor["data"])], "datatype": "INT64",
                                "data": [len(v) for v in tensor["data"]]})
                continue
            numbers = [float(v) for v in tensor["data"]]
            outputs.append({"name": f"{tensor['name']}_sum_max", "shape": [2],
                            "datatype": "FP32", "data": [sum(numbers), max(numbers)]})
        return web.json_response({"model_name": name, "model_version": "7", "id": "1",
                                  "outputs": outputs, "filler": "x" * self.padding})

    async def complete(self, request: web.Request) -> web.StreamResponse:
        refused = self._refused(request)
        if refused:
            return refused
        body = await request.json()
        self.received.append(body)
        words = sum(len(m["content"].split()) for m in body["messages"])
        return web.json_response({"id": "chatcmpl-1", "object": "chat.completion",
                                  "model": body["model"], "choices": [{
                                      "index": 0, "finish_reason": "stop", "message": {
                                          "role": "assistant",
                                          "content": f"I read {words} words."}}]})
