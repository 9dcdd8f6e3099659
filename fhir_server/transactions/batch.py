"""batch: a ``batch`` Bundle (R4 3.1.0.11): every entry on its own.

Each entry is processed independently, in the Bundle's order, in its own unit of work
(the same resolution, conditional-reference and write rules as a transaction entry); a
failing entry does not affect the others and answers its own status with an
OperationOutcome in ``response.outcome``. Entries may not reference each other by
``fullUrl`` (R4: that needs a transaction), so no ``urn:uuid`` rewriting happens here.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fhir_server.caller import CallerFhir
from fhir_server.http import store_error_to_fhir
from fhir_server.outcome import FhirError
from fhir_server.store import StoreError
from fhir_server.transactions.entries import Entry, bundle_entries, parse_entry, read_entry
from fhir_server.transactions.transaction import Transaction


def _error_entry(error: FhirError) -> dict[str, Any]:
    status = f"{error.status} {HTTPStatus(error.status).phrase}"
    return {"response": {"status": status, "outcome": error.outcome()}}


async def _process_entry(fhir: CallerFhir, entry: Entry, base_url: str,
                         prefer: str | None) -> dict[str, Any]:
    if entry.method in ("GET", "HEAD"):
        return await read_entry(fhir, entry, base_url)
    single = Transaction(fhir, [entry], base_url=base_url, prefer=prefer)
    response = await single.run()
    return response["entry"][0]  # type: ignore[no-any-return]


async def process_batch(fhir: CallerFhir, bundle: Any, *, base_url: str = "",
                        prefer: str | None = None) -> dict[str, Any]:
    """A batch Bundle → its ``batch-response`` Bundle (one response per entry)."""
    responses: list[dict[str, Any]] = []
    for index, raw_entry in enumerate(bundle_entries(bundle, "batch")):
        try:
            entry = parse_entry(index, raw_entry, base_url)
            responses.append(await _process_entry(fhir, entry, base_url, prefer))
        except FhirError as exc:
            responses.append(_error_entry(exc))
        except StoreError as exc:
            responses.append(_error_entry(store_error_to_fhir(exc)))
    return {"resourceType": "Bundle", "type": "batch-response", "entry": responses}
