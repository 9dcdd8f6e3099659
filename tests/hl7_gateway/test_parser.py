"""hl7_gateway.parser and hl7_gateway.batch on the shared public samples and edge cases."""

from __future__ import annotations

from pathlib import Path

import pytest

from hl7_gateway.batch import parse_batch, split_batch
from hl7_gateway.parser import (
    Delimiters,
    HL7ParseError,
    decode_message,
    encode_message,
    escape,
    parse,
    read_msh_leniently,
    unescape,
)
from tests.hl7_gateway.hl7_samples import sample_bytes, sample_files

ADT = (
    "MSH|^~\\&|REG|GOOD HEALTH|EHR|GOOD HEALTH|20240301101500+0100||ADT^A01^ADT_A01|MSG-7781|P|"
    "2.5.1\r"
    "EVN|A01|20240301101500+0100\r"
    "PID|1||884422^^^GHH^MR~123-45-6789^^^SSA^SS||Okafor^Chidinma^N||19870412|F\r"
    "PV1|1|I|WARD4^402^B\r"
)


# --- every public sample ------------------------------------------------------------


@pytest.mark.parametrize("path", sample_files(), ids=lambda p: p.name[:2])
def test_every_public_sample_parses_with_a_header_and_segments(path: Path) -> None:
    raw = sample_bytes(path.name[:2])
    messages = split_batch(raw) if path.name.startswith("27_") else [parse(raw)]
    for msg in messages:
        assert msg.msh.field(1) == "|"
        assert msg.msh.field(2) == "^~\\&"
        assert msg.message_type and msg.trigger_event
        assert msg.control_id
        assert msg.version.startswith("2.")
        assert len(msg) > 1
        assert all(len(seg.id) == 3 and seg.id.isalnum() for seg in msg)


def test_nist_cbc_sample_fields_after_bom_and_lf() -> None:
    msg = parse(sample_bytes("01"))
    assert msg.msh.field(9) == "ORU^R01^ORU_R01"
    assert msg.msh.field(10) == "NIST-LRI-NG-002.00"
    assert (msg.message_type, msg.trigger_event, msg.message_structure) == ("ORU", "R01", "ORU_R01")
    assert (msg.processing_id, msg.version) == ("T", "2.5.1")
    assert (msg.msh.field(15), msg.msh.field(16)) == ("AL", "NE")
    assert msg.segment("PID").component(5, 1) == "Jones"
    obx = msg.segments("OBX")
    assert len(obx) == 28
    hemoglobin = obx[1]
    assert hemoglobin.component(3, 1) == "718-7"
    assert hemoglobin.component(3, 3) == "LN"
    assert hemoglobin.field(5) == "12.5"
    assert hemoglobin.component(6, 1) == "g/mL"
    assert hemoglobin.field(8) == "L"
    assert obx[19].component(5, 2) == "Present ++ out of ++++"
    assert msg.segment("SPM").component(4, 9) == "Blood"
    assert msg.warnings == []


def test_subcomponent_escape_and_repeating_race_in_public_health_sample() -> None:
    msg = parse(sample_bytes("02"))
    note = msg.segment("NTE").field(3)
    assert "E.coli O157:H7 & other STECs" in note
    assert "\\T\\" in msg.segment("NTE").raw_field(3)  # decoded only when read
    races = msg.segment("PID").repetitions(10)
    assert [r.component(2) for r in races] == ["White", "American Indian or Alaska Native"]
    assert msg.segment("PID").subcomponent(3, 4, 2) == "2.16.840.1.114222.4.3.3.5.1.2"


def test_trailing_spaces_after_segments_are_not_part_of_the_last_field() -> None:
    msg = parse(sample_bytes("05"))
    assert msg.segment("EVN").field_count == 7
    assert msg.segment("EVN").raw.endswith("+0700|||||")
    assert msg.segment("PID").field(30) == "NO"
    assert msg.segments("IN2")[0].raw.endswith("|8885551212")


def test_cr_separated_message_with_a_trailing_lf() -> None:
    msg = parse(sample_bytes("17"))
    assert [s.id for s in msg] == ["MSH", "SFT", "PID", "ORC", "OBR", "SPM", "OBX"]
    obx = msg.segment("OBX")
    assert (obx.field(5), obx.component(6, 1), obx.field(8)) == ("50", "ug/dL", "H")


