"""``healthplatform hl7 send``: a real MLLP client run from the command line."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hl7_gateway.ack import ErrorDetail, Outcome, build_response_ack
from hl7_gateway.mllp import MLLPServer
from hl7_gateway.parser import parse
from platform_api.cli import app
from tests.hl7_gateway.messages import oru


async def lab_receiver(raw: bytes) -> list[str]:
    """Accepts everything except control ids starting with REJECT; answers both ACKs in
    enhanced mode, like the gateway does."""
    message = parse(raw)
    if message.control_id.startswith("REJECT"):
        ack = build_response_ack(message, Outcome.REJECT,
                                 errors=[ErrorDetail(203, "version not supported")])
        return [ack] if ack else []
    acks = [build_response_ack(message, Outcome.ACCEPT)]
    if message.msh.field(16) == "AL":
        acks.append(build_response_ack(parse(raw.replace(b"|AL|AL", b"||")), Outcome.ACCEPT))
    return [a for a in acks if a]


@pytest.fixture
def server_port() -> Iterator[int]:
    """An MLLP server on its own event loop thread (the CLI runs its own asyncio.run)."""
    loop = asyncio.new_event_loop()
    server = MLLPServer(lab_receiver, "127.0.0.1", 0)
    loop.run_until_complete(server.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield server.port
    asyncio.run_coroutine_threadsafe(server.close(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def test_send_prints_each_acknowledgement_and_exits_zero(tmp_path: Path, server_port: int
                                                         ) -> None:
    single = tmp_path / "result.hl7"
    single.write_bytes(b"# exported from the LIS\n" + oru("CLI-1"))
    batch = tmp_path / "batch.hl7"
    batch.write_bytes(b"FHS|^~\\&|LIS|LAB\rBHS|^~\\&|LIS|LAB\r" + oru("CLI-2")
                      + oru("CLI-3", msh15="AL", msh16="AL") + b"BTS|2\rFTS|1\r")
    result = CliRunner().invoke(app, ["hl7", "send", str(single), str(batch),
                                      "--port", str(server_port)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert [line.split()[0] for line in lines] == ["AA", "AA", "CA/AA"]
    assert [line.split()[-1] for line in lines] == ["CLI-1", "CLI-2", "CLI-3"]


def test_send_exits_one_and_shows_the_error_on_a_nak(tmp_path: Path, server_port: int) -> None:
    path = tmp_path / "rejected.hl7"
    path.write_bytes(oru("REJECT-1"))
    result = CliRunner().invoke(app, ["hl7", "send", str(path), "--port", str(server_port)])
    assert result.exit_code == 1
    assert "AR" in result.output and "version not supported" in result.output


def test_send_reports_an_unreachable_server(tmp_path: Path) -> None:
    path = tmp_path / "result.hl7"
    path.write_bytes(oru("NOWHERE-1"))
    result = CliRunner().invoke(app, ["hl7", "send", str(path), "--port", "1"])
    assert result.exit_code == 2
    assert "cannot reach 127.0.0.1:1" in result.output


def test_send_goes_to_the_port_of_healthplatform_mllp_port(tmp_path: Path, server_port: int
                                                           ) -> None:
    """The server listens on HEALTHPLATFORM_MLLP_PORT; the sender without --port uses it."""
    single = tmp_path / "result.hl7"
    single.write_bytes(oru("CLI-ENV-1"))
    result = CliRunner().invoke(app, ["hl7", "send", str(single)],
                                env={"HEALTHPLATFORM_MLLP_PORT": str(server_port)})
    assert result.exit_code == 0, result.output
    assert result.output.split()[0] == "AA"
