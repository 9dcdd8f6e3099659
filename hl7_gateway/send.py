"""Sending files of v2 messages over MLLP (``healthplatform hl7 send``).

A file holds one message, several messages one after the other, or a batch (FHS/BHS
envelope); each message is sent on its own over one persistent connection, and every
acknowledgement it gets (enhanced mode: commit and application ACK) is reported. Lines
starting with ``#`` before the first segment (the provenance notes of the shared sample
files) are skipped. A single message is sent with its bytes untouched, so the receiver
sees exactly what the file holds.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from hl7_gateway.batch import is_batch, parse_batch, strip_comment_lines
from hl7_gateway.mllp import MLLPClient, MLLPError
from hl7_gateway.parser import HL7ParseError, encode_message, parse, read_msh_leniently


def _control_id(payload: bytes) -> str:
    try:
        return parse(payload).control_id
    except HL7ParseError:
        msh = read_msh_leniently(payload)
        return msh.field(10) if msh is not None else ""

__all__ = ["Sent", "client_tls_context", "messages_in", "send_files"]

_ACCEPTED = frozenset({"AA", "CA"})


@dataclass
class Sent:
    """One message sent and what came back."""

    source: str
    control_id: str
    replies: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def codes(self) -> list[str]:
        found = []
        for reply in self.replies:
            try:
                msa = parse(reply).segment("MSA")
            except HL7ParseError:
                msa = None
            found.append(msa.field(1) if msa is not None else "?")
        return found

    @property
    def accepted(self) -> bool:
        """No error, and every acknowledgement that came is a positive one."""
        return self.error is None and all(c in _ACCEPTED for c in self.codes)

    def problems(self) -> list[str]:
        """The ERR-8 / ERR-1 texts of the replies."""
        texts = []
        for reply in self.replies:
            try:
                message = parse(reply)
            except HL7ParseError:
                continue
            for err in message.segments("ERR"):
                texts.append(err.field(8) or err.field(1))
        return [t for t in texts if t]


def messages_in(raw: bytes) -> list[bytes]:
    """The messages a file holds: itself, or its messages when it is a batch or several."""
    raw = strip_comment_lines(raw)
    if not is_batch(raw) and raw.count(b"MSH") <= 1:
        return [raw]
    try:
        batch = parse_batch(raw)
    except HL7ParseError:
        return [raw]  # let the receiver say what is wrong with it
    return [encode_message(m.to_er7()) for m in batch.messages]


def client_tls_context(ca_file: str | None = None, *, verify: bool = True) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca_file)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


async def send_files(paths: Iterable[Path], host: str, port: int, *,
                     tls: ssl.SSLContext | None = None, reply_timeout: float = 30.0
                     ) -> list[Sent]:
    """Send every message of every file, in order, over one connection."""
    results: list[Sent] = []
    async with MLLPClient(host, port, tls, server_hostname=host if tls else None,
                          timeout=reply_timeout) as client:
        for path in paths:
            content = await asyncio.to_thread(Path(path).read_bytes)
            for payload in messages_in(content):
                sent = Sent(str(path), _control_id(payload))
                try:
                    sent.replies = [r.decode("utf-8", "replace")
                                    for r in await client.exchange(payload)]
                except (OSError, TimeoutError, MLLPError) as exc:
                    # Reported per message; the client reconnects for the next one.
                    sent.error = f"{type(exc).__name__}: {exc}"
                results.append(sent)
    return results