def test_obr_wrapped_mid_phone_number_is_joined_without_a_space() -> None:
    msg = parse(sample_bytes("18"))
    assert [s.id for s in msg] == ["MSH", "PID", "PD1", "PV1", "ORC", "OBR", "DG1"]
    obr = msg.segment("OBR")
    assert obr.field(17) == "(608)258-8866"
    assert obr.field(25) == "Final"
    assert msg.processing_id == "D"
    assert msg.warnings == ["joined 1 wrapped line(s) to the segment before"]


def test_whole_message_on_one_line_separated_by_spaces_is_split_into_segments() -> None:
    msg = parse(sample_bytes("19"))
    assert [s.id for s in msg] == [
        "MSH",
        "EVN",
        "PID",
        "NK1",
        "PV1",
        "GT1",
        "DG1",
        "IN1",
        "IN2",
        "IN1",
        "IN2",
        "IN1",
    ]
    assert msg.msh.field(12) == "2.3"
    pid = msg.segment("PID")
    assert pid.component(3, 1) == "10006579"
    assert pid.component(5, 2) == "DONALD"
    assert pid.field(30) == "NO"
    assert msg.segment("DG1").component(3, 2) == "OSTEOARTHROS NOS-L/LEG "
    assert msg.segments("IN1")[0].field(49) == "8291"
    assert any("glued with spaces" in w for w in msg.warnings)


def test_wrapped_and_glued_mdm_keeps_control_id_and_every_obx() -> None:
    msg = parse(sample_bytes("20"))
    assert msg.control_id == "{6AF4DC6C-5BF1-4563-8EBD-F54B880B3613}"
    assert msg.segment("EVN").field(1) == "T04"
    obx = msg.segments("OBX")
    assert [o.field(1) for o in obx] == [str(i) for i in range(1, 45)]
    assert obx[3].field(5) == "ACCT. NUMBER:"
    assert obx[10].field(5) == "Charles Graber"
    assert obx[19].field(5) == "One film was presented for interpretation and reveals a chest tube"
    assert msg.segment("TXA").component(23, 5) == "DO"


def test_latin1_sample_declares_8859_1() -> None:
    msg = parse(sample_bytes("23"))
    assert msg.charset == "latin-1"
    assert msg.msh.field(18) == "8859/1"
    assert msg.segment("STF").component(3, 1) == "DU JARDIN"
    assert msg.segment("STF").component(11, 3) == "BRAINE-LE-CHATEAU"


def test_msh18_8859_1_is_honoured_even_when_the_bytes_are_also_valid_utf8() -> None:
    # C3 A9 is "é" in UTF-8 but "Ã©" in Latin-1: only MSH-18 can tell which is meant.
    raw = sample_bytes("23").replace(b"CHATEAU", "CHÂTEAU".encode("latin-1"))
    assert parse(raw).segment("STF").component(11, 3) == "BRAINE-LE-CHÂTEAU"
    ambiguous = b"MSH|^~\\&|A|B|C|D|20240101||ADT^A01|1|P|2.5|||||FR|8859/1\rPID|1||||Ren\xc3\xa9\r"
    assert parse(ambiguous).segment("PID").field(5) == "RenÃ©"
    assert parse(ambiguous.replace(b"8859/1", b"")).segment("PID").field(5) == "René"


def test_undeclared_non_utf8_bytes_fall_back_to_latin1_with_a_warning() -> None:
    raw = "MSH|^~\\&|A|B|C|D|20240101||ADT^A01|1|P|2.5\rPID|1||||Müller^Jürgen\r".encode("latin-1")
    msg = parse(raw)
    assert msg.segment("PID").component(5, 2) == "Jürgen"
    assert msg.charset == "latin-1"
    assert msg.warnings == ["bytes are not valid UTF-8; decoded as Latin-1"]


def test_ascii_declared_but_utf8_sent_is_decoded_as_utf8_with_a_warning() -> None:
    raw = "MSH|^~\\&|A|B|C|D|20240101||ADT^A01|1|P|2.5|||||AU|ASCII\rPID|1||||Zoë\r".encode()
    decoded = decode_message(raw)
    assert (decoded.codec, decoded.text.split("|")[-1]) == ("utf-8", "Zoë\r")
    assert decoded.warning and "ascii" in decoded.warning


