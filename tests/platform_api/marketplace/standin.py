"""A local stand-in for the outside systems the marketplace reads: a supplier's catalogue
feed (CSV and JSON over HTTP, bearer token) and a stock system (a facility's counts),
served by uvicorn on a free port; a test sets what they answer."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

TOKEN = "feed-token-7f3a"
CATALOGUE = [
    {"sku": "AMX-500-100", "gtin": "06151100012345", "name": "Amoxicillin 500 mg capsules",
     "kind": "medicine", "unit": "box of 100", "price": "12.50", "currency": "KES"},
    {"sku": "ORS-20", "gtin": "06151100054321", "name": "Oral rehydration salts 20.5 g",
     "kind": "medicine", "unit": "sachet", "price": "0.35", "currency": "KES"},
    {"sku": "GLV-M-100", "gtin": "", "name": "Nitrile examination gloves, medium",
     "kind": "consumable", "unit": "box of 100", "price": "7.20", "currency": "KES"},
]


@dataclass
class SupplierSystems:
    catalogue: list[dict[str, Any]] = field(default_factory=lambda: [dict(r) for r in CATALOGUE])
    stock: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # facility code →
    requests: list[str] = field(default_factory=list)
    url: str = ""

    def app(self) -> Starlette:
        async def feed_csv(request: Request) -> Response:
            if request.headers.get("authorization") != f"Bearer {TOKEN}":
                return JSONResponse({"error": "unauthorized"}, status_code=401)
            self.requests.append("csv")
            out = io.StringIO()
            columns = ["sku", "gtin", "name", "kind", "unit", "price", "currency"]
            writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(self.catalogue)
            return PlainTextResponse(out.getvalue(), media_type="text/csv")

        async def feed_json(request: Request) -> Response:
            self.requests.append("json")
            return JSONResponse({"items": self.catalogue})

        async def stock(request: Request) -> Response:
            code = request.path_params["code"]
            self.requests.append(f"stock:{code}")
            if code not in self.stock:
                return JSONResponse({"error": "unknown facility"}, status_code=404)
            return JSONResponse({"items": self.stock[code]})

        return Starlette(routes=[Route("/feeds/catalogue.csv", feed_csv),
                                 Route("/feeds/catalogue.json", feed_json),
                                 Route("/facilities/{code}/stock", stock)])
