"""Bulk Data export on this platform: who an export belongs to, and its access again later.

The export itself is :mod:`fhir_server.bulk` (kick-off, jobs, NDJSON files); this module
gives it the platform's side (:class:`~platform_api.stored_principal.PrincipalIdentity`):

- an export belongs to its **client**: a user (``user:<id>``), an API key
  (``api_key:<key id>``) or a SMART client (``smart:<client id>:<user>``; a backend
  services client has no user). One export per client at a time; only that client polls
  it and fetches its files (with a valid token or key each time, as any /fhir request);
- a job resumed after a restart runs under its client's access **as it is now** (the
  policy, from the stored principal: roles, memberships and scopes re-read): a user
  suspended or deleted, an API key revoked or a SMART client deactivated since the
  kick-off stops the export (it fails, saying so), and narrowed rights narrow what is
  still to come.

Settings: ``bulk_export_dir`` (default ``<data_dir>/bulk-exports``),
``bulk_export_retention_hours`` (how long finished exports' files are kept).
"""

from __future__ import annotations

from fhir_server.bulk.jobs import BulkExports
from platform_api.services import Services
from platform_api.stored_principal import PrincipalIdentity

EXTRAS_KEY = "bulk_exports"


def install(services: Services) -> BulkExports:
    """The platform's export jobs, in ``services.extras`` (started by the app)."""
    settings = services.settings
    jobs = services.extras[EXTRAS_KEY] = BulkExports(
        services.fhir, PrincipalIdentity(services),
        settings.bulk_export_dir or settings.data_dir / "bulk-exports",
        retention_seconds=settings.bulk_export_retention_hours * 3600)
    return jobs
