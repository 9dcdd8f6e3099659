"""A local stand-in of a DHIS2 server's data value import, ``POST /api/dataValueSets``,
over real HTTP: it checks HTTP Basic or ``ApiToken`` authentication, keeps values keyed
as DHIS2 does (data element, period, organisation unit, category option combo), so a
period sent again is updated rather than duplicated, refuses values for organisation
units it does not know (a conflict, the value ignored), and answers DHIS2 2.38+'s
``WebMessage`` around an ``ImportSummary`` (HTTP 409 when there are conflicts), or with
``legacy`` the bare ``ImportSummary`` of DHIS2 2.37 and before."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

JSON = dict[str, Any]
KEY_FIELDS = ("dataElement", "period", "orgUnit", "categoryOptionCombo")


@dataclass
class Dhis2StandIn:
    username: str = "hmis-reporter"
    password: str = "district-2026"
    token: str = "d2pat_5xVA12xyUbWNedQxy4ohH77WlxRGVvZZ1151814092"
    org_units: set[str] = field(default_factory=lambda: {"KEkibera001", "KEmathare01"})
    legacy: bool = False
    values: dict[tuple[str, ...], str] = field(default_factory=dict)
    requests: list[JSON] = field(default_factory=list)

    def app(self) -> web.Application:
        application = web.Application()
        application.router.add_post("/api/dataValueSets", self.import_values)
        return application

    def _authorized(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        if header.startswith("ApiToken "):
            return header[len("ApiToken "):] == self.token
        if header.startswith("Basic "):
            user, _, secret = base64.b64decode(header[6:]).decode().partition(":")
            return (user, secret) == (self.username, self.password)
        return False

    async def import_values(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.json_response({"httpStatus": "Unauthorized", "httpStatusCode": 401,
                                      "status": "ERROR",
                                      "message": "Account is not authenticated"},
                                     status=401)
        body = await request.json()
        self.requests.append({"query": dict(request.query), "body": body})
        counts = {"imported": 0, "updated": 0, "ignored": 0, "deleted": 0}
        conflicts = []
        for value in body.get("dataValues", []):
            value = {"dataSet": body.get("dataSet"), **value}
            if value.get("orgUnit") not in self.org_units:
                counts["ignored"] += 1
                conflicts.append({"object": value.get("orgUnit"),
                                  "value": "Org unit not found or not accessible"})
                continue
            key = tuple(str(value[f]) for f in KEY_FIELDS)
            counts["updated" if key in self.values else "imported"] += 1
            self.values[key] = str(value["value"])
        status = "SUCCESS" if not conflicts else (
            "ERROR" if counts["ignored"] == len(body.get("dataValues", [])) else "WARNING")
        summary = {"responseType": "ImportSummary", "status": status,
                   "importOptions": {"importStrategy": request.query.get("importStrategy")},
                   "description": "Import process completed successfully",
                   "importCount": counts, "conflicts": conflicts, "dataSetComplete": "false"}
        if self.legacy:
            return web.json_response(summary)
        if conflicts:
            return web.json_response({
                "httpStatus": "Conflict", "httpStatusCode": 409, "status": "WARNING",
                "message": "One more conflicts encountered, please check import summary.",
                "response": summary}, status=409)
        return web.json_response({"httpStatus": "OK", "httpStatusCode": 200, "status": "OK",
                                  "message": "Import was successful.", "response": summary})
