"""The MLLP listener of the gateway: an `MLLPServer` whose handler is `HL7Gateway` (one
frame, a message or a batch file, answered as ``hl7_gateway.intake`` describes).

TLS uses the same certificate and key files as HTTPS; without them the listener speaks
plain MLLP (which has no encryption of its own, so keep it on a trusted network).
"""

from __future__ import annotations

import functools
import ssl
from pathlib import Path

from hl7_gateway.gateway import HL7Gateway
from hl7_gateway.intake import mllp_handler
from hl7_gateway.mllp import DEFAULT_MAX_MESSAGE_BYTES, MLLPServer

__all__ = ["server_tls_context", "start_listener"]


def server_tls_context(cert_file: str | Path, key_file: str | Path) -> ssl.SSLContext:
    """A server-side TLS context (TLS 1.2 or later) for the given PEM files."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert_file), str(key_file))
    return context


async def start_listener(gateway: HL7Gateway, host: str, port: int, *,
                         tls: ssl.SSLContext | None = None,
                         max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                         idle_timeout: float | None = 300.0) -> MLLPServer:
    """Start accepting MLLP connections; the caller closes the returned server."""
    server = MLLPServer(functools.partial(mllp_handler, gateway), host, port, ssl=tls,
                        max_message_bytes=max_message_bytes, idle_timeout=idle_timeout)
    await server.start()
    return server
