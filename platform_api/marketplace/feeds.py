"""Clients of the outside systems the marketplace reads: supplier catalogue feeds (CSV or
JSON over HTTP) and the external stock system. Base URLs and credentials are settings;
what they answer is parsed into rows here and checked by the modules that use them."""

from __future__ import annotations

import csv
import io
from typing import Any

import httpx
import orjson

from platform_api.envelope import ApiError
from platform_api.settings import Settings

JSON = dict[str, Any]


def feed_config(settings: Settings, name: str) -> dict[str, str]:
    feed = settings.marketplace_feeds.get(name)
    if feed is None or not feed.get("url"):
        known = ", ".join(sorted(settings.marketplace_feeds)) or "none configured"
        raise ApiError(422, "UNKNOWN_FEED", f"No supplier feed named {name!r} (known: {known})",
                       field="feed")
    return feed


async def _get(settings: Settings, url: str, token: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with httpx.AsyncClient(timeout=settings.marketplace_http_timeout_seconds) as http:
            response = await http.get(url, headers=headers)
    except httpx.HTTPError as exc:
        raise ApiError(502, "UPSTREAM_UNAVAILABLE", f"Could not reach {url}: "
                       f"{type(exc).__name__}") from None
    if response.status_code != 200:
        raise ApiError(502, "UPSTREAM_REFUSED", f"{url} answered {response.status_code}")
    return response


async def fetch_feed(settings: Settings, feed: dict[str, str]) -> list[JSON]:
    """The rows of a supplier feed: CSV with a header line, or a JSON list (or an object
    whose ``items`` or ``products`` holds the list)."""
    response = await _get(settings, feed["url"], feed.get("token"))
    kind = (feed.get("format") or "").lower() or (
        "csv" if "csv" in response.headers.get("content-type", "") else "json")
    if kind == "csv":
        return [dict(row) for row in csv.DictReader(io.StringIO(response.text))]
    try:
        document = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        raise ApiError(502, "UPSTREAM_INVALID", "The feed's answer is not JSON") from None
    if isinstance(document, dict):
        document = document.get("items", document.get("products"))
    if not isinstance(document, list) or not all(isinstance(r, dict) for r in document):
        raise ApiError(502, "UPSTREAM_INVALID", "The feed's answer is not a list of products")
    return document


async def fetch_stock(settings: Settings, facility_code: str) -> list[JSON]:
    """A facility's stock as the external stock system counts it:
    ``GET {base}/facilities/{code}/stock`` → ``{"items": [{"gtin", "lot", "expiry",
    "quantity"}]}``."""
    if not settings.marketplace_stock_system_url:
        raise ApiError(503, "STOCK_SYSTEM_NOT_CONFIGURED", "No external stock system is "
                       "configured (HEALTHPLATFORM_MARKETPLACE_STOCK_SYSTEM_URL)")
    base = settings.marketplace_stock_system_url.rstrip("/")
    response = await _get(settings, f"{base}/facilities/{facility_code}/stock",
                          settings.marketplace_stock_system_token or None)
    try:
        items = orjson.loads(response.content).get("items")
    except (orjson.JSONDecodeError, AttributeError):
        items = None
    if not isinstance(items, list) or not all(isinstance(r, dict) for r in items):
        raise ApiError(502, "UPSTREAM_INVALID", "The stock system's answer has no items list")
    return items
