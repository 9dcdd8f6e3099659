"""Subscription operations of the R5 backport (Subscriptions R5 Backport IG 1.1, for R4).

- ``GET [base]/Subscription/[id]/$status``: a searchset Bundle holding the subscription's
  SubscriptionStatus (a ``Parameters`` as the backport writes it in R4): its status, how
  many events it has had, how many deliveries failed and the last error.
- ``GET`` or ``POST [base]/Subscription/$status`` (the OperationDefinition's
  ``type = true``): one SubscriptionStatus per Subscription named by an ``id`` parameter,
  or, without any, per Subscription the caller may read; ``status`` parameters keep those
  in one of the statuses named. Repeated parameters (and comma-separated values) are
  ORed, as the OperationDefinition says.
- ``POST [base]/Subscription/$get-ws-binding-token`` (``id`` parameters) and
  ``[base]/Subscription/[id]/$get-ws-binding-token``: a short-lived token a websocket
  client presents (``bind-with-token <token>``) to receive the notifications of those
  websocket subscriptions; ``Parameters`` out: ``token``, ``expiration``,
  ``subscription``, ``websocket-url``.

Both need the caller to read each Subscription named (403 otherwise, 404 unknown). The
channels themselves are the platform's (``SUBSCRIPTIONS`` in the context's extras: an
object with ``status(subscription, fhir_base)`` and ``binding_token(subscriptions,
fhir_base)``); without it these operations are 501.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from fhir_server.http import FhirResponse, check_format, parameter_values, read_json_body
from fhir_server.interactions.context import FhirContext
from fhir_server.outcome import FhirError

SUBSCRIPTIONS = "subscriptions"
JSON = dict[str, Any]


async def subscription_status(ctx: FhirContext, request: Request, resource_id: str
                              ) -> Response:
    check_format(request)
    channels = _channels(ctx)
    subscription = await ctx.caller(request).read_json("Subscription", resource_id)
    base = ctx.fhir_base(request)
    status = await channels.status(subscription, base)
    return FhirResponse({"resourceType": "Bundle", "type": "searchset", "total": 1,
                         "entry": [{"resource": status, "search": {"mode": "match"}}]})


async def subscriptions_status(ctx: FhirContext, request: Request) -> Response:
    """``$status`` at type level (module docstring)."""
    check_format(request)
    channels = _channels(ctx)
    if request.method == "POST":
        body = await read_json_body(request) if await request.body() else {
            "resourceType": "Parameters"}
        pairs = parameter_values(body, "$status")
    else:
        pairs = list(request.query_params.multi_items())
    ids = _values(pairs, "id")
    statuses = _values(pairs, "status")
    caller = ctx.caller(request)
    if ids:
        subscriptions = [await caller.read_json("Subscription", i) for i in ids]
        if statuses:
            subscriptions = [s for s in subscriptions if s.get("status") in statuses]
    else:
        criteria = [("status", ",".join(statuses))] if statuses else []
        subscriptions = await caller.search("Subscription", criteria)
    base = ctx.fhir_base(request)
    entries = [{"resource": await channels.status(s, base), "search": {"mode": "match"}}
               for s in subscriptions]
    return FhirResponse({"resourceType": "Bundle", "type": "searchset",
                         "total": len(entries), "entry": entries})


def _values(pairs: list[tuple[str, str]], name: str) -> list[str]:
    found = [v.strip() for k, value in pairs if k == name for v in value.split(",")]
    return list(dict.fromkeys(v for v in found if v))


async def binding_token(ctx: FhirContext, request: Request, resource_id: str | None = None
                        ) -> Response:
    check_format(request)
    channels = _channels(ctx)
    if resource_id is not None:
        ids = [resource_id]
    else:
        body = await read_json_body(request) if await request.body() else {
            "resourceType": "Parameters"}
        ids = [v for k, v in parameter_values(body, "$get-ws-binding-token") if k == "id"]
        if not ids:
            raise FhirError.of(400, "required", "Name the subscriptions to bind: one or "
                               "more 'id' parameters", "Parameters.parameter")
    caller = ctx.caller(request)
    subscriptions = []
    for subscription_id in dict.fromkeys(ids):
        subscription = await caller.read_json("Subscription", subscription_id)
        if (subscription.get("channel") or {}).get("type") != "websocket":
            raise FhirError.of(400, "invalid", f"Subscription/{subscription_id} is not a "
                               "websocket subscription", "Subscription.channel.type")
        subscriptions.append(subscription)
    return FhirResponse(await channels.binding_token(subscriptions, ctx.fhir_base(request)))


def _channels(ctx: FhirContext) -> Any:
    channels = ctx.extras.get(SUBSCRIPTIONS)
    if channels is None:
        raise FhirError.of(501, "not-supported", "Subscriptions are not offered here")
    return channels
