"""What the Scheduling area's modules share: code systems, time and references.

**Who writes the slot inventory.** Reads go through the caller's
:class:`~fhir_server.caller.CallerFhir` (every list is one search carrying the caller's
grants). Who may do each workflow step (book, move, cancel, approve, write a schedule) is
a rule of the access policy (:mod:`platform_api.policy.actions.commerce`), asked with
``ctx.authorize``. Writes that touch Slots then run with the platform's rights, through
the policy's one named elevation (``ctx.elevate``, naming why): Slots are the
organization's shared inventory, taken by a public booking (no caller at all), freed by a
patient cancelling their own appointment (a patient may not write Slots) and rewritten
when a schedule changes (a doctor may change their schedule but not delete Slots). What
such a unit writes carries its owner explicitly: the organization of the schedulable
resource.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from typing import Annotated, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import AfterValidator

from fhir_server.ownership import OWNER_SYSTEM, owner_labels, with_owners
from fhir_server.store import ConditionChanged, ResourceExists, VersionConflict
from platform_api.envelope import ApiError

JSON = dict[str, Any]

# meta.tag of the actors that are schedulable resources; the code says which kind.
RESOURCE_TAG = "urn:healthplatform:scheduling-resource"
# meta.tag of an Appointment that began as a patient's request.
REQUEST_TAG = "urn:healthplatform:scheduling|appointment-request"
# meta.tag of an Appointment booked without signing in: its patient is the contact given
# (a contained Patient) until the organization's staff confirm who it is.
UNCONFIRMED_TAG = "urn:healthplatform:scheduling|unconfirmed-patient"
# meta.tag of a booked Slot a schedule change left outside the working hours.
CONFLICT_TAG = "urn:healthplatform:scheduling|outside-working-hours"
EXTENSION = "urn:healthplatform:extension:"
TIME_ZONE_EXTENSION = EXTENSION + "time-zone"
USER_SYSTEM = "urn:healthplatform:user"
SOURCE = "scheduling"
# A write that lost a race (a Slot taken or freed meanwhile) is worked out again this often.
ATTEMPTS = 4
RACE_ERRORS = (VersionConflict, ConditionChanged, ResourceExists)


def owned_by(resource: JSON, organization_id: str | None) -> JSON:
    return with_owners(resource, {organization_id}) if organization_id else resource


def organization_of(resource: JSON) -> str | None:
    """The (first) owning organization of a resource."""
    owners = sorted(owner_labels(resource))
    return owners[0] if owners else None


def owner_criterion(organization_id: str) -> tuple[str, str]:
    return ("_security", f"{OWNER_SYSTEM}|{organization_id}")


# -- time ----------------------------------------------------------------------------------
def zone(name: str) -> ZoneInfo:
    """An IANA time zone (ValueError naming it when unknown: a 422 for the field)."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown IANA time zone {name!r} (e.g. Africa/Nairobi)") from None


def valid_zone(name: str) -> str:
    zone(name)
    return name


# A payload field holding an IANA time zone (422 naming the field when unknown).
TimeZone = Annotated[str, AfterValidator(valid_zone)]


def instant(moment: datetime) -> str:
    """A FHIR instant in UTC to the second (``2026-12-01T05:00:00Z``)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def aware_utc(moment: datetime) -> datetime:
    """A payload's timestamp in UTC (one without an offset is taken as UTC, as the spec's
    'ISO 8601 UTC timestamp' says)."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def day_bounds(day: date, tz: ZoneInfo) -> tuple[datetime, datetime]:
    """The UTC instants where a local day begins and the next begins."""
    start = datetime.combine(day, time(0), tz)
    end = datetime.combine(day + timedelta(days=1), time(0), tz)
    return start.astimezone(UTC), end.astimezone(UTC)


def now_utc() -> datetime:
    return datetime.now(UTC)


# -- references ----------------------------------------------------------------------------
def reference(resource: JSON) -> str:
    return f"{resource['resourceType']}/{resource['id']}"


def local_id(ref: JSON | str | None, resource_type: str | None = None) -> str | None:
    """The id of a reference (``Patient/123`` → ``123``), when it points at that type."""
    text = ref.get("reference") if isinstance(ref, dict) else ref
    if not isinstance(text, str) or "/" not in text:
        return None
    kind, _, rest = text.partition("/")
    if resource_type is not None and kind != resource_type:
        return None
    return rest.split("/_history/")[0] or None


def tag_codes(resource: JSON, system: str) -> list[str]:
    return [t["code"] for t in (resource.get("meta") or {}).get("tag") or []
            if isinstance(t, dict) and t.get("system") == system and "code" in t]


def has_tag(resource: JSON, token: str) -> bool:
    system, _, code = token.partition("|")
    return code in tag_codes(resource, system)


def with_tag(resource: JSON, token: str, present: bool = True) -> JSON:
    """``resource`` with the ``system|code`` tag added (or removed)."""
    system, _, code = token.partition("|")
    meta = dict(resource.get("meta") or {})
    tags = [t for t in meta.get("tag") or []
            if not (t.get("system") == system and t.get("code") == code)]
    if present:
        tags.append({"system": system, "code": code})
    if tags:
        meta["tag"] = tags
    else:
        meta.pop("tag", None)
    changed = {**resource, "meta": meta} if meta else {k: v for k, v in resource.items()
                                                        if k != "meta"}
    return changed


def version_of(resource: JSON) -> int | None:
    return int((resource.get("meta") or {}).get("versionId", 0)) or None


def kept_changing() -> ApiError:
    return ApiError(409, "CONFLICT", "The schedule kept changing while this was being "
                    "written; retry")


__all__ = [
    "ATTEMPTS",
    "CONFLICT_TAG",
    "EXTENSION",
    "JSON",
    "RACE_ERRORS",
    "REQUEST_TAG",
    "RESOURCE_TAG",
    "SOURCE",
    "TIME_ZONE_EXTENSION",
    "UNCONFIRMED_TAG",
    "USER_SYSTEM",
    "aware_utc",
    "day_bounds",
    "has_tag",
    "instant",
    "kept_changing",
    "local_id",
    "now_utc",
    "organization_of",
    "owned_by",
    "owner_criterion",
    "parse_instant",
    "reference",
    "tag_codes",
    "valid_zone",
    "version_of",
    "with_tag",
    "zone",
]
