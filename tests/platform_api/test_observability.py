"""Request ids, the JSON access log and JSON log formatting (platform_api.observability)."""

from __future__ import annotations

import io
import json
import logging
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request

from platform_api import observability
from platform_api.observability import (
    ACCESS_LOGGER_NAME,
    JsonFormatter,
    RequestContextMiddleware,
    configure_logging,
    request_id_var,
)

patients_log = logging.getLogger("healthplatform.patients")


def build_clinic_app(*, access_log: bool = True) -> FastAPI:
    app = FastAPI(docs_url=None, redoc_url=None)

    @app.get("/patients/{patient_id}")
    async def read_patient(patient_id: str, request: Request) -> dict[str, Any]:
        patients_log.info("read patient %s", patient_id)
        return {
            "id": patient_id,
            "state_request_id": request.state.request_id,
            "context_request_id": request_id_var.get(),
        }

    @app.get("/patients/{patient_id}/everything")
    async def patient_everything(patient_id: str) -> dict[str, Any]:
        raise RuntimeError(f"store unavailable while reading Patient/{patient_id}")

    app.add_middleware(RequestContextMiddleware, access_log=access_log)
    return app


class LogCapture:
    """JSON lines written by JsonFormatter for the healthplatform loggers."""

    def __init__(self) -> None:
        self.stream = io.StringIO()

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stream.getvalue().splitlines()]

    def access_lines(self) -> list[dict[str, Any]]:
        return [line for line in self.lines() if line["logger"] == ACCESS_LOGGER_NAME]


@pytest.fixture
def logs() -> Iterator[LogCapture]:
    capture = LogCapture()
    handler = logging.StreamHandler(capture.stream)
    handler.setFormatter(JsonFormatter())
    platform = logging.getLogger("healthplatform")
    previous_level = platform.level
    platform.addHandler(handler)
    platform.setLevel(logging.INFO)
    try:
        yield capture
    finally:
        platform.removeHandler(handler)
        platform.setLevel(previous_level)


def client_for(app: FastAPI) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://testserver")


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(build_clinic_app()) as c:
        yield c


async def test_sane_incoming_request_id_is_echoed_and_given_to_the_handler(
    client: httpx.AsyncClient, logs: LogCapture
) -> None:
    response = await client.get(
        "/patients/pat-001", headers={"X-Request-ID": "lab-gw_2024.06.01-0001"}
    )

    assert response.status_code == 200
    assert response.headers["x-request-id"] == "lab-gw_2024.06.01-0001"
    body = response.json()
    assert body["state_request_id"] == "lab-gw_2024.06.01-0001"
    assert body["context_request_id"] == "lab-gw_2024.06.01-0001"


async def test_request_id_of_128_characters_is_accepted(
    client: httpx.AsyncClient, logs: LogCapture
) -> None:
    longest = "a" * 128

    response = await client.get("/patients/pat-001", headers={"X-Request-ID": longest})

    assert response.headers["x-request-id"] == longest


async def test_missing_request_id_is_generated_as_uuid4_hex(
    client: httpx.AsyncClient, logs: LogCapture
) -> None:
    first = await client.get("/patients/pat-001")
    second = await client.get("/patients/pat-001")

    request_id = first.headers["x-request-id"]
    assert uuid.UUID(hex=request_id).version == 4
    assert request_id == uuid.UUID(hex=request_id).hex
    assert first.json()["state_request_id"] == request_id
    assert second.headers["x-request-id"] != request_id


@pytest.mark.parametrize(
    "insane",
    [
        b"",
        b"a" * 129,
        b"visit 42",
        b"Patient/pat-001",
        b"id;drop",
        "behandlung-\u00e4".encode(),
        b'{"level":"ERROR"}',
    ],
    ids=["empty", "129-chars", "space", "slash", "semicolon", "non-ascii", "json"],
)
async def test_insane_request_id_is_replaced_by_a_generated_one(
    client: httpx.AsyncClient, logs: LogCapture, insane: bytes
) -> None:
    response = await client.get("/patients/pat-001", headers=[(b"X-Request-ID", insane)])

    request_id = response.headers["x-request-id"]
    assert request_id.encode() != insane
    assert uuid.UUID(hex=request_id).version == 4
    assert logs.access_lines()[0]["request_id"] == request_id


async def test_each_request_writes_one_json_access_line_with_its_fields(
    client: httpx.AsyncClient, logs: LogCapture
) -> None:
    response = await client.get(
        "/patients/pat-001",
        params={"family": "Odhiambo", "birthdate": "1984-03-02"},
        headers={"X-Request-ID": "ward-7-0042", "User-Agent": "ward-tablet/3.1"},
    )

    assert response.status_code == 200
    [line] = logs.access_lines()
    assert line["level"] == "INFO"
    assert line["request_id"] == "ward-7-0042"
    assert line["method"] == "GET"
    # Without the query string: search parameters identify patients.
    assert line["path"] == "/patients/pat-001"
    assert line["status"] == 200
    assert isinstance(line["duration_ms"], float) and line["duration_ms"] >= 0
    assert line["client_ip"] == "127.0.0.1"
    assert line["user_agent"] == "ward-tablet/3.1"
    assert line["message"] == "GET /patients/pat-001 200"
    assert line["timestamp"].endswith("Z")


