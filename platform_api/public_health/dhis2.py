"""A client of a DHIS2 server's data value import (``POST /api/dataValueSets``), the
national HMIS most ministries of health in Africa run.

It posts one ``dataValueSets`` JSON document (``dataSet``, ``period``, ``orgUnit``,
``dataValues: [{dataElement, period, orgUnit, categoryOptionCombo, value}]``) with
``importStrategy=CREATE_AND_UPDATE``: DHIS2 keys a value by data element, period,
organisation unit and category option combo, so sending a period again updates its
values instead of adding new ones (the push is idempotent per period). Authentication: a
personal access token (``Authorization: ApiToken …``, DHIS2 2.37+) when
``HEALTHPLATFORM_HMIS_TOKEN`` is set, else HTTP Basic with the username and password.

The answer is DHIS2's import summary (``ImportSummary``: ``status`` SUCCESS | WARNING |
ERROR, ``importCount {imported, updated, ignored, deleted}``, ``conflicts``), whether it
comes bare (DHIS2 up to 2.37) or inside a ``WebMessage``'s ``response`` (2.38 and later,
where a summary with conflicts comes with HTTP 409). What cannot be read as one is a
:class:`HmisError`. Credentials are never logged nor put in an error message.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import httpx

from platform_api.settings import Settings

JSON = dict[str, Any]
IMPORT_PATH = "/api/dataValueSets"
COUNTS = ("imported", "updated", "ignored", "deleted")


class HmisError(Exception):
    """The HMIS could not be reached, refused the credentials, or answered no import
    summary: ``code`` for the /api error."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


@dataclass(frozen=True)
class ImportSummary:
    status: str  # SUCCESS | WARNING | ERROR
    description: str
    import_count: dict[str, int]
    conflicts: list[JSON] = field(default_factory=list)

    @classmethod
    def of(cls, body: Any) -> ImportSummary | None:
        """The summary in a DHIS2 answer (bare or in a WebMessage), or None."""
        if not isinstance(body, dict):
            return None
        inner = body.get("response")
        summary: JSON = inner if isinstance(inner, dict) else body
        count = summary.get("importCount")
        if not isinstance(count, dict):
            return None
        conflicts = [c for c in summary.get("conflicts") or [] if isinstance(c, dict)]
        return cls(str(summary.get("status") or body.get("status") or "SUCCESS"),
                   str(summary.get("description") or body.get("message") or ""),
                   {k: int(count.get(k) or 0) for k in COUNTS},
                   [{"object": c.get("object"), "value": c.get("value")} for c in conflicts])


@dataclass(frozen=True)
class Dhis2Client:
    base_url: str
    username: str = ""
    password: str = ""
    token: str = ""
    timeout: float = 30.0

    @classmethod
    def from_settings(cls, settings: Settings) -> Dhis2Client:
        if not settings.hmis_url:
            raise HmisError("HMIS_NOT_CONFIGURED", "No HMIS (DHIS2) server is configured on "
                            "this platform (HEALTHPLATFORM_HMIS_URL)")
        return cls(settings.hmis_url.rstrip("/"), settings.hmis_username,
                   settings.hmis_password, settings.hmis_token,
                   settings.hmis_timeout_seconds)

    def _headers(self) -> dict[str, str]:
        if self.token:
            return {"Authorization": f"ApiToken {self.token}"}
        credentials = f"{self.username}:{self.password}".encode()
        return {"Authorization": "Basic " + base64.b64encode(credentials).decode("ascii")}

    async def import_data_values(self, data_value_set: JSON) -> ImportSummary:
        """Post ``data_value_set``; DHIS2's import summary."""
        try:
            async with httpx.AsyncClient(timeout=self.timeout) as client:
                response = await client.post(
                    self.base_url + IMPORT_PATH, json=data_value_set,
                    headers={**self._headers(), "Accept": "application/json"},
                    params={"importStrategy": "CREATE_AND_UPDATE", "dryRun": "false"})
        except httpx.HTTPError as error:
            raise HmisError("HMIS_UNREACHABLE", f"The HMIS server could not be reached: "
                            f"{type(error).__name__}") from None
        if response.status_code in (401, 403):
            raise HmisError("HMIS_AUTH_FAILED", f"The HMIS server refused this platform's "
                            f"credentials (HTTP {response.status_code})")
        try:
            body = response.json()
        except ValueError:
            body = None
        summary = ImportSummary.of(body)
        if summary is None:
            said = body.get("message") if isinstance(body, dict) else None
            raise HmisError("HMIS_REJECTED", f"The HMIS server answered HTTP "
                            f"{response.status_code} without an import summary"
                            + (f": {said}" if said else ""))
        return summary
