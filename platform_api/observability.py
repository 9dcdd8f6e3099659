"""Request correlation and structured logs for the whole service.

``RequestContextMiddleware`` gives every HTTP request an id (the caller's ``X-Request-ID``
when it is sane, a fresh one otherwise), makes it visible to handlers through
``request.state.request_id`` and ``request_id_var``, echoes it in the response and writes
one access log line per request on ``healthplatform.access``.

``configure_logging`` makes every log line one JSON object, with the request id of the
request being served when there is one, so that a request can be followed across the
FHIR server, the /api facades and the HL7 gateway.

The middleware is pure ASGI rather than Starlette's ``BaseHTTPMiddleware``: the service
targets thousands of requests a second on one core, and the latter costs a task and a
stream per request.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import sys
import time
from contextvars import ContextVar
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from platform_api.client_origin import client_origin

__all__ = [
    "ACCESS_LOGGER_NAME",
    "JsonFormatter",
    "RequestContextMiddleware",
    "configure_logging",
    "new_request_id",
    "request_id_var",
    "request_scope_var",
]

ACCESS_LOGGER_NAME = "healthplatform.access"
REQUEST_ID_HEADER = b"x-request-id"

request_id_var: ContextVar[str | None] = ContextVar("request_id", default=None)
# The ASGI scope of the request being served: where it came from (client address, user
# agent) for the clinical audit trail (platform_api.sessions.audit), read only when needed.
request_scope_var: ContextVar[Scope | None] = ContextVar("request_scope", default=None)

# An incoming id is copied into logs and response headers, so only accept what cannot
# forge a log field or a header and cannot flood the logs.
_SANE_REQUEST_ID = re.compile(rb"[A-Za-z0-9._-]{1,128}")

_access_logger = logging.getLogger(ACCESS_LOGGER_NAME)
_platform_logger = logging.getLogger("healthplatform")


def new_request_id() -> str:
    """A random UUID (version 4) as 32 hex digits, like ``uuid.uuid4().hex``.

    From the process's Mersenne Twister (seeded from the OS at start), not ``os.urandom``:
    a request id must be unique, not secret, and a ``getrandom`` system call per request
    was 4% of a trivial request's time (system calls are dear in this VM).
    """
    bits = random.getrandbits(128)
    bits = (bits & ~(0xF000 << 64)) | (0x4000 << 64)  # version 4 (RFC 9562, section 5.4)
    bits = (bits & ~(0xC000 << 48)) | (0x8000 << 48)  # variant 10xx
    return f"{bits:032x}"


class RequestContextMiddleware:
    """Assign a request id, echo it as ``X-Request-ID`` and log one access line."""

    def __init__(self, app: ASGIApp, *, access_log: bool = True) -> None:
        self.app = app
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        started = time.perf_counter()
        incoming_id: bytes | None = None
        user_agent = b""
        for name, value in scope["headers"]:
            if name == REQUEST_ID_HEADER:
                incoming_id = value
            elif name == b"user-agent":
                user_agent = value
        if incoming_id is not None and _SANE_REQUEST_ID.fullmatch(incoming_id):
            request_id = incoming_id.decode("ascii")
            request_id_bytes = incoming_id
        else:
            request_id = new_request_id()
            request_id_bytes = request_id.encode("ascii")

        state = scope.get("state")
        if state is None:
            state = scope["state"] = {}
        state["request_id"] = request_id
        token = request_id_var.set(request_id)
        scope_token = request_scope_var.set(scope)

        # What the client was told; stays 500 when the app fails before answering,
        # which is what the server then sends.
        status = 500

        async def send_with_request_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                # A copy: the app may reuse the header list of a cached response.
                headers = [*message.get("headers", ()), (REQUEST_ID_HEADER, request_id_bytes)]
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_request_id)
        except Exception:
            if self.access_log:
                self._log_access(scope, request_id, status, started, user_agent, failed=True)
            raise
        else:
            if self.access_log:
                self._log_access(scope, request_id, status, started, user_agent, failed=False)
        finally:
            request_id_var.reset(token)
            request_scope_var.reset(scope_token)

    @staticmethod
    def _log_access(
        scope: Scope,
        request_id: str,
        status: int,
        started: float,
        user_agent: bytes,
        *,
        failed: bool,
    ) -> None:
        level = logging.ERROR if failed else logging.INFO
        if not _access_logger.isEnabledFor(level):
            return
        method = scope["method"]
        # The path only: FHIR search query strings carry names and birth dates.
        path = scope["path"]
        fields = {
            "request_id": request_id,
            "method": method,
            "path": path,
            "status": status,
            "duration_ms": round((time.perf_counter() - started) * 1000.0, 3),
            "client_ip": client_origin(scope).address,
            "user_agent": user_agent.decode("latin-1"),
        }
        handler = _sole_json_handler() if not failed else None
        if handler is not None:
            # The everyday line straight to the one handler: the same JSON as the
            # formatter writes, without a LogRecord and the logging machinery around it
            # (a tenth of a trivial request).
            handler.write_line(orjson.dumps({
                "timestamp": handler.formatter_timestamp(time.time()), "level": "INFO",
                "logger": ACCESS_LOGGER_NAME, "message": f"{method} {path} {status}",
                **fields}).decode())
            return
        # makeRecord + handle rather than log(): the caller's file and line say nothing
        # here, and finding them walks the stack on every request.
        record = _access_logger.makeRecord(
            ACCESS_LOGGER_NAME,
            level,
            __file__,
            0,
            "%s %s %s",
            (method, path, status),
            # The traceback of an escaping exception, filed under this request's id.
            sys.exc_info() if failed else None,
            extra=fields,
        )
        _access_logger.handle(record)


# Attributes every LogRecord has; anything else on a record came from ``extra=`` and is
# written out as a field of its own.
_RECORD_ATTRIBUTES = frozenset(
    logging.LogRecord("", logging.INFO, "", 0, "", None, None).__dict__
) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """Format a record as one JSON object on one line.

    Fields: ``timestamp`` (UTC, ISO 8601, milliseconds), ``level``, ``logger``,
    ``message``, ``request_id`` (from ``extra`` or the request being served), every
    other ``extra`` field, and ``exc`` with the formatted traceback.
    """

    def __init__(self) -> None:
        super().__init__()
        # (second, "YYYY-MM-DDTHH:MM:SS") of the last record; most records of a busy
        # service fall in the same second as the one before. One tuple, so a thread
        # never sees a second with another second's text.
        self._last_second: tuple[int, str] = (-1, "")

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "timestamp": self._timestamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = request_id_var.get()
        if request_id is not None:
            entry["request_id"] = request_id
        for key, value in record.__dict__.items():
            if key not in _RECORD_ATTRIBUTES:
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(entry, default=str).decode()

    def _timestamp(self, created: float) -> str:
        second = int(created)
        cached_second, text = self._last_second
        if second != cached_second:
            text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._last_second = (second, text)
        return f"{text}.{int((created - second) * 1000):03d}Z"


_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")


def _sole_json_handler() -> BatchingStreamHandler | None:
    """The handler every access line goes to when it is the only place one can go (our
    JSON handler alone on the root, nothing on the way that could filter or divert a
    record); None otherwise (tests capturing logs, an embedding app's handlers)."""
    root = logging.root
    if _access_logger.handlers or _access_logger.filters or root.filters \
            or len(root.handlers) != 1 or _platform_logger.handlers \
            or _platform_logger.filters or not _access_logger.propagate \
            or not _platform_logger.propagate:
        return None
    handler = root.handlers[0]
    if type(handler) is not BatchingStreamHandler or handler.filters \
            or type(handler.formatter) is not JsonFormatter \
            or handler.level > logging.INFO:
        return None
    return handler


class BatchingStreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that writes lines in batches instead of one write each.

    An access line per request made the log write (a system call per line on a
    line-buffered stderr) about a fifth of a FHIR read under load. Lines are kept in
    memory and written when ``max_bytes`` accumulate, at once for WARNING and above, and
    otherwise ``interval`` seconds after the first buffered line by a timer on the running
    event loop (no thread: nothing can hold the handler's lock behind the loop's back).
    Outside an event loop a line is written at once; ``logging.shutdown`` flushes the rest.
    """

    def __init__(self, stream: Any, *, max_bytes: int = 64 * 1024, interval: float = 0.5):
        super().__init__(stream)
        self._lines: list[str] = []
        self._size = 0
        self._max_bytes = max_bytes
        self._interval = interval
        self._timer_loop: asyncio.AbstractEventLoop | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:  # a broken record must not break the request that logged it
            self.handleError(record)
            return
        self.write_line(line, urgent=record.levelno >= logging.WARNING)

    def formatter_timestamp(self, created: float) -> str:
        assert isinstance(self.formatter, JsonFormatter)
        return self.formatter._timestamp(created)

    def write_line(self, line: str, *, urgent: bool = False) -> None:
        """Buffer one formatted line (written at once when ``urgent``)."""
        line += self.terminator
        with self.lock:  # type: ignore[union-attr]
            self._lines.append(line)
            self._size += len(line)
            if self._size >= self._max_bytes or urgent:
                self._write()
                return
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self._write()
                return
            if self._timer_loop is not loop:  # none pending on this loop yet
                self._timer_loop = loop
                loop.call_later(self._interval, self._timed_flush)

    def _timed_flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            self._timer_loop = None
            self._write()

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            self._write()

    def _write(self) -> None:
        if not self._lines:
            return
        text, self._lines, self._size = "".join(self._lines), [], 0
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # stderr closed or full: logging must not raise
            pass


def configure_logging(level: str) -> None:
    """Send the root and ``healthplatform.*`` loggers to stderr as JSON lines.

    Idempotent: calling it again replaces the handler it installed. Library loggers
    that propagate (uvicorn's when it runs with ``log_config=None``) come out as JSON
    too.
    """
    level_name = level.strip().upper()
    if level_name not in _LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(_LEVELS)}")

    handler = BatchingStreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.set_name("healthplatform-json")

    root = logging.getLogger()
    for existing in list(root.handlers):
        if existing.get_name() == "healthplatform-json":
            root.removeHandler(existing)
            existing.close()
    root.addHandler(handler)
    root.setLevel(level_name)
    # The JSON lines carry none of these, and collecting them costs every record.
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False

    # healthplatform.* reach stderr through the root handler only, so no line is
    # written twice whatever the modules did to their loggers before.
    platform = logging.getLogger("healthplatform")
    platform.setLevel(level_name)
    for existing in list(platform.handlers):
        platform.removeHandler(existing)
    platform.propagate = True
