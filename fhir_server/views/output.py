"""A view's rows in each output format, written batch by batch.

A :class:`RowWriter` takes the rows of a run a batch at a time and answers the bytes to
send or store next, so neither ``$run`` nor an export holds more than a batch (Parquet:
a row group) in memory:

- ``json``: one JSON array of objects (``application/json``);
- ``ndjson``: one object a line (``application/x-ndjson``);
- ``csv``: RFC 4180 text, with a header line unless ``header=false`` (``text/csv``);
  collections and complex values as JSON text;
- ``parquet``: Parquet (``application/vnd.apache.parquet``) through pyarrow, each column
  typed as the specification's type table says (:mod:`.types`), row groups of
  :data:`ROW_GROUP_ROWS`.

A null is ``null`` in JSON, an empty field in CSV, a null in Parquet; a collection
column is an array (a Parquet list).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from typing import Any, Protocol

import orjson

from fhir_server.outcome import FhirError
from fhir_server.views.definition import ViewColumn
from fhir_server.views.engine import Row
from fhir_server.views.types import arrow_value, text_value

FORMATS: dict[str, str] = {
    "json": "application/json", "ndjson": "application/x-ndjson", "csv": "text/csv",
    "parquet": "application/vnd.apache.parquet",
}
# Other names a client may use for them (_format values and Accept media types).
ALIASES: dict[str, str] = {
    "application/json": "json", "application/fhir+json": "json",
    "application/x-ndjson": "ndjson", "application/ndjson": "ndjson",
    "application/fhir+ndjson": "ndjson", "text/csv": "csv",
    "application/vnd.apache.parquet": "parquet", "application/parquet": "parquet",
    "application/octet-stream": "parquet",
}
EXTENSIONS = {"json": "json", "ndjson": "ndjson", "csv": "csv", "parquet": "parquet"}
ROW_GROUP_ROWS = 65_536


def output_format(value: str, parameter: str = "_format") -> str:
    """The format a ``_format`` value names (400 naming ``parameter`` otherwise)."""
    name = value.strip().lower().split(";")[0].strip()
    name = ALIASES.get(name, name)
    if name not in FORMATS:
        raise FhirError.of(400, "not-supported", f"Format {value!r} is not supported. "
                           f"Supported formats: {', '.join(FORMATS)}", parameter)
    return name


class RowWriter(Protocol):
    def begin(self) -> bytes: ...

    def write(self, rows: Sequence[Row]) -> bytes: ...

    def end(self) -> bytes: ...


def _object(names: Sequence[str], row: Row) -> dict[str, Any]:
    return {name: value for name, value in zip(names, row, strict=True)}


class JsonWriter:
    def __init__(self, columns: Sequence[ViewColumn]):
        self.names = [c.name for c in columns]
        self.first = True

    def begin(self) -> bytes:
        return b"["

    def write(self, rows: Sequence[Row]) -> bytes:
        if not rows:
            return b""
        body = b",".join(orjson.dumps(_object(self.names, row)) for row in rows)
        if self.first:
            self.first = False
            return body
        return b"," + body

    def end(self) -> bytes:
        return b"]"


class NdjsonWriter:
    def __init__(self, columns: Sequence[ViewColumn]):
        self.names = [c.name for c in columns]

    def begin(self) -> bytes:
        return b""

    def write(self, rows: Sequence[Row]) -> bytes:
        return b"".join(orjson.dumps(_object(self.names, row)) + b"\n" for row in rows)

    def end(self) -> bytes:
        return b""


class CsvWriter:
    def __init__(self, columns: Sequence[ViewColumn], header: bool = True):
        self.names = [c.name for c in columns]
        self.header = header

    def _lines(self, rows: Sequence[Sequence[Any]]) -> bytes:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\r\n")
        writer.writerows(rows)
        return buffer.getvalue().encode()

    def begin(self) -> bytes:
        return self._lines([self.names]) if self.header else b""

    def write(self, rows: Sequence[Row]) -> bytes:
        return self._lines([[text_value(v) for v in row] for row in rows])

    def end(self) -> bytes:
        return b""


class _Sink(io.RawIOBase):
    """Where pyarrow writes: the bytes since the last :meth:`take`."""

    def __init__(self) -> None:
        super().__init__()
        self.buffer = bytearray()
        self.position = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.buffer += data
        self.position += len(data)
        return len(data)

    def tell(self) -> int:
        return self.position

    def take(self) -> bytes:
        out = bytes(self.buffer)
        self.buffer.clear()
        return out


def arrow_schema(columns: Sequence[ViewColumn]) -> Any:
    import pyarrow as pa

    types = {"string": pa.string(), "bool": pa.bool_(), "int16": pa.int16(),
             "int32": pa.int32(), "int64": pa.int64(), "float32": pa.float32(),
             "float64": pa.float64(), "binary": pa.binary(), "date32": pa.date32(),
             "timestamp": pa.timestamp("us"), "timestamptz": pa.timestamp("us", tz="UTC")}
    fields = []
    for column in columns:
        kind = types[column.type.arrow_name]
        fields.append(pa.field(column.name, pa.list_(kind) if column.type.collection
                               else kind))
    return pa.schema(fields)


class ParquetWriter:
    """Parquet to a stream: the file's bytes come out as row groups are written."""

    def __init__(self, columns: Sequence[ViewColumn], row_group_rows: int = ROW_GROUP_ROWS):
        import pyarrow.parquet as pq

        self.columns = list(columns)
        self.schema = arrow_schema(columns)
        self.sink = _Sink()
        self.writer = pq.ParquetWriter(self.sink, self.schema)
        self.pending: list[Row] = []
        self.row_group_rows = row_group_rows
        self.kinds = [(c.type.arrow_name, c.type.collection) for c in columns]

    def begin(self) -> bytes:
        return b""

    def write(self, rows: Sequence[Row]) -> bytes:
        self.pending.extend(rows)
        if len(self.pending) < self.row_group_rows:
            return b""
        return self._flush()

    def _flush(self) -> bytes:
        import pyarrow as pa

        if self.pending:
            arrays = []
            for i, (kind, collection) in enumerate(self.kinds):
                values = [row[i] for row in self.pending]
                if collection:
                    values = [None if v is None else [arrow_value(x, kind) for x in v]
                              for v in values]
                elif kind != "string" or any(v.__class__ is not str and v is not None
                                             for v in values):
                    values = [arrow_value(v, kind) for v in values]
                arrays.append(pa.array(values, type=self.schema.field(i).type))
            self.writer.write_table(pa.Table.from_arrays(arrays, schema=self.schema))
            self.pending.clear()
        return self.sink.take()

    def end(self) -> bytes:
        flushed = self._flush()
        self.writer.close()
        return flushed + self.sink.take()


def row_writer(fmt: str, columns: Sequence[ViewColumn], *, header: bool = True,
               row_group_rows: int = ROW_GROUP_ROWS) -> RowWriter:
    if fmt == "json":
        return JsonWriter(columns)
    if fmt == "ndjson":
        return NdjsonWriter(columns)
    if fmt == "csv":
        return CsvWriter(columns, header)
    return ParquetWriter(columns, row_group_rows)
