"""``$viewdefinition-export`` on the Bulk Data machinery: one or several views' rows to
files, as the exporting caller, resumable after a restart.

A :class:`ViewExportRequest` (kept with the job, as :class:`~.request.ExportRequest` is)
holds each view as it was when the export started (a stored view's JSON is copied, so an
edit meanwhile changes nothing), the output format, and the run's scope (``_since``, and
the patients ``patient`` and ``group`` named, resolved once at kick-off).

:class:`ViewExporter` runs the views in turn. The resources are the caller's searches of
the view's type (:mod:`fhir_server.views.source`), page by page; each page's rows go to
the view's file:

- ``ndjson``, ``csv``, ``json``: one file per view (``<name>.<ext>``), appended and flushed
  a page at a time; the checkpoint after each page keeps the file's length and the next
  page's cursor, and a restart cuts the file back to that length and goes on from that
  cursor (as ``$export`` does);
- ``parquet``: a Parquet file cannot be cut back, so a view's rows go to parts
  (``<name>.part<k>.parquet``) of about ``part_rows`` rows each; a part is closed (its
  footer written) and then checkpointed with the cursor after it. The checkpoints in
  between keep the job alive but point at the open part's start, so a restart removes
  the unfinished part and writes it again from there: no row lost or written twice.

The column types of Parquet follow the specification's type table (:mod:`fhir_server.views.types`).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from fhir_server.caller import CallerFhir
from fhir_server.private_files import private_directory, private_open, write_private
from fhir_server.views.definition import CompiledView
from fhir_server.views.engine import Row
from fhir_server.views.output import EXTENSIONS, ROW_GROUP_ROWS, RowWriter, row_writer
from fhir_server.views.request import stored_compiled
from fhir_server.views.source import Position, Scope, pages

JSON = dict[str, Any]
VIEW_KIND = "view"
PART_ROWS = 250_000


@dataclass(frozen=True, slots=True)
class ExportedView:
    name: str
    view: JSON  # the ViewDefinition's JSON, as it was at kick-off

    def to_json(self) -> JSON:
        return {"name": self.name, "view": self.view}


@dataclass(frozen=True, slots=True)
class ViewExportRequest:
    """What to export (JSON-able: the job keeps it)."""

    url: str
    views: tuple[ExportedView, ...]
    format: str = "ndjson"
    header: bool = True
    since: str | None = None
    patients: tuple[str, ...] | None = None
    client_tracking_id: str | None = None
    kind: str = VIEW_KIND

    def to_json(self) -> JSON:
        return {"kind": self.kind, "url": self.url,
                "views": [v.to_json() for v in self.views], "format": self.format,
                "header": self.header, "since": self.since,
                "patients": list(self.patients) if self.patients is not None else None,
                "client_tracking_id": self.client_tracking_id}

    @classmethod
    def from_json(cls, data: JSON) -> ViewExportRequest:
        patients = data.get("patients")
        return cls(data["url"], tuple(ExportedView(v["name"], v["view"])
                                      for v in data["views"]),
                   data.get("format", "ndjson"), data.get("header", True), data.get("since"),
                   tuple(patients) if patients is not None else None,
                   data.get("client_tracking_id"))


@dataclass(slots=True)
class ViewProgress:
    """Where an export stands, as far as its files are durable (JSON-able)."""

    view: int = 0  # index into the request's views
    step: int = 0  # the source's position within the view
    cursor: str | None = None
    files: dict[str, JSON] = field(default_factory=dict)  # file name → view, count, bytes
    exported: int = 0  # rows
    steps: int = 0

    def to_json(self) -> JSON:
        return {"view": self.view, "step": self.step, "cursor": self.cursor,
                "files": self.files, "exported": self.exported, "steps": self.steps}

    @classmethod
    def from_json(cls, data: JSON | None) -> ViewProgress:
        data = data or {}
        return cls(data.get("view", 0), data.get("step", 0), data.get("cursor"),
                   dict(data.get("files") or {}), data.get("exported", 0),
                   data.get("steps", 0))


Checkpoint = Callable[[ViewProgress], Awaitable[None]]


def _open(path: Path, mode: str) -> Any:
    """A file for appending a page at a time (a local disk: a page's write is short)."""
    return private_open(path, mode)  # the caller closes it


def is_view_export(request: JSON) -> bool:
    return request.get("kind") == VIEW_KIND


class ViewExporter:
    """One view export's work: ``await ViewExporter(...).run()`` writes the files."""

    def __init__(self, caller: CallerFhir, request: ViewExportRequest, directory: Path,
                 progress: ViewProgress, checkpoint: Checkpoint, *, page_size: int = 1000,
                 part_rows: int = PART_ROWS):
        self.caller, self.request, self.directory = caller, request, directory
        self.progress, self.checkpoint = progress, checkpoint
        self.page_size, self.part_rows = page_size, part_rows

    async def run(self) -> ViewProgress:
        private_directory(self.directory)
        self._reopen()
        self.progress.steps = len(self.request.views)
        scope = Scope(self.request.since, self.request.patients)
        while self.progress.view < len(self.request.views):
            exported = self.request.views[self.progress.view]
            view = stored_compiled(exported.view, "view")
            if self.request.format == "parquet":
                await self._parquet(exported.name, view, scope)
            else:
                await self._text(exported.name, view, scope)
            self.progress.view += 1
            self.progress.step, self.progress.cursor = 0, None
        return self.progress

    def _start(self) -> Position:
        return Position(self.progress.step, self.progress.cursor)

    def _moved(self, position: Position) -> None:
        self.progress.step, self.progress.cursor = position.step, position.cursor

    def _rows(self, view: CompiledView, bodies: list[bytes]) -> list[Row]:
        rows: list[Row] = []
        for body in bodies:
            rows += view.rows(orjson.loads(body))
        return rows

    # -- one file a view, cut back on resume ------------------------------------------------
    async def _text(self, name: str, view: CompiledView, scope: Scope) -> None:
        file = f"{name}.{EXTENSIONS[self.request.format]}"
        entry = self.progress.files.setdefault(file, {"view": name, "count": 0, "bytes": 0})
        writer = row_writer(self.request.format, view.columns, header=self.request.header)
        with _open(self.directory / file, "ab") as handle:
            if entry["bytes"] == 0:
                handle.write(writer.begin())
            elif self.request.format == "json":
                writer.first = False  # type: ignore[attr-defined]  # resumed inside the array
            async for bodies, position in pages(self.caller, view.resource, scope,
                                                start=self._start(),
                                                page_size=self.page_size):
                rows = self._rows(view, bodies)
                handle.write(writer.write(rows))
                if position.done:
                    handle.write(writer.end())
                    entry["ended"] = True
                self._flushed(handle, entry, len(rows), position)
                await self.checkpoint(self.progress)
            if not entry.get("ended"):  # nothing to read (a Group without members)
                handle.write(writer.end())
                entry["ended"] = True
                self._flushed(handle, entry, 0, None)

    def _flushed(self, handle: Any, entry: JSON, rows: int, position: Position | None
                 ) -> None:
        handle.flush()
        entry["count"] += rows
        entry["bytes"] = handle.tell()
        self.progress.exported += rows
        if position is not None:
            self._moved(position)

    # -- parquet parts, closed and then checkpointed --------------------------------------------
    async def _parquet(self, name: str, view: CompiledView, scope: Scope) -> None:
        parts = sum(1 for f in self.progress.files.values() if f["view"] == name)
        writer: RowWriter | None = None
        handle: Any = None
        in_part = 0
        try:
            async for bodies, position in pages(self.caller, view.resource, scope,
                                                start=self._start(),
                                                page_size=self.page_size):
                if writer is None:
                    parts += 1
                    file = f"{name}.part{parts}.parquet"
                    handle = _open(self.directory / file, "wb")  # closed below
                    writer = row_writer("parquet", view.columns,
                                        row_group_rows=min(ROW_GROUP_ROWS, self.part_rows))
                    in_part = 0
                rows = self._rows(view, bodies)
                handle.write(writer.write(rows))
                in_part += len(rows)
                if in_part >= self.part_rows or position.done:
                    handle.write(writer.end())
                    handle.close()
                    self.progress.files[file] = {"view": name, "count": in_part,
                                                 "bytes": (self.directory / file).stat().st_size}
                    self.progress.exported += in_part
                    self._moved(position)
                    writer, handle = None, None
                # After a closed part: durable from here. Otherwise the open part's start.
                await self.checkpoint(self.progress)
        finally:
            if handle is not None:
                handle.close()
        if parts == 0:  # no rows at all: one empty part, so the view has its file
            file = f"{name}.part1.parquet"
            empty = row_writer("parquet", view.columns)
            write_private(self.directory / file, empty.begin() + empty.end())
            self.progress.files[file] = {"view": name, "count": 0,
                                         "bytes": (self.directory / file).stat().st_size}

    def _reopen(self) -> None:
        """Cut each text file back to its checkpointed length; remove what no checkpoint
        knows (an unfinished Parquet part, a file written after the last checkpoint)."""
        known = {f: entry["bytes"] for f, entry in self.progress.files.items()}
        for path in self.directory.iterdir():
            if path.name not in known:
                path.unlink()
            elif path.stat().st_size != known[path.name]:
                os.truncate(path, known[path.name])
