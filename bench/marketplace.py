"""Checkouts competing for scarce stock: ``--clients`` (32) clients check out carts of
``--quantity`` (3) units of one product from one district store holding ``--stock``
(300) units, until every client has tried ``--carts`` (25) times.

Runs the whole app in one process on a fresh SQLite store in a temporary directory (rate
limits off), through httpx's ASGI transport; the catalogue is synced from a JSON feed
served over HTTP on a free local port. Prints one JSON line: checkouts/s (every answer,
won or refused), their p50/p99, how many won (201) and were refused (409
``INSUFFICIENT_STOCK``), the stock left, ``oversold`` (units promised beyond the stock:
won times quantity less the initial stock, when positive; must be 0), and whether what
is left is exactly the stock less what was won.

Usage: ``python bench/marketplace.py [--clients 32] [--carts 25] [--stock 300]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web
from asgi_lifespan import LifespanManager

from platform_api.app import create_app
from platform_api.settings import Settings

PASSWORD = "correct horse battery staple"
FEED = {"items": [{"sku": "ORS-20", "gtin": "06151100054321", "kind": "medicine",
                   "name": "Oral rehydration salts 20.5 g", "unit": "sachet",
                   "price": "0.35", "currency": "KES"}]}


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def serve_feed() -> tuple[web.AppRunner, str]:
    async def feed(_request: web.Request) -> web.Response:
        return web.json_response(FEED)
    app = web.Application()
    app.router.add_get("/catalogue.json", feed)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}/catalogue.json"


async def account(client: httpx.AsyncClient, email: str) -> tuple[str, dict[str, str]]:
    registered = await client.post("/api/auth/register", json={
        "email": email, "password": PASSWORD, "first_name": "Bench", "last_name": "User"})
    login = await client.post("/api/auth/login", json={"email": email, "password": PASSWORD})
    user_id = registered.json()["data"]["id"]
    return user_id, {"Authorization": f"Bearer {login.json()['data']['token']}"}


async def checked(response: Any) -> Any:
    answer = await response
    if answer.status_code >= 300:
        raise RuntimeError(f"{answer.request.method} {answer.request.url}: "
                           f"{answer.status_code} {answer.text}")
    return answer.json()["data"] if answer.content else None


async def run(clients: int, carts: int, stock: int, quantity: int) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="bench-marketplace-"))
    runner, feed_url = await serve_feed()
    try:
        settings = Settings(data_dir=folder, rate_limit_enabled=False, access_log=False,
                            log_level="WARNING", transcription_workers=0,
                            marketplace_feeds={"bench": {"url": feed_url}})
        app = create_app(settings)
        async with LifespanManager(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://bench") as c:
                return await measure(app, c, clients, carts, stock, quantity)
    finally:
        await runner.cleanup()
        shutil.rmtree(folder, ignore_errors=True)


async def measure(app: Any, c: httpx.AsyncClient, clients: int, carts: int, stock: int,
                  quantity: int) -> dict[str, Any]:
    admin_id, _ = await account(c, "platform@bench.example")
    await app.state.services.auth.set_roles(admin_id, ["SUPER:ADMIN"])
    _, platform = await account(c, "platform@bench.example")  # a token with the role
    _, seller = await account(c, "seller@bench.example")
    _, buyer = await account(c, "buyer@bench.example")
    seller_org = (await checked(c.post("/api/organizations", headers=seller, json={
        "name": "District store", "country": "KE"})))["id"]
    buyer_org = (await checked(c.post("/api/organizations", headers=buyer, json={
        "name": "Buying clinic", "country": "KE"})))["id"]
    created = await c.post("/fhir/Location", headers={
        **seller, "Content-Type": "application/fhir+json"}, json={
        "resourceType": "Location", "status": "active", "name": "District store",
        "managingOrganization": {"reference": f"Organization/{seller_org}"},
        "position": {"latitude": -1.2566, "longitude": 36.8616}})
    store = created.json()["id"]
    await checked(c.post("/api/marketplace/catalog/sync", headers=platform,
                         json={"feed": "bench"}))
    product = (await checked(c.get("/api/marketplace/products", headers=buyer)))[0]["id"]
    await checked(c.post("/api/marketplace/inventory/adjust", headers=seller, json={
        "facility_id": store, "product_id": product, "reason": "received",
        "quantity": stock, "lot_number": "B1", "expiry_date": "2031-12-31"}))
    cart = {"organization_id": buyer_org, "items": [
        {"product_id": product, "quantity": quantity, "source_facility_id": store}]}
    times: list[float] = []
    outcomes: dict[int, int] = {}

    async def shopper() -> None:
        for _ in range(carts):
            began = time.perf_counter()
            answer = await c.post("/api/marketplace/cart/checkout", headers=buyer, json=cart)
            times.append(time.perf_counter() - began)
            outcomes[answer.status_code] = outcomes.get(answer.status_code, 0) + 1
            if answer.status_code not in (201, 409):
                raise RuntimeError(f"checkout answered {answer.status_code}: {answer.text}")

    began = time.perf_counter()
    await asyncio.gather(*(shopper() for _ in range(clients)))
    elapsed = time.perf_counter() - began
    left = (await checked(c.get("/api/marketplace/inventory", headers=seller,
                                params={"facility_id": store})))[0]["on_hand"]
    won = outcomes.get(201, 0)
    return {
        "benchmark": "marketplace", "clients": clients, "checkouts": len(times),
        "checkouts_per_s": round(len(times) / elapsed, 1),
        "p50_ms": round(1000 * statistics.median(times), 1),
        "p99_ms": round(1000 * percentile(times, 0.99), 1),
        "won": won, "refused": outcomes.get(409, 0), "stock_initial": stock,
        "stock_left": left, "oversold": max(0, won * quantity - stock),
        "stock_consistent": left == stock - won * quantity and left >= 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--carts", type=int, default=25)
    parser.add_argument("--stock", type=int, default=300)
    parser.add_argument("--quantity", type=int, default=3)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    print(json.dumps(asyncio.run(run(args.clients, args.carts, args.stock, args.quantity))))


if __name__ == "__main__":
    main()
