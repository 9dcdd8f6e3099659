"""MLLP transport over asyncio: a server that answers each framed message, and a client.

Responsible for the Minimal Lower Layer Protocol (`0x0B message 0x1C 0x0D`) and only
for it: framing and de-framing, persistent connections answered strictly in order,
resilience to framing errors, oversize messages and idle peers, optional TLS via a
standard `ssl.SSLContext`. What a message means is the handler's business; when the
handler cannot answer (it raised) or the message is too large to hand over, the server
answers itself with a NAK built from whatever MSH could be read (`hl7_gateway.ack`).

A handler may answer a message with several frames (enhanced mode: the commit ACK, then
the application ACK) or none (MSH-15/16 asked for none); the client reads, for each
message it sent, the frames its MSH-15/16 call for (`MLLPClient.exchange`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl as ssl_module
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

from hl7_gateway.ack import (
    AckMode,
    ErrorDetail,
    Outcome,
    ack_mode,
    application_ack_required,
    build_failure_ack,
    commit_ack_required,
)
from hl7_gateway.parser import HL7ParseError, Segment, encode_message, parse, read_msh_leniently

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "Frame",
    "FrameDecoder",
    "FramingError",
    "Handler",
    "MLLPClient",
    "MLLPError",
    "MLLPServer",
    "Oversize",
    "frame",
]

logger = logging.getLogger(__name__)

START_BLOCK = b"\x0b"
END_BLOCK = b"\x1c"
CARRIAGE_RETURN = b"\x0d"
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# Enough of an oversize message to read its MSH for the NAK.
_OVERSIZE_HEAD_BYTES = 8192
_READ_CHUNK = 64 * 1024

Reply = bytes | str
Handler = Callable[[bytes], Awaitable[Reply | Sequence[Reply] | None]]
"""Receives one de-framed message, returns the reply, several replies in order, or None
(send nothing back)."""
# How long the client waits for an acknowledgement that may or may not come (MSH-15/16
# ER or SU: sent only on error / on success), once the ones that must come are in.
DEFAULT_LINGER = 0.5


class MLLPError(Exception):
    """A peer broke the protocol or the connection ended before a reply."""


def frame(payload: bytes) -> bytes:
    return START_BLOCK + payload + END_BLOCK + CARRIAGE_RETURN


# --- de-framing -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Frame:
    payload: bytes


@dataclass(frozen=True, slots=True)
class Oversize:
    """A message longer than the limit; `head` is its beginning, the rest was dropped."""

    head: bytes
    limit: int


@dataclass(frozen=True, slots=True)
class FramingError:
    reason: str


Event = Frame | Oversize | FramingError

_OUTSIDE, _INSIDE, _DISCARDING, _AFTER_END = range(4)


class FrameDecoder:
    """Incremental de-framer: `feed()` bytes as they arrive, get complete events back.

    Holds at most `max_message_bytes` (plus one read) of a message. Bytes between frames are
    dropped (whitespace silently), a start block inside a frame abandons the partial
    frame, and a missing CR after the end block is tolerated.
    """

    def __init__(self, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self._max = max_message_bytes
        self._buffer = bytearray()
        self._state = _OUTSIDE

    def feed(self, data: bytes) -> list[Event]:
        events: list[Event] = []
        pos = 0
        while pos < len(data):
            if self._state == _OUTSIDE:
                pos = self._skip_outside(data, pos, events)
            elif self._state == _AFTER_END:
                if data[pos : pos + 1] == CARRIAGE_RETURN:
                    pos += 1
                self._state = _OUTSIDE
            else:
                pos = self._read_inside(data, pos, events)
        return events

    def _skip_outside(self, data: bytes, pos: int, events: list[Event]) -> int:
        start = data.find(START_BLOCK, pos)
        stray = data[pos:] if start < 0 else data[pos:start]
        if stray.strip():
            events.append(FramingError(f"{len(stray)} byte(s) outside a frame discarded"))
        if start < 0:
            return len(data)
        self._state = _INSIDE
        self._buffer.clear()
        return start + 1

    def _read_inside(self, data: bytes, pos: int, events: list[Event]) -> int:
        ends = [i for i in (data.find(END_BLOCK, pos), data.find(START_BLOCK, pos)) if i >= 0]
        stop = min(ends, default=len(data))
        if self._state == _INSIDE:
            self._buffer += data[pos:stop]
            if len(self._buffer) > self._max:
                events.append(Oversize(bytes(self._buffer[:_OVERSIZE_HEAD_BYTES]), self._max))
                self._buffer.clear()
                self._state = _DISCARDING
        if stop == len(data):
            return stop
        if data[stop : stop + 1] == START_BLOCK:
            if self._state == _INSIDE:
                events.append(
                    FramingError(
                        f"start block inside a frame; {len(self._buffer)} byte(s) discarded"
                    )
                )
            self._state = _INSIDE
            self._buffer.clear()
        else:
            if self._state == _INSIDE:
                events.append(Frame(bytes(self._buffer)))
            self._buffer.clear()
            self._state = _AFTER_END
        return stop + 1


# --- server -----------------------------------------------------------------------


def _as_bytes(reply: bytes | str) -> bytes:
    return reply if isinstance(reply, bytes) else encode_message(reply)


def _failure_reply(raw: bytes, detail: ErrorDetail, outcome: Outcome) -> list[bytes]:
    ack = build_failure_ack(raw, detail, outcome)
    return [] if ack is None else [encode_message(ack)]


def _frames(reply: Reply | Sequence[Reply] | None) -> list[bytes]:
    if reply is None:
        return []
    if isinstance(reply, bytes | str):
        return [_as_bytes(reply)]
    return [_as_bytes(r) for r in reply]


class MLLPServer:
    """Accepts MLLP connections and answers every message with the handler's reply."""

    def __init__(
        self,
        handler: Handler,
        host: str = "127.0.0.1",
        port: int = 2575,
        *,
        ssl: ssl_module.SSLContext | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        idle_timeout: float | None = 300.0,
    ) -> None:
        if max_message_bytes <= 0:
            raise ValueError("max_message_bytes must be positive")
        if idle_timeout is not None and idle_timeout <= 0:
            raise ValueError("idle_timeout must be positive or None")
        self._handler = handler
        self._host = host
        self._requested_port = port
        self._ssl = ssl
        self._max = max_message_bytes
        self._idle_timeout = idle_timeout
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        """The bound port (useful after binding port 0)."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("the server is not started")
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("the server is already started")
        self._server = await asyncio.start_server(
            self._on_connection, self._host, self._requested_port, ssl=self._ssl
        )
        logger.info(
            "MLLP server listening on %s:%d%s", self._host, self.port, " (TLS)" if self._ssl else ""
        )

    async def serve_forever(self) -> None:
        if self._server is None:
            await self.start()
        assert self._server is not None
        await self._server.serve_forever()

    async def close(self) -> None:
        """Stop listening and end every open connection."""
        if self._server is None:
            return
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def __aenter__(self) -> MLLPServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        try:
            await self._serve(reader, writer, peer)
        except (ConnectionError, ssl_module.SSLError, TimeoutError) as exc:
            logger.info("MLLP connection from %s ended: %r", peer, exc)
        except Exception:
            # One connection's failure must never reach the listener or other peers.
            logger.exception("MLLP connection from %s failed", peer)
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: object
    ) -> None:
        decoder = FrameDecoder(self._max)
        while data := await self._read(reader, peer):
            for event in decoder.feed(data):
                replies = await self._reply_to(event, peer)
                if replies:
                    writer.write(b"".join(frame(r) for r in replies))
                    # A peer that stops reading our replies is as dead as a silent one.
                    async with asyncio.timeout(self._idle_timeout):
                        await writer.drain()

    async def _read(self, reader: asyncio.StreamReader, peer: object) -> bytes:
        """The next bytes from the peer; b"" at end of stream or after the idle timeout."""
        try:
            async with asyncio.timeout(self._idle_timeout):
                return await reader.read(_READ_CHUNK)
        except TimeoutError:
            logger.info("closing MLLP connection from %s: idle for %ss", peer, self._idle_timeout)
            return b""

    async def _reply_to(self, event: Event, peer: object) -> list[bytes]:
        if isinstance(event, FramingError):
            logger.warning("MLLP framing error from %s: %s", peer, event.reason)
            return []
        if isinstance(event, Oversize):
            logger.warning("MLLP message from %s exceeds %d bytes; rejected", peer, event.limit)
            detail = ErrorDetail(199, f"message exceeds the {event.limit}-byte limit")
            return _failure_reply(event.head, detail, Outcome.REJECT)
        try:
            reply = await self._handler(event.payload)
        except Exception:
            # The sender gets a reject it may retry; the cause stays in our log only.
            logger.exception("MLLP handler failed on a message from %s", peer)
            detail = ErrorDetail(207, "internal error while processing the message")
            return _failure_reply(event.payload, detail, Outcome.REJECT)
        return _frames(reply)


# --- client -----------------------------------------------------------------------


def _header_of(message: bytes) -> Segment | None:
    """The message's MSH, read as the receiver will (wrapped lines repaired)."""
    try:
        return parse(message).msh
    except HL7ParseError:
        return read_msh_leniently(message)