def test_z_message_type_and_z_segment_are_kept() -> None:
    msg = parse(sample_bytes("25"))
    assert msg.msh.field(9) == "ERP^Z99^ERP_R09"
    assert msg.charset == "latin-1"
    assert msg.segment("ZNT").component(1, 2) == "2.16.840.1.113883.3.59.1:4006"
    assert msg.segment("MSA").field(1) == "AA"


def test_normative_sample_structured_numeric_value() -> None:
    msg = parse(sample_bytes("26"))
    obx = msg.segments("OBX")
    assert [o.field(2) for o in obx] == ["SN", "FN"]
    assert obx[0].components(5) == ["", "182"]
    assert msg.segment("PID").field(7) == "196203520"  # invalid date kept as sent


def test_zpi_segment_and_repeating_identifiers() -> None:
    msg = parse(sample_bytes("28"))
    assert [s.id for s in msg] == ["MSH", "EVN", "PID", "ZPI", "PV1", "PR1"]
    assert [r.text for r in msg.segment("ZPI").repetitions(1)] == ["Fido", "Fred"]
    pid = msg.segment("PID")
    assert len(pid.repetitions(3)) == 4
    assert pid.component(3, 1, rep=3) == "ZZZZZZ83M64Z148R"
    assert pid.component(3, 7, rep=3) == "20070103"
    assert pid.component(3, 1, rep=9) == ""


def test_utf8_apostrophe_in_repeating_address() -> None:
    msg = parse(sample_bytes("29"))
    assert msg.segment("PID").component(11, 1, rep=2) == "NICKELL\u2019S PICKLES"
    assert msg.segment("OBX").field(2) == "N^K&M"


def test_v22_labcorp_sample_with_wrapped_pid_and_z_segment() -> None:
    msg = parse(sample_bytes("30"))
    assert msg.version == "2.2"
    pid = msg.segment("PID")
    assert pid.field(7) == "19730204"
    assert pid.field(8) == "M"
    assert pid.component(11, 5) == "00000-0000"
    assert msg.segments("OBX")[0].field(11) == "X"
    assert msg.segment("ZPS").component(4, 3) == "BURLINGTON"


def test_invalid_processing_id_still_parses() -> None:
    msg = parse(sample_bytes("24"))
    assert msg.msh.field(11) == "BAR^A01"
    assert msg.processing_id == "BAR"


# --- separators and structure ---------------------------------------------------------


@pytest.mark.parametrize("separator", ["\r", "\n", "\r\n", "\n\n", "\r\n\r\n"])
def test_segment_separators_are_normalised(separator: str) -> None:
    msg = parse(ADT.replace("\r", separator))
    assert [s.id for s in msg] == ["MSH", "EVN", "PID", "PV1"]
    assert msg.warnings == []


def test_utf8_bom_is_stripped_from_bytes_and_text() -> None:
    assert parse(b"\xef\xbb\xbf" + ADT.encode()).msh.field(3) == "REG"
    assert parse("\ufeff" + ADT).msh.field(3) == "REG"


def test_field_numbering_counts_the_separator_as_msh_1() -> None:
    msh = parse(ADT).msh
    assert [msh.field(n) for n in (1, 2, 3, 7, 9, 10, 11, 12)] == [
        "|",
        "^~\\&",
        "REG",
        "20240301101500+0100",
        "ADT^A01^ADT_A01",
        "MSG-7781",
        "P",
        "2.5.1",
    ]
    assert msh.component(2, 1) == "^~\\&"  # MSH-2 is never split into components
    assert msh.field(40) == ""


def test_absent_fields_components_and_repetitions_read_as_empty() -> None:
    pid = parse(ADT).segment("PID")
    assert pid.field(0) == ""
    assert pid.component(5, 9) == ""
    assert pid.subcomponent(3, 1, 2) == ""
    assert pid.repetitions(2) == []
    assert pid.components(3, rep=2) == ["123-45-6789", "", "", "SSA", "SS"]


def test_custom_encoding_characters_from_msh_2() -> None:
    raw = (
        "MSH*%$!@*LAB*CLINIC*EHR*CLINIC*20240301**ORU%R01*ID 9*P*2.4\r"
        "PID*1**7788%%%CLINIC%MR$9900%%%SSA%SS**Ng%Mai!S!Anh\r"
        "OBX*1*ST*GLU%Glucose**5!F!6 mmol/L ratio@x\r"
    )
    msg = parse(raw)
    assert msg.delimiters == Delimiters("*", "%", "$", "!", "@")
    assert msg.msh.field(2) == "%$!@"
    assert (msg.message_type, msg.trigger_event, msg.control_id) == ("ORU", "R01", "ID 9")
    pid = msg.segment("PID")
    assert pid.component(3, 4, rep=2) == "SSA"
    assert pid.component(5, 2) == "Mai%Anh"
    assert msg.segment("OBX").subcomponent(5, 1, 1) == "5*6 mmol/L ratio"


