"""An export straight from the store into a directory (``healthplatform export``).

The same :class:`~fhir_server.bulk.exporter.Exporter` as ``$export``, run as the system
(the operator on the server's machine): the files of each type, ``manifest.json`` in the
Bulk Data manifest's shape (``file://`` URLs), and ``.progress.json``, the progress after
each page, written atomically (a new file renamed over the old), from which ``resume``
goes on after a cut-off run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from fhir_server.access import SYSTEM
from fhir_server.bulk.exporter import ERRORS, Exporter, Progress, check_filters, file_name
from fhir_server.bulk.request import SYSTEM as SYSTEM_LEVEL
from fhir_server.bulk.request import parse_request
from fhir_server.caller import CallerFhir
from fhir_server.clock import now_instant
from fhir_server.outcome import FhirError
from fhir_server.private_files import write_private
from fhir_server.service import FhirService
from fhir_server.store import ResourceStore
from fhir_server.validation import resource_types

JSON = dict[str, Any]
PROGRESS = ".progress.json"


async def export_to_directory(store: ResourceStore, out: Path, params: list[tuple[str, str]],
                              *, level: str = SYSTEM_LEVEL, group_id: str | None = None,
                              page_size: int = 1000, resume: bool = False,
                              progress: Callable[[int], None] | None = None) -> JSON:
    """Export into ``out``; the manifest (also written to ``out/manifest.json``)."""
    service = FhirService(store)
    registry = await service.refresh_registry()
    level_types = None if level == SYSTEM_LEVEL else frozenset(
        {"Patient", *registry.compartment_types("Patient")})
    described = "healthplatform export " + " ".join(f"{k}={v}" for k, v in params)
    request = parse_request(params, level=level, url=described,
                            known_types=frozenset(resource_types()), level_types=level_types,
                            group_id=group_id, strict=True)
    await check_filters(service, request)
    system = CallerFhir(service, SYSTEM)
    if group_id is not None:
        await system.read("Group", group_id)  # 404 when there is none
    state = out / PROGRESS
    if resume and not state.exists():
        raise FhirError.of(400, "not-found", f"{out} holds no export to resume")
    saved = orjson.loads(state.read_bytes()) if resume else {}
    asked = {"params": [list(p) for p in params], "level": level, "group": group_id}
    if resume and saved.get("asked") != asked:
        raise FhirError.of(400, "invalid", "--resume must ask for what the export in "
                           f"{out} was started with: {saved.get('asked')}")
    started = saved.get("transactionTime") or now_instant()

    async def checkpoint(current: Progress) -> None:
        temporary = state.with_suffix(".tmp")
        write_private(temporary, orjson.dumps({"transactionTime": started, "asked": asked,
                                            "progress": current.to_json()}))
        os.replace(temporary, state)
        if progress is not None:
            progress(current.exported)

    done = await Exporter(system, request, out,
                          Progress.from_json(saved.get("progress")), checkpoint,
                          page_size=page_size).run()
    manifest = {
        "transactionTime": started, "request": described, "requiresAccessToken": False,
        "output": [{"type": t, "url": (out / file_name(t)).resolve().as_uri(),
                    "count": f["count"]} for t, f in sorted(done.files.items())
                   if t != ERRORS and f["count"]],
        "error": [{"type": "OperationOutcome",
                   "url": (out / file_name(ERRORS)).resolve().as_uri(),
                   "count": done.files[ERRORS]["count"]}] if ERRORS in done.files else [],
    }
    write_private(out / "manifest.json", orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
    state.unlink(missing_ok=True)
    return manifest