def _control_id(message: bytes) -> str:
    msh = _header_of(message)
    return msh.field(10) if msh is not None else ""


def _msa(reply: bytes) -> tuple[str, str]:
    """(MSA-1, MSA-2) of a reply; empty strings when it has no readable MSA."""
    try:
        msa = parse(reply).segment("MSA")
    except HL7ParseError:
        return "", ""
    return (msa.field(1), msa.field(2)) if msa is not None else ("", "")


_APPLICATION_CODES = frozenset({"AA", "AE", "AR"})
_DONE, _NEED, _MAYBE = "done", "need", "maybe"


def _any_all(flags: list[bool]) -> str:
    return _NEED if all(flags) else _MAYBE if any(flags) else _DONE


def _state(msh: Segment | None, codes: list[str]) -> str:
    """Whether more acknowledgements are due for a message whose replies so far have
    these MSA-1 codes: done, need (one must come), maybe (one comes on some outcomes)."""
    if msh is None or ack_mode(msh) is AckMode.ORIGINAL:
        return _DONE if codes else _NEED
    if any(c in _APPLICATION_CODES for c in codes) or any(c in {"CE", "CR"} for c in codes):
        return _DONE  # the application ACK is the last; a failed commit has none after it
    if "CA" in codes:
        return _any_all([application_ack_required(msh, o) for o in (Outcome.ACCEPT,
                                                                     Outcome.ERROR)])
    # Nothing yet. The outcomes a receiver can have: accepted, application error after a
    # safe commit, commit failed, rejected; each implies its own set of ACKs.
    return _any_all([
        commit_ack_required(msh, Outcome.ACCEPT) or application_ack_required(msh, Outcome.ACCEPT),
        commit_ack_required(msh, Outcome.ACCEPT) or application_ack_required(msh, Outcome.ERROR),
        commit_ack_required(msh, Outcome.ERROR),
        commit_ack_required(msh, Outcome.REJECT),
    ])