def test_segment_lookup_by_id_and_occurrence() -> None:
    msg = parse(sample_bytes("06"))
    assert [nk1.component(2, 1) for nk1 in msg.segments("NK1")] == ["PEACH", "TOADSTOOL"]
    assert msg.segment("NK1", 2).field(7) == "EMC"
    assert msg.segment("NK1", 3) is None
    assert msg.segments("ZZZ") == []
    assert len(msg.segments()) == len(msg)


def test_v27_truncation_character_and_escape() -> None:
    msg = parse("MSH|^~\\&#|A|B|C|D|20240101||ADT^A01^ADT_A01|X1|P|2.7\rNTE|1||cut here\\P\\\r")
    assert msg.delimiters.truncation == "#"
    assert msg.segment("NTE").field(3) == "cut here#"


@pytest.mark.parametrize(
    "version", ["2.2", "2.3", "2.3.1", "2.4", "2.5", "2.5.1", "2.6", "2.7", "2.7.1", "2.8"]
)
def test_every_supported_version_reads_the_same_way(version: str) -> None:
    msg = parse(ADT.replace("|2.5.1\r", f"|{version}\r"))
    assert msg.version == version
    assert msg.segment("PID").component(5, 1) == "Okafor"


def test_to_er7_serialises_repaired_segments_with_cr() -> None:
    msg = parse(ADT.replace("\r", "\n"))
    assert msg.to_er7() == ADT


# --- escapes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("encoded", "text"),
    [
        ("a\\F\\b", "a|b"),
        ("a\\S\\b", "a^b"),
        ("a\\T\\b", "a&b"),
        ("a\\R\\b", "a~b"),
        ("C:\\E\\temp", "C:\\temp"),
        ("line 1\\.br\\line 2", "line 1\nline 2"),
        ("\\X48656C6C6F\\", "Hello"),
        ("caf\\XC3A9\\", "café"),
        ("\\H\\IMPORTANT\\N\\ note", "IMPORTANT note"),
        ("\\.sp 2\\after", "\n\nafter"),
        ("keep \\Zlocal\\ as is", "keep \\Zlocal\\ as is"),
        ("dangling \\ escape", "dangling \\ escape"),
        ("no escapes at all", "no escapes at all"),
    ],
)
def test_unescape(encoded: str, text: str) -> None:
    assert unescape(encoded) == text


def test_hex_escape_uses_the_message_charset() -> None:
    assert unescape("\\XE9\\", codec="latin-1") == "é"


def test_escape_round_trips_through_unescape() -> None:
    text = "A|B^C&D~E\\F\nnext line"
    encoded = escape(text)
    assert not any(c in encoded for c in "|^&~\n")
    assert unescape(encoded) == text


def test_values_are_unescaped_when_read_not_when_parsed() -> None:
    msg = parse(ADT + "NTE|1||Na \\T\\ K: 140\\S\\4.1\\.br\\repeat \\F\\ in 2h\r")
    nte = msg.segment("NTE")
    assert nte.raw_field(3) == "Na \\T\\ K: 140\\S\\4.1\\.br\\repeat \\F\\ in 2h"
    assert nte.field(3) == "Na & K: 140^4.1\nrepeat | in 2h"
    assert nte.component(3, 1) == "Na & K: 140^4.1\nrepeat | in 2h"


# --- errors and lenient header reading ------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b"", None),
        (b"   \r\n", None),
        (b"PID|1||123\r", None),
        (b"MSH", 1),
        (b"MSH|", 1),
        (b"MSH|AB12|app\r", 2),
        (b"MSH||app\r", 2),
        (b"MSHA^~\\&|app\r", 1),
    ],
)
def test_input_without_a_usable_msh_raises_a_located_parse_error(
    raw: bytes, field: int | None
) -> None:
    with pytest.raises(HL7ParseError) as caught:
        parse(raw)
    assert caught.value.segment == "MSH"
    assert caught.value.field == field


