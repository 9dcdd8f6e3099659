"""hl7_gateway.mllp: several frames per message (enhanced mode) and none at all."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from hl7_gateway.ack import AckCode, build_ack
from hl7_gateway.mllp import MLLPClient, MLLPServer
from hl7_gateway.parser import parse
from tests.hl7_gateway.messages import oru


def codes(replies: list[bytes]) -> list[tuple[str, str]]:
    found = []
    for reply in replies:
        msa = parse(reply).segment("MSA")
        assert msa is not None
        found.append((msa.field(1), msa.field(2)))
    return found


async def commit_then_apply(raw: bytes) -> list[str]:
    """What a receiver in enhanced mode answers per MSH-15/16 when all goes well."""
    message = parse(raw)
    accept, application = message.msh.field(15), message.msh.field(16)
    if not accept and not application:
        return [build_ack(message, AckCode.AA)]  # original mode
    replies = [build_ack(message, AckCode.CA)] if accept == "AL" else []
    if application in {"AL", "SU"}:
        replies.append(build_ack(message, AckCode.AA))
    return replies


@pytest.fixture
async def server() -> AsyncIterator[MLLPServer]:
    async with MLLPServer(commit_then_apply, "127.0.0.1", 0) as running:
        yield running


async def test_a_handler_may_answer_with_several_frames_in_order(server: MLLPServer) -> None:
    async with MLLPClient("127.0.0.1", server.port) as client:
        replies = await client.exchange(oru("TWO-1", msh15="AL", msh16="AL"))
    assert codes(replies) == [("CA", "TWO-1"), ("AA", "TWO-1")]


async def test_pipelined_enhanced_messages_get_their_own_frames(server: MLLPServer) -> None:
    async with MLLPClient("127.0.0.1", server.port) as client:
        exchanges = await client.exchange_many([
            oru("P-1", msh15="AL", msh16="AL"), oru("P-2", msh15="AL", msh16="NE"),
            oru("P-3"), oru("P-4", msh15="NE", msh16="AL")])
    assert [codes(r) for r in exchanges] == [
        [("CA", "P-1"), ("AA", "P-1")], [("CA", "P-2")], [("AA", "P-3")], [("AA", "P-4")]]


async def test_ne_ne_expects_nothing_and_does_not_wait(server: MLLPServer) -> None:
    async with MLLPClient("127.0.0.1", server.port, linger=5) as client:
        start = time.perf_counter()
        assert await client.exchange(oru("QUIET-1", msh15="NE", msh16="NE")) == []
        assert time.perf_counter() - start < 1
        assert codes([await client.send(oru("LOUD-2"))]) == [("AA", "LOUD-2")]


async def test_an_ack_that_may_not_come_is_waited_for_only_briefly(server: MLLPServer) -> None:
    async with MLLPClient("127.0.0.1", server.port, linger=0.2) as client:
        start = time.perf_counter()
        replies = await client.exchange(oru("ER-1", msh15="AL", msh16="ER"))
        waited = time.perf_counter() - start
    assert codes(replies) == [("CA", "ER-1")]
    assert 0.15 < waited < 2


async def test_send_refuses_a_message_that_asks_for_no_ack(server: MLLPServer) -> None:
    async with MLLPClient("127.0.0.1", server.port) as client:
        with pytest.raises(Exception, match="no acknowledgement"):
            await client.send(oru("NONE-1", msh15="NE", msh16="NE"))


async def test_a_slow_second_frame_still_belongs_to_its_message() -> None:
    async def slow(raw: bytes) -> list[str]:
        message = parse(raw)
        await asyncio.sleep(0.05)
        return [build_ack(message, AckCode.CA), build_ack(message, AckCode.AA)]

    async with MLLPServer(slow, "127.0.0.1", 0) as running, \
            MLLPClient("127.0.0.1", running.port) as client:
        replies = await client.exchange_many([oru("S-1", msh15="AL", msh16="AL"),
                                              oru("S-2", msh15="AL", msh16="AL")])
    assert [codes(r) for r in replies] == [[("CA", "S-1"), ("AA", "S-1")],
                                           [("CA", "S-2"), ("AA", "S-2")]]