class MLLPClient:
    """One persistent MLLP connection; replies are matched to messages in order.

    For each message the client reads the acknowledgements its MSH-15/16 call for: one
    in original mode; in enhanced mode the commit ACK and/or the application ACK. Where
    an ACK comes only on some outcomes (ER, SU), the client waits ``linger`` seconds for
    it once the certain ones are in. With ``check_ack_id`` a reply whose MSA-2 names
    another control id than the message just sent raises `MLLPError`: a late ACK must
    not be taken for the next message's.
    """

    def __init__(
        self,
        host: str,
        port: int,
        ssl: ssl_module.SSLContext | None = None,
        *,
        server_hostname: str | None = None,
        timeout: float | None = 30.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        check_ack_id: bool = True,
        linger: float = DEFAULT_LINGER,
    ) -> None:
        self._host, self._port, self._ssl = host, port, ssl
        self._server_hostname = server_hostname
        self._timeout = timeout
        self._max = max_message_bytes
        self._check_ack_id = check_ack_id
        self._linger = linger
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._decoder = FrameDecoder(max_message_bytes)
        self._replies: deque[bytes] = deque()
        self._answered: deque[str] = deque(maxlen=256)
        self._lock = asyncio.Lock()

    async def connect(self) -> None:
        if self._writer is not None:
            return
        async with asyncio.timeout(self._timeout):
            self._reader, self._writer = await asyncio.open_connection(
                self._host,
                self._port,
                ssl=self._ssl,
                server_hostname=self._server_hostname if self._ssl else None,
            )
        self._decoder = FrameDecoder(self._max)
        self._replies.clear()

    async def close(self) -> None:
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def __aenter__(self) -> MLLPClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def send(self, message: bytes | str) -> bytes:
        """Send one message and return the payload of its (first) acknowledgement."""
        return (await self.send_many([message]))[0]

    async def send_many(self, messages: Iterable[bytes | str]) -> list[bytes]:
        """Send messages back to back without waiting (pipelined); first replies in order."""
        payloads = [_as_bytes(m) for m in messages]
        exchanges = await self.exchange_many(payloads)
        for payload, replies in zip(payloads, exchanges, strict=True):
            if not replies:
                raise MLLPError(f"no acknowledgement for {_control_id(payload)!r} "
                                "(its MSH-15/16 did not require one)")
        return [replies[0] for replies in exchanges]

    async def exchange(self, message: bytes | str) -> list[bytes]:
        """Send one message; return every acknowledgement it gets, in order (maybe none)."""
        return (await self.exchange_many([message]))[0]

    async def exchange_many(self, messages: Iterable[bytes | str]) -> list[list[bytes]]:
        """Send messages back to back (pipelined); each one's acknowledgements, in order."""
        payloads = [_as_bytes(m) for m in messages]
        async with self._lock:
            await self.connect()
            assert self._writer is not None
            try:
                self._writer.write(b"".join(frame(p) for p in payloads))
                await self._writer.drain()
                return [await self._collect(p) for p in payloads]
            except BaseException:
                # A reply still in flight would be read as the answer to the next message.
                await self.close()
                raise

    async def _collect(self, payload: bytes) -> list[bytes]:
        msh = _header_of(payload)
        sent = msh.field(10) if msh is not None else ""
        replies: list[bytes] = []
        codes: list[str] = []
        while (state := _state(msh, codes)) != _DONE:
            reply = await self._next_reply(None if state == _NEED else self._linger)
            if reply is None:
                break
            code, acked = _msa(reply)
            if sent and acked and acked != sent:
                if acked in self._answered:
                    logger.warning("late MLLP reply for %r ignored", acked)
                    continue
                if state == _MAYBE:
                    self._replies.appendleft(reply)  # the next message's answer
                    break
                if self._check_ack_id:
                    raise MLLPError(f"reply acknowledges {acked!r}, expected {sent!r}")
            replies.append(reply)
            codes.append(code)
        if sent:
            self._answered.append(sent)
        return replies

    async def _next_reply(self, linger: float | None = None) -> bytes | None:
        """The next reply; with ``linger``, None when none comes within that time."""
        assert self._reader is not None
        try:
            async with asyncio.timeout(self._timeout if linger is None else linger):
                while not self._replies:
                    data = await self._reader.read(_READ_CHUNK)
                    if not data:
                        raise MLLPError("connection closed before a reply arrived")
                    for event in self._decoder.feed(data):
                        self._take(event)
        except TimeoutError:
            if linger is None:
                raise
            return None
        return self._replies.popleft()

    def _take(self, event: Event) -> None:
        if isinstance(event, Frame):
            self._replies.append(event.payload)
        elif isinstance(event, Oversize):
            raise MLLPError(f"reply exceeds {event.limit} bytes")
        else:
            logger.warning(
                "MLLP framing error from %s:%d: %s", self._host, self._port, event.reason
            )
