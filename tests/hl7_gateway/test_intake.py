"""hl7_gateway.intake over a real MLLP socket and a real SQLite store: batch files (HL7 v2.5.1
2.10.3) acknowledged as batches, trailer counts, and the comment lines of sample files."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fhir_server.access import SYSTEM
from fhir_server.service import FhirService
from fhir_server.store import store_from_url
from hl7_gateway.batch import parse_batch
from hl7_gateway.gateway import DEAD_LETTERS, HL7Gateway
from hl7_gateway.intake import BatchProcessed, receive
from hl7_gateway.listener import start_listener
from hl7_gateway.mllp import MLLPClient, MLLPServer
from hl7_gateway.parser import Segment


@pytest.fixture
async def fhir(tmp_path: Path) -> AsyncIterator[FhirService]:
    store = store_from_url(f"sqlite:///{tmp_path / 'intake.db'}")
    await store.open()
    yield FhirService(store)
    await store.close()


@pytest.fixture
async def mllp(fhir: FhirService) -> AsyncIterator[MLLPServer]:
    server = await start_listener(HL7Gateway(fhir, access=SYSTEM), "127.0.0.1", 0, idle_timeout=5)
    yield server
    await server.close()


def result(control_id: str, patient: str, filler: str, glucose: str, *,
           version: str = "2.5.1") -> str:
    """An ORU^R01 of 7.4.1 (a glucose result)."""
    return (
        f"MSH|^~\\&|GHH LAB|ELAB-3|GHH OE|BLDG4|200202150930||ORU^R01^ORU_R01|{control_id}|P|"
        f"{version}\r"
        f"PID|||{patient}^^^GOOD HEALTH HOSPITAL^MR||EVERYWOMAN^EVE^E^^^^L||19620320|F\r"
        f"OBR|1|845439^GHH OE|{filler}^GHH LAB|15545^GLUCOSE|||200202150730||||||||||||||"
        "||||F\r"
        f"OBX|1|NM|1554-5^GLUCOSE^LN||{glucose}|mg/dl|70-105|H|||F\r"
    )


def batch_file(*messages: str, declared: int | None = None) -> str:
    """A file of one batch (2.10.3.1: [FHS] {[BHS] {MSH...} [BTS]} [FTS]); BTS-1 declares
    ``declared`` messages (the number sent unless given)."""
    count = len(messages) if declared is None else declared
    return (
        "FHS|^~\\&|GHH LAB|ELAB-3|GHH OE|BLDG4|200202150935||results-0215||FILE-0215-01\r"
        "BHS|^~\\&|GHH LAB|ELAB-3|GHH OE|BLDG4|200202150935||glucose||BATCH-0215-01\r"
        + "".join(messages) + f"BTS|{count}\rFTS|1\r"
    )


def header(segment: Segment | None) -> dict[int, str]:
    assert segment is not None
    return {n: segment.field(n) for n in (3, 4, 5, 6, 11, 12)}


async def test_a_batch_in_one_frame_is_acknowledged_message_by_message_in_a_batch(
        mllp: MLLPServer, fhir: FhirService) -> None:
    sent = batch_file(result("CNTRL-3456", "555444444", "1045813", "182"),
                      result("CNTRL-3457", "555444445", "1045814", "95"),
                      result("CNTRL-3458", "555444446", "1045815", "77", version="3.1"))
    async with MLLPClient("127.0.0.1", mllp.port) as client:
        replies = await client.exchange(sent)
    assert len(replies) == 1  # one frame in, one acknowledgement batch out
    answer = parse_batch(replies[0])
    # the headers answer the ones received: sender and receiver swapped, the control ids
    # received in FHS-12 / BHS-12 (reference file / batch control id), new ones in -11
    file_header, batch_header = header(answer.header), header(answer.batches[0].header)
    assert {k: file_header[k] for k in (3, 4, 5, 6, 12)} == {
        3: "GHH OE", 4: "BLDG4", 5: "GHH LAB", 6: "ELAB-3", 12: "FILE-0215-01"}
    assert batch_header[12] == "BATCH-0215-01"
    assert file_header[11] and batch_header[11] and file_header[11] != "FILE-0215-01"
    acks = answer.batches[0].messages
    assert [(a.segment("MSA").field(1), a.segment("MSA").field(2)) for a in acks] == [
        ("AA", "CNTRL-3456"), ("AA", "CNTRL-3457"), ("AR", "CNTRL-3458")]
    assert acks[2].segment("ERR").component(3, 1) == "203"  # unsupported version
    assert answer.batches[0].trailer.field(1) == "3"  # BTS-1: the messages it holds
    assert answer.trailer.field(1) == "1"  # FTS-1: its batches
    assert "2 accepted" in answer.batches[0].trailer.field(2)
    assert answer.count_error is None and answer.batches[0].count_error is None
    reports = await fhir.search("DiagnosticReport", [])
    assert sorted(r["identifier"][0]["value"] for r in reports) == ["1045813", "1045814"]


async def test_a_batch_whose_trailer_count_disagrees_is_refused_whole(
        fhir: FhirService) -> None:
    gateway = HL7Gateway(fhir, access=SYSTEM)
    # BTS-1 says three messages; two arrived: the batch was cut short on its way
    sent = batch_file(result("CNTRL-4001", "555444447", "1045816", "120"),
                      result("CNTRL-4002", "555444448", "1045817", "130"), declared=3)
    received = await receive(gateway, sent.encode())
    assert isinstance(received, BatchProcessed)
    assert received.outcome.value == "reject"
    assert [(e.code, e.segment) for e in received.errors] == [(199, "BTS")]
    answer = parse_batch(received.ack)
    acks = answer.batches[0].messages
    assert [a.segment("MSA").field(1) for a in acks] == ["AR", "AR"]
    assert "BTS-1 of batch 1 declares 3 messages, found 2" in acks[0].segment("ERR").field(8)
    assert answer.batches[0].trailer.field(2).startswith("refused whole")
    assert await fhir.search("Observation", []) == []
    assert await fhir.store.find_documents(DEAD_LETTERS, {}, limit=10) == []
    # resent whole, it is processed
    again = await receive(gateway, batch_file(
        result("CNTRL-4001", "555444447", "1045816", "120"),
        result("CNTRL-4002", "555444448", "1045817", "130"),
        result("CNTRL-4003", "555444449", "1045818", "140"), declared=3).encode())
    assert isinstance(again, BatchProcessed) and again.outcome.value == "accept"
    assert len(await fhir.search("Observation", [])) == 3


async def test_comment_lines_before_the_message_are_not_part_of_it(
        mllp: MLLPServer, fhir: FhirService) -> None:
    commented = ("# source: written for this test from HL7 v2.5.1 7.4.1\n"
                 "# note: CR segment separators\n" + result("CNTRL-5001", "555444450",
                                                             "1045819", "101"))
    async with MLLPClient("127.0.0.1", mllp.port) as client:
        [ack] = await client.exchange(commented)
    assert b"MSA|AA|CNTRL-5001" in ack
    [binary] = await fhir.search("Binary", [])
    assert "# source" not in str(binary)  # the message kept is the message, without notes
