"""Standard Webhooks verification (https://www.standardwebhooks.com), shared by the
families that sign that way: e-mail delivery, inbound forms, the HR system.

A request carries ``webhook-id``, ``webhook-timestamp`` (unix seconds) and
``webhook-signature`` (``v1,<base64 HMAC-SHA256 of "id.timestamp.body">``, several
separated by spaces during a key rotation); the ``standardwebhooks`` library checks
them with the endpoint's ``whsec_…`` secret and a 5-minute tolerance either side. The
event id is ``webhook-id``.
"""

from __future__ import annotations

import binascii

from standardwebhooks import Webhook
from standardwebhooks.webhooks import EmptyWebhookSecretError, WebhookVerificationError
from starlette.requests import Request

from platform_api.envelope import ApiError
from platform_api.webhooks.inbound import log, refuse


def verify_standard_webhook(request: Request, body: bytes, secret: str, family: str) -> str:
    """The ``webhook-id`` of a request whose signature holds; 401 otherwise (503 when the
    configured secret is not a Standard Webhooks secret)."""
    try:
        verifier = Webhook(secret)
    except (EmptyWebhookSecretError, binascii.Error, ValueError) as exc:
        log.error("webhook %s: the configured secret is not a whsec_ base64 secret: %s",
                  family, type(exc).__name__)
        raise ApiError(503, "WEBHOOK_NOT_CONFIGURED", f"The {family} webhook secret is "
                       "not a valid Standard Webhooks secret") from None
    headers = {name: request.headers.get(name, "") for name in
               ("webhook-id", "webhook-timestamp", "webhook-signature")}
    try:
        verifier.verify(body, headers, json_parse=False)
    except (WebhookVerificationError, ValueError, binascii.Error, UnicodeDecodeError) as exc:
        # ValueError/binascii.Error: a signature header that is not "v1,<base64>"
        raise refuse(family, request, str(exc) or type(exc).__name__) from None
    return headers["webhook-id"]