def test_batch_given_to_parse_points_to_the_batch_reader() -> None:
    with pytest.raises(HL7ParseError, match="batch"):
        parse(sample_bytes("27"))


def test_read_msh_leniently_reads_a_header_with_broken_encoding_characters() -> None:
    msh = read_msh_leniently(b"\x0bMSH|AB12|LAB|NORTH|EHR|SOUTH|20240101||ORU^R01|CTL-5|P|2.4\r")
    assert msh is not None
    assert (msh.field(3), msh.field(6), msh.field(10), msh.field(12)) == (
        "LAB",
        "SOUTH",
        "CTL-5",
        "2.4",
    )


def test_read_msh_leniently_finds_the_header_after_junk_and_in_truncated_bytes() -> None:
    raw = b"garbage line\r\n" + ADT.encode()[:120]
    msh = read_msh_leniently(raw)
    assert msh is not None and msh.field(10) == "MSG-7781"
    assert read_msh_leniently(b"no header here") is None


def test_encode_message_follows_msh_18() -> None:
    text = "MSH|^~\\&|A|B|C|D|20240101||ACK^A01^ACK|1|P|2.3.1|||||BE|8859/1\rMSA|AA|Hélène\r"
    assert encode_message(text).endswith("Hélène\r".encode("latin-1"))
    assert encode_message(ADT + "NTE|1||é\r").endswith("é\r".encode())


# --- batches --------------------------------------------------------------------------


def test_vinah_batch_file_is_split_into_its_message() -> None:
    batch_file = parse_batch(sample_bytes("27"))
    assert batch_file.header is not None
    assert batch_file.header.field(10) == "abchs20070101123401.hl7"
    assert batch_file.trailer is not None and batch_file.trailer.field(1) == "1"
    [batch] = batch_file.batches
    assert batch.header is not None and batch.header.field(11) == "abchs20070101123401-1"
    [msg] = batch_file.messages
    assert (msg.message_type, msg.trigger_event, msg.control_id) == ("ADT", "A04", "12334456778890")
    assert msg.msh.field(18) == "ASCII"
    assert msg.segment("PID").component(3, 1) == "0000112234"
    assert batch_file.warnings == []


def test_batch_with_two_batches_and_a_wrong_count_reports_it() -> None:
    second = ADT.replace("MSG-7781", "MSG-7782")
    raw = (
        "FHS|^~\\&|REG|GOOD HEALTH\rBHS|^~\\&|REG\r" + ADT + second + "BTS|3\r"
        "BHS|^~\\&|REG\r" + ADT.replace("MSG-7781", "MSG-7783") + "BTS|1\rFTS|2\r"
    )
    batch_file = parse_batch(raw.replace("\r", "\n").encode())
    assert [len(b.messages) for b in batch_file.batches] == [2, 1]
    assert [m.control_id for m in batch_file.messages] == ["MSG-7781", "MSG-7782", "MSG-7783"]
    assert batch_file.warnings == ["BTS-1 of batch 1 declares 3 messages, found 2"]


def test_single_message_read_as_a_batch() -> None:
    assert [m.control_id for m in split_batch(ADT)] == ["MSG-7781"]


def test_msh_2_with_missing_encoding_characters_reads_without_them() -> None:
    msg = parse("MSH|^|A|B|C|D|20240101||ADT^A01|X|P|2.3\rPID|1||12^^^H~34||a\\b\r")
    pid = msg.segment("PID")
    assert pid.component(3, 4) == "H~34"  # no repetition separator declared
    assert len(pid.repetitions(3)) == 1
    assert pid.field(5) == "a\\b"  # no escape character declared


def test_each_message_in_a_batch_uses_its_own_encoding_characters() -> None:
    custom = "MSH|%~\\&|LAB|X|EHR|Y|20240301||ORU%R01|B-2|P|2.4\rPID|1||77%%%X%MR\r"
    batch_file = parse_batch("BHS|^~\\&|LAB\r" + ADT + custom + "BTS|2\r")
    assert [m.segment("PID").component(3, 1) for m in batch_file.messages] == ["884422", "77"]


def test_the_thirty_public_samples_are_in_the_repository() -> None:
    """The sample tests are parametrized over the files: none may go missing silently."""
    assert [p.name[:2] for p in sample_files()] == [f"{n:02d}" for n in range(1, 31)]
