"""hl7_gateway.gateway over a real MLLP socket and a real SQLite store: ACKs, idempotency,
corrections, merges, NAK paths, dead letters and events."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from fhir_server.access import SYSTEM
from fhir_server.caller import CallerFhir
from fhir_server.service import FhirService
from fhir_server.store import store_from_url
from hl7_gateway.ack import HeaderPolicy
from hl7_gateway.gateway import (
    DEAD_LETTERS,
    MESSAGES,
    RESULT_TOPIC,
    HL7Gateway,
    SystemTransactions,
)
from hl7_gateway.listener import start_listener
from hl7_gateway.merge import overlay
from hl7_gateway.mllp import MLLPClient, MLLPServer
from hl7_gateway.parser import encode_message, parse
from hl7_gateway.send import messages_in, send_files
from tests.hl7_gateway.hl7_samples import sample_files
from tests.hl7_gateway.messages import CHEMISTRY, EXPECTED_ACKS, adt, oru, segment

JSON = dict[str, Any]



@pytest.fixture
async def fhir(tmp_path: Path) -> AsyncIterator[FhirService]:
    store = store_from_url(f"sqlite:///{tmp_path / 'hl7.db'}")
    await store.open()
    yield FhirService(store)
    await store.close()


@pytest.fixture
def gateway(fhir: FhirService) -> HL7Gateway:
    return HL7Gateway(fhir, access=SYSTEM)


@pytest.fixture
async def mllp(gateway: HL7Gateway) -> AsyncIterator[MLLPServer]:
    server = await start_listener(gateway, "127.0.0.1", 0, idle_timeout=5)
    yield server
    await server.close()


def msa(reply: bytes | str) -> tuple[str, str]:
    segment = parse(reply).segment("MSA")
    assert segment is not None
    return segment.field(1), segment.field(2)


def errs(reply: bytes | str) -> list[tuple[str, str]]:
    """(ERR-3 code, ERR-4 severity) of each ERR segment."""
    return [(e.component(3, 1), e.field(4)) for e in parse(reply).segments("ERR")]


async def search(fhir: FhirService, kind: str, *params: tuple[str, str]) -> list[JSON]:
    return await fhir.search(kind, list(params))


# --- every sample, over MLLP ---------------------------------------------------------------------


async def test_every_sample_over_mllp_gets_its_acknowledgements(mllp: MLLPServer,
                                                               fhir: FhirService) -> None:
    results = await send_files(sample_files(), "127.0.0.1", mllp.port, reply_timeout=10)
    got: dict[str, list[str]] = {}
    for sent in results:
        got.setdefault(Path(sent.source).name[:2], []).extend(sent.codes)
        assert sent.error is None
    assert got == EXPECTED_ACKS

    # A representative set, field by field, as stored.
    [patient] = await search(fhir, "Patient", ("identifier", "PATID1234"), ("family", "Jones"))
    assert (patient["gender"], patient["birthDate"]) == ("male", "1961-06-15")
    [report] = await search(fhir, "DiagnosticReport", ("identifier", "R-991133"))
    assert report["subject"]["reference"] == f"Patient/{patient['id']}"
    assert report["status"] == "final" and len(report["result"]) == 28
    [hemoglobin] = await search(fhir, "Observation", ("code", "http://loinc.org|718-7"),
                                ("subject", f"Patient/{patient['id']}"))
    assert hemoglobin["valueQuantity"]["value"] == 12.5
    assert hemoglobin["interpretation"][0]["coding"][0]["code"] == "L"
    assert f"Observation/{hemoglobin['id']}" in {r["reference"] for r in report["result"]}
    [specimen] = await search(fhir, "Specimen", ("subject", f"Patient/{patient['id']}"))
    assert report["specimen"] == [{"reference": f"Specimen/{specimen['id']}"}]

    [everyman] = await search(fhir, "Patient", ("family", "EVERYMAN"))
    encounters = await search(fhir, "Encounter", ("subject", f"Patient/{everyman['id']}"))
    assert {e["class"]["code"] for e in encounters} >= {"PRENC"}
    [immunization] = await search(fhir, "Immunization", ("identifier", "13696"))
    assert immunization["vaccineCode"]["coding"][0]["code"] == "49281-0215-88"
    [appointment] = await search(fhir, "Appointment", ("identifier", "36996"))
    assert appointment["start"] == "2021-09-24T09:30:00+02:15"
    [document] = await search(fhir, "DocumentReference", ("identifier", "9528"))
    assert document["docStatus"] == "final"
    batch = await search(fhir, "Patient", ("identifier", "0000112234"))
    assert len(batch) == 1  # the FHS/BHS batch's message, sent on its own


async def test_batch_files_are_split_into_their_messages() -> None:
    two = b"\r".join([oru("B-1").rstrip(b"\r"), oru("B-2").rstrip(b"\r")]) + b"\r"
    batch = b"FHS|^~\\&|LIS|LAB\rBHS|^~\\&|LIS|LAB\r" + two + b"BTS|2\rFTS|1\r"
    assert [parse(m).control_id for m in messages_in(batch)] == ["B-1", "B-2"]
    assert [parse(m).control_id for m in messages_in(two)] == ["B-1", "B-2"]
    assert messages_in(b"# provenance note\n" + oru("S-1")) == [oru("S-1")]


# --- idempotency, corrections, merges ------------------------------------------------------------


async def test_a_message_beyond_the_segment_limit_is_refused_naming_it(
        fhir: FhirService) -> None:
    """A lab feed's runaway message (an ORU of tens of thousands of OBX) is refused with
    AR before it is mapped, the ERR naming the limit; the next message goes through."""
    gateway = HL7Gateway(fhir, access=SYSTEM, max_segments=40)
    many = [("2345-7", "Glucose", "NM", f"{90 + n % 20}", "mg/dL", "N") for n in range(60)]
    processed = await gateway.process(oru("LAB-HUGE", results=many))
    ack = encode_message(processed.acks[0])
    assert msa(ack)[0] == "AR"
    assert b"the limit is 40 (HEALTHPLATFORM_HL7_MAX_SEGMENTS)" in ack
    assert await search(fhir, "Observation") == []
    fine = await gateway.process(oru("LAB-0002"))
    assert msa(fine.acks[0])[0] == "AA"


async def test_a_resent_message_gets_the_same_ack_and_is_stored_once(
        mllp: MLLPServer, fhir: FhirService) -> None:
    async with MLLPClient("127.0.0.1", mllp.port) as client:
        first = await client.exchange(oru("DUP-1"))
        again = await client.exchange(oru("DUP-1"))
    assert [msa(r) for r in first] == [("AA", "DUP-1")]
    assert again == first  # the stored ACK, byte for byte
    assert len(await search(fhir, "Binary")) == 1
    assert len(await search(fhir, "Provenance")) == 1
    assert len(await search(fhir, "Observation")) == len(CHEMISTRY)
    record = await fhir.store.get_document(MESSAGES, "CITYLAB-LIS|CITY LAB|DUP-1")
    assert record is not None and record["outcome"] == "accept"


async def test_a_correction_updates_the_same_observations(gateway: HL7Gateway,
                                                          fhir: FhirService) -> None:
    assert (await gateway.process(oru("C-1", status="F"))).ack_code == "AA"
    before = {o["id"]: o for o in await search(fhir, "Observation")}
    corrected = [(c, n, "5.9" if c == "2823-3" else v, u, r, "H" if c == "2823-3" else f)
                 for c, n, v, u, r, f in CHEMISTRY]
    assert (await gateway.process(oru("C-2", status="C", results=corrected))).ack_code == "AA"
    after = {o["id"]: o for o in await search(fhir, "Observation")}
    assert after.keys() == before.keys()
    potassium = next(o for o in after.values() if o["code"]["coding"][0]["code"] == "2823-3")
    assert (potassium["status"], potassium["valueQuantity"]["value"]) == ("corrected", 5.9)
    assert potassium["meta"]["versionId"] == "2"
    [report] = await search(fhir, "DiagnosticReport")
    assert report["status"] == "corrected"
    assert len(await search(fhir, "Patient")) == 1


async def test_an_adt_resending_the_same_record_adds_no_versions(
        gateway: HL7Gateway, fhir: FhirService) -> None:
    assert (await gateway.process(adt("A01", "SAME-1"))).ack_code == "AA"
    for n in (2, 3):  # A08s that change nothing: the feed resends what it holds
        assert (await gateway.process(adt("A08", f"SAME-{n}"))).ack_code == "AA"
    [patient] = await search(fhir, "Patient")
    [encounter] = await search(fhir, "Encounter")
    assert (patient["meta"]["versionId"], encounter["meta"]["versionId"]) == ("1", "1")
    assert (await fhir.store.history("Patient", patient["id"])).total == 1
    assert len(await search(fhir, "Provenance")) == 3  # every message is still recorded


async def test_repeated_adts_update_one_patient_and_keep_what_others_added(
        gateway: HL7Gateway, fhir: FhirService) -> None:
    assert (await gateway.process(adt("A01", "ADT-1"))).ack_code == "AA"
    [patient] = await search(fhir, "Patient")
    patient["identifier"].append({"system": "urn:oid:2.16.404.1", "value": "KE-29384756"})
    await CallerFhir(fhir, SYSTEM).update("Patient", patient["id"], patient)
    assert (await gateway.process(adt("A08", "ADT-2", family="Achieng-Otieno"))).ack_code == "AA"
    assert (await gateway.process(adt("A03", "ADT-3", discharge="20240305120000+0300"))
            ).ack_code == "AA"
    [patient] = await search(fhir, "Patient")
    assert patient["name"][0]["family"] == "Achieng"  # A03 sent the name again
    assert {i["value"] for i in patient["identifier"]} == {"MRN-884422", "KE-29384756"}
    [encounter] = await search(fhir, "Encounter")
    assert (encounter["status"], encounter["period"]["end"]) == ("finished",
                                                                 "2024-03-05T12:00:00+03:00")
    # A08 changed the patient, not the visit: only A03's discharge was a new version
    assert encounter["meta"]["versionId"] == "2"


async def test_a40_merge_links_the_records_and_deactivates_the_old_one(
        gateway: HL7Gateway, fhir: FhirService) -> None:
    await gateway.process(adt("A04", "REG-1", patient="MRN-OLD", family="Atieno"))
    await gateway.process(adt("A04", "REG-2", patient="MRN-NEW", family="Atieno", visit="V-2"))
    merge = adt("A40", "MRG-1", patient="MRN-NEW", extra=["MRG|MRN-OLD^^^KISUMU HOSP^MR"])
    assert (await gateway.process(merge)).ack_code == "AA"
    [old] = await search(fhir, "Patient", ("identifier", "MRN-OLD"))
    [new] = await search(fhir, "Patient", ("identifier", "MRN-NEW"))
    assert old["active"] is False
    assert old["link"] == [{"other": {"reference": f"Patient/{new['id']}"},
                            "type": "replaced-by"}]
    assert new["link"] == [{"other": {"reference": f"Patient/{old['id']}"}, "type": "replaces"}]
    assert old["address"][0]["city"] == "Kisumu"  # merged: the old record keeps its data


async def test_messages_for_one_new_patient_on_eight_connections_create_one_patient(
        mllp: MLLPServer, fhir: FhirService) -> None:
    async def sender(n: int) -> list[str]:
        async with MLLPClient("127.0.0.1", mllp.port) as client:
            replies = await client.send_many(
                oru(f"CC-{n}-{k}", filler=f"F-{n}-{k}", placer=f"P-{n}-{k}") for k in range(3))
        return [msa(r)[0] for r in replies]

    codes = await asyncio.gather(*(sender(n) for n in range(8)))
    assert codes == [["AA"] * 3] * 8
    assert len(await search(fhir, "Patient")) == 1
    assert len(await search(fhir, "DiagnosticReport")) == 24


# --- acknowledgement modes ------------------------------------------------------------------------


@pytest.mark.parametrize(("msh15", "msh16", "codes"), [
    ("AL", "AL", ["CA", "AA"]), ("AL", "NE", ["CA"]), ("ER", "AL", ["AA"]),
    ("NE", "NE", []), ("AL", "SU", ["CA", "AA"]), ("AL", "ER", ["CA"]),
])
async def test_enhanced_mode_sends_commit_then_application_acks(mllp: MLLPServer, msh15: str,
                                                                msh16: str, codes: list[str]
                                                                ) -> None:
    async with MLLPClient("127.0.0.1", mllp.port, linger=0.2) as client:
        replies = await client.exchange(oru(f"ENH-{msh15}{msh16}", msh15=msh15, msh16=msh16))
        after = await client.send(oru("AFTER"))  # the connection stays in step
    assert [msa(r)[0] for r in replies] == codes
    assert msa(after) == ("AA", "AFTER")


async def test_enhanced_mode_mapping_error_is_committed_then_answered_ae(
        mllp: MLLPServer) -> None:
    broken = oru("ENH-AE", msh15="AL", msh16="AL").replace(b"OBR|1|", b"XXX|1|")
    async with MLLPClient("127.0.0.1", mllp.port) as client:
        commit, application = await client.exchange(broken)
    assert msa(commit) == ("CA", "ENH-AE")  # safe: kept in the dead letters
    assert msa(application) == ("AE", "ENH-AE")
    assert errs(application) == [("100", "E")]


# --- NAK paths ----------------------------------------------------------------------------------


def _header(message: bytes, **fields: str) -> bytes:
    msh, rest = message.split(b"\r", 1)
    parts = msh.decode().split("|")
    for index, value in fields.items():
        parts[int(index.removeprefix("f")) - 1] = value
    return "|".join(parts).encode() + b"\r" + rest


@pytest.mark.parametrize(("fields", "code"), [
    ({"f9": "MFN^M02"}, "200"), ({"f9": "ADT^A99^ADT_A01"}, "201"),
    ({"f11": "X"}, "202"), ({"f12": "3.0"}, "203"),
])
async def test_unsupported_header_values_are_rejected_ar_with_their_code(
        mllp: MLLPServer, fields: dict[str, str], code: str) -> None:
    async with MLLPClient("127.0.0.1", mllp.port) as client:
        reply = await client.send(_header(oru("HDR-1"), **fields))
    assert msa(reply) == ("AR", "HDR-1")
    assert (code, "E") in errs(reply)


@pytest.mark.parametrize(("fields", "reason"), [
    ({"f9": "MFN^M02"}, "MFN"), ({"f12": "3.0"}, "version '3.0' is not supported"),
    ({"f11": "X"}, "processing id 'X' is not accepted"),
])
async def test_a_rejected_message_is_kept_as_a_dead_letter_with_why(
        gateway: HL7Gateway, fhir: FhirService, fields: dict[str, str], reason: str) -> None:
    raw = _header(oru("AR-1"), **fields)
    processed = await gateway.process(raw)
    assert msa(processed.acks[0]) == ("AR", "AR-1")
    entry = await fhir.store.get_document(DEAD_LETTERS, processed.dead_letter_id or "")
    assert entry is not None
    assert entry["topic"] == "platform.hl7.message_failed"
    assert entry["raw_message"].startswith("MSH|^~\\&|CITYLAB-LIS")
    assert "AR-1" in entry["raw_message"] and "OBX|" in entry["raw_message"]
    assert entry["error"].startswith("rejected: ") and reason in entry["error"]
    assert entry["control_id"] == "AR-1"
    # A resend is answered the same way and replaces its entry rather than adding one.
    again = await gateway.process(raw)
    assert again.dead_letter_id == processed.dead_letter_id
    assert len(await fhir.store.find_documents(DEAD_LETTERS)) == 1


async def test_a_rejected_message_replays_once_the_gateway_takes_it(fhir: FhirService
                                                                    ) -> None:
    """An analyst replays what a narrower gateway refused (here: one taking ADT only),
    once the gateway takes it: the result is stored and the entry goes."""
    adt_only = HL7Gateway(fhir, access=SYSTEM, policy=HeaderPolicy(message_types={"ADT": None}))
    refused = await adt_only.process(oru("AR-REPLAY-1"))
    assert refused.ack_code == "AR" and refused.dead_letter_id is not None
    with pytest.raises(RuntimeError, match="failed again"):
        await adt_only.retry_dead_letter(refused.dead_letter_id)
    assert await search(fhir, "Observation") == []
    replayed = await HL7Gateway(fhir, access=SYSTEM).retry_dead_letter(refused.dead_letter_id)
    assert replayed.ack_code == "AA"
    assert len(await search(fhir, "Observation")) == len(CHEMISTRY)
    assert await fhir.store.get_document(DEAD_LETTERS, refused.dead_letter_id) is None


async def test_a_mapping_failure_is_ae_with_err_and_a_dead_letter(gateway: HL7Gateway,
                                                                  fhir: FhirService) -> None:
    # OBR-4 empty: the report cannot say what it reports, so none of it is stored.
    broken = oru("BAD-1").replace(b"|24323-8^Comprehensive metabolic panel^LN|", b"||")
    processed = await gateway.process(broken)
    assert msa(processed.acks[0]) == ("AE", "BAD-1")
    assert errs(processed.acks[0]) == [("101", "E")]
    assert "OBR-4" in parse(processed.acks[0]).segment("ERR").field(8)  # type: ignore[union-attr]
    entry = await fhir.store.get_document(DEAD_LETTERS, processed.dead_letter_id or "")
    assert entry is not None
    assert entry["topic"] == "platform.hl7.message_failed"
    assert entry["raw_message"].startswith("MSH|^~\\&|CITYLAB-LIS")
    assert set(entry) >= {"id", "event_id", "topic", "original_payload", "error", "created_at"}
    assert await search(fhir, "Observation") == []
    again = await gateway.process(broken)  # the recorded outcome, not a second dead letter
    assert again.duplicate and again.acks == processed.acks


async def test_a_header_missing_required_fields_is_rejected_with_code_101(
        mllp: MLLPServer) -> None:
    async with MLLPClient("127.0.0.1", mllp.port) as client:
        reply = await client.send(b"MSH|^~\\&|LIS|LAB|EHR|CLINIC|20240301||ORU^R01|NO-VERSION")
    assert msa(reply) == ("AR", "NO-VERSION")
    assert errs(reply) == [("101", "E"), ("101", "E")]  # MSH-11 and MSH-12


async def test_an_unparseable_message_gets_a_nak_and_is_kept(mllp: MLLPServer,
                                                              fhir: FhirService) -> None:
    async with MLLPClient("127.0.0.1", mllp.port) as client:
        garbage = await client.send(b"this is not HL7 at all")
    assert msa(garbage)[0] == "AE"
    assert errs(garbage)[0][0] == "100"
    found = await fhir.store.find_documents(DEAD_LETTERS, {"raw_message": "this is not HL7 at all"})
    assert len(found) == 1


async def test_an_oversize_message_is_rejected_and_the_connection_survives(
        gateway: HL7Gateway) -> None:
    server = await start_listener(gateway, "127.0.0.1", 0, max_message_bytes=4096)
    try:
        big = oru("BIG-1", results=CHEMISTRY * 30)
        async with MLLPClient("127.0.0.1", server.port) as client:
            assert msa(await client.send(big)) == ("AR", "BIG-1")
            assert msa(await client.send(oru("SMALL-1"))) == ("AA", "SMALL-1")
    finally:
        await server.close()


class FailingOnce:
    """The FHIR service, except that the first transaction hits a storage failure."""

    def __init__(self, fhir: FhirService) -> None:
        self._fhir, self.store, self.failures = fhir, fhir.store, 1

    async def transaction(self, bundle: JSON, **options: Any) -> JSON:
        if self.failures:
            self.failures -= 1
            raise OSError("disk I/O error")
        return await SystemTransactions(self._fhir, SYSTEM).transaction(bundle, **options)

    async def search(self, kind: str, params: list[tuple[str, str]]) -> list[JSON]:
        return await self._fhir.search(kind, params)


async def test_a_storage_failure_is_ar_not_recorded_and_the_resend_is_stored(
        fhir: FhirService) -> None:
    gateway = HL7Gateway(FailingOnce(fhir))  # type: ignore[arg-type]
    failed = await gateway.process(oru("IO-1"))
    assert msa(failed.acks[0]) == ("AR", "IO-1")
    assert errs(failed.acks[0]) == [("207", "E")]
    assert await fhir.store.get_document(MESSAGES, "CITYLAB-LIS|CITY LAB|IO-1") is None
    resent = await gateway.process(oru("IO-1"))
    assert (resent.ack_code, resent.duplicate) == ("AA", False)
    assert len(await search(fhir, "DiagnosticReport")) == 1


async def test_resources_and_outcome_record_are_stored_together_or_not_at_all(
        fhir: FhirService, monkeypatch: pytest.MonkeyPatch) -> None:
    """The record (and the result events) commit with the resources: when recording fails,
    nothing of the message is stored, the sender is told to resend, and the resend is
    processed as a new message."""
    from hl7_gateway import gateway as module

    real_record_of = module._record_of

    def failing_record_of(*args: Any) -> JSON:
        raise RuntimeError("record store unavailable")

    monkeypatch.setattr(module, "_record_of", failing_record_of)
    gateway = HL7Gateway(fhir, access=SYSTEM)
    failed = await gateway.process(oru("ATOM-1"))
    assert msa(failed.acks[0]) == ("AR", "ATOM-1")
    assert await search(fhir, "DiagnosticReport") == []
    assert await search(fhir, "Patient") == []
    assert [e for e in await fhir.store.pending_events() if e["topic"] == RESULT_TOPIC] == []
    monkeypatch.setattr(module, "_record_of", real_record_of)
    resent = await gateway.process(oru("ATOM-1"))
    assert (resent.ack_code, resent.duplicate) == ("AA", False)
    record = await fhir.store.get_document(MESSAGES, "CITYLAB-LIS|CITY LAB|ATOM-1")
    assert record is not None and record["resources"] == resent.resources
    [report] = await search(fhir, "DiagnosticReport")
    assert f"DiagnosticReport/{report['id']}" in record["resources"]


async def test_a_dead_letter_is_retried_once_the_cause_is_gone(fhir: FhirService) -> None:
    gateway = HL7Gateway(FailingOnce(fhir))  # type: ignore[arg-type]
    failed = await gateway.process(oru("RETRY-1"))
    assert failed.dead_letter_id is not None
    retried = await gateway.retry_dead_letter(failed.dead_letter_id)
    assert retried.ack_code == "AA"
    assert await fhir.store.get_document(DEAD_LETTERS, failed.dead_letter_id) is None
    assert len(await search(fhir, "Observation")) == len(CHEMISTRY)


# --- events -------------------------------------------------------------------------------------


async def test_a_stored_result_emits_result_received_with_the_resource_ids(
        gateway: HL7Gateway, fhir: FhirService) -> None:
    await gateway.process(oru("EV-1"))
    [event] = [e for e in await fhir.store.pending_events() if e["topic"] == RESULT_TOPIC]
    payload = event["payload"]
    [report] = await search(fhir, "DiagnosticReport")
    assert payload["diagnostic_report_id"] == report["id"]
    assert payload["patient_id"] == report["subject"]["reference"].removeprefix("Patient/")
    assert sorted(payload["observation_ids"]) == sorted(
        r["reference"].removeprefix("Observation/") for r in report["result"])
    assert (payload["abnormal"], payload["critical"]) == (True, True)  # H and HH flags
    assert (payload["filler_order_number"], payload["placer_order_number"]) == ("F-1001",
                                                                                "P-5001")
    assert payload["message"]["control_id"] == "EV-1"
    assert event["source_service"] == "hl7_gateway"


async def test_the_stored_original_message_is_byte_identical(gateway: HL7Gateway,
                                                             fhir: FhirService) -> None:
    raw = oru("RAW-1") + b"ZLB|1|site note\r"
    await gateway.process(raw)
    [binary] = await search(fhir, "Binary")
    assert base64.b64decode(binary["data"]) == raw


async def test_a_retry_that_fails_again_keeps_the_one_dead_letter(gateway: HL7Gateway,
                                                                  fhir: FhirService) -> None:
    still_broken = oru("AGAIN-1").replace(b"\rOBR|", b"\rXXX|")  # no OBR: never maps
    failed = await gateway.process(still_broken)
    assert failed.dead_letter_id is not None
    with pytest.raises(RuntimeError, match="failed again"):
        await gateway.retry_dead_letter(failed.dead_letter_id)
    assert len(await fhir.store.find_documents(DEAD_LETTERS)) == 1


def test_a_merge_keeps_identity_links_subject_and_requester() -> None:
    stored = {"resourceType": "ServiceRequest", "id": "sr-1", "meta": {"versionId": "3"},
              "status": "active", "subject": {"reference": "Patient/p-1"},
              "requester": {"display": "Dr Otieno"}, "note": [{"text": "fasting"}],
              "identifier": [{"system": "urn:a", "value": "1"}]}
    mapped = {"resourceType": "ServiceRequest", "status": "completed",
              "subject": {"reference": "urn:uuid:0"}, "requester": {"display": "LAB"},
              "identifier": [{"system": "urn:b", "value": "2"},
                             {"system": "urn:a", "value": "1"}]}
    merged = overlay(stored, mapped)
    assert merged["status"] == "completed"
    assert merged["subject"] == {"reference": "Patient/p-1"}
    assert merged["requester"] == {"display": "Dr Otieno"}
    assert merged["note"] == [{"text": "fasting"}]
    assert merged["identifier"] == [{"system": "urn:b", "value": "2"},
                                    {"system": "urn:a", "value": "1"}]
    assert "meta" not in merged


async def test_enhanced_mode_rejects_with_cr_and_storage_failures_with_ce(
        gateway: HL7Gateway, fhir: FhirService) -> None:
    rejected = await gateway.process(_header(oru("ENH-CR", msh15="AL", msh16="AL"), f12="3.0"))
    assert [msa(a)[0] for a in rejected.acks] == ["CR"]
    assert errs(rejected.acks[0]) == [("203", "E")]
    failing = HL7Gateway(FailingOnce(fhir))  # type: ignore[arg-type]
    failed = await failing.process(oru("ENH-CE", msh15="AL", msh16="AL"))
    assert [msa(a)[0] for a in failed.acks] == ["CE"]
    assert errs(failed.acks[0]) == [("207", "E")]


# --- messages written from the HL7 v2.5.1 chapters (not from the shared samples) ----------------

# 3.3.1 ADT^A01: [{OBX}] follows PV1/PV2, here the height and weight taken at admission.
ADT_A01_WITH_OBSERVATIONS = (
    "MSH|^~\\&|ADT1|GOOD HEALTH HOSPITAL|GHH LAB, INC.|GOOD HEALTH HOSPITAL|200708181126|"
    "SECURITY|ADT^A01^ADT_A01|MSG00001|P|2.5.1\r"
    "EVN|A01|200708181123\r"
    "PID|1||PATID1234^^^GOOD HEALTH HOSPITAL^MR||EVERYMAN^ADAM^A^III||19610615|M\r"
    "PV1|1|I|2000^2012^01||||004777^ATTEND^AARON^A|||SUR||||ADM|A0||||"
    "V20070818^^^GOOD HEALTH HOSPITAL^VN\r"
    "OBX|1|NM|8302-2^Body height^LN||180|cm^centimeter^UCUM|||||F|||200708181120\r"
    "OBX|2|NM|29463-7^Body weight^LN||82.5|kg^kilogram^UCUM|||||F|||200708181120\r"
    "OBX|3|ST|8661-1^Chief complaint^LN||Right lower quadrant pain||||||F\r"
)


async def test_adt_observations_are_stored_with_the_patient_and_the_stay(
        gateway: HL7Gateway, fhir: FhirService) -> None:
    processed = await gateway.process(ADT_A01_WITH_OBSERVATIONS)
    assert (processed.ack_code, processed.errors) == ("AA", [])
    [patient] = await search(fhir, "Patient", ("identifier", "PATID1234"))
    [encounter] = await search(fhir, "Encounter", ("identifier", "V20070818"))
    found = {o["code"]["coding"][0]["code"]: o for o in await search(fhir, "Observation")}
    assert found.keys() == {"8302-2", "29463-7", "8661-1"}
    for observation in found.values():
        assert observation["subject"]["reference"] == f"Patient/{patient['id']}"
        assert observation["encounter"]["reference"] == f"Encounter/{encounter['id']}"
        assert observation["status"] == "final"
    weight = found["29463-7"]
    assert weight["valueQuantity"] == {"value": 82.5, "unit": "kilogram",
                                       "system": "http://unitsofmeasure.org", "code": "kg"}
    assert weight["effectiveDateTime"].startswith("2007-08-18T11:20:00")
    assert weight["category"][0]["coding"][0]["code"] == "vital-signs"
    assert "category" not in found["8661-1"]  # not a vital sign
    assert found["8661-1"]["valueString"] == "Right lower quadrant pain"
    # the A08 that repeats the admission weight corrects it (the same Observation)
    update = ADT_A01_WITH_OBSERVATIONS.replace("ADT^A01^ADT_A01|MSG00001", "ADT^A08^ADT_A01|"
                                               "MSG00002").replace("EVN|A01", "EVN|A08")
    update = update.replace("||82.5|kg", "||81.9|kg")
    assert (await gateway.process(update)).ack_code == "AA"
    weights = await search(fhir, "Observation", ("code", "http://loinc.org|29463-7"))
    assert [(w["id"], w["valueQuantity"]["value"]) for w in weights] == [(weight["id"], 81.9)]


# 7.4.1 ORU^R01 (the chapter's glucose example), with a second result whose OBX-3 the sender
# left empty: OBX-3 is required (7.4.2.3), the other two results are still good.
ORU_WITH_ONE_RESULT_WITHOUT_CODE = (
    "MSH|^~\\&|GHH LAB|ELAB-3|GHH OE|BLDG4|200202150930||ORU^R01^ORU_R01|CNTRL-3456|P|2.5.1\r"
    "PID|||555444444^^^GOOD HEALTH HOSPITAL^MR||EVERYWOMAN^EVE^E^^^^L|JONES|19620320|F\r"
    "OBR|1|845439^GHH OE|1045813^GHH LAB|15545^GLUCOSE|||200202150730|||||||||"
    "555-55-5555^PRIMARY^PATRICIA P^^^^MD^^|||||||||F\r"
    "OBX|1|SN|1554-5^GLUCOSE^POST 12H CFST:MCNC:PT:SER/PLAS:QN||^182|mg/dl|70_105|H|||F\r"
    "OBX|2|NM|||6.1|mmol/L|3.5-5.1|H|||F\r"
    "OBX|3|NM|2160-0^CREATININE^LN||1.1|mg/dl|0.7-1.3|N|||F\r"
)


async def test_a_result_line_without_its_code_is_reported_and_the_others_are_stored(
        gateway: HL7Gateway, fhir: FhirService) -> None:
    processed = await gateway.process(ORU_WITH_ONE_RESULT_WITHOUT_CODE)
    [ack] = processed.acks
    assert msa(ack) == ("AE", "CNTRL-3456")
    [err] = parse(ack).segments("ERR")
    # ERR-2 error location: segment id, sequence, field; ERR-3 table 0357; ERR-4 severity
    assert err.field(2) == "OBX^2^3"
    assert (err.component(3, 1), err.field(4)) == ("101", "E")
    assert "not stored" in err.field(8)
    stored = {o["code"]["coding"][0]["code"]: o for o in await search(fhir, "Observation")}
    assert stored.keys() == {"1554-5", "2160-0"}
    assert stored["1554-5"]["valueQuantity"]["value"] == 182
    [report] = await search(fhir, "DiagnosticReport", ("identifier", "1045813"))
    assert {r["reference"] for r in report["result"]} == {
        f"Observation/{o['id']}" for o in stored.values()}
    assert processed.dead_letter_id is None  # stored: nothing to replay
    assert await fhir.store.find_documents(DEAD_LETTERS, {}, limit=10) == []
    # the sender's resend is answered from the record, and stores nothing twice
    again = await gateway.process(ORU_WITH_ONE_RESULT_WITHOUT_CODE)
    assert (again.duplicate, again.acks) == (True, processed.acks)
    assert len(await search(fhir, "Observation")) == 2


def _stay_message(event: str, structure: str, control_id: str, pv1: dict[int, str]) -> str:
    """An ADT of chapter 3 (3.3.1 A01, 3.3.2 A02, 3.3.3 A03, 3.3.8 A08) whose PV1 carries
    neither a visit number (PV1-19) nor an admit date/time (PV1-44)."""
    return "\r".join([
        "MSH|^~\\&|ADT1|GOOD HEALTH HOSPITAL|GHH LAB, INC.|GOOD HEALTH HOSPITAL|"
        f"200708181126|SECURITY|ADT^{event}^{structure}|{control_id}|P|2.5.1",
        f"EVN|{event}|200708181123",
        "PID|1||PATID5678^^^GOOD HEALTH HOSPITAL^MR||EVERYWOMAN^EVE^E||19620320|F",
        segment("PV1", {1: "1", 2: "I", 7: "004777^ATTEND^AARON^A", **pv1}),
    ]) + "\r"


async def test_one_stay_without_visit_number_or_admit_time_is_one_encounter(
        gateway: HL7Gateway, fhir: FhirService) -> None:
    ward, surgery = "2000^2012^01", "3000^3015^02"
    messages = [
        _stay_message("A01", "ADT_A01", "STAY-1", {3: ward}),
        _stay_message("A08", "ADT_A01", "STAY-2", {3: ward, 10: "SUR"}),
        # the transfer names the new location in PV1-3 and the one it left in PV1-6
        _stay_message("A02", "ADT_A02", "STAY-3", {3: surgery, 6: ward}),
        _stay_message("A03", "ADT_A03", "STAY-4", {3: surgery, 45: "200708201000"}),
    ]
    for message in messages:
        assert (await gateway.process(message)).ack_code == "AA"
    [patient] = await search(fhir, "Patient", ("identifier", "PATID5678"))
    [encounter] = await search(fhir, "Encounter", ("subject", f"Patient/{patient['id']}"))
    assert encounter["status"] == "finished"
    assert encounter["period"]["end"].startswith("2007-08-20T10:00:00")
    assert encounter["serviceType"]["coding"][0]["code"] == "SUR"  # the A08's update
    assert encounter["meta"]["versionId"] == "4"
    # a new admission after the discharge is a new stay, not the finished one
    readmission = _stay_message("A01", "ADT_A01", "STAY-5", {3: ward})
    assert (await gateway.process(readmission)).ack_code == "AA"
    stays = await search(fhir, "Encounter", ("subject", f"Patient/{patient['id']}"))
    assert sorted(e["status"] for e in stays) == ["finished", "in-progress"]


async def test_an_admission_elsewhere_does_not_take_an_open_stay_at_another_location(
        gateway: HL7Gateway, fhir: FhirService) -> None:
    # an outpatient visit (A04) still open at the clinic, then an inpatient admission (A01)
    visit = _stay_message("A04", "ADT_A01", "OUT-1", {2: "O", 3: "CLINIC^1^1"})
    admission = _stay_message("A01", "ADT_A01", "IN-1", {3: "2000^2012^01"})
    for message in (visit, admission):
        assert (await gateway.process(message)).ack_code == "AA"
    stays = await search(fhir, "Encounter")
    assert sorted((e["class"]["code"], e["status"]) for e in stays) == [
        ("AMB", "arrived"), ("IMP", "in-progress")]
