"""The batch and transaction engine: a Bundle of requests in, its response Bundle out.

Reached without HTTP — the ``POST [base]`` interaction, the HL7v2 gateway (each message
is one transaction), CDS Hooks and the patient index call :func:`process_bundle` — and
always on behalf of a caller, whose access every entry is checked against
(:data:`~fhir_server.access.SYSTEM` for the platform's own doors).

- :mod:`~fhir_server.transactions.entries`: parsing, checking and answering entries;
- :mod:`~fhir_server.transactions.references`: ``urn:uuid`` and conditional references;
- :mod:`~fhir_server.transactions.transaction`: a transaction, all or nothing;
- :mod:`~fhir_server.transactions.batch`: a batch, every entry on its own.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fhir_server.access import Access
from fhir_server.caller import CallerFhir
from fhir_server.service import FhirService
from fhir_server.transactions.batch import process_batch
from fhir_server.transactions.entries import bundle_entries, parse_entry
from fhir_server.transactions.transaction import OnCommit, Transaction

__all__ = ["OnCommit", "cyclic_gc_deferred", "process_bundle"]

_gc_holds = 0  # bundles being processed with the cyclic garbage collector held off


@contextmanager
def cyclic_gc_deferred(large: bool) -> Iterator[None]:
    """Hold off Python's cyclic garbage collector while a large bundle is processed.

    Validating and indexing hundreds of resources allocates millions of short-lived,
    acyclic objects; each allocation burst triggers collections that traverse every live
    object, the whole bundle included (measured: 15% of a 500-entry transaction). Nothing
    here creates cycles, so collecting once afterwards loses nothing. A counter keeps
    concurrent bundles from re-enabling it under each other."""
    global _gc_holds
    if not large or (_gc_holds == 0 and not gc.isenabled()):
        yield
        return
    _gc_holds += 1
    gc.disable()
    try:
        yield
    finally:
        _gc_holds -= 1
        if _gc_holds == 0:
            gc.enable()


async def process_bundle(service: FhirService, bundle: Any, *, access: Access,
                         base_url: str = "", prefer: str | None = None,
                         on_commit: OnCommit | None = None) -> dict[str, Any]:
    """A transaction or batch Bundle → its response Bundle (FhirError when refused), each
    entry as ``access`` allows (``SYSTEM`` for the platform's own doors).

    ``on_commit(staging, written)`` (transactions only) runs inside the commit with the
    "Type/id" each entry wrote or matched, in entry order; what it stages (documents,
    events) commits atomically with the resources."""
    kind = bundle.get("type") if isinstance(bundle, dict) else None
    if kind == "batch":
        return await process_batch(CallerFhir(service, access), bundle, base_url=base_url,
                                   prefer=prefer)
    raw_entries = bundle_entries(bundle, "transaction")
    with cyclic_gc_deferred(len(raw_entries) >= 50):
        entries = [parse_entry(i, e, base_url) for i, e in enumerate(raw_entries)]
        return await Transaction(CallerFhir(service, access), entries, base_url=base_url,
                                 prefer=prefer, on_commit=on_commit).run()


