"""hl7_gateway.mllp over real sockets on 127.0.0.1: ordering, concurrency, damage, TLS."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import random
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from hl7_gateway.ack import Outcome, build_response_ack
from hl7_gateway.mllp import (
    Frame,
    FrameDecoder,
    FramingError,
    MLLPClient,
    MLLPError,
    MLLPServer,
    Oversize,
    frame,
)
from hl7_gateway.parser import encode_message, parse
from tests.hl7_gateway.hl7_samples import sample_bytes

Handler = Callable[[bytes], Awaitable[bytes | str | None]]


def adt(control_id: str, *, padding: int = 0, msh15: str = "") -> bytes:
    return (
        f"MSH|^~\\&|REG|GOOD HEALTH|EHR|GOOD HEALTH|20240301101500||ADT^A04^ADT_A01|{control_id}"
        f"|P|2.5.1|||{msh15}\r"
        "PID|1||884422^^^GHH^MR||Okafor^Chidinma||19870412|F\r"
        f"NTE|1||{'x' * padding}\r"
    ).encode()


async def accept_everything(raw: bytes) -> bytes | None:
    message = parse(raw)
    if message.control_id == "BOOM":
        raise RuntimeError("storage adapter exploded")
    if message.control_id.startswith("SILENT"):
        return None
    await asyncio.sleep(random.uniform(0, 0.005))  # replies must not overtake each other
    ack = build_response_ack(message, Outcome.ACCEPT)
    return None if ack is None else encode_message(ack)


def msa(reply: bytes) -> tuple[str, str]:
    segment = parse(reply).segment("MSA")
    assert segment is not None
    return segment.field(1), segment.field(2)


@pytest.fixture
async def start_server() -> AsyncIterator[Callable[..., Awaitable[MLLPServer]]]:
    servers: list[MLLPServer] = []

    async def start(handler: Handler = accept_everything, **options: object) -> MLLPServer:
        server = MLLPServer(handler, "127.0.0.1", 0, **options)  # type: ignore[arg-type]
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.close()


async def read_reply(reader: asyncio.StreamReader) -> bytes:
    decoder = FrameDecoder()
    async with asyncio.timeout(2.0):
        while True:
            data = await reader.read(65536)
            if not data:
                raise EOFError("server closed the connection")
            frames = [e for e in decoder.feed(data) if isinstance(e, Frame)]
            if frames:
                assert len(frames) == 1
                return frames[0].payload


# --- ordering and concurrency ---------------------------------------------------------


async def test_pipelined_messages_on_one_connection_are_answered_in_order(start_server) -> None:
    server = await start_server()
    ids = [f"MSG-{n:03d}" for n in range(50)]
    async with MLLPClient("127.0.0.1", server.port) as client:
        replies = await client.send_many(adt(i) for i in ids)
        assert [msa(r) for r in replies] == [("AA", i) for i in ids]
        assert msa(await client.send(adt("MSG-LAST").decode())) == ("AA", "MSG-LAST")


async def test_many_concurrent_connections_each_get_their_own_answers(start_server) -> None:
    server = await start_server()

    async def one_sender(sender: int) -> list[tuple[str, str]]:
        async with MLLPClient("127.0.0.1", server.port) as client:
            return [msa(await client.send(adt(f"S{sender}-{n}"))) for n in range(10)]

    results = await asyncio.gather(*(one_sender(s) for s in range(25)))
    for sender, answers in enumerate(results):
        assert answers == [("AA", f"S{sender}-{n}") for n in range(10)]


async def test_public_samples_round_trip_over_mllp(start_server) -> None:
    server = await start_server()
    async with MLLPClient("127.0.0.1", server.port) as client:
        for prefix in ("01", "19", "23", "29"):
            raw = sample_bytes(prefix)
            assert msa(await client.send(raw)) == (
                "AA" if prefix != "01" else "CA",
                parse(raw).control_id,
            )


# --- damaged input ------------------------------------------------------------------


async def test_bytes_outside_a_frame_are_dropped_and_the_connection_keeps_working(
    start_server,
) -> None:
    server = await start_server()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET / HTTP/1.1\r\n\r\n" + frame(adt("AFTER-JUNK")))
    assert msa(await read_reply(reader)) == ("AA", "AFTER-JUNK")
    writer.close()


async def test_new_start_block_before_the_end_abandons_the_partial_frame(start_server) -> None:
    server = await start_server()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"\x0b" + adt("TRUNCATED")[:40] + frame(adt("COMPLETE")))
    assert msa(await read_reply(reader)) == ("AA", "COMPLETE")
    writer.write(b"\x0b" + adt("NO-CR") + b"\x1c" + frame(adt("NEXT")))  # CR after FS missing
    assert msa(await read_reply(reader)) == ("AA", "NO-CR")
    assert msa(await read_reply(reader)) == ("AA", "NEXT")
    writer.close()


async def test_oversize_message_gets_a_reject_and_the_connection_stays_usable(
    start_server,
) -> None:
    server = await start_server(max_message_bytes=2048)
    async with MLLPClient("127.0.0.1", server.port) as client:
        reply = parse(await client.send(adt("HUGE-1", padding=50_000)))
        assert (reply.segment("MSA").field(1), reply.segment("MSA").field(2)) == ("AR", "HUGE-1")
        assert "2048-byte limit" in reply.segment("ERR").field(8)
        assert msa(await client.send(adt("SMALL-2"))) == ("AA", "SMALL-2")


async def test_oversize_message_without_a_readable_msh_still_gets_a_reject(start_server) -> None:
    server = await start_server(max_message_bytes=1024)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(frame(b"Z" * 10_000) + frame(adt("FINE")))
    assert msa(await read_reply(reader)) == ("AR", "")
    assert msa(await read_reply(reader)) == ("AA", "FINE")
    writer.close()


async def test_handler_exception_is_answered_with_a_reject_and_the_server_survives(
    start_server, caplog: pytest.LogCaptureFixture
) -> None:
    server = await start_server()
    async with MLLPClient("127.0.0.1", server.port) as client:
        reply = parse(await client.send(adt("BOOM")))
        assert reply.segment("MSA").field(1) == "AR"
        assert reply.segment("MSA").field(2) == "BOOM"
        assert reply.segment("ERR").component(3, 1) == "207"
        assert "exploded" not in reply.to_er7()  # internals stay in the log
        assert msa(await client.send(adt("AFTER-BOOM"))) == ("AA", "AFTER-BOOM")
    assert "storage adapter exploded" in caplog.text
    async with MLLPClient("127.0.0.1", server.port) as other:
        assert msa(await other.send(adt("OTHER"))) == ("AA", "OTHER")


async def test_handler_returning_none_sends_nothing(start_server) -> None:
    server = await start_server()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(frame(adt("SILENT-1")) + frame(adt("LOUD-2")))
    assert msa(await read_reply(reader)) == ("AA", "LOUD-2")
    writer.close()


async def test_enhanced_mode_never_gets_no_nak_on_handler_failure(start_server) -> None:
    async def failing(raw: bytes) -> bytes:
        raise RuntimeError("down")

    server = await start_server(failing)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(frame(adt("NE-1", msh15="NE")) + frame(adt("AL-2", msh15="AL")))
    assert msa(await read_reply(reader)) == ("CR", "AL-2")
    writer.close()


# --- idle connections and shutdown ----------------------------------------------------


async def test_idle_connection_is_closed_without_disturbing_an_active_one(start_server) -> None:
    server = await start_server(idle_timeout=0.3)
    idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", server.port)
    async with MLLPClient("127.0.0.1", server.port) as active:
        for n in range(6):
            assert msa(await active.send(adt(f"ACTIVE-{n}"))) == ("AA", f"ACTIVE-{n}")
            await asyncio.sleep(0.1)
        async with asyncio.timeout(2):
            assert await idle_reader.read() == b""  # closed by the server
    idle_writer.close()


async def test_close_ends_open_connections(start_server) -> None:
    server = await start_server()
    client = MLLPClient("127.0.0.1", server.port, timeout=2)
    assert msa(await client.send(adt("BEFORE"))) == ("AA", "BEFORE")
    await server.close()
    with pytest.raises((MLLPError, ConnectionError)):
        await client.send(adt("AFTER"))
    await client.close()


# --- client safeguards ----------------------------------------------------------------


async def test_client_refuses_a_reply_for_another_control_id(start_server) -> None:
    async def stale(raw: bytes) -> bytes:
        return encode_message(build_response_ack(parse(adt("PREVIOUS")), Outcome.ACCEPT) or "")

    server = await start_server(stale)
    async with MLLPClient("127.0.0.1", server.port) as client:
        with pytest.raises(MLLPError, match="PREVIOUS"):
            await client.send(adt("CURRENT"))


async def test_client_times_out_when_no_reply_comes(start_server) -> None:
    server = await start_server()
    async with MLLPClient("127.0.0.1", server.port, timeout=0.3) as client:
        with pytest.raises(TimeoutError):
            await client.send(adt("SILENT-FOREVER"))
        assert msa(await client.send(adt("RECONNECTED"))) == ("AA", "RECONNECTED")


# --- TLS ------------------------------------------------------------------------------


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


async def test_tls_server_and_client(start_server, tmp_path: Path) -> None:
    cert, key = self_signed_certificate(tmp_path)
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    client_context = ssl.create_default_context(cafile=str(cert))
    server = await start_server(ssl=server_context)

    async with MLLPClient(
        "127.0.0.1", server.port, client_context, server_hostname="localhost"
    ) as client:
        replies = await client.send_many([adt("TLS-1"), adt("TLS-2")])
        assert [msa(r) for r in replies] == [("AA", "TLS-1"), ("AA", "TLS-2")]

    plain = MLLPClient("127.0.0.1", server.port, timeout=2)
    with pytest.raises((MLLPError, ConnectionError, TimeoutError)):
        await plain.send(adt("PLAINTEXT"))  # a plaintext peer does not get through
    await plain.close()
    async with MLLPClient(
        "127.0.0.1", server.port, client_context, server_hostname="localhost"
    ) as client:
        assert msa(await client.send(adt("TLS-3"))) == ("AA", "TLS-3")


# --- de-framer ------------------------------------------------------------------------


def test_decoder_gives_the_same_frames_whatever_the_chunking() -> None:
    stream = b"\r\n" + frame(adt("A")) + b"noise" + frame(adt("B")) + frame(b"")
    whole = FrameDecoder().feed(stream)
    decoder = FrameDecoder()
    byte_by_byte = [e for i in range(len(stream)) for e in decoder.feed(stream[i : i + 1])]
    frames = [e.payload for e in whole if isinstance(e, Frame)]
    assert frames == [adt("A"), adt("B"), b""]
    assert [e.payload for e in byte_by_byte if isinstance(e, Frame)] == frames
    assert [type(e) for e in whole] == [Frame, FramingError, Frame, Frame]


def test_decoder_reports_oversize_once_and_resumes_at_the_next_frame() -> None:
    decoder = FrameDecoder(max_message_bytes=100)
    events = decoder.feed(b"\x0bMSH|" + b"y" * 150)
    events += decoder.feed(b"z" * 500)
    events += decoder.feed(b"\x1c\r" + frame(b"MSH|ok"))
    assert [type(e) for e in events] == [Oversize, Frame]
    assert isinstance(events[0], Oversize) and events[0].head.startswith(b"MSH|")
    assert isinstance(events[1], Frame) and events[1].payload == b"MSH|ok"