async def test_unknown_route_is_logged_with_its_status(
    client: httpx.AsyncClient, logs: LogCapture
) -> None:
    response = await client.post("/appointments")

    assert response.status_code == 404
    [line] = logs.access_lines()
    assert (line["method"], line["path"], line["status"]) == ("POST", "/appointments", 404)


async def test_unhandled_exception_is_logged_as_500_with_its_traceback(
    client: httpx.AsyncClient, logs: LogCapture
) -> None:
    response = await client.get(
        "/patients/pat-001/everything", headers={"X-Request-ID": "everything-1"}
    )

    assert response.status_code == 500
    [line] = logs.access_lines()
    assert line["level"] == "ERROR"
    assert line["status"] == 500
    assert line["request_id"] == "everything-1"
    assert "RuntimeError: store unavailable while reading Patient/pat-001" in line["exc"]


async def test_handler_log_lines_carry_the_request_id(
    client: httpx.AsyncClient, logs: LogCapture
) -> None:
    await client.get("/patients/pat-001", headers={"X-Request-ID": "ward-7-0043"})

    [line] = [line for line in logs.lines() if line["logger"] == "healthplatform.patients"]
    assert line["message"] == "read patient pat-001"
    assert line["request_id"] == "ward-7-0043"


async def test_request_id_is_forgotten_after_the_response(
    client: httpx.AsyncClient, logs: LogCapture
) -> None:
    await client.get("/patients/pat-001", headers={"X-Request-ID": "ward-7-0044"})

    assert request_id_var.get() is None


async def test_access_log_off_writes_no_line_but_still_sets_the_request_id(
    logs: LogCapture,
) -> None:
    async with client_for(build_clinic_app(access_log=False)) as client:
        response = await client.get("/patients/pat-001", headers={"X-Request-ID": "quiet-1"})

    assert response.headers["x-request-id"] == "quiet-1"
    assert logs.access_lines() == []


def test_formatter_writes_extra_fields_and_exceptions_as_json() -> None:
    record = logging.LogRecord(
        "healthplatform.hl7", logging.WARNING, __file__, 1, "rejected %s", ("ADT^A01",), None
    )
    record.control_id = "MSG00001"
    try:
        raise ValueError("PID-3 is empty")
    except ValueError:
        record.exc_info = sys.exc_info()

    entry = json.loads(JsonFormatter().format(record))

    assert entry["level"] == "WARNING"
    assert entry["logger"] == "healthplatform.hl7"
    assert entry["message"] == "rejected ADT^A01"
    assert entry["control_id"] == "MSG00001"
    assert "ValueError: PID-3 is empty" in entry["exc"]
    assert "request_id" not in entry


@pytest.fixture
def root_logging() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    platform = logging.getLogger("healthplatform")
    saved = (list(root.handlers), root.level, platform.level, platform.propagate)
    flags = (logging.logThreads, logging.logProcesses, logging.logMultiprocessing)
    try:
        yield root
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        platform.setLevel(saved[2])
        platform.propagate = saved[3]
        logging.logThreads, logging.logProcesses, logging.logMultiprocessing = flags


def test_configure_logging_installs_one_json_handler_however_often_called(
    root_logging: logging.Logger,
) -> None:
    configure_logging("info")
    configure_logging("DEBUG")

    json_handlers = [h for h in root_logging.handlers if isinstance(h.formatter, JsonFormatter)]
    assert len(json_handlers) == 1
    assert root_logging.level == logging.DEBUG
    assert logging.getLogger("healthplatform").getEffectiveLevel() == logging.DEBUG


def test_configure_logging_rejects_an_unknown_level(root_logging: logging.Logger) -> None:
    with pytest.raises(ValueError, match="'verbose' is not one of"):
        configure_logging("verbose")


async def test_the_direct_access_line_is_the_line_the_formatter_writes(
    root_logging: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Alone on the root (as in production), the JSON handler gets access lines directly;
    they must read exactly like those formatted from a LogRecord."""
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    root_logging.handlers[:] = []  # pytest's capture handlers off: production's setup
    configure_logging("info")
    handler = root_logging.handlers[0]
    assert observability._sole_json_handler() is handler  # the direct path is taken
    async def access_lines() -> list[dict[str, object]]:
        async with client_for(build_clinic_app()) as c:
            await c.get("/patients/pat-9", headers={"X-Request-ID": "direct-1",
                                                    "User-Agent": "lab-bench/1"})
        handler.flush()
        return [json.loads(line) for line in stream.getvalue().splitlines()
                if json.loads(line)["logger"] == ACCESS_LOGGER_NAME]

    direct = await access_lines()
    # The same request with another handler beside it: the LogRecord path.
    side = logging.StreamHandler(io.StringIO())
    root_logging.addHandler(side)
    assert observability._sole_json_handler() is None
    stream.seek(0)
    stream.truncate()
    formatted = await access_lines()
    assert len(direct) == len(formatted) == 1
    for line in (direct[0], formatted[0]):
        line.pop("timestamp")
        line.pop("duration_ms")
    assert direct[0] == formatted[0]
    assert list(direct[0]) == list(formatted[0])  # same fields, same order
